//! How layers are spread over pipeline stages and their interleaved chunks.

/// Layers per pipeline stage when `layers` are spread as evenly as possible over
/// `pp · interleave` chunks. When the chunks do not divide evenly the end chunks get fewer layers
/// (the first chunk holds the embedding and the last the logits), alternating from both ends:
/// the last chunk loses one first, then the first, then the second to last, and so on.
pub fn even_split(layers: u64, pp: u64, interleave: u64) -> Vec<u64> {
    let chunks = (pp * interleave).max(1);
    let base = layers.div_ceil(chunks);
    let mut per_chunk = vec![base; chunks as usize];
    let mut deficit = base * chunks - layers;
    let order = end_first_order(chunks as usize);
    let mut index = 0;
    while deficit > 0 {
        let chunk = order[index % order.len()];
        if per_chunk[chunk] > 0 {
            per_chunk[chunk] -= 1;
            deficit -= 1;
        }
        index += 1;
    }
    let mut per_stage = vec![0; pp as usize];
    for (chunk, count) in per_chunk.iter().enumerate() {
        per_stage[chunk_stage(chunk as u64, pp) as usize] += count;
    }
    per_stage
}

/// Chunk indices ordered last, first, second to last, second, ...
fn end_first_order(chunks: usize) -> Vec<usize> {
    let mut order = Vec::with_capacity(chunks);
    let (mut low, mut high) = (0usize, chunks);
    while low < high {
        high -= 1;
        order.push(high);
        if low < high {
            order.push(low);
            low += 1;
        }
    }
    order
}

/// The pipeline stage that holds model chunk `chunk` (chunks are laid out round-robin: chunk `j`
/// lives on stage `j mod pp`, as in Megatron's interleaved schedule).
fn chunk_stage(chunk: u64, pp: u64) -> u64 {
    chunk % pp
}

/// The model layer ranges `[first, last)` each stage holds, given the layers per stage. A stage's
/// layers are split over its `interleave` chunks as evenly as possible (earlier chunks take the
/// remainder), and chunks are laid out in model order round-robin over the stages.
pub fn layer_ranges(stage_layers: &[u64], interleave: u64) -> Vec<Vec<[u64; 2]>> {
    let pp = stage_layers.len();
    let v = interleave.max(1);
    let mut ranges = vec![Vec::with_capacity(v as usize); pp];
    let mut next = 0;
    for chunk in 0..v {
        for (stage, &layers) in stage_layers.iter().enumerate() {
            let size = layers / v + u64::from(chunk < layers % v);
            if size > 0 {
                ranges[stage].push([next, next + size]);
            }
            next += size;
        }
    }
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_split_gives_end_stages_fewer() {
        assert_eq!(even_split(126, 16, 1), {
            let mut v = vec![8; 16];
            v[15] = 7;
            v[0] = 7;
            v
        });
        assert_eq!(even_split(96, 8, 1), vec![12; 8]);
        assert_eq!(even_split(10, 4, 1), vec![2, 3, 3, 2]);
        assert_eq!(even_split(7, 1, 1), vec![7]);
        // 126 layers over 16 stages × 2 chunks: 32 chunks of 4 less 2 → chunks 31 and 0 lose one.
        let split = even_split(126, 16, 2);
        assert_eq!(split.iter().sum::<u64>(), 126);
        assert_eq!(split[0], 7);
        assert_eq!(split[15], 7);
        assert_eq!(split[1], 8);
    }

    #[test]
    fn layer_ranges_cover_the_model_in_order() {
        let ranges = layer_ranges(&[3, 4, 3], 1);
        assert_eq!(ranges, vec![vec![[0, 3]], vec![[3, 7]], vec![[7, 10]]]);
        let ranges = layer_ranges(&[4, 4], 2);
        assert_eq!(ranges, vec![vec![[0, 2], [4, 6]], vec![[2, 4], [6, 8]]]);
        let ranges = layer_ranges(&[3, 4], 2);
        assert_eq!(ranges, vec![vec![[0, 2], [4, 5]], vec![[2, 4], [5, 7]]]);
    }
}
