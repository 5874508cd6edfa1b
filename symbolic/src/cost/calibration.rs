//! Calibratable parameters of the cost model: how far below peak each GPU generation runs, how
//! much of a link's bandwidth collectives reach, what overlaps, and fixed memory overheads.
//!
//! The parameters below were fitted offline (`cargo run --release -p tessel-symbolic --example
//! calibrate`) by a coordinate search inside physically plausible ranges, on every published
//! source with complete configurations, each source weighing the same, with Korthikanti et
//! al.'s Table 5 target as an extra term, starting from round priors and from the committed
//! values and keeping the better fit. Fitted (20 for throughput): Ampere, Volta and Hopper
//! bf16 `matmul`, Hopper `fp8_matmul`, the half-efficiency GEMM dimension (one value; Volta
//! shares Ampere's, Hopper keeps its prior ratio 160/132.9 to it), Ampere and Hopper
//! `attention`, Hopper `native_attention` (Ampere's is its `attention`), Ampere (shared by
//! Volta) and Hopper `memory`, Ada `matmul` (the L4, whose
//! 72 W limit holds it far below its boost-clock peak), the two NCCL efficiencies,
//! `dp_overlap`, `zero3_overlap`, `pp_exposed`, `layer_overhead_s`, `deepspeed_kernels`,
//! `fp8_rowwise_matmul` (torchtitan's row-wise float8 runs are its only data) and
//! `misaligned_matmul` (BLOOM's sweeps over head counts are its only data); then the memory
//! overheads (CUDA context, NCCL buffers, fragmentation, logits bytes, the allocator's cache
//! in reserved readings) against the measured memory, penalising completed runs predicted not
//! to fit. Leave-one-source-out
//! cross-validation of the same procedure, and which parameters sit on their bounds, are in
//! `docs/VALIDATION.md`. Everything not named here (Ada's other fractions, unknown GPUs, `tp_overlap`,
//! `ep_overlap`, optimizer bytes) is a prior.

use tessel_grammar::{Framework, GpuSpec};

/// GPU generations that share kernel behaviour (tensor-core shapes, memory system).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuGeneration {
    Volta,
    Ampere,
    Ada,
    Hopper,
    Other,
}

impl GpuGeneration {
    /// Recognises the generation from the GPU's name (catalog names such as `a100_80gb`,
    /// `H100-SXM`, `V100`, `L4`).
    pub fn from_name(name: &str) -> GpuGeneration {
        let lower = name.to_ascii_lowercase();
        let has = |needle: &str| lower.contains(needle);
        if has("h100") || has("h200") || has("h800") || has("gh200") {
            GpuGeneration::Hopper
        } else if has("a100") || has("a800") || has("a10") || has("a30") || has("a40") {
            GpuGeneration::Ampere
        } else if has("v100") {
            GpuGeneration::Volta
        } else if has("l4") || has("l40") || has("4090") {
            GpuGeneration::Ada
        } else {
            GpuGeneration::Other
        }
    }
}

/// Achievable fractions of peak for one GPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KernelEfficiency {
    /// Fraction of dense peak a large matmul reaches.
    pub matmul: f64,
    /// A GEMM whose smallest dimension is `n` runs at `matmul · n / (n + matmul_half_dim)`:
    /// skinny GEMMs (small hidden sizes, tensor-parallel shards, per-head batched matmuls)
    /// under-fill the tensor cores and waves.
    pub matmul_half_dim: f64,
    /// Fraction of the fp8 peak a large fp8 matmul reaches (scaling and casts keep it below
    /// the bf16 fraction).
    pub fp8_matmul: f64,
    /// Fraction of the bf16/fp16 peak the fused (flash) attention kernel reaches: flash-attention
    /// 2's, which the PyTorch-native stacks (SDPA) and DeepSpeed run.
    pub attention: f64,
    /// The same for the fused attention Transformer Engine runs under Megatron-LM (cuDNN's):
    /// on Hopper written for its asynchronous tensor-core instructions (`wgmma`, TMA), which
    /// flash-attention 2's Ampere-era kernels do not use (Shah et al. 2024, FlashAttention-3,
    /// arXiv 2407.08608: 1.5–2× flash-attention 2 on H100); elsewhere the two kernels are of a
    /// kind and share `attention`.
    pub native_attention: f64,
    /// Fraction of HBM bandwidth memory-bound kernels reach.
    pub memory: f64,
}

