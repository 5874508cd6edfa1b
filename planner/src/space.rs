//! The search space: the planner's own candidate sets for `auto` dimensions, the outer
//! configurations (degrees, micro-batching, ZeRO, sequence parallel, interleave) and the stage
//! options (recompute and offload) an outer configuration is combined with.
//!
//! `auto` candidate sets (documented in docs/PLANNER.md):
//! - tp: powers of two up to `gpus_per_node` that divide `heads`, and divide `kv_heads` or are a
//!   multiple of it (key/value heads are then replicated);
//! - pp: divisors of `GPUs / tp` up to `layers`;
//! - cp: 1, plus powers of two up to 32 when `seq_len ≥ 16384`, keeping ≥ 4096 tokens per rank;
//! - ep: divisors of `experts` that divide `dp · cp` for mixture-of-experts models, else 1;
//! - microbatch: divisors of `global_batch / dp` whose tokens (`microbatch · seq_len`) stay
//!   within 128Ki, and always 1;
//! - interleave: 1, plus 2, 3, 4, 6, 8 when `pp > 1`, `pp · v ≤ layers` and the micro-batch
//!   count is a multiple of `pp` (Megatron's interleaved schedule needs that);
//! - etp: `tp`, and 1 (experts folded over tp·dp·cp) for mixture-of-experts models with
//!   `ep > 1` and `tp > 1` under a framework that folds;
//! - zero: 0–3 when the sharding group `dp · cp` has more than one rank, else 0;
//! - dp_shard: `dp`, and with ZeRO ≥ 1 the data-parallel ranks of one node
//!   (`gpus_per_node / (tp · cp)`) when that is above 1 and divides `dp` (hybrid sharding:
//!   gathers and reduce-scatters on NVLink, one all-reduce across nodes per step);
//! - sequence_parallel: both when `tp > 1`, else off;
//! - recompute: none, selective, full, and partial full recompute of ¼, ½ and ¾ of the largest
//!   even stage's layers;
//! - offload: none, half or all of the optimizer states, all optimizer states plus half the
//!   activations, and weights, gradients and optimizer states together.
//!
//! Whatever the candidates, a configuration or stage option the spec's framework cannot run
//! (`tessel_grammar::Capabilities`: Megatron-LM has no ZeRO-2/3, DeepSpeed's pipeline engine
//! no interleaving, FSDP2 offloads all its state or none, ...) is left out and counted.

use tessel_grammar::{Choice, Offload, Recompute, RecomputeModules, SearchSpace, Spec, Strategy};

/// The degrees and settings fixed outside the inner problem. Field order is the canonical
/// tie-breaking order of configurations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OuterConfig {
    pub tp: u64,
    pub pp: u64,
    pub cp: u64,
    pub ep: u64,
    /// The experts' tensor-parallel degree: `tp`, or 1 when they are folded over tp·dp·cp.
    pub etp: u64,
    pub dp: u64,
    /// The data-parallel ranks ZeRO shards over: `dp`, or fewer under hybrid sharding.
    pub dp_shard: u64,
    pub microbatch: u64,
    /// Micro-batches per step per data-parallel rank.
    pub microbatches: u64,
    pub interleave: u64,
    pub zero: u8,
    pub sequence_parallel: bool,
}

impl OuterConfig {
    /// A strategy with these degrees and the given stage choices.
    pub fn strategy(
        &self,
        name: &str,
        recompute: Recompute,
        offload: Offload,
        stages: Option<Vec<u64>>,
    ) -> Strategy {
        Strategy {
            name: name.to_string(),
            dp: self.dp,
            tp: self.tp,
            pp: self.pp,
            cp: self.cp,
            ep: self.ep,
            etp: (self.etp != self.tp).then_some(self.etp),
            dp_shard: (self.dp_shard != self.dp).then_some(self.dp_shard),
            microbatch: self.microbatch,
            interleave: self.interleave,
            recompute,
            sequence_parallel: self.sequence_parallel,
            zero: self.zero,
            offload,
            stages,
            ..Strategy::default()
        }
    }

