//! The serving cost model: what one engine iteration of an inference instance costs, what the
//! weights and the KV cache hold, and what sending a prompt's KV cache between instances costs.
//!
//! An instance is `tp × pp` GPUs running one engine (vLLM's, SGLang's): each iteration
//! processes a batch of new tokens, some of them prompt tokens being prefilled (in chunks) and
//! one per sequence being decoded. Its time is built from the same primitives as training's,
//! each calibrated on its own microbenchmarks:
//! - every linear layer is a GEMM of the batch's tokens by the weight shard ([`gemm_time`]:
//!   tiles and waves on the SMs, and the HBM floor that makes decoding read every weight);
//! - prefill attention runs the fused kernel at its fitted rate on the pairs of tokens the
//!   causal mask keeps; decode attention streams each sequence's KV cache from HBM;
//! - norms, residuals and activations are memory-bound passes;
//! - tensor parallelism all-reduces each layer's two outputs ([`collective_time`]), pipeline
//!   parallelism sends the activations between stages.
//!
//! Only the engine's own per-iteration time on the host (scheduling, preparing inputs,
//! sampling) is a software parameter, [`EngineOverhead`], with its source.

use tessel_grammar::{ClusterSpec, ModelSpec, Precision};

use crate::cost::GpuGeneration;
use crate::primitives::{
    attention_forward_rate, collective_time, gemm_time, memory_pass_time, AttentionKernel,
    AttentionParams, Collective, CollectiveParams, GemmDevice, GemmParams, Group, Links,
    HBM_STREAM_FRACTION,
};

/// Bytes of an element stored in `precision`.
pub fn element_bytes(precision: Precision) -> f64 {
    match precision {
        Precision::Fp8 => 1.0,
        Precision::Bf16 | Precision::Fp16 => 2.0,
        Precision::Fp32 => 4.0,
    }
}

/// How an instance splits the model: tensor parallel inside a node, pipeline stages across.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InstanceShape {
    pub tp: u64,
    pub pp: u64,
}

impl InstanceShape {
    pub fn gpus(self) -> u64 {
        self.tp * self.pp
    }
}

/// Fraction of GPU memory the engine may use (vLLM's `--gpu-memory-utilization` default, 0.9;
/// SGLang's `--mem-fraction-static` is of the same size).
pub const GPU_MEMORY_UTILIZATION: f64 = 0.9;

/// The engine's host time per iteration that the GPU waits for: scheduling, building the
/// batch's inputs and sampling, beyond the kernels' own launch costs. One value for every
/// engine: at four concurrent requests of Qwen3-8B on an H100 (GPUStack's performance lab,
/// `data/serving/`), vLLM v0.11 (7.38 ms per output token), SGLang v0.5.3 (7.19 ms) and
/// TensorRT-LLM v1.2 (7.67 ms) decode at the same pace: the Python engines hide their host
/// work (asynchronous scheduling, CUDA graphs) as well as the compiled one. It is a prior, not
/// a fit; the per-token errors it leaves are in `docs/VALIDATION.md`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EngineOverhead {
    /// Seconds per iteration.
    pub per_iteration_s: f64,
    /// Seconds per sequence in the batch.
    pub per_sequence_s: f64,
}

pub const ENGINE_OVERHEAD: EngineOverhead = EngineOverhead {
    per_iteration_s: 0.2e-3,
    per_sequence_s: 1.0e-6,
};

/// Kernels of a layer other than its GEMMs: two norms, rotary embedding, attention, the
/// activation, two residual adds.
const OTHER_KERNELS_PER_LAYER: f64 = 7.0;

/// What one engine iteration processes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IterationBatch {
    /// Prompt tokens prefilled this iteration (whole prompts or chunks).
    pub prefill_tokens: u64,
    /// Pairs of (query, key) tokens the prefill's causal attention computes: a chunk of `n`
    /// tokens after `c` already cached adds `n·c + n·(n+1)/2`.
    pub prefill_pairs: f64,
    /// The longest prefill chunk, which sets the attention kernel's fill.
    pub longest_chunk: u64,
    /// Prompts (or chunks of them) in the batch.
    pub prefill_chunks: u64,
    /// Sequences decoding one token each.
    pub decode_sequences: u64,
    /// Tokens in the KV caches those sequences read.
    pub decode_context: u64,
    /// Sequences that sample a token this iteration (decodes and prompts completing).
    pub sampled: u64,
}

