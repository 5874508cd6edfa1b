//! Tessel's own traces (`tessel launch --trace`, written by `tessel_runtime::trace`): the
//! data-parallel collectives it records inside each step, as `collective` events whose `args`
//! hold the buffer's `bytes` and the group's `ranks`; and the run itself from the trace's
//! `tessel` object (the scaled spec, each pipeline stage's strategy, each rank's stage, the
//! step times, the matmuls each rank timed by shape), with each rank's forward, backward,
//! communication and optimizer time per step summed from its events. A trace with neither is refused with that reason.

use serde_json::Value;
use tessel_grammar::{Spec, Strategy};

use super::TraceError;

/// One traced collective call.
#[derive(Clone, Debug, PartialEq)]
pub struct TesselCollective {
    /// `all_reduce`, `reduce_scatter` or `all_gather`.
    pub name: String,
    pub bytes: u64,
    pub ranks: u64,
    pub duration_us: f64,
    /// The call's time after the last of its group's ranks entered it: the collective itself,
    /// without this rank's wait for a slower one (which is the other rank's compute, not the
    /// link's). The whole duration where the trace lacks the other ranks' calls.
    pub after_last_arrival_us: f64,
}

/// What a Tessel trace holds.
#[derive(Clone, Debug, PartialEq)]
pub struct TesselTrace {
    pub collectives: Vec<TesselCollective>,
    /// The traced run, when the trace records it (traces written before it was have none).
    pub run: Option<TracedRun>,
}

/// A traced training run: what ran, and where each rank's time went.
#[derive(Clone, Debug, PartialEq)]
pub struct TracedRun {
    /// The spec the runtime trained (scaled as `tessel launch` scaled it).
    pub spec: Spec,
    /// The strategy of each pipeline stage (its own recompute and offload).
    pub stage_strategies: Vec<Strategy>,
    /// Seconds of each step, the slowest rank's.
    pub step_time_s: Vec<f64>,
    pub ranks: Vec<RankWork>,
    /// The matmuls each rank timed, by shape (none in traces written before they were).
    pub matmuls: Vec<TracedMatmul>,
}

/// The matmuls of one shape one rank timed: `m × k` by `k × n`, the calls and their median.
#[derive(Clone, Copy, Debug, PartialEq, serde::Deserialize)]
pub struct TracedMatmul {
    pub rank: u64,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub calls: u64,
    pub median_s: f64,
}

/// One rank's pipeline stage and the work of each step it completed.
#[derive(Clone, Debug, PartialEq)]
pub struct RankWork {
    pub rank: u64,
    pub stage: u64,
    pub steps: Vec<StepWork>,
}

/// Seconds one rank spent on each kind of work in one step.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepWork {
    pub forward_s: f64,
    pub backward_s: f64,
    /// The data-parallel gradient reduction (`reduce gradients`).
    pub reduce_s: f64,
    /// Pipeline sends and receives, waits for the peer included.
    pub p2p_s: f64,
    pub optimizer_s: f64,
}

/// The collectives and run of a Tessel trace; an error when the JSON is not one.
pub fn parse_tessel_trace(text: &str) -> Result<TesselTrace, TraceError> {
    tessel_trace(&super::read_trace_json(text)?)
}

fn refuse(message: impl Into<String>) -> TraceError {
    TraceError {
        line: 1,
        message: message.into(),
    }
}

/// [`parse_tessel_trace`] of a document already read.
pub fn tessel_trace(value: &Value) -> Result<TesselTrace, TraceError> {
    let events = value
        .get("traceEvents")
        .and_then(Value::as_array)
        .ok_or_else(|| refuse("not a trace: no `traceEvents` array"))?;
    let mut ranks_named = false;
    let calls: Vec<TracedCall> = events
        .iter()
        .filter(|e| e.get("cat").and_then(Value::as_str) == Some("collective"))
        .filter_map(|event| {
            ranks_named = true;
            let args = event.get("args")?;
            Some(TracedCall {
                collective: TesselCollective {
                    name: event.get("name")?.as_str()?.to_string(),
                    bytes: args.get("bytes")?.as_u64()?,
                    ranks: args.get("ranks")?.as_u64()?,
                    duration_us: duration_us(event)?,
                    after_last_arrival_us: 0.0,
                },
                rank: event.get("tid").and_then(Value::as_u64),
                start_us: event.get("ts").and_then(Value::as_f64),
            })
        })
        .collect();
    let collectives = after_last_arrival(&calls);
    let run = match value.get("tessel") {
        Some(run) => Some(traced_run(run, events)?),
        None => None,
    };
    if !ranks_named && run.is_none() {
        return Err(refuse(
            "no `collective` events and no `tessel` run: not a `tessel launch --trace` file, or \
             one written before they were traced",
        ));
    }
    Ok(TesselTrace { collectives, run })
}

/// One collective event and where it ran.
struct TracedCall {
    collective: TesselCollective,
    rank: Option<u64>,
    start_us: Option<f64>,
}