    /// The outer part of a fixed strategy.
    pub fn of_strategy(strategy: &Strategy, global_batch: u64) -> OuterConfig {
        let per_step = strategy.dp.saturating_mul(strategy.microbatch).max(1);
        OuterConfig {
            tp: strategy.tp,
            pp: strategy.pp,
            cp: strategy.cp,
            ep: strategy.ep,
            etp: strategy.expert_tp(),
            dp: strategy.dp,
            dp_shard: strategy.shard_degree(),
            microbatch: strategy.microbatch,
            microbatches: global_batch / per_step,
            interleave: strategy.interleave,
            zero: strategy.zero,
            sequence_parallel: strategy.sequence_parallel,
        }
    }

    /// Short human-readable form, e.g. `tp8 pp4 dp32 mb1×16 v5 zero1 sp`.
    pub fn label(&self) -> String {
        let mut parts = vec![format!("tp{} pp{}", self.tp, self.pp)];
        if self.cp > 1 {
            parts.push(format!("cp{}", self.cp));
        }
        if self.ep > 1 {
            parts.push(format!("ep{}", self.ep));
        }
        if self.etp != self.tp {
            parts.push(format!("etp{}", self.etp));
        }
        parts.push(format!("dp{}", self.dp));
        if self.dp_shard != self.dp {
            parts.push(format!("shard{}", self.dp_shard));
        }
        parts.push(format!("mb{}×{}", self.microbatch, self.microbatches));
        if self.interleave > 1 {
            parts.push(format!("v{}", self.interleave));
        }
        parts.push(format!("zero{}", self.zero));
        if self.sequence_parallel {
            parts.push("sp".to_string());
        }
        parts.join(" ")
    }
}

/// One recompute/offload choice of a pipeline stage (each stage of a plan takes its own).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StageOption {
    pub recompute: Recompute,
    pub offload: Offload,
}

impl StageOption {
    pub fn label(&self) -> String {
        format!(
            "recompute {}, offload {}",
            recompute_label(self.recompute),
            offload_label(&self.offload)
        )
    }
}

