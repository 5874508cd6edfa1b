//! The typed, validated spec that every other crate consumes.
//!
//! All quantities are in SI base units as `f64`: bytes, bytes per second, FLOP per second,
//! seconds. Counts are `u64`. Nothing here refers to the parser: a `Spec` can be built by hand
//! (the validation harness does so for published runs) as well as parsed from a file.

use serde::{Deserialize, Serialize};

/// A whole resolved spec: the model, the cluster and the training job named by the `train`
/// block, every `strategy` block, and the search space.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Spec {
    pub model: ModelSpec,
    pub cluster: ClusterSpec,
    pub train: TrainSpec,
    /// Every `strategy` block, in the order they appear (after `use` resolution).
    pub strategies: Vec<Strategy>,
    pub search: SearchSpace,
}

impl Spec {
    pub fn strategy(&self, name: &str) -> Option<&Strategy> {
        self.strategies.iter().find(|s| s.name == name)
    }

    /// Whether the planner resolves a choice beside the strategy: the training's `auto`
    /// fields, or where a multimodal model's encoders run.
    pub fn has_planner_choices(&self) -> bool {
        self.train.has_planner_choices() || self.placement_to_choose().is_some()
    }

    /// A multimodal model's training settings while the planner still chooses where its
    /// encoders run (`placement = auto`, the default, or `separate` without `encoder_gpus`).
    pub fn placement_to_choose(&self) -> Option<MultimodalTraining> {
        if self.model.encoders.is_empty() {
            return None;
        }
        let training = self.train.multimodal.unwrap_or_default();
        match (training.placement, training.encoder_gpus) {
            (EncoderPlacement::Auto, _) | (EncoderPlacement::Separate, None) => Some(training),
            _ => None,
        }
    }
}

/// Feed-forward block flavour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MlpKind {
    /// Two matrices, `h → ffn → h`.
    Gelu,
    /// Three matrices (gate, up, down).
    Swiglu,
}

/// How positions enter the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PositionKind {
    /// Rotary embeddings: no parameters.
    Rope,
    /// A learned `max_seq_len × hidden` table (GPT-2/GPT-3).
    Learned,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NormKind {
    Layernorm,
    Rmsnorm,
}

/// Mixture-of-experts settings of a model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoeSpec {
    pub experts: u64,
    pub top_k: u64,
    /// An expert layer every `every` blocks (1 = every block).
    pub every: u64,
    pub expert_ffn_hidden: u64,
    /// Always-active experts of size `expert_ffn_hidden` (DeepSeek style); 0 = none.
    pub shared_experts: u64,
    pub capacity_factor: f64,
    /// Leading blocks that stay dense before the `every` pattern starts (DeepSeek's
    /// `first_k_dense_replace`); 0 = none.
    pub first_dense: u64,
}

/// A decoder-only transformer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    pub name: String,
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    /// Key/value heads (grouped-query attention); equals `heads` for multi-head attention.
    pub kv_heads: u64,
    /// Per-head dimension; `hidden / heads` unless set.
    pub head_dim: u64,
    /// Dense MLP width (for MoE models: the width of the dense blocks between expert blocks).
    pub ffn_hidden: u64,
    pub vocab: u64,
    pub mlp: MlpKind,
    pub norm: NormKind,
    pub tie_embeddings: bool,
    /// Linear layers carry biases.
    pub bias: bool,
    pub max_seq_len: Option<u64>,
    /// Learned position embeddings need `max_seq_len`.
    pub position: PositionKind,
    pub moe: Option<MoeSpec>,
    /// Encoders of other modalities (`encoder NAME { … }`) whose outputs a projector turns
    /// into tokens of this language model; none for a text-only model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub encoders: Vec<EncoderSpec>,
}

/// A modality encoder (a ViT, an audio transformer): a bidirectional transformer over the
/// `tokens_per_item` patches (frames) of each image (clip), then a projector into the language
/// model's width; every `merge` encoder tokens become one language-model token.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EncoderSpec {
    pub name: String,
    pub layers: u64,
    pub hidden: u64,
    pub heads: u64,
    pub ffn_hidden: u64,
    pub mlp: MlpKind,
    pub norm: NormKind,
    /// Encoder tokens (patches, frames) of one item.
    pub tokens_per_item: u64,
    /// Encoder tokens merged (concatenated) into one projector input, as Qwen2-VL's 2×2 merger.
    pub merge: u64,
    pub projector: ProjectorKind,
    /// Width between an MLP projector's two matrices; `None`: the language model's width
    /// (LLaVA's); Qwen2-VL's merger keeps its input width.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub projector_hidden: Option<u64>,
    /// Items (images, clips) per training sample.
    pub items_per_sample: ItemCount,
    /// Not trained: forward only, no gradients or optimizer state (LLaVA's frozen vision tower).
    pub frozen: bool,
}

impl EncoderSpec {
    /// Language-model tokens one item becomes.
    pub fn llm_tokens_per_item(&self) -> u64 {
        self.tokens_per_item.div_ceil(self.merge.max(1))
    }

    /// Width of the projector's input (the merged tokens).
    pub fn projector_input(&self) -> u64 {
        self.hidden * self.merge.max(1)
    }
}

/// How the projector maps merged encoder tokens to the language model's width.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProjectorKind {
    /// One matrix.
    Linear,
    /// Two matrices with a GELU between: into `projector_hidden`, then into the language
    /// model's width (LLaVA-1.5's `mlp2x_gelu`, Qwen2-VL's merger).
    Mlp,
}

/// How many items a sample holds: a count that may be 0 (text-only samples), unlike a
/// [`LengthDistribution`], whose lengths start at 1.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ItemCount {
    pub mean: f64,
    /// Draws above it are cut to it.
    pub max: u64,
    pub shape: CountShape,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CountShape {
    /// Every sample the mean (rounded).
    Fixed,
    /// Uniform on `0 ..= 2·mean`.
    Uniform,
    /// Poisson with the mean: most samples near it, some with none.
    Poisson,
}

impl CountShape {
    pub const ALL: [CountShape; 3] = [CountShape::Fixed, CountShape::Uniform, CountShape::Poisson];

    pub fn name(self) -> &'static str {
        match self {
            CountShape::Fixed => "fixed",
            CountShape::Uniform => "uniform",
            CountShape::Poisson => "poisson",
        }
    }
}

/// Dense peak compute of a GPU in FLOP/s, per precision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeakCompute {
    pub bf16: f64,
    pub fp16: f64,
    /// 0 when the GPU has no FP8 tensor cores.
    pub fp8: f64,
    pub fp32: f64,
    pub tf32: f64,
}