impl KernelEfficiency {
    /// Defaults per generation, overridden by the spec's `GpuSpec.efficiency`.
    pub fn for_gpu(gpu: &GpuSpec) -> KernelEfficiency {
        let base = match GpuGeneration::from_name(&gpu.name) {
            GpuGeneration::Volta => KernelEfficiency {
                matmul: 0.8025,
                matmul_half_dim: 102.37,
                fp8_matmul: 0.6,
                attention: 0.40,
                native_attention: 0.40,
                memory: 0.6586,
            },
            GpuGeneration::Ampere => KernelEfficiency {
                matmul: 0.7725,
                matmul_half_dim: 102.37,
                fp8_matmul: 0.6,
                attention: 0.2767,
                native_attention: 0.2767,
                memory: 0.6586,
            },
            GpuGeneration::Ada => KernelEfficiency {
                matmul: 0.6375,
                matmul_half_dim: 110.0,
                fp8_matmul: 0.6,
                attention: 0.50,
                native_attention: 0.50,
                memory: 0.70,
            },
            GpuGeneration::Hopper => KernelEfficiency {
                matmul: 0.6283,
                matmul_half_dim: 123.24,
                fp8_matmul: 0.6886,
                attention: 0.1777,
                native_attention: 0.3870,
                memory: 0.40,
            },
            GpuGeneration::Other => KernelEfficiency {
                matmul: 0.75,
                matmul_half_dim: 128.0,
                fp8_matmul: 0.6,
                attention: 0.45,
                native_attention: 0.45,
                memory: 0.65,
            },
        };
        KernelEfficiency {
            matmul: gpu.efficiency.matmul.unwrap_or(base.matmul),
            attention: gpu.efficiency.attention.unwrap_or(base.attention),
            native_attention: gpu.efficiency.attention.unwrap_or(base.native_attention),
            memory: gpu.efficiency.memory.unwrap_or(base.memory),
            ..base
        }
    }

    /// The fractions the given training software reaches. The per-GPU fractions describe
    /// Megatron-LM's kernels, whose attention is Transformer Engine's (`native_attention`);
    /// the other stacks run flash-attention 2 (`attention`). DeepSpeed's kernels
    /// (Megatron-DeepSpeed's, its pipeline engine's host overheads) run at the calibrated
    /// fraction `deepspeed_kernels` of them, every kernel class alike. The FSDP stacks get no
    /// factor of their own: fitted, it came out at 0.97, and with all DeepSpeed runs on A100s
    /// it cannot be told apart from the GPU's fractions.
    pub fn for_framework(self, framework: Framework, cal: &Calibration) -> KernelEfficiency {
        let factor = match framework {
            Framework::Megatron | Framework::Fsdp => 1.0,
            Framework::Deepspeed => cal.deepspeed_kernels,
        };
        let attention = match framework {
            Framework::Megatron => self.native_attention,
            Framework::Deepspeed | Framework::Fsdp => self.attention,
        };
        KernelEfficiency {
            matmul: self.matmul * factor,
            fp8_matmul: self.fp8_matmul * factor,
            attention: attention * factor,
            memory: self.memory * factor,
            ..self
        }
    }
}

