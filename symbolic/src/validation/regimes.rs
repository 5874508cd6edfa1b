//! The regime runs (`data/regimes/runs.csv`): published runs that no calibration sees, each
//! written as a spec the way a user would write it from the paper, and scored on step time.
//! They test the mechanisms, not a fit: ZeRO-3 at scale, Megatron-LM from 1.7B to 1T
//! parameters on A100 and from 1.7B to 462B on H100 (with every overlap on), a 175B model
//! from 256 to 12,288 GPUs, Llama 3 405B, and a 352B MoE.
//!
//! What a row leaves unsaid takes what the paper's text or its software's defaults say, and
//! the spec records it in a comment: Narayanan et al. (2021) ran Megatron-LM of that year
//! (fp16, full recompute, dropout 0.1, no flash attention, gradients all-reduced after the
//! backward pass); micro-batch 1 where no row says otherwise.

use std::path::{Path, PathBuf};

use tessel_grammar::Spec;

use super::csv::Table;
use crate::cost::{CostModel, Estimate};

/// What a regime row measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RegimeMeasure {
    StepTime(f64),
    /// TFLOP/s per GPU counting recompute (Narayanan et al.'s Eq. 3).
    HardwareTflops(f64),
    /// TFLOP/s per GPU of model FLOPs.
    ModelTflops(f64),
}

/// One regime run as a spec.
#[derive(Clone, Debug)]
pub struct RegimeCase {
    pub line: usize,
    pub regime: String,
    pub model: String,
    pub gpus: u64,
    pub spec_text: String,
    pub spec: Spec,
    pub measured: RegimeMeasure,
}

/// The prediction of one regime case.
#[derive(Clone, Debug)]
pub struct RegimeOutcome {
    pub case: RegimeCase,
    pub estimate: Estimate,
    /// Predicted over measured step time, minus one (positive: predicted slower).
    pub step_error: f64,
}

impl RegimeOutcome {
    /// ln(predicted / measured step time), the held-out error table's measure.
    pub fn log_step_error(&self) -> f64 {
        (1.0 + self.step_error).ln()
    }
}

/// `data/regimes/runs.csv` in this repository.
pub fn default_regimes_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("data")
        .join("regimes")
        .join("runs.csv")
}

/// Reads the regime table and writes each usable row as a spec. Rows of systems the cost
/// model does not describe (MegaScale's and MegaScale-MoE's own rows, whose model changes the
/// math) and rows without a parallel configuration are left out.
pub fn load_regime_cases(path: &Path) -> Result<Vec<RegimeCase>, String> {
    let mut cases = Vec::new();
    for (line, get) in Table::read(path)?.rows() {
        if let Some(case) = regime_case(line, &get)? {
            cases.push(case);
        }
    }
    Ok(cases)
}

fn number(text: &str) -> Option<f64> {
    text.parse::<f64>().ok()
}