/// Each call with its time after the last of its group arrived. The group's other calls are
/// the same collective of the same size on other ranks that overlap it in time, the
/// `ranks − 1` whose ends are nearest its own (every rank of a group leaves the call
/// together; a concurrent call of another group ends elsewhere).
fn after_last_arrival(calls: &[TracedCall]) -> Vec<TesselCollective> {
    let mut same_kind: std::collections::BTreeMap<(&str, u64), Vec<&TracedCall>> =
        Default::default();
    for call in calls {
        let c = &call.collective;
        same_kind.entry((&c.name, c.bytes)).or_default().push(call);
    }
    calls
        .iter()
        .map(|call| {
            let c = &call.collective;
            let mut out = c.clone();
            out.after_last_arrival_us = c.duration_us;
            let (Some(rank), Some(start)) = (call.rank, call.start_us) else {
                return out;
            };
            let end = start + c.duration_us;
            let mut peers: Vec<(f64, f64)> = same_kind[&(c.name.as_str(), c.bytes)]
                .iter()
                .filter(|p| p.rank.is_some_and(|r| r != rank))
                .filter_map(|p| {
                    let s = p.start_us?;
                    let e = s + p.collective.duration_us;
                    (s < end && e > start).then_some(((e - end).abs(), s))
                })
                .collect();
            let needed = c.ranks.saturating_sub(1) as usize;
            if needed == 0 || peers.len() < needed {
                return out;
            }
            peers.sort_by(|a, b| a.0.total_cmp(&b.0));
            let last_arrival = peers[..needed]
                .iter()
                .map(|&(_, s)| s)
                .fold(start, f64::max);
            out.after_last_arrival_us = end - last_arrival;
            out
        })
        .collect()
}

fn duration_us(event: &Value) -> Option<f64> {
    event
        .get("dur")?
        .as_f64()
        .filter(|d| d.is_finite() && *d >= 0.0)
}

