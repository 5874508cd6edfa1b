//! Expert settings shared by the MoE families: which blocks carry experts and the Tessel
//! `every`/`first_dense` pattern closest to it, top-k checks, and the notes every MoE import
//! makes.
//!
//! Tessel puts experts in block `l` (0-based) when `l >= first_dense` and
//! `(l - first_dense + 1) % every == 0`. Hugging Face families describe the same thing in their
//! own ways (DeepSeek: `l >= first_k_dense_replace && l % moe_layer_freq == 0`; Qwen2-MoE:
//! `(l + 1) % decoder_sparse_step == 0` outside `mlp_only_layers`). The importer lists the
//! family's expert blocks and searches for the Tessel pattern that matches them: the same number
//! of expert blocks first (parameters), then the fewest blocks in the wrong place.

use crate::hf::config::{HfConfig, MAX_LAYERS};
use crate::hf::error::ImportError;
use crate::hf::note::Note;

/// A Tessel expert-block pattern and how well it matches the source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MoeLayout {
    pub every: u64,
    pub first_dense: u64,
    /// Expert blocks in the source.
    pub source_count: u64,
    /// Expert blocks in the Tessel pattern.
    pub tessel_count: u64,
    /// Blocks that are expert blocks in one and dense in the other.
    pub misplaced: u64,
}

impl MoeLayout {
    pub fn is_exact(&self) -> bool {
        self.misplaced == 0
    }
}

/// The closest pattern to `source` (one flag per block). `None` when no block has experts.
pub(crate) fn fit(source: &[bool]) -> Option<MoeLayout> {
    let layers = source.len() as u64;
    debug_assert!(layers <= MAX_LAYERS);
    let source_count = source.iter().filter(|&&e| e).count() as u64;
    if source_count == 0 {
        return None;
    }
    let mut best: Option<(u64, u64, MoeLayout)> = None;
    for every in 1..=layers {
        for first_dense in 0..layers {
            // Expert blocks of this pattern: first_dense + every - 1, then every `every`.
            let first = first_dense + every - 1;
            if first >= layers {
                break;
            }
            let tessel_count = (layers - first - 1) / every + 1;
            let shared = (0..tessel_count)
                .filter(|k| source[(first + k * every) as usize])
                .count() as u64;
            let misplaced = source_count + tessel_count - 2 * shared;
            let key = (source_count.abs_diff(tessel_count), misplaced);
            let better = match &best {
                None => true,
                Some((count_gap, wrong, _)) => key < (*count_gap, *wrong),
            };
            if better {
                best = Some((
                    key.0,
                    key.1,
                    MoeLayout {
                        every,
                        first_dense,
                        source_count,
                        tessel_count,
                        misplaced,
                    },
                ));
                if key == (0, 0) {
                    return best.map(|(_, _, layout)| layout);
                }
            }
        }
    }
    best.map(|(_, _, layout)| layout)
}

/// Top-k routing needs `top_k` of the experts.
pub(crate) fn check_top_k(
    config: &HfConfig,
    top_k_field: &str,
    top_k: u64,
    experts: u64,
) -> Result<(), ImportError> {
    if top_k > experts {
        return Err(config.unsupported(
            top_k_field,
            top_k.to_string(),
            format!("it routes to more experts than the {experts} there are"),
        ));
    }
    Ok(())
}

/// The note every imported MoE model carries about capacity.
pub(crate) fn dropless_note() -> Note {
    Note::on(
        "moe",
        "Hugging Face routes without dropping tokens; capacity_factor = 1.0 costs each expert \
         its average load",
    )
}

/// Describes a layout that differs from the source's expert blocks.
pub(crate) fn note_inexact_layout(layout: &MoeLayout, notes: &mut Vec<Note>) {
    if layout.is_exact() {
        return;
    }
    notes.push(Note::on(
        "moe",
        format!(
            "the config puts experts in {} blocks in a pattern Tessel cannot write; every = {}, \
             first_dense = {} gives {} expert blocks, {} block(s) placed differently",
            layout.source_count,
            layout.every,
            layout.first_dense,
            layout.tessel_count,
            layout.misplaced
        ),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Expert-block flags of a Tessel pattern, straight from the language's definition.
    fn flags(layers: u64, first_dense: u64, every: u64) -> Vec<bool> {
        (0..layers)
            .map(|l| l >= first_dense && (l - first_dense + 1).is_multiple_of(every))
            .collect()
    }

    #[test]
    fn every_block_is_every_one() {
        let layout = fit(&[true; 32]).unwrap();
        assert_eq!((layout.every, layout.first_dense), (1, 0));
        assert!(layout.is_exact());
    }

    #[test]
    fn deepseek_v3_leading_dense_blocks() {
        // first_k_dense_replace = 3, moe_layer_freq = 1, 61 blocks.
        let source: Vec<bool> = (0..61).map(|l| l >= 3).collect();
        let layout = fit(&source).unwrap();
        assert_eq!((layout.every, layout.first_dense), (1, 3));
        assert_eq!(layout.tessel_count, 58);
        assert!(layout.is_exact());
    }

    #[test]
    fn deepseek_every_second_from_one() {
        // l >= 1 && l % 2 == 0 → 2, 4, 6, ...: Tessel first_dense = 1, every = 2.
        let source: Vec<bool> = (0..12).map(|l| l >= 1 && l % 2 == 0).collect();
        let layout = fit(&source).unwrap();
        assert_eq!(flags(12, layout.first_dense, layout.every), source);
    }

    #[test]
    fn inexpressible_pattern_keeps_the_count() {
        // Experts at 0, 2, 4, 6: Tessel cannot start at block 0 with every = 2.
        let source: Vec<bool> = (0..8).map(|l| l % 2 == 0).collect();
        let layout = fit(&source).unwrap();
        assert_eq!(layout.tessel_count, 4);
        assert!(!layout.is_exact());
        // Brute force agrees that no pattern with four expert blocks misplaces fewer.
        let best = (1..=8u64)
            .flat_map(|e| (0..8u64).map(move |f| (f, e)))
            .map(|(f, e)| flags(8, f, e))
            .filter(|fl| fl.iter().filter(|&&x| x).count() == 4)
            .map(|fl| fl.iter().zip(&source).filter(|(a, b)| a != b).count() as u64)
            .min()
            .unwrap();
        assert_eq!(layout.misplaced, best);
    }

    #[test]
    fn dense_model_has_no_layout() {
        assert_eq!(fit(&[false; 4]), None);
    }
}
