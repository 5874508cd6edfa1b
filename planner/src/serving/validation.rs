//! The serving cost model and simulator against published inference measurements
//! (`data/serving/measurements.csv`, each row cited in `data/serving/README.md`): first-token
//! latency, per-token decode latency and whole-batch latency of static batches, and the
//! output throughput of offline runs with in-flight batching, which the simulator replays
//! request by request.

use std::path::Path;

use tessel_grammar::{gpu_catalog, ClusterSpec, Link, MlpKind, ModelSpec, MoeSpec, NormKind};
use tessel_grammar::{PositionKind, Precision};
use tessel_symbolic::serving::{InstanceShape, IterationBatch, ServingCostModel};
use tessel_symbolic::validation::Table;

use super::engine::{simulate_instance, Arrival, BatchLimits, Role, Timing};
use super::workload::{poisson_arrivals, SplitMix64};

/// One published measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct ServingMeasurement {
    pub source: String,
    pub framework: String,
    pub model: String,
    pub gpu: String,
    pub tp: u64,
    pub pp: u64,
    pub precision: String,
    pub kind: String,
    pub batch: Option<u64>,
    pub input_len: u64,
    pub output_len: u64,
    pub requests: Option<u64>,
    pub value: f64,
    pub unit: String,
    /// Requests per second of an online run (`None` for a static run or a closed loop of
    /// `batch` clients; infinite when every request was sent at once).
    pub request_rate: Option<f64>,
}

/// The columns the reader needs.
const COLUMNS: [&str; 15] = [
    "source",
    "framework",
    "model",
    "gpu",
    "tp",
    "pp",
    "precision",
    "kind",
    "batch",
    "input_len",
    "output_len",
    "requests",
    "value",
    "unit",
    "request_rate",
];

/// Reads `measurements.csv`.
pub fn read_measurements(path: &Path) -> Result<Vec<ServingMeasurement>, String> {
    let table = Table::read(path)?;
    table.require(path, &COLUMNS)?;
    let mut rows = Vec::new();
    for (line, get) in table.rows() {
        let bad = |what: &str| format!("{}:{line}: bad `{what}`", path.display());
        let number = |name: &str| get(name).parse::<u64>().map_err(|_| bad(name));
        let optional = |name: &str| -> Result<Option<u64>, String> {
            if get(name).is_empty() {
                Ok(None)
            } else {
                number(name).map(Some)
            }
        };
        rows.push(ServingMeasurement {
            source: get("source"),
            framework: get("framework"),
            model: get("model"),
            gpu: get("gpu"),
            tp: number("tp")?,
            pp: number("pp")?,
            precision: get("precision"),
            kind: get("kind"),
            batch: optional("batch")?,
            input_len: number("input_len")?,
            // A first-token latency samples one token.
            output_len: optional("output_len")?.unwrap_or(1),
            requests: optional("requests")?,
            value: get("value").parse().map_err(|_| bad("value"))?,
            unit: get("unit"),
            request_rate: match get("request_rate").as_str() {
                "" => None,
                "inf" => Some(f64::INFINITY),
                text => Some(text.parse().map_err(|_| bad("request_rate"))?),
            },
        });
    }
    Ok(rows)
}

/// The measurements file of this repository.
pub fn default_measurements_path() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/serving/measurements.csv")
}

#[allow(clippy::too_many_arguments)]
fn decoder(
    name: &str,
    layers: u64,
    hidden: u64,
    heads: u64,
    kv_heads: u64,
    ffn: u64,
    vocab: u64,
    mlp: MlpKind,
) -> ModelSpec {
    ModelSpec {
        name: name.to_string(),
        layers,
        hidden,
        heads,
        kv_heads,
        head_dim: hidden / heads,
        ffn_hidden: ffn,
        vocab,
        mlp,
        norm: if mlp == MlpKind::Swiglu {
            NormKind::Rmsnorm
        } else {
            NormKind::Layernorm
        },
        tie_embeddings: false,
        bias: mlp == MlpKind::Gelu,
        max_seq_len: None,
        position: PositionKind::Rope,
        moe: None,
        encoders: Vec::new(),
    }
}