fn regime_case(line: usize, get: &dyn Fn(&str) -> String) -> Result<Option<RegimeCase>, String> {
    let regime = get("regime");
    let framework = get("framework");
    if !framework.starts_with("Megatron-L")
        && !framework.starts_with("Meta")
        && !framework.starts_with("torchtitan")
    {
        return Ok(None);
    }
    let Some(tp) = number(&get("tp")) else {
        return Ok(None);
    };
    let whole = |name: &str| number(&get(name)).map(|v| v as u64);
    let (Some(layers), Some(hidden), Some(heads), Some(gpus), Some(batch)) = (
        whole("layers"),
        whole("hidden"),
        whole("heads"),
        whole("gpus"),
        whole("global_batch"),
    ) else {
        return Ok(None);
    };
    let pp = whole("pp").unwrap_or(1);
    let cp = whole("cp").unwrap_or(1);
    let dp = whole("dp").unwrap_or(gpus / (tp as u64 * pp * cp));
    let seq = whole("seq_len").unwrap_or(2048);
    let vocab = whole("vocab").unwrap_or(51200);
    let microbatch = whole("micro_batch").unwrap_or(1);
    let measured = if let Some(step) = number(&get("measured_step_time_s")) {
        RegimeMeasure::StepTime(step)
    } else if let Some(tokens) = number(&get("measured_tokens_per_s_per_gpu")) {
        RegimeMeasure::StepTime((batch * seq) as f64 / (tokens * gpus as f64))
    } else if let Some(tflops) = number(&get("measured_tflops_per_gpu")) {
        // Meta's and Megatron-Core's TFLOP/s count the model's FLOPs, not recompute.
        if regime == "llama3_405b" || regime == "megatron_h100" {
            RegimeMeasure::ModelTflops(tflops)
        } else {
            RegimeMeasure::HardwareTflops(tflops)
        }
    } else {
        return Ok(None);
    };
    let (gpu, cluster) = if regime == "llama3_405b"
        || regime == "megatron_h100"
        || regime == "torchao_float8"
    {
        // One 400 Gb/s NIC per H100: Meta's Grand Teton nodes (RoCE, Llama 3 paper §3.3.1) and
        // DGX H100 (eight NDR InfiniBand ports per node), on which NVIDIA benchmarks.
        (
            "H100_SXM",
            "intra_node = { bandwidth = 450 GB/s, latency = 3 us }\n  inter_node = { bandwidth = 400 Gb/s, latency = 8 us }\n  host_link = 50 GB/s",
        )
    } else if regime == "moe_h800" {
        // H800: NVLink cut to 400 GB/s (200 per direction); one 400 Gb/s NIC per GPU.
        (
            "H800",
            "intra_node = { bandwidth = 200 GB/s, latency = 3 us }\n  inter_node = { bandwidth = 400 Gb/s, latency = 8 us }\n  host_link = 50 GB/s",
        )
    } else {
        // DGX A100 (Selene): NVLink 3, one 200 Gb/s HDR NIC per GPU.
        (
            "A100_80GB",
            "intra_node = { bandwidth = 300 GB/s, latency = 3 us }\n  inter_node = { bandwidth = 200 Gb/s, latency = 8 us }\n  host_link = 25 GB/s",
        )
    };
    let nodes = gpus.div_ceil(8);
    let (model_block, train_extra, strategy_extra) = match regime.as_str() {
        "llama3_405b" => (
            format!(
                "layers = {layers}; hidden = {hidden}; heads = {heads}; kv_heads = 8\n  ffn_hidden = 53248; vocab = {vocab}; mlp = swiglu; norm = rmsnorm"
            ),
            "precision = bf16".to_string(),
            // Meta's interleaved schedule (V not given: two chunks, as specs/llama3-405b.tsl),
            // one layer fewer on the first and the last stage (§3.3.2).
            format!(
                "recompute = none; sequence_parallel = true; zero = 1; interleave = 2\n  stages = [3, {}3]",
                "4, ".repeat(30)
            ),
        ),
        // MegaScale-MoE's Table 2 gives `m = 4` for this model, which its Table 1 defines as
        // query heads over key/value heads: 32 heads share 8 key/value heads.
        "moe_h800" => (
            format!(
                "layers = {layers}; hidden = {hidden}; heads = {heads}; kv_heads = {}; ffn_hidden = 14336\n  vocab = 65536; mlp = swiglu; norm = rmsnorm\n  moe = {{ experts = 32, top_k = 3, expert_ffn_hidden = 14336 }}",
                heads / 4
            ),
            "precision = bf16".to_string(),
            "recompute = selective; sequence_parallel = true; zero = 1; ep = 1".to_string(),
        ),
        "megatron_175b_scale" => (
            format!(
                "layers = {layers}; hidden = {hidden}; heads = {heads}; ffn_hidden = {}\n  vocab = {vocab}; mlp = gelu; norm = layernorm; position = learned; max_seq_len = {seq}\n  bias = true; tie_embeddings = true",
                4 * hidden
            ),
            // MegaScale's baseline: Megatron-LM at commit 285068c8 (2023-01-11, the merge that
            // brought FlashAttention v1 in as the opt-in `--use-flash-attn`) with its defaults:
            // no data-parallel overlap (MegaScale adds it) and no flash attention (§3.3 lists
            // FlashAttention-2 among MegaScale's own operators; no flag is named for the
            // baseline).
            "precision = bf16; flash_attention = false\n  overlap = { grad_reduce = false, param_gather = false }"
                .to_string(),
            "recompute = selective; sequence_parallel = true; zero = 1".to_string(),
        ),
        // Megatron-LM's README: its GPT models (ffn 4h), bf16 (the MFU is over the bf16 peak),
        // every communication overlap on; `--overlap-param-gather` runs only with the
        // distributed optimizer, `--tp-comm-overlap` only with sequence parallelism.
        "megatron_h100" => (
            format!(
                "layers = {layers}; hidden = {hidden}; heads = {heads}; ffn_hidden = {}\n  vocab = {vocab}; mlp = gelu; norm = layernorm; position = learned; max_seq_len = {seq}\n  bias = true; tie_embeddings = true",
                4 * hidden
            ),
            format!(
                "precision = bf16\n  overlap = {{ grad_reduce = true, param_gather = true, tp_comm = {} }}",
                tp > 1.0
            ),
            format!(
                "recompute = none; sequence_parallel = {}; zero = 1",
                tp > 1.0
            ),
        ),
        // torchao's float8 benchmark: torchtitan's Llama 3 8B (its llama3_8b.toml) under FSDP2
        // over the node's 8 GPUs, compiled, per-op selective recompute; FP8 as the row names it.
        "torchao_float8" => (
            format!(
                "layers = {layers}; hidden = {hidden}; heads = {heads}; kv_heads = {}\n  ffn_hidden = {}; vocab = {vocab}; mlp = swiglu; norm = rmsnorm; tie_embeddings = false",
                whole("kv_heads").unwrap_or(heads),
                whole("ffn_hidden").unwrap_or(4 * hidden),
            ),
            {
                let precision = match get("precision").split_once(' ') {
                    Some((precision, scaling)) => {
                        format!("precision = {precision}; fp8_scaling = {scaling}")
                    }
                    None => format!("precision = {}", get("precision")),
                };
                format!("{precision}\n  framework = fsdp; compile = true")
            },
            "recompute = selective; zero = 3".to_string(),
        ),
        "zero3_scale" => (
            gpt_2021(layers, hidden, heads, vocab, seq),
            "precision = fp16; framework = deepspeed; flash_attention = false; dropout = 0.1"
                .to_string(),
            "recompute = full; zero = 3".to_string(),
        ),
        _ => (
            gpt_2021(layers, hidden, heads, vocab, seq),
            "precision = fp16; flash_attention = false; dropout = 0.1\n  overlap = { grad_reduce = false, param_gather = false }".to_string(),
            "recompute = full".to_string(),
        ),
    };
    // Megatron-LM's README overlaps pipeline sends "by default", which its interleaved
    // schedule does (not supported on 2 stages). Its 119B and 462B split 23 and 7 layers per
    // stage, which only one layer per virtual stage divides; every pipelined row takes that.
    let virtual_stages = if regime == "megatron_h100" && pp > 2 {
        layers / pp
    } else {
        1
    };
    let interleave = whole("interleave").unwrap_or(virtual_stages);
    let interleave = if regime == "llama3_405b" {
        String::new()
    } else {
        format!("; interleave = {interleave}")
    };
    let spec_text = format!(
        "# {regime}: {model} on {gpus} GPUs ({source}, {table})\nmodel m {{\n  {model_block}\n}}\ncluster c {{\n  gpu = {gpu}; nodes = {nodes}; gpus_per_node = 8\n  {cluster}\n  host_memory = 2 TB\n}}\ntrain {{\n  model = m; cluster = c; seq_len = {seq}; global_batch = {batch}\n  {train_extra}\n}}\nstrategy s {{\n  tp = {tp}; pp = {pp}; cp = {cp}; dp = {dp}; microbatch = {microbatch}{interleave}\n  {strategy_extra}\n}}\n",
        model = get("model"),
        source = get("source"),
        table = get("table"),
    );
    let spec =
        tessel_grammar::load_str(&format!("regimes.csv:{line}"), &spec_text).map_err(|d| {
            let messages: Vec<String> = d
                .iter()
                .map(|e| format!("{}:{}: {}", e.line, e.column, e.message))
                .collect();
            format!("line {line}: {}\n{spec_text}", messages.join("; "))
        })?;
    Ok(Some(RegimeCase {
        line,
        regime,
        model: get("model"),
        gpus,
        spec_text,
        spec,
        measured,
    }))
}

