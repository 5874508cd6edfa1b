//! A fused (flash) attention kernel: the fraction of the tensor-core peak it reaches as a
//! function of sequence length (short sequences leave the kernel's tiles and the SMs
//! under-filled), head width (narrow heads do less work per byte loaded), the causal mask
//! (masked blocks are skipped, but the diagonal blocks and the imbalance between rows cost)
//! and the direction (backward recomputes the scores and writes three gradients).
//!
//! The FLOP convention is the flash-attention repository's benchmark: `4·s²·d` per head
//! forward (halved with a causal mask), backward 2.5× forward.

use super::scalar::{c, Scalar};
use crate::cost::GpuGeneration;

pub use tessel_grammar::AttentionKernel;

/// The kernel a benchmark's label names, among those the cost model runs.
pub fn kernel_of_label(label: &str) -> Option<AttentionKernel> {
    match label {
        "FlashAttention (v1)" => Some(AttentionKernel::Flash1),
        "FlashAttention-2" => Some(AttentionKernel::Flash2),
        "cuDNN" => Some(AttentionKernel::Cudnn),
        _ => None,
    }
}

/// One kernel's behaviour on one GPU generation (`fit::fit_attention`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    /// Fraction of peak forward at long sequences and wide heads.
    pub efficiency: f64,
    /// Sequence length at which the forward reaches half of that.
    pub seq_half: f64,
    /// Head width at which it reaches half.
    pub head_dim_half: f64,
    /// Rate with a causal mask relative to without (per counted FLOP).
    pub causal: f64,
    /// Backward rate relative to forward.
    pub backward: f64,
}

impl Default for AttentionParams {
    fn default() -> Self {
        AttentionParams {
            efficiency: 0.6,
            seq_half: 512.0,
            head_dim_half: 32.0,
            causal: 0.8,
            backward: 0.75,
        }
    }
}

impl AttentionParams {
    /// The committed fit (`fit::fit_attention`) of `kernel` on `generation`. Off Hopper
    /// cuDNN's kernels are of flash-attention 2's kind and share its fit; generations without
    /// measurements take Ampere's.
    pub fn for_kernel(generation: GpuGeneration, kernel: AttentionKernel) -> AttentionParams {
        match (generation, kernel) {
            (GpuGeneration::Hopper, AttentionKernel::Cudnn) => AttentionParams {
                efficiency: 0.8177,
                seq_half: 316.5,
                head_dim_half: 42.0,
                causal: 0.8009,
                backward: 0.8783,
            },
            (GpuGeneration::Hopper, AttentionKernel::Flash2) => AttentionParams {
                efficiency: 0.4028,
                seq_half: 234.5,
                head_dim_half: 6.0,
                causal: 0.7961,
                backward: 0.7776,
            },
            (GpuGeneration::Hopper, AttentionKernel::Flash1) => AttentionParams {
                efficiency: 0.25,
                seq_half: 128.0,
                head_dim_half: 0.0,
                causal: 0.8,
                backward: 0.4883,
            },
            (_, AttentionKernel::Flash1) => AttentionParams {
                efficiency: 0.5781,
                seq_half: 236.0,
                head_dim_half: 0.0,
                causal: 0.7551,
                backward: 0.5365,
            },
            _ => AttentionParams {
                efficiency: 1.1247,
                seq_half: 424.0,
                head_dim_half: 19.88,
                causal: 0.8887,
                backward: 0.6331,
            },
        }
    }
}

/// Forward rate, FLOP/s, at sequence length `seq` and head width `head_dim`.
pub fn attention_forward_rate<S: Scalar>(
    peak_flops: f64,
    seq: S,
    head_dim: f64,
    causal: bool,
    params: &AttentionParams,
) -> S {
    let width = head_dim / (head_dim + params.head_dim_half);
    let mask = if causal { params.causal } else { 1.0 };
    let fill = seq.clone() / (seq + c(params.seq_half));
    fill * c(peak_flops * params.efficiency * width * mask)
}

/// Rate (FLOP/s) of a benchmark direction: `fwd`, `bwd` or `fwd_bwd` (3.5 forward FLOPs over
/// the time of both).
pub fn attention_tflops(
    peak_flops: f64,
    seq: f64,
    head_dim: f64,
    causal: bool,
    direction: &str,
    params: &AttentionParams,
) -> f64 {
    let forward = attention_forward_rate(peak_flops, seq, head_dim, causal, params);
    let backward = forward * params.backward;
    match direction {
        "fwd" => forward,
        "bwd" => backward,
        _ => 3.5 / (1.0 / forward + 2.5 / backward),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longer_sequences_and_wider_heads_run_faster() {
        let p = AttentionParams::default();
        let short = attention_tflops(312e12, 512.0, 64.0, false, "fwd", &p);
        let long = attention_tflops(312e12, 8192.0, 64.0, false, "fwd", &p);
        let wide = attention_tflops(312e12, 8192.0, 128.0, false, "fwd", &p);
        assert!(short < long && long < wide);
        assert!(wide < 312e12 * p.efficiency);
    }

    #[test]
    fn fwd_bwd_rate_lies_between_the_two() {
        let p = AttentionParams::default();
        let f = attention_tflops(312e12, 4096.0, 128.0, true, "fwd", &p);
        let b = attention_tflops(312e12, 4096.0, 128.0, true, "bwd", &p);
        let both = attention_tflops(312e12, 4096.0, 128.0, true, "fwd_bwd", &p);
        assert!(b < both && both < f);
    }
}