impl PeakCompute {
    /// Peak FLOP/s for a training precision.
    pub fn for_precision(&self, precision: Precision) -> f64 {
        match precision {
            Precision::Bf16 => self.bf16,
            Precision::Fp16 => self.fp16,
            Precision::Fp8 => self.fp8,
            Precision::Fp32 => self.fp32,
        }
    }
}

/// Calibratable fractions of peak a GPU reaches. `None` fields mean "use the cost model's
/// default for this GPU generation".
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuEfficiency {
    pub matmul: Option<f64>,
    pub attention: Option<f64>,
    pub memory: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuSpec {
    pub name: String,
    /// Device memory in bytes.
    pub memory: f64,
    pub peak: PeakCompute,
    /// HBM bandwidth in bytes/s.
    pub hbm_bandwidth: f64,
    pub efficiency: GpuEfficiency,
    /// Compute units one GEMM spreads its tiles over: the SMs of a GPU, 1 for a CPU rank that
    /// multiplies on one thread. `None`: known from the GPU's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_units: Option<u64>,
    /// Side of the square output tile one compute unit computes at a time, where it is not
    /// cuBLAS's (256 × 128 and 64 × 64): a CPU core's GEMM micro-kernel (matrixmultiply's
    /// 16 × 16 with AVX-512). `None`: cuBLAS's tiles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm_tile: Option<u64>,
}

/// A link, per GPU and per direction.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Link {
    /// Bytes per second.
    pub bandwidth: f64,
    /// Seconds per message.
    pub latency: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterSpec {
    pub name: String,
    pub gpu: GpuSpec,
    pub nodes: u64,
    pub gpus_per_node: u64,
    pub intra_node: Link,
    pub inter_node: Link,
    /// Host-to-device bandwidth per GPU in bytes/s (used by offload).
    pub host_link: f64,
    /// Host memory per node in bytes.
    pub host_memory: f64,
    /// Primitive costs measured on this cluster (`calibration = "cluster.cal.json"`, written by
    /// `tessel calibrate`); absent: the published calibration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<CalibrationFile>,
    /// Pools of GPUs of their own kind (`pool NAME { … }` blocks), in the order written; empty
    /// for a cluster of one kind. A cluster with pools describes its first pool in its own
    /// fields (`gpu`, `nodes`, links), so that whatever reads one GPU type reads a real one;
    /// what plans across pools reads `pools`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<ClusterSpec>,
    /// The link between two pools, per GPU and direction (`between_pools`); absent without
    /// pools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub between_pools: Option<Link>,
}

/// A cluster's calibration file, read when the spec is loaded: what the cost model takes from
/// it and how to tell when it changed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CalibrationFile {
    /// The path as the spec writes it, relative to the spec.
    pub path: String,
    /// SHA-256 of the file's bytes, hex.
    pub digest: String,
    /// NCCL's collective parameters it fitted, by name (the cost model's `CollectiveParams`);
    /// empty when it measured no collective.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub collectives: std::collections::BTreeMap<String, f64>,
    /// The GEMM primitive's parameters it fitted (`GemmParams`); empty when it timed no GEMM.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub gemm: std::collections::BTreeMap<String, f64>,
    /// The step's compute it fitted on traced steps (`ComputeParams`); empty when it read no
    /// `tessel launch` trace of a run.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub compute: std::collections::BTreeMap<String, f64>,
}

impl CalibrationFile {
    /// As messages name it: `cluster.cal.json (NCCL collectives, GEMMs; sha256 1a2b3c4d)`.
    pub fn label(&self) -> String {
        let mut parts = Vec::new();
        if !self.collectives.is_empty() {
            parts.push("NCCL collectives");
        }
        if !self.gemm.is_empty() {
            parts.push("GEMMs");
        }
        if !self.compute.is_empty() {
            parts.push("compute");
        }
        format!(
            "{} ({}; sha256 {})",
            self.path,
            parts.join(", "),
            &self.digest[..self.digest.len().min(8)]
        )
    }
}

impl ClusterSpec {
    /// GPUs of this cluster, or of its first pool when it has pools (see [`ClusterSpec::pools`];
    /// [`ClusterSpec::pooled_gpus`] counts them all).
    pub fn total_gpus(&self) -> u64 {
        self.nodes * self.gpus_per_node
    }

    /// The cluster left to the language model when `gpus` of it (whole nodes) run a multimodal
    /// model's encoders; why not, when they cannot.
    pub fn without_encoder_gpus(&self, gpus: u64) -> Result<ClusterSpec, String> {
        if !self.pools.is_empty() {
            return Err(format!(
                "cluster `{}` has pools; encoders on GPUs of their own are planned on one GPU type",
                self.name
            ));
        }
        if !gpus.is_multiple_of(self.gpus_per_node) {
            return Err(format!(
                "`encoder_gpus` ({gpus}) is not a whole number of nodes of {} GPUs",
                self.gpus_per_node
            ));
        }
        if gpus >= self.total_gpus() {
            return Err(format!(
                "`encoder_gpus` ({gpus}) leaves none of the cluster's {} GPUs to the language model",
                self.total_gpus()
            ));
        }
        Ok(ClusterSpec {
            nodes: self.nodes - gpus / self.gpus_per_node,
            ..self.clone()
        })
    }

    /// GPUs of every pool together (of the cluster, when it has no pools).
    pub fn pooled_gpus(&self) -> u64 {
        if self.pools.is_empty() {
            self.total_gpus()
        } else {
            self.pools.iter().map(ClusterSpec::total_gpus).sum()
        }
    }

    /// A cluster made of `pools` (two or more), its own fields those of the first (see
    /// [`ClusterSpec::pools`]).
    pub fn of_pools(name: &str, pools: Vec<ClusterSpec>, between_pools: Link) -> ClusterSpec {
        let first = pools[0].clone();
        ClusterSpec {
            name: name.to_string(),
            pools,
            between_pools: Some(between_pools),
            ..first
        }
    }

    /// The pool named `name`.
    pub fn pool(&self, name: &str) -> Option<&ClusterSpec> {
        self.pools.iter().find(|pool| pool.name == name)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Bf16,
    Fp16,
    Fp8,
    Fp32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Optimizer {
    Adam,
    Sgd,
}

/// The training software whose mechanisms the cost model applies: how pipeline stages
/// exchange activations and which gradient copies the optimizer keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Framework {
    /// Megatron-LM, NeMo, Megatron-Core: pipeline sends scattered over the tensor-parallel
    /// ranks and batched, fp32 main gradients.
    #[default]
    Megatron,
    /// Megatron-FSDP (`--use-megatron-fsdp`): Megatron-Core's models and kernels with
    /// parameters, gradients and optimizer state sharded per module over the data-parallel
    /// ranks (ZeRO 0–3), no pipeline parallelism.
    #[serde(rename = "megatron_fsdp")]
    MegatronFsdp,
    /// Megatron-DeepSpeed and DeepSpeed's pipeline engine: pipeline sends split over the
    /// tensor-parallel ranks, as Megatron-LM's, but blocking, one after another; half-precision
    /// gradients beside an fp32 gradient buffer.
    Deepspeed,
    /// PyTorch-native stacks (FSDP, torchtitan, llm-foundry): fp32 gradient reduction;
    /// pipeline stages send the whole activation.
    Fsdp,
    /// Tessel's own runtime (`tessel launch`): Megatron-LM's layout with per-layer ZeRO
    /// buffers, and the one framework that runs a different recompute and offload per stage.
    Tessel,
}

impl Framework {
    pub fn is_megatron(&self) -> bool {
        *self == Framework::Megatron
    }

