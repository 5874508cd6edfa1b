//! A memory-bound pass (norms, activations, casts, the optimizer step): bytes over the HBM
//! bandwidth a streaming kernel reaches.

use super::scalar::{c, Scalar};

/// Fraction of the datasheet HBM bandwidth STREAM-style kernels reach (copy, scale, add,
/// triad, dot), fitted on the Azure A100, H100 and H200 measurements and this project's H200
/// copies of 64 MiB and more (`fit::fit_and_score`):
/// one number for every GPU.
pub const HBM_STREAM_FRACTION: f64 = 0.8583;

/// Seconds to move `bytes` through HBM of `datasheet_bandwidth` at the streaming fraction.
pub fn memory_pass_time<S: Scalar>(bytes: S, datasheet_bandwidth: f64) -> S {
    bytes / c(datasheet_bandwidth * HBM_STREAM_FRACTION)
}

/// HBM bytes one elementwise pass moves per token and per element of its width, with 2-byte
/// elements, forward and backward: what the cost model charges for it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PassBytes {
    pub forward: f64,
    pub backward: f64,
}

/// A norm: forward reads its input and writes its output; backward reads the input and the
/// output's gradient and writes the input's.
pub const NORM_BYTES: PassBytes = PassBytes {
    forward: 4.0,
    backward: 6.0,
};

/// The fused bias-residual add: forward reads the two summands and writes the sum; backward
/// adds the branch's gradient into the residual stream's.
pub const RESIDUAL_ADD_BYTES: PassBytes = PassBytes {
    forward: 6.0,
    backward: 4.0,
};

/// GELU per element of the MLP's width: forward reads and writes it; backward reads the input
/// and the output's gradient and writes the input's.
pub const GELU_BYTES: PassBytes = PassBytes {
    forward: 4.0,
    backward: 6.0,
};

/// SwiGLU per element of the MLP's width: forward reads the gate and the up projection and
/// writes their product; backward reads both and the output's gradient and writes both
/// gradients.
pub const SWIGLU_BYTES: PassBytes = PassBytes {
    forward: 6.0,
    backward: 10.0,
};

/// Fraction of the datasheet HBM bandwidth that eager PyTorch's norm and gated activation
/// reach, forward and backward, counted with the bytes above. Measured on lent H100 SXM
/// machines with `scripts/gpu/moe_dispatch.py elementwise` (`F.rms_norm` and SwiGLU at
/// 8,192 × 4,096 and 16,384 × 8,192, two machines): the median of the eight rows, which span
/// 0.23–0.36 (`data/microbench/measured-h100/elementwise.csv`; `symbolic/tests/primitives.rs`
/// checks it). The H100's wider HBM3 is far from saturated by these kernels: their forward alone
/// reaches 0.45–0.54, and the backward's reductions are slower. The fraction is the kernels',
/// not the generation's: Liger-Kernel's published timings of `torch.nn.LayerNorm` reach the
/// same fraction on an A100 and an H100 (`data/microbench/liger/`, 0.40 and 0.41), so the
/// eager stacks run at it on every GPU (`KernelEfficiency::for_training`).
pub const EAGER_ELEMENTWISE: f64 = 0.3208;

/// Fraction of the datasheet HBM bandwidth that RMSNorm written as float32 operators reaches,
/// forward and backward, counted with [`NORM_BYTES`]: the norm of torchtitan's eager Llama
/// (`norm_type = "rmsnorm"`, 2024) and of Hugging Face's `LlamaRMSNorm`, which upcast, square,
/// average, scale, downcast and weight in a kernel each (and as many in backward). Measured on
/// lent H100 SXM machines (`scripts/gpu/eager_layer.py` and `scripts/gpu/moe_dispatch.py
/// elementwise`, 8,192-16,384 tokens of 4,096-8,192): the median of eight rows, which span
/// 0.053-0.058 (`data/microbench/measured-h100/`; `symbolic/tests/primitives.rs` checks it),
/// 5.3 times the time of PyTorch 2.11's fused `F.rms_norm` on the same tensors. Like
/// [`EAGER_ELEMENTWISE`] it is the kernels' fraction, on every GPU: on a lent H200 the same
/// operators reach 0.049-0.051 of its faster HBM (`data/microbench/measured-h200/eager/`).
pub const COMPOSITE_RMSNORM: f64 = 0.0567;
