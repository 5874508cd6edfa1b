//! How a strategy spreads the model's layers over pipeline stages.

use tessel_grammar::{empty_chunk_error, stage_chunks, Spec, Strategy};

use super::Report;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Stages {
    /// Every virtual stage (pipeline stage × interleave chunk) holds the same layers.
    Even { per_chunk: u64 },
    /// Layers of every virtual stage, `pp·interleave` entries in model order (chunk `j` on
    /// stage `j mod pp`); the first may hold only the embedding and the last only the loss.
    Uneven { chunks: Vec<u64> },
}

/// The strategy's `stages` (layers per chunk, or per pipeline stage when interleaved and given
/// per stage), or the split the exporter chooses when the strategy leaves it open: even when
/// the layers divide, otherwise equal middle stages and lighter end stages (which also hold
/// the embedding and the logits).
pub(crate) fn stages(spec: &Spec, strategy: &Strategy, report: &mut Report) -> Stages {
    let layers = spec.model.layers;
    let pp = strategy.pp.max(1);
    let v = strategy.interleave.max(1);
    if pp > layers.max(1) {
        report.unsupported(format!(
            "pp = {pp} is more pipeline stages than the model's {layers} layers; written as one \
             layer per virtual stage"
        ));
        return Stages::Even { per_chunk: 1 };
    }
    let chunks = pp.saturating_mul(v);
    if chunks > layers.max(1) {
        report.unsupported(format!(
            "pp·interleave = {pp}·{v} is more virtual stages than the model's {layers} layers; \
             written as one layer per virtual stage"
        ));
        return Stages::Even { per_chunk: 1 };
    }
    if let Some(given) = &strategy.stages {
        let sum = given.iter().fold(0u64, |acc, &n| acc.saturating_add(n));
        let per_chunk = given.len() as u64 == chunks && empty_chunk_error(given).is_none();
        let per_stage = v > 1 && given.len() as u64 == pp && given.iter().all(|&n| n > 0);
        if sum == layers && (per_chunk || per_stage) {
            let chunks = if per_chunk {
                given.clone()
            } else {
                stage_chunks(given, v)
            };
            return if chunks.iter().all(|&n| n == chunks[0]) {
                Stages::Even {
                    per_chunk: chunks[0],
                }
            } else {
                Stages::Uneven { chunks }
            };
        }
        report.note(format!(
            "stages = {given:?} does not give {chunks} chunks summing to {layers} layers; ignored"
        ));
    }
    if layers.is_multiple_of(chunks) {
        return Stages::Even {
            per_chunk: layers / chunks,
        };
    }
    let split = default_split(layers, pp);
    report.note(format!(
        "{layers} layers do not divide over pp·interleave = {pp}·{v} chunks and the strategy sets \
         no `stages`; exported with layers per stage {split:?}"
    ));
    Stages::Uneven {
        chunks: stage_chunks(&split, v),
    }
}

/// Equal middle stages of `ceil(layers / pp)` and the rest shared by the two end stages; an
/// even spread when that leaves an end stage empty.
fn default_split(layers: u64, pp: u64) -> Vec<u64> {
    if pp >= 3 {
        let middle = layers.div_ceil(pp);
        let ends = layers.saturating_sub((pp - 2) * middle);
        if ends >= 2 {
            let first = ends / 2;
            let mut split = vec![middle; pp as usize];
            split[0] = first;
            split[pp as usize - 1] = ends - first;
            return split;
        }
    }
    let base = layers / pp;
    let extra = layers % pp;
    // Extra layers go to the middle stages first, sparing the ends.
    let mut split = vec![base; pp as usize];
    let order: Vec<usize> = (1..pp as usize - 1)
        .chain([pp as usize - 1, 0])
        .take(extra as usize)
        .collect();
    for i in order {
        split[i] += 1;
    }
    split
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_405b_on_16_stages() {
        let split = default_split(126, 16);
        assert_eq!(split.iter().sum::<u64>(), 126);
        assert_eq!(split[0], 7);
        assert_eq!(split[15], 7);
        assert!(split[1..15].iter().all(|&n| n == 8));
    }

    #[test]
    fn small_models_spread_evenly() {
        let split = default_split(5, 4);
        assert_eq!(split.iter().sum::<u64>(), 5);
        assert!(split.iter().all(|&n| n >= 1));
        assert_eq!(default_split(7, 2), vec![3, 4]);
    }
}
