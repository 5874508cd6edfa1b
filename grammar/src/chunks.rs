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

/// Layers per pipeline stage of chunk layers in model order (chunk `j` on stage `j mod pp`).
pub fn stage_totals(chunks: &[u64], pp: u64) -> Vec<u64> {
    let pp = pp.max(1) as usize;
    let mut stages = vec![0; pp];
    for (j, layers) in chunks.iter().enumerate() {
        stages[j % pp] += layers;
    }
    stages
}

/// Why chunk layers (model order) leave a chunk empty where no framework would, if they do.
/// Only the first chunk may hold the embedding alone and only the last the loss alone
/// (Megatron-LM's `E|…` and `…|L` pipeline layouts); a chunk in between needs a layer.
pub fn empty_chunk_error(chunks: &[u64]) -> Option<String> {
    let last = chunks.len().checked_sub(1)?;
    let inner = chunks
        .iter()
        .enumerate()
        .position(|(index, &layers)| layers == 0 && index != 0 && index != last);
    if let Some(index) = inner {
        return Some(format!(
            "chunk {index} holds no layer; only the first chunk (the embedding alone) or the last \
             (the loss alone) may"
        ));
    }
    (last == 0 && chunks[0] == 0).then(|| "the only chunk holds no layer".to_string())
}

#[cfg(test)]
mod tests {
    use super::{empty_chunk_error, stage_chunks};

    #[test]
    fn only_end_chunks_may_be_empty() {
        assert_eq!(empty_chunk_error(&[0, 10, 10, 0]), None);
        assert!(empty_chunk_error(&[5, 0, 10, 5])
            .unwrap()
            .contains("chunk 1"));
        assert!(empty_chunk_error(&[0]).is_some());
    }

    #[test]
    fn earlier_chunks_take_the_remainder() {
        // Stage 0 holds 7 layers as 4 + 3, stage 1 holds 6 as 3 + 3; chunks in model order.
        assert_eq!(stage_chunks(&[7, 6], 2), vec![4, 3, 3, 3]);
        assert_eq!(stage_chunks(&[5, 5], 1), vec![5, 5]);
    }
}