    /// Megatron-LM or Megatron-FSDP: Megatron-Core's models, kernels and MoE layers.
    pub fn is_megatron_core(self) -> bool {
        matches!(self, Framework::Megatron | Framework::MegatronFsdp)
    }

    /// Whether the software's FP8 library is torchao (the PyTorch-native stacks) rather than
    /// Transformer Engine (Megatron-LM, and DeepSpeed through Megatron-DeepSpeed).
    pub fn fp8_through_torchao(self) -> bool {
        self == Framework::Fsdp
    }

    /// Whether ZeRO 2–3 go through flat buffers piece by piece: each micro-batch's gradients
    /// copied into one and reduce-scattered as each layer's backward finishes (so that only
    /// the shard outlives it; ZeRO-2 too, not once a step), and under ZeRO-3 every gathered
    /// block copied out of its buffer into the layer's weights, in forward and again in
    /// backward. Tessel's runtime does (`flatten`, `unflatten` and
    /// `scatter_microbatch_gradients` in its executor); the others' ZeRO is left as it was
    /// fitted until these passes are measured there.
    pub fn zero_through_flat_buffers(self) -> bool {
        self == Framework::Tessel
    }

    /// The spec language's word for it.
    pub fn name(self) -> &'static str {
        match self {
            Framework::Megatron => "megatron",
            Framework::MegatronFsdp => "megatron_fsdp",
            Framework::Deepspeed => "deepspeed",
            Framework::Fsdp => "fsdp",
            Framework::Tessel => "tessel",
        }
    }
}

/// How FP8 training scales its tensors into the 8-bit range, which decides the cast passes
/// around every FP8 GEMM, the GEMM kernel, and what travels in FP8.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fp8Scaling {
    /// Transformer Engine's delayed scaling (Megatron-LM, NeMo, DeepSpeed): the scale comes
    /// from earlier steps' amax history, so each cast is one pass fused with its neighbour.
    Delayed,
    /// Dynamic per-tensor scaling (torchao, torchtitan): an amax pass over each GEMM input
    /// before its cast; weights are all-gathered in FP8 under FSDP, and the sequence-parallel
    /// all-gathers of tensor parallelism move FP8.
    Tensorwise,
    /// Dynamic per-row scaling (torchao): row and column scales for each input and its
    /// transpose, and a row-scaled GEMM kernel; nothing is communicated in FP8.
    Rowwise,
}

impl Fp8Scaling {
    /// The spec language's word for it.
    pub fn name(self) -> &'static str {
        match self {
            Fp8Scaling::Delayed => "delayed",
            Fp8Scaling::Tensorwise => "tensorwise",
            Fp8Scaling::Rowwise => "rowwise",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainSpec {
    pub seq_len: u64,
    /// Sequences per optimizer step.
    pub global_batch: u64,
    pub precision: Precision,
    pub optimizer: Optimizer,
    pub flash_attention: bool,
    /// Which fused attention kernel runs (`train.attention_kernel`); `None`: the framework's
    /// own (Transformer Engine's cuDNN kernel under Megatron-LM, flash-attention 2 elsewhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_kernel: Option<AttentionKernel>,
    /// How the norms run (`train.norm_kernel`); `None`: float32 operators for an RMSNorm under
    /// `framework = fsdp` without `compile` (torchtitan's and Hugging Face's eager Llama), a
    /// fused kernel otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm_kernel: Option<NormKernel>,
    /// Hidden and attention dropout probability; 0 (the default, as in Llama-style training)
    /// keeps no dropout masks. Megatron-LM's GPT default is 0.1.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dropout: f64,
    /// The training software (Megatron-LM unless the spec says otherwise).
    #[serde(default, skip_serializing_if = "Framework::is_megatron")]
    pub framework: Framework,
    /// FP8 scaling as written; `None` takes the framework's own (see
    /// [`TrainSpec::fp8_scaling`]). Only allowed with `precision = fp8`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8_scaling: Option<Fp8Scaling>,
    /// Whether the loss runs as a fused cross-entropy kernel, as written; `None` takes the
    /// framework's own (see [`TrainSpec::fused_cross_entropy`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fused_cross_entropy: Option<bool>,
    /// Whether each transformer block runs under `torch.compile` (torchtitan's
    /// `training.compile`): its partitioner recomputes pointwise results in backward (the
    /// norms' outputs, the MLP's activated product) instead of keeping them.
    #[serde(default, skip_serializing_if = "is_false")]
    pub compile: bool,
    /// Tempo's activation-saving kernels (`train.memory_saving_kernels`).
    #[serde(default, skip_serializing_if = "MemorySavingKernels::is_off")]
    pub memory_saving_kernels: MemorySavingKernels,
    /// Which communication runs behind compute, as written; each field left out takes the
    /// framework's default (see [`TrainSpec::overlap`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<OverlapSpec>,
    /// How often the job's GPUs fail and where checkpoints go (`train.failures`,
    /// `train.checkpoint`): with it the plan states the checkpoint interval and the goodput.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failures: Option<FailureSpec>,
    /// Fine-tuning with adapters (`train.finetune`); `None`: every weight trains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finetune: Option<FinetuneSpec>,
    /// Compressed data-parallel gradients (`train.grad_compression`); `None`: sent whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_compression: Option<GradCompression>,
    /// Where a multimodal model's encoders run and whether samples are reordered
    /// (`train.multimodal`); `None`: the defaults (`placement = auto`, reordered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multimodal: Option<MultimodalTraining>,
}

/// `train.multimodal = { placement = auto | first_stage | separate, encoder_gpus = 16,
/// reorder = true }`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MultimodalTraining {
    pub placement: EncoderPlacement,
    /// GPUs of their own for the encoders under `placement = separate` (whole nodes); `None`:
    /// the planner sizes them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoder_gpus: Option<u64>,
    /// Samples are reordered so that every micro-batch carries about as many items (images,
    /// clips) as every other (MMScale's and DistTrain's data reordering).
    pub reorder: bool,
}

impl Default for MultimodalTraining {
    fn default() -> Self {
        MultimodalTraining {
            placement: EncoderPlacement::Auto,
            encoder_gpus: None,
            reorder: true,
        }
    }
}

/// Where the encoders of a multimodal model run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EncoderPlacement {
    /// The planner tries both and keeps the faster plan.
    Auto,
    /// On the GPUs of the first pipeline stage, before its layers (Megatron-LM's LLaVA with
    /// the encoder in the first stage).
    FirstStage,
    /// On GPUs of their own, as one more pipeline stage before the language model's first
    /// (MMScale's and DistTrain's disaggregation).
    Separate,
}

