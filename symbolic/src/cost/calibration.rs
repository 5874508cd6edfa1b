//! Calibratable parameters of the cost model: how far below peak each GPU generation runs in a
//! training step, the NCCL primitive's parameters, and fixed memory overheads.
//!
//! NCCL's (`Calibration::collectives`) are fitted on nccl-tests measurements
//! (`primitives::fit`), never on training runs. The rest were fitted offline (`cargo run
//! --release -p tessel-symbolic --example calibrate`) by a coordinate search inside physically
//! plausible ranges, on every published source with complete configurations, each source
//! weighing the same, with Korthikanti et al.'s Table 5 target as an extra term, starting from
//! round priors and from the committed values and keeping the better fit. Fitted (5 for
//! throughput): Ampere (shared by Volta, whose GEMMs are costed with Ampere's primitive) and
//! Hopper `matmul` (the level of a large GEMM's rate in a step; shapes are the GEMM
//! primitive's, the attention outside Megatron-LM runs at the same fraction of its own
//! benchmarks, [`KernelEfficiency::sustained_fraction`], and FP8 GEMMs at the primitive's
//! measured FP8 speedup over it, [`KernelEfficiency::fp8_matmul`]), Ampere's
//! `memory` of the fused stacks (shared by Volta; Hopper's, and every generation's under eager
//! PyTorch, is measured, [`EAGER_ELEMENTWISE`]),
//! `deepspeed_kernels` and `misaligned_matmul` (BLOOM's sweeps over head counts are its only data); then the
//! memory overheads (CUDA context, NCCL buffers,
//! fragmentation, logits bytes, the allocator's cache in reserved readings) against the
//! measured memory, penalising completed runs predicted not to fit. What overlaps is
//! configuration (`train.overlap`), not a parameter; pipeline sends are on the critical path
//! (fitted while they were a parameter, their exposed fraction came out at 1, its bound); the
//! fixed time per layer pass is the GEMM primitive's launch time (fitted beside it, the
//! separate `layer_overhead_s` came out at 0, its bound), and is fitted only on a cluster's own
//! traced steps (`tessel calibrate`). The held-out errors (one source, one GPU
//! generation or the large runs left out) and every parameter with its range and bound are in
//! `docs/VALIDATION.md`. Everything not named here (Ada's fractions, unknown GPUs,
//! `ep_overlap`, optimizer bytes) is a prior.

use tessel_grammar::{Framework, GpuSpec, NormKernel, NormKind, PeakCompute, TrainSpec};

use crate::primitives::{
    fp8_speedup, AttentionKernel, AttentionParams, CollectiveParams, GemmParams, COMPOSITE_RMSNORM,
    EAGER_ELEMENTWISE, FP8_ROWWISE_RATE,
};

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
    pub const ALL: [GpuGeneration; 5] = [
        GpuGeneration::Volta,
        GpuGeneration::Ampere,
        GpuGeneration::Ada,
        GpuGeneration::Hopper,
        GpuGeneration::Other,
    ];

    /// The lower-case name tables and files use (`hopper`).
    pub fn name(self) -> &'static str {
        match self {
            GpuGeneration::Volta => "volta",
            GpuGeneration::Ampere => "ampere",
            GpuGeneration::Ada => "ada",
            GpuGeneration::Hopper => "hopper",
            GpuGeneration::Other => "other",
        }
    }

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

/// How fast a fused (flash) attention kernel runs in a training step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum AttentionRate {
    /// The attention primitive of the kernel on the GPU's generation, fitted on attention
    /// microbenchmarks: its rate by sequence length, head width and mask, its backward at the
    /// primitive's ratio to the forward. No training run refits it.
    Kernel(AttentionParams),
    /// A fraction of peak, forward and backward alike (a spec's `efficiency.attention`).
    Flat(f64),
}

impl AttentionRate {
    fn scaled(self, factor: f64) -> AttentionRate {
        match self {
            AttentionRate::Kernel(params) => AttentionRate::Kernel(AttentionParams {
                efficiency: params.efficiency * factor,
                ..params
            }),
            AttentionRate::Flat(fraction) => AttentionRate::Flat(fraction * factor),
        }
    }
}

/// Achievable fractions of peak for one GPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KernelEfficiency {
    /// Fraction of dense peak a large GEMM sustains in a training step (the GEMM primitive's
    /// main-loop rate); how a given shape falls below it (tiles, waves, short `k`) is the
    /// primitive's, calibrated on GEMM microbenchmarks.
    pub matmul: f64,
    /// The fused attention: flash-attention 2's primitive on this GPU until
    /// [`KernelEfficiency::for_training`] picks the kernel the training software runs, or the
    /// spec's flat fraction.
    pub attention: AttentionRate,
    /// Fraction of HBM bandwidth memory-bound kernels reach.
    pub memory: f64,
    /// Whether `memory` was given (the spec's `efficiency.memory` or a cluster's calibration)
    /// rather than the generation's default, which `for_training` replaces for eager stacks.
    pub memory_given: bool,
    /// The GPU's generation, whose attention primitive `for_training` looks up.
    pub generation: GpuGeneration,
}