impl IterationBatch {
    /// One prefill of a whole prompt of `tokens`.
    pub fn prefill(tokens: u64) -> IterationBatch {
        let mut batch = IterationBatch::default();
        batch.add_chunk(tokens, 0, true);
        batch
    }

    /// `sequences` decoding with `context` cached tokens each.
    pub fn decode(sequences: u64, context: u64) -> IterationBatch {
        IterationBatch {
            decode_sequences: sequences,
            decode_context: sequences * context,
            sampled: sequences,
            ..IterationBatch::default()
        }
    }

    /// Adds a prefill chunk of `tokens` after `cached` tokens; `completes` when it ends the
    /// prompt (the first output token is sampled).
    pub fn add_chunk(&mut self, tokens: u64, cached: u64, completes: bool) {
        let n = tokens as f64;
        self.prefill_tokens += tokens;
        self.prefill_pairs += n * cached as f64 + n * (n + 1.0) / 2.0;
        self.longest_chunk = self.longest_chunk.max(tokens);
        self.prefill_chunks += 1;
        if completes {
            self.sampled += 1;
        }
    }

    /// Adds one decoding sequence with `context` cached tokens.
    pub fn add_decode(&mut self, context: u64) {
        self.decode_sequences += 1;
        self.decode_context += context;
        self.sampled += 1;
    }

    pub fn tokens(&self) -> u64 {
        self.prefill_tokens + self.decode_sequences
    }

    /// Sequences in the batch: prompts being prefilled and sequences decoding.
    pub fn sequences(&self) -> u64 {
        self.prefill_chunks + self.decode_sequences
    }

    pub fn is_empty(&self) -> bool {
        self.tokens() == 0
    }
}

/// The costs of one instance shape of a model on a cluster's GPU.
#[derive(Clone, Debug)]
pub struct ServingCostModel {
    pub shape: InstanceShape,
    /// Layers of the largest pipeline stage.
    stage_layers: f64,
    hidden: f64,
    heads_per_gpu: f64,
    kv_heads_per_gpu: f64,
    head_dim: f64,
    ffn_per_gpu: f64,
    mlp_matrices: f64,
    /// Experts of a block and the experts a token visits; `None` for a dense model.
    experts: Option<(f64, f64)>,
    vocab_per_gpu: f64,
    bytes: f64,
    kv_bytes: f64,
    device: GemmDevice,
    gemm: GemmParams,
    attention: AttentionParams,
    collectives: CollectiveParams,
    links: Links,
    memory_bandwidth: f64,
    gpu_memory: f64,
    gpus_per_node: u64,
    overhead: EngineOverhead,
    weight_bytes: f64,
}

impl ServingCostModel {
    pub fn new(
        model: &ModelSpec,
        cluster: &ClusterSpec,
        precision: Precision,
        kv_precision: Precision,
        shape: InstanceShape,
    ) -> ServingCostModel {
        let gpu = &cluster.gpu;
        let generation = GpuGeneration::from_name(&gpu.name);
        let tp = shape.tp as f64;
        let stage_layers = model.layers.div_ceil(shape.pp) as f64;
        let bytes = element_bytes(precision);
        let (ffn, experts) = match &model.moe {
            Some(moe) => (
                moe.expert_ffn_hidden as f64,
                Some((moe.experts as f64, moe.top_k as f64)),
            ),
            None => (model.ffn_hidden as f64, None),
        };
        let mlp_matrices = match model.mlp {
            tessel_grammar::MlpKind::Gelu => 2.0,
            tessel_grammar::MlpKind::Swiglu => 3.0,
        };
        // The largest stage holds its layers and one of the embedding and the output layer
        // (both when the model is on one stage), each split over the tensor-parallel ranks.
        let params = model.parameter_count().total as f64;
        let embedding = (model.vocab * model.hidden) as f64;
        let tables = if model.tie_embeddings { 1.0 } else { 2.0 };
        let layer_params = (params - tables * embedding) / model.layers as f64;
        let stage_tables = if shape.pp == 1 { tables } else { 1.0 };
        let weight_bytes = (stage_layers * layer_params + stage_tables * embedding) / tp * bytes;
        ServingCostModel {
            shape,
            stage_layers,
            hidden: model.hidden as f64,
            heads_per_gpu: model.heads as f64 / tp,
            // Fewer key/value heads than ranks: each rank keeps a copy of one.
            kv_heads_per_gpu: (model.kv_heads as f64 / tp).max(1.0),
            head_dim: model.head_dim as f64,
            ffn_per_gpu: ffn / tp,
            mlp_matrices,
            experts,
            vocab_per_gpu: model.vocab as f64 / tp,
            bytes,
            kv_bytes: element_bytes(kv_precision),
            device: GemmDevice::of(
                gpu,
                gpu.peak.for_precision(precision),
                gpu.hbm_bandwidth * HBM_STREAM_FRACTION,
            ),
            gemm: GemmParams::for_generation(generation),
            attention: AttentionParams::for_kernel(generation, AttentionKernel::Flash2),
            collectives: CollectiveParams::default(),
            links: Links::of(cluster),
            memory_bandwidth: gpu.hbm_bandwidth,
            gpu_memory: gpu.memory,
            gpus_per_node: cluster.gpus_per_node,
            overhead: ENGINE_OVERHEAD,
            weight_bytes,
        }
    }