/// Parameters that do not depend on the GPU generation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Calibration {
    /// Fraction of the intra-node link's bandwidth a ring collective reaches (NCCL bus
    /// bandwidth over the link rate).
    pub intra_node_comm_efficiency: f64,
    /// The same for a collective that crosses nodes.
    pub inter_node_comm_efficiency: f64,
    /// Fraction of tensor-parallel communication hidden behind compute (0 for Megatron's
    /// synchronous collectives).
    pub tp_overlap: f64,
    /// Fraction of one micro-batch's backward that data-parallel gradient reduction can hide
    /// behind (bucketed reduction starts while the last backward runs).
    pub dp_overlap: f64,
    /// Fraction of a micro-batch's compute behind which ZeRO-3 gathers and reduce-scatters can
    /// hide (prefetching one layer ahead).
    pub zero3_overlap: f64,
    /// Fraction of pipeline point-to-point time that stays exposed.
    pub pp_exposed: f64,
    /// Fraction of expert-parallel all-to-all time hidden behind compute.
    pub ep_overlap: f64,
    /// Fixed time per layer and micro-batch pass (kernel launches, synchronisation), seconds.
    pub layer_overhead_s: f64,
    /// Throughput of DeepSpeed's kernels relative to Megatron-LM's (see
    /// [`KernelEfficiency::for_framework`]).
    pub deepspeed_kernels: f64,
    /// Throughput of row-scaled FP8 GEMMs relative to tensor-scaled ones (`fp8_matmul`):
    /// the scale vectors are applied in the kernel's epilogue, and the kernels are newer and
    /// less tuned than cuBLAS's tensor-scaled path.
    pub fp8_rowwise_matmul: f64,
    /// Throughput of a GEMM whose operands are not aligned to 16 bytes (attention heads whose
    /// width times the element size is not a multiple of 16) relative to an aligned one.
    pub misaligned_matmul: f64,
    /// Bytes of HBM the optimizer step touches per locally held parameter (Adam: read fp32
    /// grad 4, read+write master 8, two moments 16, write the bf16 copy 2, clip/zero 4).
    pub adam_bytes_per_param: f64,
    /// The same for SGD with momentum.
    pub sgd_bytes_per_param: f64,
    /// CUDA context and framework allocations outside the caching allocator, bytes.
    pub cuda_context_bytes: f64,
    /// Communication buffers (NCCL channels, gradient buckets), bytes.
    pub comm_buffer_bytes: f64,
    /// Allocator fragmentation the job needs room for, as a fraction of the memory allocated
    /// and freed every micro-batch (the states sit in flat buffers allocated once).
    pub fragmentation: f64,
    /// Freed blocks the caching allocator keeps reserved while the device has room, as a
    /// fraction of the memory allocated and freed every micro-batch. Reserved-memory readings
    /// (nvidia-smi, `max_memory_reserved`) include it; it is released under memory pressure, so
    /// it does not decide whether a job fits. Only the validation's reserved measures use it.
    pub allocator_cache: f64,
    /// Bytes per logits element alive at a fused cross-entropy: the bf16 logits and the fp32
    /// softmax kept for backward (an unfused one holds 12, see `cost::memory`).
    pub logits_bytes_per_element: f64,
}

impl Default for Calibration {
    fn default() -> Self {
        Calibration {
            intra_node_comm_efficiency: 0.8817,
            inter_node_comm_efficiency: 0.9138,
            tp_overlap: 0.0,
            dp_overlap: 0.0,
            zero3_overlap: 0.5430,
            pp_exposed: 0.1058,
            ep_overlap: 0.0,
            layer_overhead_s: 100.0e-6,
            deepspeed_kernels: 0.8245,
            fp8_rowwise_matmul: 0.4694,
            misaligned_matmul: 0.1072,
            adam_bytes_per_param: 34.0,
            sgd_bytes_per_param: 22.0,
            cuda_context_bytes: 0.6557e9,
            comm_buffer_bytes: 3.0e9,
            fragmentation: 0.03,
            allocator_cache: 0.1768,
            logits_bytes_per_element: 6.18,
        }
    }
}