impl KernelEfficiency {
    /// The fraction of its microbenchmarked rate a tensor-core kernel sustains in a training
    /// step on this GPU: the step's GEMM level over the GEMM primitive's level fitted on
    /// microbenchmarks (the cluster's own when `tessel calibrate` measured it). Benchmarks run
    /// for milliseconds; a step runs for seconds at the clocks and power the GPU holds under
    /// sustained load, and every kernel of the step runs under them.
    pub fn sustained_fraction(&self, cal: &Calibration) -> f64 {
        (self.matmul / cal.gemm_for(self.generation).efficiency).min(1.0)
    }

    /// Fraction of the fp8 peak a large FP8 GEMM with one scale per tensor sustains in a step:
    /// the bf16 `matmul` level at the GEMM primitive's measured FP8 speedup
    /// ([`fp8_speedup`]), so the step's clocks and power weigh on both alike. 0 on a GPU
    /// without fp8 tensor cores.
    pub fn fp8_matmul(&self, peak: &PeakCompute) -> f64 {
        if peak.fp8 > 0.0 {
            self.matmul * fp8_speedup(self.generation) * peak.bf16 / peak.fp8
        } else {
            0.0
        }
    }

    /// The memory-bound passes' fraction under the given training software. The PyTorch-native
    /// stacks (`fsdp`: torchtitan, llm-foundry) run eager kernels unless compiled, at
    /// [`EAGER_ELEMENTWISE`] on every GPU: the fraction is the kernels' (Liger-Kernel's
    /// LayerNorm timings reach the same fraction on A100 and H100). The generations' defaults
    /// describe the fused kernels of Megatron-LM, DeepSpeed and Tessel's runtime. A fraction the
    /// spec or a cluster's calibration gives is kept.
    fn memory_in_step(&self, train: &TrainSpec) -> f64 {
        if self.runs_eager(train) {
            EAGER_ELEMENTWISE
        } else {
            self.memory
        }
    }

    /// Whether the training software runs PyTorch's eager kernels at their measured fractions:
    /// the PyTorch-native stacks uncompiled, unless the spec or a calibration gave the memory
    /// fraction of the cluster's own kernels.
    fn runs_eager(&self, train: &TrainSpec) -> bool {
        train.framework == Framework::Fsdp && !train.compile && !self.memory_given
    }

    /// The norms' fraction of HBM bandwidth in a step. Float32 operators
    /// (`train.norm_kernel = composite`) run at [`COMPOSITE_RMSNORM`], measured at 5.3 times
    /// the time of a fused norm; a fused kernel at the step's memory-bound fraction (`in_step`,
    /// from [`KernelEfficiency::for_training`]). Unless the spec says, an eager stack's RMSNorm
    /// is float32 operators (torchtitan's Llama and Hugging Face's, the published eager runs')
    /// and every other norm a fused kernel.
    pub fn norm_in_step(
        &self,
        train: &TrainSpec,
        norm: NormKind,
        in_step: &KernelEfficiency,
    ) -> f64 {
        let composite = match train.norm_kernel {
            Some(kernel) => kernel == NormKernel::Composite,
            None => norm == NormKind::Rmsnorm && self.runs_eager(train),
        };
        if composite {
            COMPOSITE_RMSNORM
        } else {
            in_step.memory
        }
    }

    /// Defaults per generation, overridden by the spec's `GpuSpec.efficiency`.
    pub fn for_gpu(gpu: &GpuSpec) -> KernelEfficiency {
        let generation = GpuGeneration::from_name(&gpu.name);
        let (matmul, memory) = match generation {
            GpuGeneration::Volta | GpuGeneration::Ampere => (0.8196, 0.8229),
            // Ada (L4, L40S) has no fit of its own: Mist's two L4 runs are too few to identify
            // a level, so it keeps the round prior every held-out generation starts from.
            GpuGeneration::Ada => (0.75, 0.70),
            GpuGeneration::Hopper => (0.6799, EAGER_ELEMENTWISE),
            GpuGeneration::Other => (0.75, 0.65),
        };
        let attention = match gpu.efficiency.attention {
            Some(fraction) => AttentionRate::Flat(fraction),
            None => AttentionRate::Kernel(AttentionParams::for_kernel(
                generation,
                AttentionKernel::Flash2,
            )),
        };
        KernelEfficiency {
            matmul: gpu.efficiency.matmul.unwrap_or(matmul),
            attention,
            memory: gpu.efficiency.memory.unwrap_or(memory),
            memory_given: gpu.efficiency.memory.is_some(),
            generation,
        }
    }