    /// Weights on the GPU of the largest stage, bytes.
    pub fn weight_bytes(&self) -> f64 {
        self.weight_bytes
    }

    /// KV-cache bytes one token takes on each GPU of the largest stage.
    pub fn kv_bytes_per_token(&self) -> f64 {
        2.0 * self.stage_layers * self.kv_heads_per_gpu * self.head_dim * self.kv_bytes
    }

    /// Activation memory of an iteration of `tokens` at its peak (the MLP's input and its
    /// widest intermediate, the logits of the sampled rows in fp32), bytes.
    fn activation_bytes(&self, tokens: f64, sampled: f64) -> f64 {
        let mlp = self.mlp_matrices - 1.0;
        tokens * (4.0 * self.hidden + mlp * self.ffn_per_gpu) * self.bytes
            + sampled * self.vocab_per_gpu * 4.0
    }

    /// Tokens the KV cache holds on this instance once the weights and the activations of an
    /// iteration of `max_batched_tokens` are placed; `None` when the weights alone do not fit.
    pub fn kv_capacity_tokens(&self, max_batched_tokens: u64, max_sequences: u64) -> Option<u64> {
        let usable = self.gpu_memory * GPU_MEMORY_UTILIZATION;
        let free = usable
            - self.weight_bytes
            - self.activation_bytes(max_batched_tokens as f64, max_sequences as f64);
        (free > 0.0).then(|| (free / self.kv_bytes_per_token()) as u64)
    }

    fn gemm(&self, m: f64, n: f64, k: f64, batch: f64) -> f64 {
        gemm_time(m, n, k, batch, self.bytes, &self.device, &self.gemm)
    }

    fn tp_group(&self) -> Group<f64> {
        Group::placed(
            self.shape.tp as f64,
            1.0,
            self.gpus_per_node as f64,
            self.shape.tp.div_ceil(self.gpus_per_node) as f64,
        )
    }

