//! Host time of a loop that issues one small module at a time from eager PyTorch: the
//! sequential expert loop of Megatron-Core's `SequentialMLP` and DeepSpeed's MoE layer.
//!
//! Each expert's forward is a handful of operators (its two GEMMs, the gated activation, the
//! split and the concatenation) that Python dispatches one by one and autograd records, and
//! its backward as many nodes again for the autograd engine. The loop starts right after the
//! router's token counts are copied to the host (the split needs them there), so the GPU's
//! queue is empty and it cannot run ahead: when an expert's kernels take less time than the
//! host needs to issue them, the loop runs at the host's pace.

/// Host seconds one expert of a sequential loop costs, forward (dispatch and autograd
/// recording) and backward (the autograd engine's nodes), in eager PyTorch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExpertHostTime {
    pub forward_s: f64,
    pub backward_s: f64,
}

/// Measured on lent H100 machines (PyTorch 2.11, 16-core Xeon hosts) with
/// `scripts/gpu/moe_dispatch.py expert_loop`: 8 and 32 experts of 4,096 → 2 × 1,792 → 4,096
/// (SwiGLU), 8 tokens each so that no kernel binds, and 768 each, the tokens a 32-expert top-3
/// layer gives each expert of an 8,192-token sequence, which took the same wall time (its GEMMs
/// at 209–257 TFLOP/s). The second machine's rows time the forward alone too: the medians are
/// 123 µs forward and 373 µs backward per expert (the first machine's, forward and backward
/// together, are 395–439 µs against the second's 485–497, and a third machine's 304–439, so
/// hosts of one kind span 0.61–1.0 of these constants). Rows in
/// `data/microbench/measured-h100/expert_loop.csv`; `symbolic/tests/primitives.rs` checks the
/// constants against them.
pub const EAGER_EXPERT_HOST: ExpertHostTime = ExpertHostTime {
    forward_s: 123e-6,
    backward_s: 373e-6,
};