/// The shapes of the measured models, from their published configurations: Llama 2 (Touvron
/// et al. 2023, table 1 and the released `config.json`s), Llama 3 (Dubey et al. 2024, table
/// 3), Mixtral (Jiang et al. 2024, table 1), GPT-J (EleutherAI's `config.json`). The
/// FasterTransformer GPTs give layers, heads and head width in the guide; their MLP is the
/// GPT convention of 4 × hidden (an assumption: the guide does not state it).
pub fn measured_model(name: &str) -> Option<ModelSpec> {
    use MlpKind::{Gelu, Swiglu};
    let model = match name {
        "Llama-2-7B" => decoder(name, 32, 4096, 32, 32, 11008, 32000, Swiglu),
        "Llama-2-13B" => decoder(name, 40, 5120, 40, 40, 13824, 32000, Swiglu),
        "Llama-2-70B" => decoder(name, 80, 8192, 64, 8, 28672, 32000, Swiglu),
        // Llama 3.1 has Llama 3's shapes (Dubey et al. 2024, table 3).
        "Llama-3-8B" | "Llama-3.1-8B" => decoder(name, 32, 4096, 32, 8, 14336, 128256, Swiglu),
        "Llama-3-70B" | "Llama-3.1-70B" => decoder(name, 80, 8192, 64, 8, 28672, 128256, Swiglu),
        // Qwen3-8B's `config.json`: 36 layers, hidden 4096, 32 heads of 128, 8 key/value
        // heads, intermediate 12288, vocabulary 151936, untied.
        "Qwen3-8B" => decoder(name, 36, 4096, 32, 8, 12288, 151936, Swiglu),
        "Mixtral-8x7B" => ModelSpec {
            moe: Some(MoeSpec {
                experts: 8,
                top_k: 2,
                every: 1,
                expert_ffn_hidden: 14336,
                shared_experts: 0,
                capacity_factor: 1.0,
                first_dense: 0,
            }),
            ..decoder(name, 32, 4096, 32, 8, 14336, 32000, Swiglu)
        },
        "GPT-J-6B" => decoder(name, 28, 4096, 16, 16, 16384, 50400, Gelu),
        _ if name.starts_with("GPT-6.7B") => decoder(name, 32, 4096, 32, 32, 16384, 51200, Gelu),
        _ if name.starts_with("GPT-20B") => decoder(name, 44, 6144, 48, 48, 24576, 51200, Gelu),
        _ if name.starts_with("GPT-3-175B") => decoder(name, 96, 12288, 96, 96, 49152, 51200, Gelu),
        _ if name.starts_with("Megatron-530B") => {
            decoder(name, 105, 20480, 128, 128, 81920, 51200, Gelu)
        }
        _ => return None,
    };
    Some(model)
}

/// One node of the measured GPU: NVLink per GPU and direction from the DGX datasheets (A100
/// 300 GB/s, H100 and H200 450 GB/s), NDR InfiniBand across nodes.
fn measured_cluster(gpu: &str, gpus: u64) -> Option<ClusterSpec> {
    let (catalog_name, nvlink) = if gpu.starts_with("A100") {
        ("A100_80GB", 300e9)
    } else if gpu.starts_with("H100") {
        ("H100_SXM", 450e9)
    } else if gpu.starts_with("H200") {
        ("H200", 450e9)
    } else {
        return None;
    };
    let gpu = gpu_catalog().into_iter().find(|g| g.name == catalog_name)?;
    let per_node = gpus.min(8);
    Some(ClusterSpec {
        name: "measured".into(),
        gpu,
        nodes: gpus.div_ceil(8),
        gpus_per_node: per_node,
        intra_node: Link {
            bandwidth: nvlink,
            latency: 3e-6,
        },
        inter_node: Link {
            bandwidth: 25e9,
            latency: 8e-6,
        },
        host_link: 25e9,
        host_memory: 1e12,
        calibration: None,
        pools: Vec::new(),
        between_pools: None,
    })
}

/// The prediction for a row, in the row's unit; `None` for a row the model does not cover
/// (an FP8 engine, a model or GPU it does not know).
pub fn predict(row: &ServingMeasurement) -> Option<f64> {
    if row.precision != "fp16" && row.precision != "bf16" {
        return None;
    }
    let model = measured_model(&row.model)?;
    let gpus = row.tp * row.pp;
    let cluster = measured_cluster(&row.gpu, gpus)?;
    let shape = InstanceShape {
        tp: row.tp,
        pp: row.pp,
    };
    let cost = ServingCostModel::new(&model, &cluster, Precision::Fp16, Precision::Fp16, shape);
    let (input, output) = (row.input_len, row.output_len);
    let static_batch = |batch: u64| -> f64 {
        let mut prefill = IterationBatch::default();
        for _ in 0..batch {
            prefill.add_chunk(input, 0, true);
        }
        let mut time = cost.iteration_time(&prefill);
        for step in 1..output {
            time += cost.iteration_time(&IterationBatch::decode(batch, input + step));
        }
        time
    };
    let seconds_as_unit = |seconds: f64| match row.unit.as_str() {
        "ms" => seconds * 1e3,
        _ => seconds,
    };
    match (row.kind.as_str(), row.batch) {
        ("prefill_latency", Some(batch)) => {
            let mut prefill = IterationBatch::default();
            for _ in 0..batch {
                prefill.add_chunk(input, 0, true);
            }
            Some(seconds_as_unit(cost.iteration_time(&prefill)))
        }
        ("decode_step_latency", Some(batch)) => Some(seconds_as_unit(
            cost.iteration_time(&IterationBatch::decode(batch, input + output / 2)),
        )),
        ("end_to_end_latency", Some(batch)) => Some(seconds_as_unit(static_batch(batch))),
        ("throughput_output_tokens", Some(batch)) => {
            let total = (batch * output) as f64 / static_batch(batch);
            Some(per_unit(total, gpus, &row.unit))
        }
        ("throughput_output_tokens", None) => {
            let requests = row.requests?;
            let limits = BatchLimits {
                max_sequences: requests,
                max_batched_tokens: OFFLINE_BATCHED_TOKENS,
            };
            let capacity = cost.kv_capacity_tokens(limits.max_batched_tokens, 256)?;
            let arrivals: Vec<Arrival> = (0..requests as usize)
                .map(|id| Arrival {
                    id,
                    at: 0.0,
                    prompt: input,
                    output,
                })
                .collect();
            let mut timings = vec![Timing::default(); arrivals.len()];
            simulate_instance(&cost, Role::Both, limits, capacity, &arrivals, &mut timings)?;
            let makespan = timings.iter().map(|t| t.finished).fold(0.0, f64::max);
            Some(per_unit(
                (requests * output) as f64 / makespan,
                gpus,
                &row.unit,
            ))
        }
        ("ttft_mean" | "itl_mean" | "tpot_mean" | "throughput_output_tokens_online", _) => {
            let (ttft, tpot, throughput) = online(row, &cost)?;
            Some(match row.kind.as_str() {
                "ttft_mean" => seconds_as_unit(ttft),
                "throughput_output_tokens_online" => per_unit(throughput, gpus, &row.unit),
                _ => seconds_as_unit(tpot),
            })
        }
        _ => None,
    }
}

