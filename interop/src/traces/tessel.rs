//! Tessel's own traces (`tessel launch --trace`, written by `tessel_runtime::trace`): the
//! data-parallel collectives it records inside each step, as `collective` events whose `args`
//! hold the buffer's `bytes` and the group's `ranks`. A trace written before those events were
//! recorded has none and is refused with that reason.

use serde_json::Value;

use super::TraceError;

/// One traced collective call.
#[derive(Clone, Debug, PartialEq)]
pub struct TesselCollective {
    /// `all_reduce`, `reduce_scatter` or `all_gather`.
    pub name: String,
    pub bytes: u64,
    pub ranks: u64,
    pub duration_us: f64,
}

/// The collectives of a Tessel trace; an error when the JSON is not one.
pub fn parse_tessel_trace(text: &str) -> Result<Vec<TesselCollective>, TraceError> {
    tessel_trace(&super::read_trace_json(text)?)
}

/// [`parse_tessel_trace`] of a document already read.
pub fn tessel_trace(value: &Value) -> Result<Vec<TesselCollective>, TraceError> {
    let events = value
        .get("traceEvents")
        .and_then(Value::as_array)
        .ok_or_else(|| TraceError {
            line: 1,
            message: "not a trace: no `traceEvents` array".to_string(),
        })?;
    let mut ranks_named = false;
    let collectives: Vec<TesselCollective> = events
        .iter()
        .filter(|e| e.get("cat").and_then(Value::as_str) == Some("collective"))
        .filter_map(|event| {
            ranks_named = true;
            let args = event.get("args")?;
            Some(TesselCollective {
                name: event.get("name")?.as_str()?.to_string(),
                bytes: args.get("bytes")?.as_u64()?,
                ranks: args.get("ranks")?.as_u64()?,
                duration_us: event
                    .get("dur")?
                    .as_f64()
                    .filter(|d| d.is_finite() && *d >= 0.0)?,
            })
        })
        .collect();
    if !ranks_named {
        return Err(TraceError {
            line: 1,
            message: "no `collective` events: not a `tessel launch --trace` file, or one written \
                      before collectives were traced"
                .to_string(),
        });
    }
    Ok(collectives)
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
        assert!(err.message.starts_with("no `collective` events"), "{err}");
    }
}
