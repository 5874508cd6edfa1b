//! How layers are spread over pipeline stages and their interleaved chunks.
//!
//! A model with `pp` stages and `v` interleaved chunks per stage is cut into `pp·v` chunks in
//! model order; chunk `j` lives on stage `j mod pp` (Megatron's interleaved layout). A strategy's
//! `stages` lists the layers of every chunk in model order (`pp·v` entries, `pp` without
//! interleaving), the convention the cost model reads.

/// Layers per chunk when `layers` are spread as evenly as possible over `pp·v` chunks: each gets
/// `layers / chunks`, and the remainder goes one layer at a time to the middle chunks first and
/// only then to the end chunks (the first chunk also holds the embedding, the last the logits).
pub fn even_chunks(layers: u64, pp: u64, interleave: u64) -> Vec<u64> {
    let chunks = (pp * interleave).clamp(1, layers.max(1)) as usize;
    let mut per_chunk = vec![layers / chunks as u64; chunks];
    let mut remainder = layers % chunks as u64;
    let middle = 1..chunks.saturating_sub(1);
    let ends = if chunks == 1 {
        vec![0]
    } else {
        vec![0, chunks - 1]
    };
    for index in middle.chain(ends) {
        if remainder == 0 {
            break;
        }
        per_chunk[index] += 1;
        remainder -= 1;
    }
    per_chunk
}

/// Layers per stage of the even spread (see [`even_chunks`]).
pub fn even_split(layers: u64, pp: u64, interleave: u64) -> Vec<u64> {
    stage_totals(&even_chunks(layers, pp, interleave), pp)
}

pub use tessel_grammar::{stage_chunks, stage_totals};

/// The model layer ranges `[first, last)` each stage holds, one per chunk, from the layers per
/// chunk in model order.
pub fn chunk_ranges(chunks: &[u64], pp: u64) -> Vec<Vec<[u64; 2]>> {
    let pp = pp.max(1) as usize;
    let mut ranges = vec![Vec::new(); pp];
    let mut next = 0;
    for (j, &size) in chunks.iter().enumerate() {
        // An empty end chunk (the embedding or the loss alone) keeps its place.
        ranges[j % pp].push([next, next + size]);
        next += size;
    }
    ranges
}

/// The layer ranges of each stage when stages hold `stage_layers` (split over chunks as in
/// [`stage_chunks`]).
pub fn layer_ranges(stage_layers: &[u64], interleave: u64) -> Vec<Vec<[u64; 2]>> {
    chunk_ranges(
        &stage_chunks(stage_layers, interleave),
        stage_layers.len() as u64,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_split_gives_end_stages_fewer() {
        let mut expected = vec![8; 16];
        expected[0] = 7;
        expected[15] = 7;
        assert_eq!(even_split(126, 16, 1), expected);
        assert_eq!(even_split(96, 8, 1), vec![12; 8]);
        assert_eq!(even_split(10, 4, 1), vec![2, 3, 3, 2]);
        assert_eq!(even_split(11, 5, 1), vec![2, 3, 2, 2, 2]);
        assert_eq!(even_split(7, 1, 1), vec![7]);
        // 126 layers over 16 stages × 2 chunks: 32 chunks of 3, 30 left for chunks 1..=30.
        let chunks = even_chunks(126, 16, 2);
        assert_eq!(chunks.len(), 32);
        assert_eq!((chunks[0], chunks[1], chunks[30], chunks[31]), (3, 4, 4, 3));
        assert_eq!(even_split(126, 16, 2), {
            let mut v = vec![8; 16];
            v[0] = 7;
            v[15] = 7;
            v
        });
    }

    #[test]
    fn chunks_and_stages_agree() {
        let chunks = stage_chunks(&[3, 4], 2);
        assert_eq!(chunks, vec![2, 2, 1, 2]);
        assert_eq!(stage_totals(&chunks, 2), vec![3, 4]);
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