impl EncoderPlacement {
    pub const ALL: [EncoderPlacement; 3] = [
        EncoderPlacement::Auto,
        EncoderPlacement::FirstStage,
        EncoderPlacement::Separate,
    ];

    pub fn name(self) -> &'static str {
        match self {
            EncoderPlacement::Auto => "auto",
            EncoderPlacement::FirstStage => "first_stage",
            EncoderPlacement::Separate => "separate",
        }
    }
}

/// `train.attention_kernel`: the fused attention kernel a run uses, when it is not its
/// framework's own: `flash1` (FlashAttention v1 and kernels of its generation, such as the
/// Triton port llm-foundry's `attn_impl: triton` runs), `flash2` (flash-attention 2, PyTorch's
/// SDPA), `cudnn` (cuDNN's fused attention, Transformer Engine's on Hopper).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionKernel {
    Flash1,
    Flash2,
    Cudnn,
}

impl AttentionKernel {
    pub const ALL: [AttentionKernel; 3] = [
        AttentionKernel::Flash1,
        AttentionKernel::Flash2,
        AttentionKernel::Cudnn,
    ];

    pub fn name(self) -> &'static str {
        match self {
            AttentionKernel::Flash1 => "flash1",
            AttentionKernel::Flash2 => "flash2",
            AttentionKernel::Cudnn => "cudnn",
        }
    }
}

/// `train.norm_kernel`: how a run's norms execute. `fused`: one kernel forward and one backward
/// (Megatron-LM's and Transformer Engine's, `torch.compile`'s, PyTorch's `F.rms_norm` since its
/// fused CUDA kernel); `composite`: float32 operators, a kernel each (torchtitan's 2024
/// `norm_type = "rmsnorm"`, Hugging Face's `LlamaRMSNorm`, `nn.RMSNorm` before the fused
/// kernel), measured at 5.3 times the fused kernel's time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormKernel {
    Fused,
    Composite,
}

impl NormKernel {
    pub const ALL: [NormKernel; 2] = [NormKernel::Fused, NormKernel::Composite];

    pub fn name(self) -> &'static str {
        match self {
            NormKernel::Fused => "fused",
            NormKernel::Composite => "composite",
        }
    }
}

/// `train.memory_saving_kernels`: Tempo's activation-saving kernels (Andoorveedu et al.,
/// NeurIPS 2022, arXiv 2210.10246): in-place GELU (its output and a one-bit branch mask instead
/// of its input), in-place LayerNorm/RMSNorm (the backward from the output, so the input is not
/// kept) and the attention's dropout output rebuilt in backward from the softmax output and the
/// mask. They save memory and cost a little time, so `auto` lets the planner choose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemorySavingKernels {
    #[default]
    Off,
    On,
    /// The planner plans with and without them and keeps the faster plan.
    Auto,
}

impl MemorySavingKernels {
    pub fn is_off(&self) -> bool {
        *self == MemorySavingKernels::Off
    }

    pub fn is_on(self) -> bool {
        self == MemorySavingKernels::On
    }
}

/// `train.grad_compression`: how data-parallel gradients are compressed before they are
/// summed, each with error feedback (what compression drops is added to the next step's
/// gradient). PowerSGD (Vogels et al., NeurIPS 2019, arXiv 1905.13727) sends a rank-`rank`
/// factorisation `P·Qᵀ` of each weight matrix's gradient from one power-iteration step; top-k
/// sends the `ratio` largest entries with their indices (all-gathered, as sparse sums do not
/// all-reduce); fp8 sends each gradient in 1 byte with a scale. The cost model compresses each
/// class of buckets (the layers', the embedding's and output layer's) only where that is
/// faster, and only under ZeRO 0 (the reduction is an all-reduce); `auto` lets the planner pick
/// the method.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GradCompression {
    pub method: CompressionMethod,
    /// PowerSGD's rank.
    pub rank: u64,
    /// Top-k's share of the entries sent.
    pub ratio: f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompressionMethod {
    Powersgd,
    Topk,
    Fp8,
    /// The planner plans each method (and none) and keeps the fastest plan.
    Auto,
}

impl CompressionMethod {
    pub const ALL: [CompressionMethod; 4] = [
        CompressionMethod::Powersgd,
        CompressionMethod::Topk,
        CompressionMethod::Fp8,
        CompressionMethod::Auto,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CompressionMethod::Powersgd => "powersgd",
            CompressionMethod::Topk => "topk",
            CompressionMethod::Fp8 => "fp8",
            CompressionMethod::Auto => "auto",
        }
    }
}

impl GradCompression {
    /// `powersgd rank 4`, `topk 1 %`, `fp8`.
    pub fn label(&self) -> String {
        match self.method {
            CompressionMethod::Powersgd => format!("powersgd rank {}", self.rank),
            CompressionMethod::Topk => format!("topk {} %", self.ratio * 100.0),
            CompressionMethod::Fp8 | CompressionMethod::Auto => self.method.name().to_string(),
        }
    }
}

/// `train.finetune`: which weights train. LoRA (Hu et al. 2021, arXiv 2106.09685) freezes the
/// model and trains a rank-`r` update `B·A` beside each targeted projection; LoRA-FA (Zhang
/// et al. 2023, arXiv 2308.03303) also freezes `A`, so only `B` trains and the projection's
/// input need not be kept for the backward (its `r`-wide product with `A` is).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FinetuneSpec {
    pub method: FinetuneMethod,
    pub rank: u64,
    pub targets: LoraTargets,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinetuneMethod {
    /// Every weight trains (the default without `finetune`).
    Full,
    Lora,
    LoraFa,
    /// LoRA, or LoRA-FA where memory binds: the planner chooses.
    Auto,
}

impl FinetuneMethod {
    pub const ALL: [FinetuneMethod; 4] = [
        FinetuneMethod::Full,
        FinetuneMethod::Lora,
        FinetuneMethod::LoraFa,
        FinetuneMethod::Auto,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FinetuneMethod::Full => "full",
            FinetuneMethod::Lora => "lora",
            FinetuneMethod::LoraFa => "lora_fa",
            FinetuneMethod::Auto => "auto",
        }
    }
}

