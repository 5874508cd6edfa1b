//! Chrome trace (`chrome://tracing`, Perfetto) of a run: one thread id per rank, a complete
//! event per forward, backward, communication and optimizer step, and inside the gradient
//! reduction one `collective` event per data-parallel collective with its `bytes` (nccl-tests'
//! size of the buffer) and `ranks` in `args`, which `tessel calibrate` fits collectives to.
//! Beside the events, a `tessel` object describes the run (the scaled spec, each stage's
//! strategy, each rank's pipeline stage, the step times, and the matmuls each rank timed by
//! shape), from which `tessel calibrate` fits the GEMM primitive and the compute.

use crate::error::RuntimeError;
use serde_json::{json, Map, Value};
use std::path::Path;
use tessel_symbolic::primitives::fit::median;

#[derive(Clone, Debug, PartialEq)]
pub struct TraceEvent {
    pub rank: usize,
    pub name: String,
    /// `forward`, `backward`, `comm` or `optimizer`.
    pub category: &'static str,
    /// Microseconds since the run started.
    pub start_us: f64,
    pub duration_us: f64,
    /// For a `collective` event: what it moved.
    pub collective: Option<CollectiveRecord>,
}

/// The size of one collective call and its group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollectiveRecord {
    pub bytes: u64,
    pub ranks: u64,
}

/// The matmuls of one shape a rank timed: `m × k` by `k × n`, how many calls and their
/// median seconds (robust to the first step's page faults and to preemption).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatmulRecord {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub calls: usize,
    pub median_s: f64,
}

impl MatmulRecord {
    /// One record per shape from each call's seconds.
    pub fn tally(
        calls: std::collections::BTreeMap<(usize, usize, usize), Vec<f64>>,
    ) -> Vec<MatmulRecord> {
        calls
            .into_iter()
            .filter(|(_, seconds)| !seconds.is_empty())
            .map(|((m, n, k), mut seconds)| MatmulRecord {
                m,
                n,
                k,
                calls: seconds.len(),
                median_s: median(&mut seconds),
            })
            .collect()
    }

    pub fn json(&self, rank: usize) -> Value {
        json!({
            "rank": rank,
            "m": self.m,
            "n": self.n,
            "k": self.k,
            "calls": self.calls,
            "median_s": self.median_s,
        })
    }
}

/// The trace as JSON, events ordered by rank and start time, and `run` as its `tessel`
/// object (left out when empty).
pub fn trace_json(events: &[TraceEvent], run: Map<String, Value>) -> Value {
    let mut sorted: Vec<&TraceEvent> = events.iter().collect();
    sorted.sort_by(|a, b| {
        (a.rank, a.start_us)
            .partial_cmp(&(b.rank, b.start_us))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let mut out: Vec<Value> = Vec::new();
    let mut ranks: Vec<usize> = sorted.iter().map(|e| e.rank).collect();
    ranks.dedup();
    for r in ranks {
        out.push(json!({"name": "thread_name", "ph": "M", "pid": 0, "tid": r,
                        "args": {"name": format!("rank {r}")}}));
    }
    for e in sorted {
        let mut event = json!({
            "name": e.name, "cat": e.category, "ph": "X", "pid": 0, "tid": e.rank,
            "ts": (e.start_us * 1000.0).round() / 1000.0,
            "dur": (e.duration_us * 1000.0).round() / 1000.0,
        });
        if let Some(c) = e.collective {
            event["args"] = json!({"bytes": c.bytes, "ranks": c.ranks});
        }
        out.push(event);
    }
    let mut trace = json!({ "traceEvents": out, "displayTimeUnit": "ms" });
    if !run.is_empty() {
        trace["tessel"] = Value::Object(run);
    }
    trace
}

pub fn write_trace(
    path: &Path,
    events: &[TraceEvent],
    run: Map<String, Value>,
) -> Result<(), RuntimeError> {
    let text =
        serde_json::to_string(&trace_json(events, run)).map_err(|e| RuntimeError::Trace {
            reason: e.to_string(),
        })?;
    std::fs::write(path, text).map_err(|e| RuntimeError::Trace {
        reason: format!("{}: {e}", path.display()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_become_complete_events_per_rank() {
        let ev = |rank, start| TraceEvent {
            rank,
            name: "forward mb0".into(),
            category: "forward",
            start_us: start,
            duration_us: 2.5,
            collective: None,
        };
        let v = trace_json(&[ev(1, 5.0), ev(0, 3.0)], Map::new());
        let events = v["traceEvents"].as_array().unwrap();
        assert_eq!(events.len(), 4);
        assert_eq!(events[0]["ph"], "M");
        assert_eq!(events[2]["tid"], 0);
        assert_eq!(events[3]["ts"], 5.0);
        assert_eq!(events[3]["dur"], 2.5);
        assert!(events[3].get("args").is_none());
    }

    #[test]
    fn collectives_carry_their_size_and_group() {
        let event = TraceEvent {
            rank: 0,
            name: "all_reduce".into(),
            category: "collective",
            start_us: 1.0,
            duration_us: 4.0,
            collective: Some(CollectiveRecord {
                bytes: 4096,
                ranks: 2,
            }),
        };
        let v = trace_json(&[event], Map::new());
        let traced = &v["traceEvents"][1];
        assert_eq!(traced["cat"], "collective");
        assert_eq!(traced["args"]["bytes"], 4096);
        assert_eq!(traced["args"]["ranks"], 2);
    }
}
