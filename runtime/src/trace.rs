//! Chrome trace (`chrome://tracing`, Perfetto) of a run: one thread id per rank, a complete
//! event per forward, backward, communication and optimizer step, and inside the gradient
//! reduction one `collective` event per data-parallel collective with its `bytes` (nccl-tests'
//! size of the buffer) and `ranks` in `args`, which `tessel calibrate` fits collectives to.

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
    /// For a `collective` event: what it moved.
    pub collective: Option<CollectiveRecord>,
}

/// The size of one collective call and its group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollectiveRecord {
    pub bytes: u64,
    pub ranks: u64,
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
            collective: None,
        };
        let v = trace_json(&[ev(1, 5.0), ev(0, 3.0)]);
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
        let v = trace_json(&[event]);
        let traced = &v["traceEvents"][1];
        assert_eq!(traced["cat"], "collective");
        assert_eq!(traced["args"]["bytes"], 4096);
        assert_eq!(traced["args"]["ranks"], 2);
    }
}