/// The projections of each block that carry adapters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoraTargets {
    /// Query, key and value projections.
    pub qkv: bool,
    /// The attention's output projection.
    pub o: bool,
    /// Every matrix of the MLP (and of each expert).
    pub mlp: bool,
}

impl LoraTargets {
    pub const ALL: LoraTargets = LoraTargets {
        qkv: true,
        o: true,
        mlp: true,
    };

    /// The targeted projections as the language names them, in order.
    pub fn names(self) -> Vec<&'static str> {
        [("qkv", self.qkv), ("o", self.o), ("mlp", self.mlp)]
            .into_iter()
            .filter(|(_, on)| *on)
            .map(|(name, _)| name)
            .collect()
    }
}

impl FinetuneSpec {
    /// Whether only adapters train (LoRA or LoRA-FA).
    pub fn is_adapter(&self) -> bool {
        self.method != FinetuneMethod::Full
    }
}

/// `train.failures` and `train.checkpoint`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailureSpec {
    pub mtbf: Mtbf,
    /// Seconds from a failure to training again, the checkpoint's reading aside: detection,
    /// rescheduling, start-up.
    pub restart_s: f64,
    /// Where checkpoints go as written; `None`: the planner weighs host memory against disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_to: Option<CheckpointTarget>,
    /// Write (and read) bandwidth of the disk target per GPU, bytes/s; `None`: no disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bandwidth: Option<f64>,
}

/// Mean time between failures, seconds, as written.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mtbf {
    /// Of one GPU (with its share of the node): the job's is this over its GPU count.
    PerGpu(f64),
    /// Of the whole job.
    Job(f64),
}

/// Where a checkpoint is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointTarget {
    /// An in-memory snapshot: copied to the node's host memory over the GPU's host link and
    /// replicated to a peer node's (so a failed node's snapshot survives it).
    Host,
    /// Persistent storage at the spec's bandwidth per GPU.
    Disk,
}

impl CheckpointTarget {
    pub const ALL: [CheckpointTarget; 2] = [CheckpointTarget::Host, CheckpointTarget::Disk];

    pub fn name(self) -> &'static str {
        match self {
            CheckpointTarget::Host => "host",
            CheckpointTarget::Disk => "disk",
        }
    }
}

impl FailureSpec {
    /// The job's mean time between failures on `gpus` GPUs, seconds.
    pub fn job_mtbf_s(&self, gpus: u64) -> f64 {
        match self.mtbf {
            Mtbf::PerGpu(s) => s / gpus.max(1) as f64,
            Mtbf::Job(s) => s,
        }
    }
}

/// `train.overlap` as written: `None` fields take the framework's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OverlapSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_reduce: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param_gather: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp_comm: Option<bool>,
}

/// What communication a step overlaps with compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overlap {
    /// Data-parallel gradient reduction runs bucket by bucket during the backward pass
    /// (Megatron-LM's `--overlap-grad-reduce`, DeepSpeed's `overlap_comm`, FSDP's
    /// reduce-scatter after each unit's backward).
    pub grad_reduce: bool,
    /// Parameter all-gathers run ahead of the layers that need them: the distributed
    /// optimizer's gather of updated weights behind the next step's forward
    /// (`--overlap-param-gather`), ZeRO-3's and FSDP's prefetch of the next layer.
    pub param_gather: bool,
    /// Tensor-parallel collectives split and pipelined with the GEMMs beside them
    /// (Transformer Engine's `--tp-comm-overlap`).
    pub tp_comm: bool,
}

impl Framework {
    /// What the software overlaps unless told otherwise. Megatron-Core's published recipes
    /// (NeMo's, Megatron-LM's) turn on `--overlap-grad-reduce` and `--overlap-param-gather`
    /// but not `--tp-comm-overlap`. DeepSpeed's `overlap_comm` is off by default, except under
    /// ZeRO-3, whose configuration turns it on; its ZeRO-3 parameter fetches are issued from
    /// module hooks as each module runs, and measured ZeRO-3 step times (Narayanan et al.
    /// 2021, Table 2: flat from 768 to 1,536 GPUs at a fixed batch) are those of gathers that
    /// do not hide behind compute, so prefetch is off unless the spec turns it on. FSDP
    /// reduce-scatters each unit's gradients during backward and prefetches the next unit.
    /// Tessel's runtime (its CUDA backend, what a plan runs on) reduces the gradients after
    /// the last backward below ZeRO-3, and under ZeRO-3 reduce-scatters each layer's on
    /// NCCL's stream behind the next layer's backward; it gathers ZeRO-3's weights as each
    /// layer runs, without prefetch. (Its CPU backend overlaps nothing: the CPU specs say so.)
    pub fn default_overlap(self, zero3: bool) -> Overlap {
        let deepspeed = self == Framework::Deepspeed;
        match self {
            Framework::Tessel => Overlap {
                grad_reduce: zero3,
                param_gather: false,
                tp_comm: false,
            },
            _ => Overlap {
                grad_reduce: !deepspeed || zero3,
                param_gather: !(deepspeed && zero3),
                tp_comm: false,
            },
        }
    }
}

impl TrainSpec {
    /// Whether the spec leaves the planner a choice beyond the strategy: `finetune = { method
    /// = auto }`, `memory_saving_kernels = auto` or `grad_compression = { method = auto }`.
    pub fn has_planner_choices(&self) -> bool {
        self.finetune
            .is_some_and(|f| f.method == FinetuneMethod::Auto)
            || self.memory_saving_kernels == MemorySavingKernels::Auto
            || self
                .grad_compression
                .is_some_and(|c| c.method == CompressionMethod::Auto)
    }

    /// The overlap in effect under ZeRO-3 (`zero3`) or below: what the spec writes, the
    /// framework's default for the rest.
    pub fn overlap(&self, zero3: bool) -> Overlap {
        let default = self.framework.default_overlap(zero3);
        let written = self.overlap.unwrap_or_default();
        Overlap {
            grad_reduce: written.grad_reduce.unwrap_or(default.grad_reduce),
            param_gather: written.param_gather.unwrap_or(default.param_gather),
            tp_comm: written.tp_comm.unwrap_or(default.tp_comm),
        }
    }

    /// The FP8 scaling in effect: as written, else the framework's FP8 library's default,
    /// Transformer Engine's delayed scaling for Megatron-LM and DeepSpeed, torchao's
    /// tensor-wise dynamic scaling for the PyTorch-native stacks.
    pub fn fp8_scaling(&self) -> Fp8Scaling {
        self.fp8_scaling
            .unwrap_or(if self.framework.fp8_through_torchao() {
                Fp8Scaling::Tensorwise
            } else {
                Fp8Scaling::Delayed
            })
    }

