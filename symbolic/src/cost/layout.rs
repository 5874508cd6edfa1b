//! Where layers go: spreading a model's layers over pipeline devices and interleaved chunks,
//! and the checks a strategy must pass before it can be costed.

use tessel_grammar::{Recompute, Spec, Strategy};

use super::CostError;

/// Layers of each pipeline device (all its chunks together) when `layers` blocks are spread
/// over `pp · interleave` chunks, chunk `j` living on device `j mod pp`. (More chunks than
/// layers is an invalid strategy; the count is capped at `layers` so that no input allocates
/// without bound.)
///
/// Chunks get `layers / chunks` blocks each; the remainder goes one block at a time to the
/// middle chunks first (the first and last chunk also hold the embedding and the logits, so
/// they get fewer when the split is uneven), and only then to the end chunks.
pub fn spread_layers(layers: u64, pp: u64, interleave: u64) -> Vec<u64> {
    let chunks = pp.saturating_mul(interleave).clamp(1, layers.max(1));
    let mut per_chunk = vec![layers / chunks; chunks as usize];
    let mut remainder = layers % chunks;
    let middle: Vec<usize> = (1..chunks.saturating_sub(1) as usize).collect();
    let ends: Vec<usize> = if chunks == 1 {
        vec![0]
    } else {
        vec![0, chunks as usize - 1]
    };
    for index in middle.iter().chain(ends.iter()) {
        if remainder == 0 {
            break;
        }
        per_chunk[*index] += 1;
        remainder -= 1;
    }
    chunk_layers_to_devices(&per_chunk, pp)
}

/// Sums chunk layer counts onto their devices (chunk `j` on device `j mod pp`).
pub fn chunk_layers_to_devices(per_chunk: &[u64], pp: u64) -> Vec<u64> {
    // Never more devices than chunks (a valid strategy has pp ≤ chunks).
    tessel_grammar::stage_totals(per_chunk, pp.max(1).min(per_chunk.len().max(1) as u64))
}

/// Layers per pipeline device for a strategy: its explicit `stages` (per chunk) or the even
/// spread.
pub fn stage_layers(spec: &Spec, strategy: &Strategy) -> Vec<u64> {
    match &strategy.stages {
        Some(chunks) => chunk_layers_to_devices(chunks, strategy.pp),
        None => spread_layers(spec.model.layers, strategy.pp, strategy.interleave),
    }
}

/// Micro-batches per step: `global_batch / (dp · microbatch)`.
pub fn microbatches(spec: &Spec, strategy: &Strategy) -> u64 {
    let per_step = strategy
        .dp
        .max(1)
        .saturating_mul(strategy.microbatch.max(1));
    spec.train.global_batch / per_step
}

