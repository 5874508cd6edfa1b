//! Chrome trace (`chrome://tracing`, Perfetto) of a run: one thread id per rank, a complete
//! event per forward, backward, communication and optimizer step.

use crate::error::RuntimeError;
use serde_json::{json, Value};
use std::path::Path;

#[derive(Clone, Debug, PartialEq)]
pub struct TraceEvent {
    pub rank: usize,
    pub name: String,
    /// `forward`, `backward`, `comm` or `optimizer`.
    pub category: &'static str,
    /// Microseconds since the run started.
    pub start_us: f64,
    pub duration_us: f64,
}

/// The trace as JSON, events ordered by rank and start time.
pub fn trace_json(events: &[TraceEvent]) -> Value {
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
        out.push(json!({
            "name": e.name, "cat": e.category, "ph": "X", "pid": 0, "tid": e.rank,
            "ts": (e.start_us * 1000.0).round() / 1000.0,
            "dur": (e.duration_us * 1000.0).round() / 1000.0,
        }));
    }
    json!({ "traceEvents": out, "displayTimeUnit": "ms" })
}

pub fn write_trace(path: &Path, events: &[TraceEvent]) -> Result<(), RuntimeError> {
    let text = serde_json::to_string(&trace_json(events)).map_err(|e| RuntimeError::Trace {
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
        };
        let v = trace_json(&[ev(1, 5.0), ev(0, 3.0)]);
        let events = v["traceEvents"].as_array().unwrap();
        assert_eq!(events.len(), 4);
        assert_eq!(events[0]["ph"], "M");
        assert_eq!(events[2]["tid"], 0);
        assert_eq!(events[3]["ts"], 5.0);
        assert_eq!(events[3]["dur"], 2.5);
    }
}