/// An online run replayed by the simulator: `requests` requests of the row's lengths arriving
/// as a Poisson process at the row's rate (all at once for an infinite rate), or sent by a
/// closed loop of `batch` clients (every request queued, at most `batch` in the engine, each
/// timed from its admission). Returns the mean time to first token, the mean time per output
/// token after it, and output tokens per second over the run.
fn online(row: &ServingMeasurement, cost: &ServingCostModel) -> Option<(f64, f64, f64)> {
    let count = row.requests? as usize;
    let (input, output) = (row.input_len, row.output_len);
    let (at, max_sequences): (Vec<f64>, u64) = match (row.request_rate, row.batch) {
        (Some(rate), _) if rate.is_finite() => {
            let mut rng = SplitMix64::new(0);
            let mut arrival = poisson_arrivals();
            let times = (0..count).map(|_| arrival(&mut rng, rate)).collect();
            (times, ONLINE_MAX_SEQUENCES)
        }
        (Some(_), _) => (vec![0.0; count], ONLINE_MAX_SEQUENCES),
        (None, Some(clients)) => (vec![0.0; count], clients),
        (None, None) => return None,
    };
    let arrivals: Vec<Arrival> = at
        .iter()
        .enumerate()
        .map(|(id, &at)| Arrival {
            id,
            at,
            prompt: input,
            output,
        })
        .collect();
    let limits = BatchLimits {
        max_sequences,
        max_batched_tokens: OFFLINE_BATCHED_TOKENS,
    };
    let capacity = cost.kv_capacity_tokens(limits.max_batched_tokens, max_sequences)?;
    let mut timings = vec![Timing::default(); count];
    simulate_instance(cost, Role::Both, limits, capacity, &arrivals, &mut timings)?;
    let closed_loop = row.request_rate.is_none();
    let n = count as f64;
    let ttft = timings
        .iter()
        .zip(&arrivals)
        .map(|(t, a)| t.first_token - if closed_loop { t.admitted } else { a.at })
        .sum::<f64>()
        / n;
    let tpot = timings
        .iter()
        .map(|t| (t.finished - t.first_token) / (output.max(2) - 1) as f64)
        .sum::<f64>()
        / n;
    let makespan = timings.iter().map(|t| t.finished).fold(0.0, f64::max);
    Some((ttft, tpot, (count as u64 * output) as f64 / makespan))
}

/// Sequences an online engine batches when the source does not say (vLLM's `--max-num-seqs`
/// default, TensorRT-LLM's common `max_batch_size`).
const ONLINE_MAX_SEQUENCES: u64 = 256;

/// Tokens per iteration of an offline run: TensorRT-LLM's `max_num_tokens` default (8,192).
pub const OFFLINE_BATCHED_TOKENS: u64 = 8192;

fn per_unit(total_tokens_per_s: f64, gpus: u64, unit: &str) -> f64 {
    if unit.ends_with("/gpu") {
        total_tokens_per_s / gpus as f64
    } else {
        total_tokens_per_s
    }
}

/// A row's prediction and its error relative to the measurement.
#[derive(Clone, Debug)]
pub struct ScoredRow {
    pub row: ServingMeasurement,
    pub predicted: f64,
    /// `predicted / measured − 1`.
    pub error: f64,
}

/// Every row the model covers, predicted.
pub fn score(rows: &[ServingMeasurement]) -> Vec<ScoredRow> {
    rows.iter()
        .filter_map(|row| {
            let predicted = predict(row)?;
            Some(ScoredRow {
                row: row.clone(),
                predicted,
                error: predicted / row.value - 1.0,
            })
        })
        .collect()
}