/// Checks that a strategy can run the spec's model on the spec's cluster.
pub fn validate_strategy(spec: &Spec, strategy: &Strategy) -> Result<(), CostError> {
    let fail = |reason: String| Err(CostError::strategy(&strategy.name, reason));
    let degrees = [
        ("dp", strategy.dp),
        ("tp", strategy.tp),
        ("pp", strategy.pp),
        ("cp", strategy.cp),
        ("ep", strategy.ep),
        ("microbatch", strategy.microbatch),
        ("interleave", strategy.interleave),
    ];
    for (name, value) in degrees {
        if value == 0 {
            return fail(format!("{name} must be at least 1"));
        }
    }
    let gpus = spec.cluster.total_gpus();
    let used = strategy
        .dp
        .checked_mul(strategy.tp)
        .and_then(|x| x.checked_mul(strategy.pp))
        .and_then(|x| x.checked_mul(strategy.cp));
    if used != Some(gpus) {
        return fail(format!(
            "dp·tp·pp·cp = {}·{}·{}·{} must equal the cluster's {gpus} GPUs",
            strategy.dp, strategy.tp, strategy.pp, strategy.cp
        ));
    }
    let per_step = strategy.dp.saturating_mul(strategy.microbatch);
    if !spec.train.global_batch.is_multiple_of(per_step) {
        return fail(format!(
            "global batch {} is not divisible by dp·microbatch = {}·{}",
            spec.train.global_batch, strategy.dp, strategy.microbatch
        ));
    }
    let model = &spec.model;
    if !model.heads.is_multiple_of(strategy.tp) {
        return fail(format!(
            "{} attention heads are not divisible by tp = {}",
            model.heads, strategy.tp
        ));
    }
    if !model.kv_heads.is_multiple_of(strategy.tp) && !strategy.tp.is_multiple_of(model.kv_heads) {
        return fail(format!(
            "{} key/value heads cannot be split over tp = {} (one must divide the other)",
            model.kv_heads, strategy.tp
        ));
    }
    if !spec.train.seq_len.is_multiple_of(strategy.cp) {
        return fail(format!(
            "sequence length {} is not divisible by cp = {}",
            spec.train.seq_len, strategy.cp
        ));
    }
    if strategy.interleave > 1 && strategy.pp == 1 {
        return fail("interleave > 1 needs pp > 1".to_string());
    }
    if strategy.interleave > 1 && !spec.train.framework.capabilities().interleave {
        return fail(format!(
            "{} has no interleaved pipeline schedule: use interleave = 1",
            spec.train.framework.software()
        ));
    }
    let chunks = strategy.pp.saturating_mul(strategy.interleave);
    if model.layers < chunks {
        return fail(format!(
            "{} layers cannot fill pp·interleave = {}·{} chunks",
            model.layers, strategy.pp, strategy.interleave
        ));
    }
    if strategy.zero > 3 {
        return fail(format!("ZeRO stage {} does not exist (0–3)", strategy.zero));
    }
    if let Some(reason) = strategy.expert_layout_error(model) {
        return fail(reason);
    }
    let listed = [
        ("recompute", strategy.stage_recompute.as_ref().map(Vec::len)),
        ("offload", strategy.stage_offload.as_ref().map(Vec::len)),
    ];
    for (name, count) in listed {
        if let Some(count) = count.filter(|&n| n as u64 != strategy.pp) {
            return fail(format!(
                "per-stage {name} lists {count} stages but pp = {}",
                strategy.pp
            ));
        }
    }
    for stage in 0..strategy.pp {
        let offload = strategy.offload_of(stage);
        for (name, value) in [
            ("optimizer", offload.optimizer),
            ("weights", offload.weights),
            ("gradients", offload.gradients),
            ("activations", offload.activations),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return fail(format!("offload {name} fraction {value} is outside [0, 1]"));
            }
        }
    }
    if let Some(stages) = &strategy.stages {
        if stages.len() as u64 != chunks {
            return fail(format!(
                "stages lists {} entries but pp·interleave = {chunks}",
                stages.len()
            ));
        }
        if let Some(reason) = tessel_grammar::empty_chunk_error(stages) {
            return fail(reason);
        }
        let total: u64 = stages.iter().sum();
        if total != model.layers {
            return fail(format!(
                "stages hold {total} layers but the model has {}",
                model.layers
            ));
        }
    }
    let layers = stage_layers(spec, strategy);
    for (stage, &held) in layers.iter().enumerate() {
        if let Recompute::Partial { full_layers } = strategy.recompute_of(stage as u64) {
            if full_layers > held {
                return fail(format!(
                    "partial recompute of {full_layers} layers but stage {stage} holds {held}"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_split_is_even() {
        assert_eq!(spread_layers(96, 8, 1), vec![12; 8]);
        assert_eq!(spread_layers(96, 8, 3), vec![12; 8]);
    }

    #[test]
    fn llama405b_on_16_stages_gives_ends_fewer() {
        let devices = spread_layers(126, 16, 1);
        assert_eq!(devices.iter().sum::<u64>(), 126);
        assert_eq!(devices[0], 7);
        assert_eq!(devices[15], 7);
        assert!(devices[1..15].iter().all(|&l| l == 8));
    }

    #[test]
    fn llama405b_interleaved() {
        // 126 layers over 16 devices × 2 chunks = 32 chunks: 3 each plus 30 extra layers for
        // the 30 middle chunks; device 0 holds chunks 0 (3) and 16 (4).
        let devices = spread_layers(126, 16, 2);
        assert_eq!(devices.iter().sum::<u64>(), 126);
        assert_eq!(devices[0], 7);
        assert_eq!(devices[15], 7);
        assert!(devices[1..15].iter().all(|&l| l == 8));
        let four = spread_layers(126, 8, 4);
        assert_eq!(four.iter().sum::<u64>(), 126);
        assert_eq!(four, vec![15, 16, 16, 16, 16, 16, 16, 15]);
    }

    #[test]
    fn remainder_reaches_ends_only_after_middle() {
        // 7 layers over 3 chunks: 2 each, one extra to the middle.
        assert_eq!(spread_layers(7, 3, 1), vec![2, 3, 2]);
        // 8 over 3: middle first, then the first chunk.
        assert_eq!(spread_layers(8, 3, 1), vec![3, 3, 2]);
        assert_eq!(spread_layers(5, 1, 1), vec![5]);
    }
}