    /// The fractions the given training software reaches. The per-GPU fractions describe
    /// Megatron-LM's kernels. Its attention is Transformer Engine's (cuDNN's fused kernel),
    /// costed at its microbenchmarked rate; the other stacks run flash-attention 2 unless the
    /// spec names another kernel (`train.attention_kernel`), at the fraction of the kernel's
    /// benchmarked rate that the step's GEMMs sustain of theirs
    /// ([`KernelEfficiency::sustained_fraction`]). Transformer Engine's attention keeps its
    /// benchmarked rate: scaled alike, it made NeMo's rows slower than measured (5.6 → 6.0 %)
    /// and the Llama 3 405B regime's bias +8.7 → +14.5 %. DeepSpeed's kernels
    /// (Megatron-DeepSpeed's, its pipeline engine's host overheads) run at the calibrated
    /// fraction `deepspeed_kernels` of them, every kernel class alike. The FSDP stacks get no
    /// factor of their own: fitted, it came out at 0.97, and with all DeepSpeed runs on A100s
    /// it cannot be told apart from the GPU's fractions.
    pub fn for_training(self, train: &TrainSpec, cal: &Calibration) -> KernelEfficiency {
        let factor = match train.framework {
            Framework::Megatron | Framework::MegatronFsdp | Framework::Fsdp | Framework::Tessel => {
                1.0
            }
            Framework::Deepspeed => cal.deepspeed_kernels,
        };
        let attention = match self.attention {
            AttentionRate::Flat(_) => self.attention,
            AttentionRate::Kernel(_) => {
                let (default, in_step) = match train.framework {
                    Framework::Megatron | Framework::MegatronFsdp => (AttentionKernel::Cudnn, 1.0),
                    Framework::Deepspeed | Framework::Fsdp | Framework::Tessel => {
                        (AttentionKernel::Flash2, self.sustained_fraction(cal))
                    }
                };
                let kernel = train.attention_kernel.unwrap_or(default);
                AttentionRate::Kernel(AttentionParams::for_kernel(self.generation, kernel))
                    .scaled(in_step)
            }
        };
        KernelEfficiency {
            matmul: self.matmul * factor,
            attention: attention.scaled(factor),
            memory: self.memory_in_step(train) * factor,
            ..self
        }
    }
}

/// What a step's compute costs on one cluster's devices, fitted on its traced steps
/// (`calibration::fit_cluster_compute`).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComputeParams {
    /// Fraction of dense peak a large GEMM's main loop reaches ([`KernelEfficiency::matmul`]).
    pub matmul: f64,
    /// Fraction of memory bandwidth the elementwise passes and the optimizer reach
    /// ([`KernelEfficiency::memory`]).
    pub memory: f64,
    /// Fixed time per layer and micro-batch pass, seconds ([`Calibration::layer_overhead_s`]).
    pub layer_overhead_s: f64,
    /// How much one rank's compute varies, independently of the other ranks', over its mean
    /// (a coefficient of variation): measured on traced steps, not fitted; every
    /// synchronisation waits for the slowest rank (`cost::stragglers`). 0 when not measured.
    #[serde(default)]
    pub jitter: f64,
}

impl KernelEfficiency {
    /// These fractions with a cluster calibration's compute in place of the GPU's.
    pub fn calibrated(self, cal: &Calibration) -> KernelEfficiency {
        match cal.compute {
            None => self,
            Some(compute) => KernelEfficiency {
                matmul: compute.matmul,
                memory: compute.memory,
                memory_given: true,
                ..self
            },
        }
    }
}

