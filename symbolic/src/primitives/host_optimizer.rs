//! The optimizer step a host runs when the optimizer states are offloaded to its memory
//! (DeepSpeed's ZeRO-Offload, Megatron-LM's and PyTorch's CPU optimizers): after the last
//! backward, each rank's gradients come down, the host's cores update the fp32 weights and the
//! moments in host memory, and the updated weights go back up. The ranks of a node update
//! their shards at the same time on the same cores and memory, so a node's GPUs share its rate.

/// Parameters a host's CPU Adam updates per second: the median of three published timings
/// (`data/microbench/host-optimizer/cpu_adam.csv`: DeepSpeed's CPU Adam on an A100 node,
/// Megatron-LM's CPU Adam on an H100 node, PyTorch's fused CPU AdamW on a one-GPU host;
/// 1.0–2.8 × 10⁹ per second), checked against them by `symbolic/tests/primitives.rs`.
pub const HOST_ADAM_PARAMS_PER_S: f64 = 1.8e9;