    /// Whether the loss is a fused cross-entropy kernel: as written, else the framework's
    /// own. Megatron-LM's vocabulary-parallel cross-entropy (DeepSpeed runs Megatron's) works
    /// on the logits in place; the PyTorch-native stacks call PyTorch's cross-entropy on
    /// logits upcast to fp32, as torchtitan does.
    pub fn fused_cross_entropy(&self) -> bool {
        self.fused_cross_entropy
            .unwrap_or(self.framework != Framework::Fsdp)
    }
}

fn is_zero(value: &f64) -> bool {
    *value == 0.0
}

fn is_false(value: &bool) -> bool {
    !value
}

/// Activation recomputation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Recompute {
    None,
    /// Re-run the attention core (scores, softmax, dropout, values) only.
    Selective,
    /// Re-run every layer's forward.
    Full,
    /// Full recompute of this many layers per pipeline stage, none for the rest.
    Partial {
        full_layers: u64,
    },
    /// Re-run the named modules of every layer (Megatron-LM's `--recompute-granularity
    /// selective --recompute-modules …`); more than the attention core alone, which is
    /// `Selective`.
    Modules(RecomputeModules),
}

impl Recompute {
    /// The recompute of `modules`: none for no module, `Selective` for the attention core
    /// alone, so that each choice has one spelling.
    pub fn of_modules(modules: RecomputeModules) -> Recompute {
        if modules == RecomputeModules::NONE {
            Recompute::None
        } else if modules == RecomputeModules::CORE_ATTN {
            Recompute::Selective
        } else {
            Recompute::Modules(modules)
        }
    }

    /// The modules re-run in layers that are not fully recomputed.
    pub fn modules(self) -> RecomputeModules {
        match self {
            Recompute::Selective => RecomputeModules::CORE_ATTN,
            Recompute::Modules(modules) => modules,
            Recompute::None | Recompute::Full | Recompute::Partial { .. } => RecomputeModules::NONE,
        }
    }
}

/// The spec language's spelling: `none`, `selective`, `full`, `{ full_layers = N }`,
/// `{ modules = [layernorm, moe_act] }`.
impl std::fmt::Display for Recompute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Recompute::None => f.write_str("none"),
            Recompute::Selective => f.write_str("selective"),
            Recompute::Full => f.write_str("full"),
            Recompute::Partial { full_layers } => write!(f, "{{ full_layers = {full_layers} }}"),
            Recompute::Modules(modules) => write!(f, "{{ modules = [{modules}] }}"),
        }
    }
}

/// A set of modules whose forward is re-run in backward, by Megatron-LM's names
/// (`--recompute-modules`, megatron/core/transformer/transformer_config.py).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecomputeModules(u8);

impl RecomputeModules {
    pub const NONE: RecomputeModules = RecomputeModules(0);
    /// Scores, softmax and values of attention.
    pub const CORE_ATTN: RecomputeModules = RecomputeModules(1);
    /// The two norms of each layer: their outputs are not kept.
    pub const LAYERNORM: RecomputeModules = RecomputeModules(2);
    /// The experts' activation function: its output, the down projection's input, is not kept.
    pub const MOE_ACT: RecomputeModules = RecomputeModules(4);
    /// Every module Tessel models.
    pub const ALL: RecomputeModules = RecomputeModules(
        RecomputeModules::CORE_ATTN.0 | RecomputeModules::LAYERNORM.0 | RecomputeModules::MOE_ACT.0,
    );
    /// Every module Tessel models, by name, in Megatron-LM's order.
    pub const NAMED: [(&'static str, RecomputeModules); 3] = [
        ("core_attn", RecomputeModules::CORE_ATTN),
        ("layernorm", RecomputeModules::LAYERNORM),
        ("moe_act", RecomputeModules::MOE_ACT),
    ];

    pub fn contains(self, other: RecomputeModules) -> bool {
        self.0 & other.0 == other.0
    }

    pub fn with(self, other: RecomputeModules) -> RecomputeModules {
        RecomputeModules(self.0 | other.0)
    }

    /// The modules of `self` that `other` lacks.
    pub fn without(self, other: RecomputeModules) -> RecomputeModules {
        RecomputeModules(self.0 & !other.0)
    }

    /// The names of the modules in the set, in Megatron-LM's order.
    pub fn names(self) -> impl Iterator<Item = &'static str> {
        Self::NAMED
            .into_iter()
            .filter(move |(_, module)| self.contains(*module))
            .map(|(name, _)| name)
    }

    pub fn by_name(name: &str) -> Option<RecomputeModules> {
        Self::NAMED
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, module)| *module)
    }
}

impl std::fmt::Display for RecomputeModules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.names().collect::<Vec<_>>().join(", "))
    }
}

/// Plan files list the modules by name.
impl Serialize for RecomputeModules {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.names())
    }
}

impl<'de> Deserialize<'de> for RecomputeModules {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let names = Vec::<String>::deserialize(deserializer)?;
        names.iter().try_fold(RecomputeModules::NONE, |set, name| {
            RecomputeModules::by_name(name)
                .map(|module| set.with(module))
                .ok_or_else(|| {
                    serde::de::Error::custom(format!(
                        "unknown recompute module `{name}` (known: {})",
                        RecomputeModules::ALL
                    ))
                })
        })
    }
}

/// Fractions of state moved to host memory, each in [0, 1].
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Offload {
    pub optimizer: f64,
    pub weights: f64,
    pub gradients: f64,
    pub activations: f64,
}

impl Offload {
    pub fn is_none(&self) -> bool {
        self.optimizer == 0.0
            && self.weights == 0.0
            && self.gradients == 0.0
            && self.activations == 0.0
    }
}

/// A fixed configuration (a `strategy` block). Degrees not written in the block default to 1,
/// except `dp`, which defaults to the cluster's GPUs divided by `tp·pp·cp`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Strategy {
    pub name: String,
    pub dp: u64,
    pub tp: u64,
    pub pp: u64,
    pub cp: u64,
    pub ep: u64,
    /// Tensor-parallel degree of the experts when it is not `tp` (Megatron-Core's MoE
    /// parallel folding, `--expert-tensor-parallel-size`): the experts' `etp · ep` ranks are
    /// drawn from the `tp · cp · dp` ranks of a pipeline stage together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etp: Option<u64>,
    /// Data-parallel ranks ZeRO shards state over when fewer than `dp` (hybrid sharding:
    /// FSDP's HSDP, Megatron-LM's `--num-distributed-optimizer-instances`, DeepSpeed's MiCS):
    /// `dp / dp_shard` replicas of `dp_shard`-way sharded state. `None` shards over all `dp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp_shard: Option<u64>,
    /// Sequences per micro-batch.
    pub microbatch: u64,
    /// Virtual pipeline chunks per device (1 = plain 1F1B).
    pub interleave: u64,
    pub recompute: Recompute,
    pub sequence_parallel: bool,
    /// ZeRO stage 0–3.
    pub zero: u8,
    pub offload: Offload,
    /// Layers per pipeline stage; `None` spreads them evenly.
    pub stages: Option<Vec<u64>>,
    /// Recompute of each pipeline stage (`pp` entries) when the stages differ; `None` applies
    /// `recompute` to every stage. When present, `recompute` holds the first stage's choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_recompute: Option<Vec<Recompute>>,
    /// Offload fractions of each pipeline stage when the stages differ, as `stage_recompute`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_offload: Option<Vec<Offload>>,
}