/// A GPT of Narayanan et al.'s table: GPT-2 style blocks, learned positions, tied embeddings.
fn gpt_2021(layers: u64, hidden: u64, heads: u64, vocab: u64, seq: u64) -> String {
    format!(
        "layers = {layers}; hidden = {hidden}; heads = {heads}; ffn_hidden = {}\n  vocab = {vocab}; mlp = gelu; norm = layernorm; position = learned; max_seq_len = {seq}\n  bias = true; tie_embeddings = true",
        4 * hidden
    )
}

/// Predicts every case with the committed calibration.
pub fn evaluate_regimes(cases: &[RegimeCase]) -> Result<Vec<RegimeOutcome>, String> {
    cases
        .iter()
        .map(|case| {
            let model =
                CostModel::new(&case.spec).map_err(|e| format!("line {}: {e}", case.line))?;
            let strategy = &case.spec.strategies[0];
            let estimate = model
                .estimate(strategy)
                .map_err(|e| format!("line {}: {e}", case.line))?;
            let step_error = match case.measured {
                RegimeMeasure::StepTime(step) => estimate.step_time_s / step - 1.0,
                RegimeMeasure::HardwareTflops(tflops) => {
                    tflops / estimate.hardware_tflops_per_gpu - 1.0
                }
                RegimeMeasure::ModelTflops(tflops) => tflops / estimate.model_tflops_per_gpu - 1.0,
            };
            Ok(RegimeOutcome {
                case: case.clone(),
                estimate,
                step_error,
            })
        })
        .collect()
}