/// One label when every stage agrees, else the stages in order with runs counted:
/// `[full ×4, none ×2]`.
pub fn per_stage_label(labels: &[String]) -> String {
    let mut runs: Vec<(&String, usize)> = Vec::new();
    for label in labels {
        match runs.last_mut() {
            Some((last, count)) if *last == label => *count += 1,
            _ => runs.push((label, 1)),
        }
    }
    if runs.len() <= 1 {
        return labels.first().cloned().unwrap_or_default();
    }
    let parts: Vec<String> = runs
        .iter()
        .map(|&(label, count)| match count {
            1 => label.clone(),
            _ => format!("{label} ×{count}"),
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

pub fn recompute_label(recompute: Recompute) -> String {
    match recompute {
        Recompute::None => "none".to_string(),
        Recompute::Selective => "selective".to_string(),
        Recompute::Full => "full".to_string(),
        Recompute::Partial { full_layers } => format!("full on {full_layers} layers per stage"),
        Recompute::Modules(modules) => format!("modules {modules}"),
    }
}

pub fn offload_label(offload: &Offload) -> String {
    if offload.is_none() {
        return "none".to_string();
    }
    let parts: Vec<String> = [
        ("optimizer", offload.optimizer),
        ("weights", offload.weights),
        ("gradients", offload.gradients),
        ("activations", offload.activations),
    ]
    .iter()
    .filter(|(_, fraction)| *fraction > 0.0)
    .map(|(name, fraction)| format!("{name} {:.0}%", fraction * 100.0))
    .collect();
    parts.join(" + ")
}

/// Counts from enumerating the outer space.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EnumerationCounts {
    /// Combinations of candidate values looked at, valid or not.
    pub enumerated: u64,
    /// Combinations rejected because a degree does not divide what it must.
    pub rejected_divisibility: u64,
    /// Combinations the spec's framework cannot run (`tessel_grammar::Capabilities`).
    pub rejected_framework: u64,
}

fn values_or<T: Clone>(choice: &Choice<T>, auto: impl FnOnce() -> Vec<T>) -> Vec<T> {
    match choice {
        Choice::Auto => auto(),
        Choice::Values(values) => values.clone(),
    }
}

fn powers_of_two_up_to(limit: u64) -> Vec<u64> {
    let mut values = Vec::new();
    let mut value = 1;
    while value <= limit {
        values.push(value);
        value *= 2;
    }
    values
}

fn divisors(n: u64) -> Vec<u64> {
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut d = 1;
    while d <= n / d {
        if n.is_multiple_of(d) {
            small.push(d);
            if d != n / d {
                large.push(n / d);
            }
        }
        d += 1;
    }
    small.extend(large.into_iter().rev());
    small
}

/// Long sequences from which context parallelism is worth searching.
const CONTEXT_PARALLEL_MIN_SEQ: u64 = 16384;
/// Tokens each context-parallel rank keeps at least.
const CONTEXT_PARALLEL_MIN_TOKENS: u64 = 4096;
const CONTEXT_PARALLEL_MAX: u64 = 32;
/// Tokens one micro-batch may hold in the `auto` set (MosaicML ran 56 × 2048 on a 1B model).
const MICROBATCH_MAX_TOKENS: u64 = 131_072;
const INTERLEAVE_CANDIDATES: [u64; 5] = [2, 3, 4, 6, 8];

/// Every valid outer configuration of the spec's search space, in canonical order.
pub fn outer_configs(spec: &Spec) -> (Vec<OuterConfig>, EnumerationCounts) {
    let search: &SearchSpace = &spec.search;
    let model = &spec.model;
    let gpus = spec.cluster.total_gpus();
    let global_batch = spec.train.global_batch;
    let mut counts = EnumerationCounts::default();
    let mut configs = Vec::new();
    if gpus == 0 || global_batch == 0 || model.layers == 0 {
        return (configs, counts);
    }

    let tps = values_or(&search.tp, || {
        powers_of_two_up_to(spec.cluster.gpus_per_node.min(gpus))
            .into_iter()
            .filter(|&tp| {
                model.heads.is_multiple_of(tp)
                    && (model.kv_heads.is_multiple_of(tp) || tp.is_multiple_of(model.kv_heads))
            })
            .collect()
    });
    let cps = values_or(&search.cp, || {
        let mut values = vec![1];
        if spec.train.seq_len >= CONTEXT_PARALLEL_MIN_SEQ {
            let mut cp = 2;
            while cp <= CONTEXT_PARALLEL_MAX
                && spec.train.seq_len / cp >= CONTEXT_PARALLEL_MIN_TOKENS
            {
                values.push(cp);
                cp *= 2;
            }
        }
        values
    });

    for &tp in &tps {
        let heads_split = tp > 0
            && model.heads.is_multiple_of(tp)
            && (model.kv_heads.is_multiple_of(tp) || tp.is_multiple_of(model.kv_heads));
        if !heads_split || !gpus.is_multiple_of(tp) {
            counts.enumerated += 1;
            counts.rejected_divisibility += 1;
            continue;
        }
        let pps = values_or(&search.pp, || {
            divisors(gpus / tp)
                .into_iter()
                .filter(|&pp| pp <= model.layers)
                .collect()
        });
        for &pp in &pps {
            for &cp in &cps {
                let group = tp.saturating_mul(pp).saturating_mul(cp);
                if pp == 0
                    || cp == 0
                    || pp > model.layers
                    || !gpus.is_multiple_of(group)
                    || !spec.train.seq_len.is_multiple_of(cp)
                {
                    counts.enumerated += 1;
                    counts.rejected_divisibility += 1;
                    continue;
                }
                let dp = gpus / group;
                let dp_allowed = match &search.dp {
                    Choice::Auto => true,
                    Choice::Values(values) => values.contains(&dp),
                };
                if !dp_allowed || !global_batch.is_multiple_of(dp) {
                    counts.enumerated += 1;
                    counts.rejected_divisibility += 1;
                    continue;
                }
                enumerate_inner(spec, tp, pp, cp, dp, &mut configs, &mut counts);
            }
        }
    }
    configs.sort();
    configs.dedup();
    (configs, counts)
}

fn enumerate_inner(
    spec: &Spec,
    tp: u64,
    pp: u64,
    cp: u64,
    dp: u64,
    configs: &mut Vec<OuterConfig>,
    counts: &mut EnumerationCounts,
) {
    let search = &spec.search;
    let model = &spec.model;
    let per_rank = spec.train.global_batch / dp;
    let interleaving = spec.train.framework.capabilities().interleave;
    // Folded experts (etp 1) may also take their expert-parallel ranks from tp.
    let folding = tp > 1 && framework_folds(spec);
    let eps = values_or(&search.ep, || match &model.moe {
        Some(moe) => divisors(moe.experts)
            .into_iter()
            .filter(|&ep| (dp * cp * if folding { tp } else { 1 }).is_multiple_of(ep))
            .collect(),
        None => vec![1],
    });
    let microbatches = values_or(&search.microbatch, || {
        let limit = (MICROBATCH_MAX_TOKENS / spec.train.seq_len.max(1)).max(1);
        divisors(per_rank)
            .into_iter()
            .filter(|&mb| mb <= limit)
            .collect()
    });
    let framework = spec.train.framework;
    let zeros = values_or(&search.zero, || {
        if dp * cp > 1 {
            vec![0, 1, 2, 3]
        } else {
            vec![0]
        }
    });
    let sps = values_or(&search.sequence_parallel, || {
        if tp > 1 {
            vec![false, true]
        } else {
            vec![false]
        }
    });
    let expert_layouts: Vec<(u64, u64)> = eps
        .iter()
        .flat_map(|&ep| {
            let etps = values_or(&search.etp, || {
                let mut values = vec![tp];
                if folding && model.moe.is_some() && ep > 1 {
                    values.push(1);
                }
                values
            });
            etps.into_iter().map(move |etp| (ep, etp))
        })
        .collect();
    // ZeRO shards over every data-parallel rank, or (hybrid) over those of one node.
    let shards = values_or(&search.dp_shard, || {
        let mut values = vec![dp];
        let model_parallel = tp.saturating_mul(cp);
        let node_ranks = spec.cluster.gpus_per_node / model_parallel.max(1);
        if spec.cluster.gpus_per_node.is_multiple_of(model_parallel)
            && node_ranks > 1
            && node_ranks < dp
            && dp.is_multiple_of(node_ranks)
        {
            values.push(node_ranks);
        }
        values
    });
    for &(ep, etp) in &expert_layouts {
        // The experts' layout rule of the checker and the cost model; sequence parallelism,
        // which folding also needs, is decided below.
        let experts = Strategy {
            dp,
            tp,
            cp,
            ep,
            etp: (etp != tp).then_some(etp),
            sequence_parallel: true,
            ..Strategy::default()
        };
        if experts.expert_layout_error(model).is_some() {
            counts.enumerated += 1;
            counts.rejected_divisibility += 1;
            continue;
        }
        for &microbatch in &microbatches {
            if microbatch == 0 || !per_rank.is_multiple_of(microbatch) {
                counts.enumerated += 1;
                counts.rejected_divisibility += 1;
                continue;
            }
            let m = per_rank / microbatch;
            let interleaves = values_or(&search.interleave, || {
                let mut values = vec![1];
                if pp > 1 && m.is_multiple_of(pp) && interleaving {
                    values.extend(
                        INTERLEAVE_CANDIDATES
                            .iter()
                            .copied()
                            .filter(|&v| pp.saturating_mul(v) <= model.layers),
                    );
                }
                values
            });
            for &interleave in &interleaves {
                for &zero in &zeros {
                    // Without ZeRO nothing is sharded: one configuration, whatever dp_shard.
                    let zero_shards = if zero == 0 { &[dp][..] } else { &shards[..] };
                    for &dp_shard in zero_shards {
                        for &sequence_parallel in &sps {
                            counts.enumerated += 1;
                            let config = OuterConfig {
                                tp,
                                pp,
                                cp,
                                ep,
                                etp,
                                dp,
                                dp_shard,
                                microbatch,
                                microbatches: m,
                                interleave,
                                zero,
                                sequence_parallel,
                            };
                            let layout =
                                config.strategy("", Recompute::None, Offload::default(), None);
                            let valid = interleave >= 1
                                && pp.saturating_mul(interleave) <= model.layers
                                && (interleave == 1
                                    || (interleaving && pp > 1 && m.is_multiple_of(pp)))
                                && zero <= 3
                                && !(sequence_parallel && tp == 1)
                                && layout.expert_layout_error(model).is_none()
                                && layout.hybrid_sharding_error().is_none();
                            if !valid {
                                counts.rejected_divisibility += 1;
                                continue;
                            }
                            if !framework.layout_limits(&layout).is_empty() {
                                counts.rejected_framework += 1;
                                continue;
                            }
                            configs.push(config);
                        }
                    }
                }
            }
        }
    }
}

/// Whether the spec's framework runs folded experts (`Capabilities::expert_folding`).
fn framework_folds(spec: &Spec) -> bool {
    spec.train.framework.capabilities().expert_folding
}

/// The recompute/offload options searched for an outer configuration, in canonical order.
pub fn stage_options(spec: &Spec, outer: &OuterConfig) -> Vec<StageOption> {
    let largest_stage = spec.model.layers.div_ceil(outer.pp.max(1));
    let recomputes = values_or(&spec.search.recompute, || {
        let mut values = vec![Recompute::None, Recompute::Selective, Recompute::Full];
        // Expert models can also drop the norms' and the experts' activation outputs alone.
        if spec.model.moe.is_some() {
            values.push(Recompute::Modules(
                RecomputeModules::LAYERNORM.with(RecomputeModules::MOE_ACT),
            ));
        }
        let mut partial: Vec<u64> = [1, 2, 3]
            .iter()
            .map(|quarter| (largest_stage * quarter).div_ceil(4))
            .filter(|&n| n >= 1 && n < largest_stage)
            .collect();
        partial.dedup();
        values.extend(
            partial
                .into_iter()
                .map(|full_layers| Recompute::Partial { full_layers }),
        );
        values
    });
    let offloads = values_or(&spec.search.offload, || {
        vec![
            Offload::default(),
            Offload {
                optimizer: 0.5,
                ..Offload::default()
            },
            Offload {
                optimizer: 1.0,
                ..Offload::default()
            },
            Offload {
                optimizer: 1.0,
                activations: 0.5,
                ..Offload::default()
            },
            // How FSDP2 offloads: weights, gradients and optimizer state together.
            Offload {
                optimizer: 1.0,
                weights: 1.0,
                gradients: 1.0,
                activations: 0.0,
            },
        ]
    });
    // Only what the framework runs on a stage of the largest size (the planner's partial
    // recompute counts are quarters of it).
    let layout = outer.strategy("", Recompute::None, Offload::default(), None);
    let framework = spec.train.framework;
    let mut options = Vec::with_capacity(recomputes.len() * offloads.len());
    for &recompute in &recomputes {
        for &offload in &offloads {
            if framework
                .stage_limits(&layout, largest_stage, recompute, &offload)
                .is_empty()
            {
                options.push(StageOption { recompute, offload });
            }
        }
    }
    options
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_stage_labels_group_runs() {
        let labels = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(per_stage_label(&labels(&["full", "full"])), "full");
        assert_eq!(
            per_stage_label(&labels(&["full", "full", "none", "selective"])),
            "[full ×2, none, selective]"
        );
    }

    #[test]
    fn divisors_in_order() {
        assert_eq!(divisors(12), vec![1, 2, 3, 4, 6, 12]);
        assert_eq!(divisors(1), vec![1]);
        assert_eq!(divisors(16), vec![1, 2, 4, 8, 16]);
    }

    #[test]
    fn powers_of_two() {
        assert_eq!(powers_of_two_up_to(8), vec![1, 2, 4, 8]);
        assert_eq!(powers_of_two_up_to(6), vec![1, 2, 4]);
    }
}
