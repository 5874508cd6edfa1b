//! The measured timeline of one step, read from the Chrome trace `tessel launch` writes
//! (`traceEvents` with complete events, `ph: "X"`, `tid` = global rank, `cat` = forward,
//! backward, comm or optimizer, `ts`/`dur` in microseconds; `collective` events nested inside
//! them are skipped).
//!
//! One lane per pipeline stage: the lowest global rank of the stage (via the plan's rank map)
//! that has events stands for it. The step drawn is the last one every lane completed, found by
//! counting optimizer events; a trace without them is one step.

use serde_json::Value;

use super::error::ReportError;
use crate::plan::Plan;

/// What a traced event was doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Forward,
    Backward,
    Comm,
    Optimizer,
    Other,
}

impl EventKind {
    fn parse(category: &str, name: &str) -> EventKind {
        let text = if category.is_empty() { name } else { category };
        let word = text.split_whitespace().next().unwrap_or("");
        match word {
            "forward" => EventKind::Forward,
            "backward" => EventKind::Backward,
            "comm" => EventKind::Comm,
            "optimizer" => EventKind::Optimizer,
            _ => EventKind::Other,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct MeasuredEvent {
    pub kind: EventKind,
    pub name: String,
    /// Seconds since the start of the drawn step.
    pub start_s: f64,
    pub end_s: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct MeasuredLane {
    pub stage: u64,
    /// The global rank whose events the lane shows.
    pub rank: u64,
    pub events: Vec<MeasuredEvent>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct MeasuredTimeline {
    pub lanes: Vec<MeasuredLane>,
    /// Seconds from the first event of the drawn step to its last end.
    pub step_s: f64,
    /// Zero-based index of the drawn step, and how many complete steps the trace holds.
    pub step_index: usize,
    pub steps: usize,
}

/// A lane before the step is picked: stage, rank, events with their step index.
type RawLane<'a> = (u64, u64, Vec<(usize, &'a RawEvent)>);

struct RawEvent {
    rank: u64,
    kind: EventKind,
    name: String,
    start_us: f64,
    end_us: f64,
}

/// Reads a Chrome trace of a run of `plan`.
pub fn parse_trace(text: &str, plan: &Plan) -> Result<MeasuredTimeline, ReportError> {
    let error = |message: String| ReportError::Trace { message };
    let value: Value = serde_json::from_str(text).map_err(|e| error(e.to_string()))?;
    let events = match &value {
        Value::Array(list) => list,
        Value::Object(map) => match map.get("traceEvents") {
            Some(Value::Array(list)) => list,
            _ => return Err(error("no `traceEvents` array".to_string())),
        },
        _ => return Err(error("not a JSON object or array".to_string())),
    };
    let mut raw = Vec::new();
    for event in events {
        if event.get("ph").and_then(Value::as_str) != Some("X") {
            continue;
        }
        let number = |key: &str| event.get(key).and_then(Value::as_f64);
        let (Some(rank), Some(ts), Some(dur)) = (
            event.get("tid").and_then(Value::as_u64),
            number("ts"),
            number("dur"),
        ) else {
            return Err(error(format!(
                "a complete event lacks a numeric tid, ts or dur: {event}"
            )));
        };
        if !ts.is_finite() || !dur.is_finite() || dur < 0.0 {
            return Err(error(format!("an event has a bad time: {event}")));
        }
        let name = event.get("name").and_then(Value::as_str).unwrap_or("");
        let category = event.get("cat").and_then(Value::as_str).unwrap_or("");
        // Collectives are traced inside the events that run them (for `tessel calibrate`):
        // drawing them too would count their time twice.
        if category == "collective" {
            continue;
        }
        raw.push(RawEvent {
            rank,
            kind: EventKind::parse(category, name),
            name: name.to_string(),
            start_us: ts,
            end_us: ts + dur,
        });
    }
    if raw.is_empty() {
        return Err(error(
            "the trace has no complete (\"X\") events".to_string(),
        ));
    }
    let stage_of = |rank: u64| {
        plan.rank_map
            .ranks
            .get(rank as usize)
            .map(|row| row[3])
            .ok_or_else(|| {
                error(format!(
                    "rank {rank} is not in the plan's rank map ({} ranks); is this the plan's trace?",
                    plan.rank_map.ranks.len()
                ))
            })
    };
    let mut representative: Vec<Option<u64>> = vec![None; plan.config.pp as usize];
    for event in &raw {
        let stage = stage_of(event.rank)? as usize;
        let slot = representative
            .get_mut(stage)
            .ok_or_else(|| error(format!("stage {stage} is outside the plan's pipeline")))?;
        *slot = Some(slot.map_or(event.rank, |r| r.min(event.rank)));
    }
    // Each lane's events with their step index: optimizer events that ended before it started.
    let mut lanes_raw: Vec<RawLane> = Vec::new();
    for (stage, rank) in representative.iter().enumerate() {
        let Some(rank) = *rank else { continue };
        let mut own: Vec<&RawEvent> = raw.iter().filter(|e| e.rank == rank).collect();
        own.sort_by(|a, b| a.start_us.total_cmp(&b.start_us));
        let mut optimizer_ends: Vec<f64> = own
            .iter()
            .filter(|e| e.kind == EventKind::Optimizer)
            .map(|e| e.end_us)
            .collect();
        optimizer_ends.sort_by(f64::total_cmp);
        let indexed = own
            .into_iter()
            .map(|e| {
                let before = optimizer_ends
                    .iter()
                    .filter(|&&end| end <= e.start_us)
                    .count();
                (before, e)
            })
            .collect();
        lanes_raw.push((stage as u64, rank, indexed));
    }
    let steps = lanes_raw
        .iter()
        .map(|(_, _, events)| {
            events
                .iter()
                .filter(|(_, e)| e.kind == EventKind::Optimizer)
                .count()
        })
        .min()
        .unwrap_or(0);
    let step_index = steps.saturating_sub(1);
    let in_step: Vec<&RawEvent> = lanes_raw
        .iter()
        .flat_map(|(_, _, events)| {
            events
                .iter()
                .filter(|(s, _)| *s == step_index)
                .map(|(_, e)| *e)
        })
        .collect();
    let origin = in_step
        .iter()
        .map(|e| e.start_us)
        .fold(f64::INFINITY, f64::min);
    let finish = in_step
        .iter()
        .map(|e| e.end_us)
        .fold(f64::NEG_INFINITY, f64::max);
    if !origin.is_finite() || finish <= origin {
        return Err(error("the drawn step has no duration".to_string()));
    }
    let lanes = lanes_raw
        .iter()
        .map(|(stage, rank, events)| MeasuredLane {
            stage: *stage,
            rank: *rank,
            events: events
                .iter()
                .filter(|(s, _)| *s == step_index)
                .map(|(_, e)| MeasuredEvent {
                    kind: e.kind,
                    name: e.name.clone(),
                    start_s: (e.start_us - origin) / 1e6,
                    end_s: (e.end_us - origin) / 1e6,
                })
                .collect(),
        })
        .collect();
    Ok(MeasuredTimeline {
        lanes,
        step_s: (finish - origin) / 1e6,
        step_index,
        steps: steps.max(1),
    })
}

/// One kind of time of one pipeline stage in one step, measured against predicted.
#[derive(Clone, Debug, PartialEq)]
pub struct Disagreement {
    pub stage: u64,
    pub category: &'static str,
    pub measured_s: f64,
    pub predicted_s: f64,
}

/// The categories both sides split a stage's step into.
const COMPUTE: &str = "compute (forward, backward, recompute, in-layer communication)";
const PIPELINE: &str = "pipeline sends and receives";
const GRADIENTS: &str = "gradient reduction";
const OPTIMIZER: &str = "optimizer step";
const IDLE: &str = "idle (pipeline bubble)";

/// Each traced stage's time by category against the prediction for that stage
/// (`stages[i].time`, seconds per step), largest difference first, as dPRO's replay ranks
/// what it got wrong. Traced communication that is not a pipeline transfer (`send …`,
/// `recv …`) counts as gradient reduction.
pub fn disagreements(
    measured: &MeasuredTimeline,
    stages: &[tessel_symbolic::cost::StageEstimate],
) -> Vec<Disagreement> {
    let mut rows = Vec::new();
    for lane in &measured.lanes {
        let Some(predicted) = stages.iter().find(|s| s.stage == lane.stage) else {
            continue;
        };
        let mut spent = [0.0f64; 4];
        for event in &lane.events {
            let slot = match event.kind {
                EventKind::Forward | EventKind::Backward => 0,
                EventKind::Comm
                    if event.name.starts_with("send") || event.name.starts_with("recv") =>
                {
                    1
                }
                EventKind::Comm => 2,
                EventKind::Optimizer => 3,
                EventKind::Other => continue,
            };
            spent[slot] += event.end_s - event.start_s;
        }
        let idle = (measured.step_s - spent.iter().sum::<f64>()).max(0.0);
        let t = &predicted.time;
        let predicted_by = [
            t.compute + t.recompute + t.tp_comm + t.cp_comm + t.ep_comm + t.offload,
            t.pp_comm,
            t.dp_comm,
            t.optimizer,
            t.bubble,
        ];
        let measured_by = [spent[0], spent[1], spent[2], spent[3], idle];
        for ((category, measured_s), predicted_s) in [COMPUTE, PIPELINE, GRADIENTS, OPTIMIZER, IDLE]
            .into_iter()
            .zip(measured_by)
            .zip(predicted_by)
        {
            rows.push(Disagreement {
                stage: lane.stage,
                category,
                measured_s,
                predicted_s,
            });
        }
    }
    rows.sort_by(|a, b| {
        let gap = |d: &Disagreement| (d.measured_s - d.predicted_s).abs();
        gap(b)
            .total_cmp(&gap(a))
            .then(a.stage.cmp(&b.stage))
            .then(a.category.cmp(b.category))
    });
    rows
}