/// Parameters that do not depend on the GPU generation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Calibration {
    /// NCCL's collectives: per-call and per-step latency, bus bandwidth over link rate.
    /// Calibrated on nccl-tests measurements (`primitives::fit`), not on training runs.
    pub collectives: CollectiveParams,
    /// The GEMM primitive measured on the cluster's own GPUs (`tessel calibrate`); `None`: the
    /// committed fit for the GPU's generation.
    pub gemm: Option<GemmParams>,
    /// The step's compute fitted on traced training steps of the cluster's own devices
    /// (`tessel calibrate` on `tessel launch --trace` files); `None`: the GPU's fractions and
    /// the committed `layer_overhead_s`.
    pub compute: Option<ComputeParams>,
    /// Fraction of expert-parallel all-to-all time hidden behind compute.
    pub ep_overlap: f64,
    /// Fixed time per layer and micro-batch pass (kernel launches, synchronisation), seconds.
    pub layer_overhead_s: f64,
    /// Throughput of DeepSpeed's kernels relative to Megatron-LM's (see
    /// [`KernelEfficiency::for_training`]).
    pub deepspeed_kernels: f64,
    /// Throughput of row-scaled FP8 GEMMs relative to tensor-scaled ones (`fp8_matmul`), the
    /// scale vectors applied in the kernel's epilogue: measured, [`FP8_ROWWISE_RATE`].
    pub fp8_rowwise_matmul: f64,
    /// Throughput of a GEMM whose operands are not aligned to 16 bytes (attention heads whose
    /// width times the element size is not a multiple of 16) relative to an aligned one.
    pub misaligned_matmul: f64,
    /// Bytes of HBM the optimizer step touches per locally held parameter (Adam: read fp32
    /// grad 4, read+write master 8, two moments 16, write the bf16 copy 2, clip/zero 4).
    pub adam_bytes_per_param: f64,
    /// The same for SGD with momentum.
    pub sgd_bytes_per_param: f64,
    /// Device memory a process holds outside PyTorch's caching allocator, bytes: the CUDA
    /// context with its loaded kernels, library workspaces, and NCCL's buffers (per
    /// communicator, linear in its channels: NVIDIA/nccl#864 and #964 measure 0.5–1.6 GB for
    /// one). One parameter, since every published reading sees only their sum (nvidia-smi
    /// less the allocator's reserved bytes).
    pub outside_allocator_bytes: f64,
    /// Allocator fragmentation the job needs room for, as a fraction of the memory allocated
    /// and freed every micro-batch (the states sit in flat buffers allocated once).
    pub fragmentation: f64,
    /// Freed blocks the caching allocator keeps reserved while the device has room, as a
    /// fraction of the memory allocated and freed every micro-batch. Reserved-memory readings
    /// (nvidia-smi, `max_memory_reserved`) include it; it is released under memory pressure, so
    /// it does not decide whether a job fits. Only the validation's reserved measures use it.
    pub allocator_cache: f64,
}

impl Calibration {
    /// The committed calibration, with the collective and GEMM parameters of the cluster's
    /// calibration file (`cluster { calibration = "…" }`, written by `tessel calibrate`) when it
    /// has one.
    pub fn for_spec(spec: &tessel_grammar::Spec) -> Result<Calibration, super::CostError> {
        let mut calibration = Calibration::default();
        let Some(file) = &spec.cluster.calibration else {
            return Ok(calibration);
        };
        fn read<T: serde::de::DeserializeOwned>(
            file: &tessel_grammar::CalibrationFile,
            section: &str,
            values: &std::collections::BTreeMap<String, f64>,
        ) -> Result<Option<T>, super::CostError> {
            if values.is_empty() {
                return Ok(None);
            }
            let json = serde_json::to_value(values).expect("numbers serialise");
            serde_json::from_value(json).map(Some).map_err(|error| {
                super::CostError::spec(format!(
                    "calibration `{}`: its `{section}` are not this version's ({error})",
                    file.path
                ))
            })
        }
        if let Some(collectives) = read(file, "collectives", &file.collectives)? {
            calibration.collectives = collectives;
        }
        calibration.gemm = read(file, "gemm", &file.gemm)?;
        Ok(match read(file, "compute", &file.compute)? {
            Some(compute) => calibration.with_compute(compute),
            None => calibration,
        })
    }

    /// The GEMM primitive: the cluster's own measurement, else the committed fit for
    /// `generation`.
    pub fn gemm_for(&self, generation: GpuGeneration) -> GemmParams {
        self.gemm
            .unwrap_or_else(|| GemmParams::for_generation(generation))
    }

    /// This calibration with a cluster's fitted compute: its fractions (read through
    /// [`KernelEfficiency::calibrated`]) and its time per layer pass.
    pub fn with_compute(self, compute: ComputeParams) -> Calibration {
        Calibration {
            compute: Some(compute),
            layer_overhead_s: compute.layer_overhead_s,
            ..self
        }
    }
}

impl Default for Calibration {
    fn default() -> Self {
        Calibration {
            collectives: CollectiveParams::default(),
            gemm: None,
            compute: None,
            ep_overlap: 0.0,
            layer_overhead_s: 0.0,
            deepspeed_kernels: 0.7438,
            fp8_rowwise_matmul: FP8_ROWWISE_RATE,
            misaligned_matmul: 0.1451,
            adam_bytes_per_param: 34.0,
            sgd_bytes_per_param: 22.0,
            outside_allocator_bytes: 4.029e9,
            fragmentation: 0.0331,
            allocator_cache: 0.1768,
        }
    }
}
