//! How a pipeline stage's layers split over its interleaved chunks: the one convention the
//! planner's plans, the cost model and the exporters share.
//!
//! A model with `pp` stages and `v` chunks per stage is cut into `pp·v` chunks in model order;
//! chunk `j` lives on stage `j mod pp` (Megatron-LM's interleaved layout, and the order of the
//! segments of its `--pipeline-model-parallel-layout`).

/// Layers per chunk, in model order, when every stage's layers are split over its `v` chunks as
/// evenly as possible (its earlier chunks take the remainder).
pub fn stage_chunks(stage_layers: &[u64], interleave: u64) -> Vec<u64> {
    let v = interleave.max(1);
    let mut chunks = Vec::with_capacity(stage_layers.len() * v as usize);
    for chunk in 0..v {
        for &layers in stage_layers {
            chunks.push(layers / v + u64::from(chunk < layers % v));
        }
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::stage_chunks;

    #[test]
    fn earlier_chunks_take_the_remainder() {
        // Stage 0 holds 7 layers as 4 + 3, stage 1 holds 6 as 3 + 3; chunks in model order.
        assert_eq!(stage_chunks(&[7, 6], 2), vec![4, 3, 3, 3]);
        assert_eq!(stage_chunks(&[5, 5], 1), vec![5, 5]);
    }
}