/// The `tessel` object and each rank's work per step: a step ends with the rank's optimizer
/// event, and what follows the last one (an unfinished step) is left out.
fn traced_run(run: &Value, events: &[Value]) -> Result<TracedRun, TraceError> {
    fn field<T: serde::de::DeserializeOwned>(run: &Value, key: &str) -> Result<T, TraceError> {
        let value = run
            .get(key)
            .ok_or_else(|| refuse(format!("the `tessel` run has no `{key}`")))?;
        serde_json::from_value(value.clone()).map_err(|error| {
            refuse(format!(
                "the `tessel` run's `{key}` is not this version's ({error}); trace the run again \
                 with this `tessel launch`"
            ))
        })
    }
    let spec: Spec = field(run, "spec")?;
    let stage_strategies: Vec<Strategy> = field(run, "stage_strategies")?;
    let stages: Vec<u64> = field(run, "stages")?;
    let step_time_s: Vec<f64> = field(run, "step_time_s")?;
    let matmuls: Vec<TracedMatmul> = match run.get("matmuls") {
        None => Vec::new(),
        Some(_) => field(run, "matmuls")?,
    };
    if let Some(bad) = matmuls
        .iter()
        .find(|t| !(t.median_s.is_finite() && t.median_s > 0.0) || t.calls == 0)
    {
        return Err(refuse(format!(
            "the `tessel` run times a {}×{}×{} matmul at {} s over {} calls",
            bad.m, bad.n, bad.k, bad.median_s, bad.calls
        )));
    }
    if let Some(stage) = stages
        .iter()
        .find(|&&s| s as usize >= stage_strategies.len())
    {
        return Err(refuse(format!(
            "the `tessel` run puts a rank on stage {stage} of {}",
            stage_strategies.len()
        )));
    }
    let mut ranks: Vec<RankWork> = stages
        .iter()
        .enumerate()
        .map(|(rank, &stage)| RankWork {
            rank: rank as u64,
            stage,
            steps: Vec::new(),
        })
        .collect();
    let mut open = vec![StepWork::default(); ranks.len()];
    let mut timed: Vec<(u64, f64, &str, &str, f64)> = events
        .iter()
        .filter(|e| e.get("ph").and_then(Value::as_str) == Some("X"))
        .filter_map(|e| {
            Some((
                e.get("tid")?.as_u64()?,
                e.get("ts")?.as_f64()?,
                e.get("cat").and_then(Value::as_str).unwrap_or(""),
                e.get("name").and_then(Value::as_str).unwrap_or(""),
                duration_us(e)?,
            ))
        })
        .collect();
    timed.sort_by(|a, b| {
        (a.0, a.1)
            .partial_cmp(&(b.0, b.1))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    for (rank, _, category, name, us) in timed {
        let Some(step) = open.get_mut(rank as usize) else {
            return Err(refuse(format!(
                "an event of rank {rank}, but the `tessel` run has {} ranks",
                ranks.len()
            )));
        };
        let seconds = us * 1e-6;
        match category {
            "forward" => step.forward_s += seconds,
            "backward" => step.backward_s += seconds,
            "comm" if name == "reduce gradients" => step.reduce_s += seconds,
            "comm" => step.p2p_s += seconds,
            "optimizer" => {
                step.optimizer_s += seconds;
                ranks[rank as usize].steps.push(std::mem::take(step));
            }
            _ => {}
        }
    }
    Ok(TracedRun {
        spec,
        stage_strategies,
        step_time_s,
        ranks,
        matmuls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_without_collectives_says_why() {
        // What `tessel launch --trace` wrote before collectives were traced.
        let old = r#"{"traceEvents": [{"name": "reduce gradients", "cat": "comm", "ph": "X",
            "pid": 0, "tid": 0, "ts": 1.0, "dur": 2.0}], "displayTimeUnit": "ms"}"#;
        let err = parse_tessel_trace(old).unwrap_err();
        assert!(
            err.message
                .starts_with("no `collective` events and no `tessel` run"),
            "{err}"
        );
    }

    /// A two-rank, one-stage run as `tessel launch --trace` writes it: each rank's forward,
    /// backward, reduction and optimizer of two steps, and the matmuls it timed.
    fn run_trace(matmul_seconds: f64) -> String {
        let spec = crate::export::test_spec::llama_like(2);
        let strategy = Strategy::default();
        let mut events = Vec::new();
        for rank in 0..2 {
            for step in 0..2 {
                let t = 100.0 * step as f64;
                for (cat, name, ts, dur) in [
                    ("forward", "forward", 0.0, 10.0),
                    ("backward", "backward", 10.0, 20.0),
                    ("comm", "reduce gradients", 30.0, 5.0),
                    ("optimizer", "optimizer step", 35.0, 4.0),
                ] {
                    events.push(serde_json::json!({"name": name, "cat": cat, "ph": "X",
                        "pid": 0, "tid": rank, "ts": t + ts, "dur": dur}));
                }
            }
        }
        serde_json::json!({
            "traceEvents": events,
            "tessel": {
                "spec": spec,
                "stage_strategies": [strategy],
                "stages": [0, 0],
                "step_time_s": [0.0002, 0.0001],
                "matmuls": [{"rank": 0, "m": 64, "n": 256, "k": 256, "calls": 12,
                             "median_s": matmul_seconds}],
            }
        })
        .to_string()
    }

    #[test]
    fn a_traced_run_gives_each_ranks_steps_and_its_matmuls() {
        let trace = parse_tessel_trace(&run_trace(2.5e-5)).unwrap();
        assert!(trace.collectives.is_empty());
        let run = trace.run.expect("the run");
        assert_eq!(run.ranks.len(), 2);
        for rank in &run.ranks {
            assert_eq!(rank.stage, 0);
            assert_eq!(rank.steps.len(), 2);
            let step = rank.steps[1];
            assert!((step.forward_s - 10e-6).abs() < 1e-12, "{step:?}");
            assert!((step.backward_s - 20e-6).abs() < 1e-12, "{step:?}");
            assert!((step.reduce_s - 5e-6).abs() < 1e-12, "{step:?}");
            assert!((step.optimizer_s - 4e-6).abs() < 1e-12, "{step:?}");
        }
        assert_eq!(
            run.matmuls,
            vec![TracedMatmul {
                rank: 0,
                m: 64,
                n: 256,
                k: 256,
                calls: 12,
                median_s: 2.5e-5,
            }]
        );
    }

    #[test]
    fn a_collective_is_timed_from_the_last_rank_s_arrival() {
        // Two groups of two ranks gather the same bytes at overlapping times: ranks 0 and 1
        // leave at 100 µs (rank 1 arrived at 70), ranks 2 and 3 at 130 µs (rank 3 at 110);
        // rank 4's call has no peer in the trace; the 8-byte call on rank 0 none of that size.
        let call = |rank: u64, ts: f64, end: f64, bytes: u64| {
            serde_json::json!({"name": "all_gather", "cat": "collective", "ph": "X",
                "pid": 0, "tid": rank, "ts": ts, "dur": end - ts,
                "args": {"bytes": bytes, "ranks": 2}})
        };
        let events = [
            call(0, 10.0, 100.0, 64),
            call(1, 70.0, 100.5, 64),
            call(2, 20.0, 130.0, 64),
            call(3, 110.0, 130.2, 64),
            call(4, 0.0, 50.0, 1024),
            call(0, 200.0, 260.0, 8),
        ];
        let trace = tessel_trace(&serde_json::json!({ "traceEvents": events })).unwrap();
        let own: Vec<f64> = trace
            .collectives
            .iter()
            .map(|c| c.after_last_arrival_us)
            .collect();
        let expected = [30.0, 30.5, 20.0, 20.2, 50.0, 60.0];
        for (got, want) in own.iter().zip(expected) {
            assert!((got - want).abs() < 1e-9, "{own:?} against {expected:?}");
        }
        assert_eq!(trace.collectives[0].duration_us, 90.0);
    }

    #[test]
    fn a_matmul_timed_at_zero_is_refused() {
        let err = parse_tessel_trace(&run_trace(0.0)).unwrap_err();
        assert!(err.message.contains("64×256×256 matmul at 0 s"), "{err}");
    }
}
