//! PyTorch profiler (Kineto) traces: the Chrome-trace JSON that `torch.profiler` exports and
//! torchtitan and Megatron-LM write per rank. Read here: the GPU, the ranks, and each NCCL
//! kernel with the collective, message size and group size PyTorch records on it
//! (`Collective name`, `In msg nelems`, `Out msg nelems`, `Group size`, `dtype`,
//! `Process Group Ranks`, as PyTorch ≥ 2.1 writes them). A kernel's duration includes any wait
//! for slower peers, so it bounds the collective's time from above. With `record_shapes`, each
//! bf16 or fp16 `aten::mm` and `aten::addmm` with its shapes, timed by the kernels it launched
//! (the kernels' `External id` is the op's).
//!
//! Samples: `tests/traces/kineto/` (excerpts of Holistic Trace Analysis's and TraceLens's test
//! data).

use std::collections::BTreeMap;

use serde_json::Value;

use super::TraceError;

/// One NCCL kernel with its collective's description.
#[derive(Clone, Debug, PartialEq)]
pub struct KinetoCollective {
    /// PyTorch's name: `allreduce`, `allgather`, `_allgather_base`, `reduce_scatter`,
    /// `_reduce_scatter_base`, `all_to_all`, `broadcast`, ...
    pub name: String,
    /// Bytes of the buffer in nccl-tests' sense: the reduced buffer (all-reduce), the gathered
    /// output (all-gather), the scattered input (reduce-scatter, all-to-all).
    pub bytes: u64,
    pub group_size: u64,
    /// Global ranks of the process group, when recorded.
    pub group_ranks: Vec<u64>,
    /// Kernel duration, microseconds.
    pub duration_us: f64,
}

/// One GEMM the trace recorded with its shapes: `m × k` by `k × n`.
#[derive(Clone, Debug, PartialEq)]
pub struct KinetoGemm {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    /// `bf16` or `fp16`.
    pub dtype: &'static str,
    /// The launched kernels' time, microseconds.
    pub duration_us: f64,
}

/// What one rank's trace says.
#[derive(Clone, Debug, PartialEq)]
pub struct KinetoTrace {
    /// `deviceProperties[0].name`, when recorded.
    pub gpu: Option<String>,
    /// `distributedInfo.rank` and `world_size`, when recorded.
    pub rank: Option<u64>,
    pub world_size: Option<u64>,
    pub collectives: Vec<KinetoCollective>,
    /// Events read past: kernels of collectives without a size, or of an unknown element type.
    pub skipped_collectives: usize,
    /// bf16 and fp16 matrix products with their shapes (traces recorded with `record_shapes`).
    pub gemms: Vec<KinetoGemm>,
}

/// Reads a Kineto trace (the object with `traceEvents`, or a bare event array).
pub fn parse_kineto_trace(text: &str) -> Result<KinetoTrace, TraceError> {
    kineto_trace(&super::read_trace_json(text)?)
}

/// [`parse_kineto_trace`] of a document already read.
pub fn kineto_trace(value: &Value) -> Result<KinetoTrace, TraceError> {
    let events = match value {
        Value::Object(map) => map.get("traceEvents").and_then(Value::as_array),
        Value::Array(events) => Some(events),
        _ => None,
    }
    .ok_or_else(|| TraceError {
        line: 1,
        message: "not a PyTorch profiler trace: no `traceEvents` array".to_string(),
    })?;
    if events.is_empty() {
        return Err(TraceError {
            line: 1,
            message: "the trace has no events".to_string(),
        });
    }
    let gpu = value
        .pointer("/deviceProperties/0/name")
        .and_then(Value::as_str)
        .map(str::to_string);
    let rank = value
        .pointer("/distributedInfo/rank")
        .and_then(Value::as_u64);
    let world_size = value
        .pointer("/distributedInfo/world_size")
        .and_then(Value::as_u64);
    let mut collectives = Vec::new();
    let mut skipped_collectives = 0;
    // GPU time launched by each CPU op, by the op's `External id`.
    let mut launched: BTreeMap<u64, f64> = BTreeMap::new();
    for event in events {
        if event.get("cat").and_then(Value::as_str) == Some("kernel") {
            if let (Some(id), Some(dur)) = (
                event.pointer("/args/External id").and_then(Value::as_u64),
                event.get("dur").and_then(Value::as_f64),
            ) {
                *launched.entry(id).or_default() += dur;
            }
        }
    }
    let gemms = events
        .iter()
        .filter_map(|event| gemm(event, &launched))
        .collect();
    for event in events {
        let is_kernel = event.get("cat").and_then(Value::as_str) == Some("kernel");
        let Some(args) = event.get("args").filter(|_| is_kernel) else {
            continue;
        };
        let Some(name) = args.get("Collective name").and_then(Value::as_str) else {
            continue;
        };
        match collective(name, args, event) {
            Some(c) => collectives.push(c),
            None => skipped_collectives += 1,
        }
    }
    Ok(KinetoTrace {
        gpu,
        rank,
        world_size,
        collectives,
        skipped_collectives,
        gemms,
    })
}