    /// Seconds of one layer over `tokens` new tokens.
    fn layer_time(&self, batch: &IterationBatch) -> f64 {
        let m = batch.tokens() as f64;
        let h = self.hidden;
        let q = self.heads_per_gpu * self.head_dim;
        let kv = self.kv_heads_per_gpu * self.head_dim;
        let projections = self.gemm(m, q + 2.0 * kv, h, 1.0) + self.gemm(m, h, q, 1.0);
        let up = self.mlp_matrices - 1.0;
        let mlp = match self.experts {
            None => {
                self.gemm(m, up * self.ffn_per_gpu, h, 1.0) + self.gemm(m, h, self.ffn_per_gpu, 1.0)
            }
            Some((experts, top_k)) => {
                // Tokens spread evenly over the experts; each expert's weights are read
                // whatever its share, which the GEMMs' memory floor counts.
                let per_expert = (m * top_k / experts).max(1.0);
                self.gemm(m, experts, h, 1.0)
                    + self.gemm(per_expert, up * self.ffn_per_gpu, h, experts)
                    + self.gemm(per_expert, h, self.ffn_per_gpu, experts)
            }
        };
        let prefill_attention = if batch.prefill_tokens > 0 {
            let flops = 4.0 * self.heads_per_gpu * self.head_dim * batch.prefill_pairs;
            let rate = attention_forward_rate(
                self.device.peak_flops,
                batch.longest_chunk as f64,
                self.head_dim,
                true,
                &self.attention,
            );
            flops / rate
        } else {
            0.0
        };
        let kv_per_layer = 2.0 * kv * self.kv_bytes;
        let decode_attention = memory_pass_time(
            batch.decode_context as f64 * kv_per_layer,
            self.memory_bandwidth,
        );
        let elementwise = memory_pass_time(
            m * (12.0 * h + 3.0 * up * self.ffn_per_gpu) * self.bytes,
            self.memory_bandwidth,
        );
        let kernels = OTHER_KERNELS_PER_LAYER * self.gemm.launch_s;
        let all_reduce = if self.shape.tp > 1 {
            2.0 * collective_time(
                Collective::AllReduce,
                m * h * self.bytes,
                &self.tp_group(),
                &self.links,
                &self.collectives,
            )
        } else {
            0.0
        };
        projections
            + mlp
            + prefill_attention
            + decode_attention
            + elementwise
            + kernels
            + all_reduce
    }

    /// Seconds from an iteration's start until its tokens are sampled. With pipeline stages the
    /// engine keeps up to `pp` batches in flight (vLLM's virtual engines), so a batch of `B`
    /// sequences moves as `g = min(pp, B)` groups of `B/g`, each passing every stage: every
    /// sequence gets one token per `pp` stage times of its group, plus the hops between
    /// stages. A single prompt thus takes every stage's time in turn.
    pub fn iteration_time(&self, batch: &IterationBatch) -> f64 {
        if batch.is_empty() {
            return 0.0;
        }
        let pp = self.shape.pp as f64;
        let groups = self.shape.pp.min(batch.sequences()).max(1);
        let group = if groups > 1 {
            scaled(batch, 1.0 / groups as f64)
        } else {
            *batch
        };
        let layers = self.stage_layers * self.layer_time(&group);
        let head = self.gemm(group.sampled as f64, self.vocab_per_gpu, self.hidden, 1.0);
        let hop = if self.shape.pp > 1 {
            let crosses = self.shape.gpus() > self.gpus_per_node;
            let bandwidth = if crosses {
                self.links.inter_bandwidth * self.collectives.inter_efficiency
            } else {
                self.links.intra_bandwidth * self.collectives.intra_efficiency
            };
            self.collectives.call_latency_s
                + group.tokens() as f64 * self.hidden * self.bytes / bandwidth
        } else {
            0.0
        };
        let gpu = pp * layers + head + (pp - 1.0) * hop;
        gpu + self.overhead.per_iteration_s + self.overhead.per_sequence_s * batch.sampled as f64
    }

    /// Seconds to send the KV cache of `tokens` prompt tokens from a prefill instance to a
    /// decode instance: every GPU sends its shard at once, over NVLink when the two instances
    /// share a node, else over its NIC.
    pub fn kv_transfer_time(&self, tokens: u64, same_node: bool) -> f64 {
        let bytes = tokens as f64 * self.kv_bytes_per_token();
        let bandwidth = if same_node {
            self.links.intra_bandwidth * self.collectives.intra_efficiency
        } else {
            self.links.inter_bandwidth * self.collectives.inter_efficiency
        };
        self.collectives.call_latency_s + bytes / bandwidth
    }
}

/// A batch's share for one of `pp` groups: tokens and sequences divided, at least one.
fn scaled(batch: &IterationBatch, share: f64) -> IterationBatch {
    let part = |n: u64| ((n as f64 * share).ceil() as u64).min(n);
    IterationBatch {
        prefill_tokens: part(batch.prefill_tokens),
        prefill_pairs: batch.prefill_pairs * share,
        longest_chunk: batch.longest_chunk,
        prefill_chunks: part(batch.prefill_chunks),
        decode_sequences: part(batch.decode_sequences),
        decode_context: part(batch.decode_context),
        sampled: part(batch.sampled),
    }
}
