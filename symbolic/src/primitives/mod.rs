//! Primitive costs: a GEMM of a given shape on a given GPU, a fused attention kernel, an NCCL
//! collective of a given size over a given group, a memory-bound pass, and two host costs
//! (measured constants): issuing an eager loop of small modules and an offloaded optimizer
//! step. The first four are each one cost
//! function written over [`Scalar`], so the same code is fitted to published
//! microbenchmarks (`f64`, [`fit`]) and built into the cost model's expressions (`Expr`).
//! The microbenchmarks and how each primitive reproduces them, held out by source, are in
//! `docs/VALIDATION.md`; `cargo run --release -p tessel-symbolic --example fit_primitives`
//! refits and prints the table.

mod attention;
mod collective;
pub mod fit;
mod gemm;
mod host_loop;
mod host_optimizer;
mod memory_pass;
mod microbench;
mod scalar;

pub use attention::{
    attention_forward_rate, attention_tflops, kernel_of_label, AttentionKernel, AttentionParams,
};
pub use collective::{
    collective_time, nccl_compute_share, Collective, CollectiveParams, Group, Links,
};
pub use gemm::{
    compute_units, fp8_speedup, gemm_tile, gemm_time, sm_count, GemmDevice, GemmParams,
    FP8_ROWWISE_RATE, POWER_CAPPED_GEMM_RATE, TILES,
};
pub use host_loop::{ExpertHostTime, EAGER_EXPERT_HOST};
pub use host_optimizer::HOST_ADAM_PARAMS_PER_S;
pub use memory_pass::{
    memory_pass_time, PassBytes, COMPOSITE_RMSNORM, EAGER_ELEMENTWISE, GELU_BYTES,
    HBM_STREAM_FRACTION, NORM_BYTES, RESIDUAL_ADD_BYTES, SWIGLU_BYTES,
};
pub use microbench::{
    default_microbench_dirs, device_of, load_fit_microbenchmarks, load_microbenchmarks,
    project_microbench_dir, AttentionMeasurement, CollectiveMeasurement, GemmMeasurement,
    MemoryMeasurement, Microbenchmarks, MEASURED_DIRS,
};
pub use scalar::{c, ceil_log2, exceeds, Scalar};