/// A bf16 or fp16 `aten::mm` (`[m, k], [k, n]`) or `aten::addmm` (`bias, [m, k], [k, n]`)
/// with the time of the kernels it launched.
fn gemm(event: &Value, launched: &BTreeMap<u64, f64>) -> Option<KinetoGemm> {
    if event.get("cat").and_then(Value::as_str) != Some("cpu_op") {
        return None;
    }
    let first = match event.get("name").and_then(Value::as_str)? {
        "aten::mm" => 0,
        "aten::addmm" => 1,
        _ => return None,
    };
    let args = event.get("args")?;
    let dims = args.get("Input Dims")?.as_array()?;
    let shape = |i: usize| -> Option<Vec<u64>> {
        dims.get(i)?.as_array()?.iter().map(Value::as_u64).collect()
    };
    let (a, b) = (shape(first)?, shape(first + 1)?);
    let ([m, k], [kb, n]) = (<[u64; 2]>::try_from(a).ok()?, <[u64; 2]>::try_from(b).ok()?);
    let types = args.get("Input type")?.as_array()?;
    let dtype = match types.get(first)?.as_str()? {
        "c10::BFloat16" => "bf16",
        "c10::Half" => "fp16",
        _ => return None,
    };
    let duration_us = *launched.get(&args.get("External id")?.as_u64()?)?;
    let work = m.checked_mul(n).and_then(|mn| mn.checked_mul(k));
    (k == kb && work.is_some_and(|w| w > 0) && duration_us > 0.0).then_some(KinetoGemm {
        m,
        n,
        k,
        dtype,
        duration_us,
    })
}

fn collective(name: &str, args: &Value, event: &Value) -> Option<KinetoCollective> {
    let count = |key: &str| args.get(key).and_then(Value::as_u64);
    let element = element_bytes(args.get("dtype").and_then(Value::as_str)?)?;
    let gathers = name.contains("allgather") || name.contains("all_gather");
    let elements = if gathers {
        count("Out msg nelems")?
    } else {
        count("In msg nelems")?
    };
    let duration_us = event
        .get("dur")
        .and_then(Value::as_f64)
        .filter(|d| d.is_finite() && *d > 0.0)?;
    let group_ranks = args
        .get("Process Group Ranks")
        .and_then(Value::as_str)
        .map(|list| {
            list.trim_matches(|c| c == '[' || c == ']')
                .split(',')
                .filter_map(|r| r.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default();
    Some(KinetoCollective {
        name: name.to_string(),
        bytes: elements.checked_mul(element)?,
        group_size: count("Group size")?,
        group_ranks,
        duration_us,
    })
}

/// Bytes per element of PyTorch's scalar type names as the profiler writes them.
fn element_bytes(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "Double" | "Long" | "ComplexFloat" => 8,
        "Float" | "Int" => 4,
        "BFloat16" | "Half" | "Short" => 2,
        "Byte" | "Char" | "Bool" | "Float8_e4m3fn" | "Float8_e5m2" => 1,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_json_is_refused() {
        let err = parse_kineto_trace("{\"model_type\": \"llama\"}").unwrap_err();
        assert!(err.message.contains("no `traceEvents`"), "{err}");
        let err = parse_kineto_trace("step,loss\n").unwrap_err();
        assert!(err.message.contains("not JSON"), "{err}");
    }

    #[test]
    fn gathers_count_their_output_and_reductions_their_input() {
        let trace = r#"[{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL", "dur": 12.5,
            "args": {"Collective name": "_allgather_base", "In msg nelems": 1024, "Out msg nelems": 8192,
                     "Group size": 8, "dtype": "BFloat16", "Process Group Ranks": "[0, 1, 2, 3, 4, 5, 6, 7]"}}]"#;
        let trace = parse_kineto_trace(trace).unwrap();
        assert_eq!(trace.collectives[0].bytes, 8192 * 2);
        assert_eq!(trace.collectives[0].group_ranks.len(), 8);
    }
}