/// One device, no recompute, no ZeRO, no offload: the base that fixed configurations are
/// written against (`Strategy { tp: 8, ..Strategy::default() }`).
impl Default for Strategy {
    fn default() -> Self {
        Strategy {
            name: "default".to_string(),
            dp: 1,
            tp: 1,
            pp: 1,
            cp: 1,
            ep: 1,
            etp: None,
            dp_shard: None,
            microbatch: 1,
            interleave: 1,
            recompute: Recompute::None,
            sequence_parallel: false,
            zero: 0,
            offload: Offload::default(),
            stages: None,
            stage_recompute: None,
            stage_offload: None,
        }
    }
}

impl Strategy {
    /// The experts' tensor-parallel degree: `etp` when written, else `tp`.
    pub fn expert_tp(&self) -> u64 {
        self.etp.unwrap_or(self.tp)
    }

    /// The ZeRO stage as messages show it: `3`, or `3 over 8 of 64 data-parallel ranks`.
    pub fn zero_label(&self) -> String {
        zero_label(self.zero, self.dp, self.dp_shard)
    }

    /// The data-parallel ranks ZeRO shards over: `dp_shard` when written, else `dp`.
    pub fn shard_degree(&self) -> u64 {
        self.dp_shard.unwrap_or(self.dp)
    }

    /// Why `dp_shard` cannot split this strategy's data parallelism, if it cannot: it divides
    /// `dp`, shards something (`zero ≥ 1`), and holds whole expert shards (`ep·etp` divides
    /// `dp_shard·cp·tp`, the ranks a replica's experts are drawn from).
    pub fn hybrid_sharding_error(&self) -> Option<String> {
        let shard = self.dp_shard?;
        if shard == 0 || !self.dp.is_multiple_of(shard) {
            return Some(format!("dp_shard = {shard} must divide dp = {}", self.dp));
        }
        if shard < self.dp && self.zero == 0 {
            return Some(format!(
                "dp_shard = {shard} shards ZeRO state over part of the data-parallel ranks, but                  zero = 0 shards nothing"
            ));
        }
        let ranks = shard.saturating_mul(self.cp).saturating_mul(self.tp);
        let expert_ranks = self.ep.saturating_mul(self.expert_tp());
        (!ranks.is_multiple_of(expert_ranks)).then(|| {
            format!(
                "ep·etp = {}·{} must divide dp_shard·cp·tp = {shard}·{}·{} = {ranks}: a                  replica's experts come from its own ranks",
                self.ep,
                self.expert_tp(),
                self.cp,
                self.tp
            )
        })
    }

    /// Why the experts cannot be laid out as written on `model`, if they cannot: `ep` must
    /// divide the experts, and unfolded (`etp = tp`) it takes its ranks from `dp·cp`; folded
    /// (`etp` dividing `tp` and below it, Megatron-Core's MoE parallel folding) `etp·ep` ranks
    /// come from the `tp·cp·dp` ranks of a pipeline stage, with sequence parallelism.
    pub fn expert_layout_error(&self, model: &ModelSpec) -> Option<String> {
        let Some(moe) = &model.moe else {
            return if self.ep > 1 {
                Some(format!("ep = {} needs a mixture-of-experts model", self.ep))
            } else if self.etp.is_some() {
                Some("etp needs a mixture-of-experts model".to_string())
            } else {
                None
            };
        };
        if self.ep == 0 || !moe.experts.is_multiple_of(self.ep) {
            return Some(format!(
                "ep = {} must divide the {} experts",
                self.ep, moe.experts
            ));
        }
        let etp = self.expert_tp();
        let data_ranks = self.dp.saturating_mul(self.cp);
        if etp == self.tp {
            return (!data_ranks.is_multiple_of(self.ep)).then(|| {
                format!(
                    "ep = {} must divide dp·cp = {data_ranks} (or fold the experts over tp \
                     with etp below tp)",
                    self.ep
                )
            });
        }
        if etp == 0 || etp > self.tp || !self.tp.is_multiple_of(etp) {
            return Some(format!("etp = {etp} must divide tp = {}", self.tp));
        }
        let ranks = data_ranks.saturating_mul(self.tp);
        let expert_ranks = self.ep.saturating_mul(etp);
        if !ranks.is_multiple_of(expert_ranks) {
            return Some(format!(
                "etp·ep = {etp}·{} = {expert_ranks} must divide tp·cp·dp = {ranks}",
                self.ep
            ));
        }
        if self.tp > 1 && !self.sequence_parallel {
            return Some(
                "folded experts (etp below tp) need sequence parallelism, as Megatron-Core's \
                 MoE layers do"
                    .to_string(),
            );
        }
        None
    }

    /// The recompute choice of pipeline stage `stage`.
    pub fn recompute_of(&self, stage: u64) -> Recompute {
        self.stage_recompute
            .as_ref()
            .and_then(|per_stage| per_stage.get(stage as usize).copied())
            .unwrap_or(self.recompute)
    }

    /// The offload fractions of pipeline stage `stage`.
    pub fn offload_of(&self, stage: u64) -> Offload {
        self.stage_offload
            .as_ref()
            .and_then(|per_stage| per_stage.get(stage as usize).copied())
            .unwrap_or(self.offload)
    }

    /// Sets every stage's recompute and offload, keeping the per-stage lists only when the
    /// stages differ (so a uniform choice reads, prints and serialises as before).
    pub fn set_stage_options(&mut self, recompute: Vec<Recompute>, offload: Vec<Offload>) {
        if let Some(&first) = recompute.first() {
            self.recompute = first;
        }
        if let Some(&first) = offload.first() {
            self.offload = first;
        }
        let uniform_recompute = recompute.iter().all(|r| *r == self.recompute);
        let uniform_offload = offload.iter().all(|o| *o == self.offload);
        self.stage_recompute = (!uniform_recompute).then_some(recompute);
        self.stage_offload = (!uniform_offload).then_some(offload);
    }
}

/// A ZeRO stage and its sharding group, as messages show it: `3`, or under hybrid sharding
/// `3 over 8 of 64 data-parallel ranks`.
pub fn zero_label(zero: u8, dp: u64, dp_shard: Option<u64>) -> String {
    match dp_shard {
        Some(shard) if shard != dp => format!("{zero} over {shard} of {dp} data-parallel ranks"),
        _ => zero.to_string(),
    }
}

/// One search dimension: the planner's own candidates, or an explicit list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Choice<T> {
    Auto,
    Values(Vec<T>),
}

impl<T> Choice<T> {
    pub fn auto() -> Choice<T> {
        Choice::Auto
    }

    pub fn is_auto(&self) -> bool {
        matches!(self, Choice::Auto)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Objective {
    Throughput,
}

/// The `search` block. A spec without one searches every key `auto`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SearchSpace {
    pub dp: Choice<u64>,
    pub tp: Choice<u64>,
    pub pp: Choice<u64>,
    pub cp: Choice<u64>,
    pub ep: Choice<u64>,
    /// The experts' tensor-parallel degree (below `tp`: folded experts). Absent from files
    /// while `auto`, as in those written before it.
    #[serde(default = "Choice::auto", skip_serializing_if = "Choice::is_auto")]
    pub etp: Choice<u64>,
    /// The data-parallel ranks ZeRO shards over (below `dp`: hybrid sharding), as `etp`.
    #[serde(default = "Choice::auto", skip_serializing_if = "Choice::is_auto")]
    pub dp_shard: Choice<u64>,
    pub microbatch: Choice<u64>,
    pub interleave: Choice<u64>,
    pub recompute: Choice<Recompute>,
    pub sequence_parallel: Choice<bool>,
    pub zero: Choice<u8>,
    pub offload: Choice<Offload>,
    pub objective: Objective,
    /// Fraction of each GPU's memory a plan may use.
    pub memory_limit: f64,
    /// Wall-clock limit of the search in seconds.
    pub time_limit: Option<f64>,
    /// Runners-up to keep.
    pub top: Option<u64>,
}

impl Default for SearchSpace {
    fn default() -> Self {
        SearchSpace {
            dp: Choice::Auto,
            tp: Choice::Auto,
            pp: Choice::Auto,
            cp: Choice::Auto,
            ep: Choice::Auto,
            etp: Choice::Auto,
            dp_shard: Choice::Auto,
            microbatch: Choice::Auto,
            interleave: Choice::Auto,
            recompute: Choice::Auto,
            sequence_parallel: Choice::Auto,
            zero: Choice::Auto,
            offload: Choice::Auto,
            objective: Objective::Throughput,
            memory_limit: 0.95,
            time_limit: None,
            top: None,
        }
    }
}

/// A whole resolved serving spec: the model and cluster named by the `serve` block and the
/// job itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServingSpec {
    pub model: ModelSpec,
    pub cluster: ClusterSpec,
    pub serve: ServeSpec,
}

/// What a spec file asks for: a training job or a serving one.
#[derive(Clone, Debug, PartialEq)]
pub enum Job {
    Train(Box<Spec>),
    Serve(Box<ServingSpec>),
}

/// The `serve` block: how requests arrive and what latency they must see.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServeSpec {
    /// Weights and activations.
    pub precision: Precision,
    /// The KV cache's elements (`kv_precision`); the weights' precision unless set.
    pub kv_precision: Precision,
    pub workload: Workload,
    pub slo: Slo,
    /// Which deployments the planner may choose.
    pub deployment: DeploymentChoice,
    /// The engine the plan is written for and exported to.
    pub engine: ServingEngine,
}

/// Requests: their rate and lengths, drawn from distributions or read from a trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// Requests per second; with a trace, its arrivals are rescaled to this mean rate, and
    /// without one the trace's own rate holds.
    pub rate: Option<f64>,
    pub prompt: LengthDistribution,
    pub output: LengthDistribution,
    /// Requests each simulation replays.
    pub requests: u64,
    /// Seeds arrivals and lengths: the same seed, the same requests.
    pub seed: u64,
    /// A file of requests (`trace = "requests.csv"`) in place of the distributions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceFile>,
}

/// Token counts of a prompt or an output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LengthDistribution {
    pub mean: f64,
    /// Longer draws are cut to `max`; the model's context cuts them anyway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u64>,
    pub shape: LengthShape,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LengthShape {
    /// Every request the mean.
    Fixed,
    /// Uniform on `[1, 2·mean − 1]`.
    Uniform,
    /// Exponential with the mean: many short requests, a long tail (chat traces' shape).
    Exponential,
}

impl LengthShape {
    pub const ALL: [LengthShape; 3] = [
        LengthShape::Fixed,
        LengthShape::Uniform,
        LengthShape::Exponential,
    ];

    pub fn name(self) -> &'static str {
        match self {
            LengthShape::Fixed => "fixed",
            LengthShape::Uniform => "uniform",
            LengthShape::Exponential => "exponential",
        }
    }
}

/// A request file the spec names, read by `tessel-interop` (its format is foreign).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceFile {
    /// As the spec writes it, relative to the spec.
    pub path: String,
    /// Where it was read from.
    #[serde(skip)]
    pub resolved: std::path::PathBuf,
    /// SHA-256 of its bytes, hex: a changed trace is a changed spec.
    pub digest: String,
}

/// One request of a workload.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Seconds from the first request.
    pub arrival: f64,
    pub prompt: u64,
    pub output: u64,
}

/// Latency targets and the fraction of requests that must meet both.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    /// Time to first token, seconds.
    pub ttft: f64,
    /// Time per output token after the first, seconds.
    pub tpot: f64,
    pub attainment: f64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeploymentChoice {
    /// Colocated and disaggregated deployments, the better kept.
    #[default]
    Auto,
    /// Each instance runs prefill and decode (vLLM's, SGLang's default).
    Colocated,
    /// Prefill and decode on instances of their own, the KV cache sent between (DistServe).
    Disaggregated,
}

impl DeploymentChoice {
    pub const ALL: [DeploymentChoice; 3] = [
        DeploymentChoice::Auto,
        DeploymentChoice::Colocated,
        DeploymentChoice::Disaggregated,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DeploymentChoice::Auto => "auto",
            DeploymentChoice::Colocated => "colocated",
            DeploymentChoice::Disaggregated => "disaggregated",
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServingEngine {
    #[default]
    Vllm,
    Sglang,
}

impl ServingEngine {
    pub const ALL: [ServingEngine; 2] = [ServingEngine::Vllm, ServingEngine::Sglang];

    pub fn name(self) -> &'static str {
        match self {
            ServingEngine::Vllm => "vllm",
            ServingEngine::Sglang => "sglang",
        }
    }
}
