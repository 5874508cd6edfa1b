//! What each training framework runs, in one table: the planner (its search space) and the
//! exporters read it, so a plan is never made for something the framework cannot execute, and a
//! strategy that asks for it is exported with a line saying why.
//!
//! Sources, each framework's own documentation and argument parser:
//! - Megatron-LM (`megatron`): `--use-distributed-optimizer` shards optimizer state only
//!   (ZeRO-1); `--optimizer-cpu-offload` with `--optimizer-offload-fraction` moves any share of
//!   it to the host (it needs the distributed optimizer); `--cpu-offloading-num-layers` offloads
//!   activations only without pipeline parallelism and without recompute; interleaved
//!   schedules (`--num-layers-per-virtual-pipeline-stage`), context parallelism, and
//!   selective recompute of named modules (`--recompute-modules core_attn layernorm moe_act`,
//!   Megatron-Core's `TransformerConfig.recompute_modules`; Megatron-FSDP shares it).
//! - Megatron-FSDP (`megatron_fsdp`, `--use-megatron-fsdp`):
//!   `--data-parallel-sharding-strategy no_shard | optim | optim_grads | optim_grads_params`
//!   (ZeRO 0–3), with tensor, context and expert parallelism but no pipeline parallelism.
//! - DeepSpeed with Megatron-DeepSpeed (`deepspeed`): ZeRO 0–3, of which its pipeline engine
//!   accepts 0 and 1 only and has no interleaved schedule; `offload_optimizer` needs ZeRO ≥ 1
//!   and takes a partial `ratio` under ZeRO-3 only; `offload_param` needs ZeRO-3; no ring
//!   context parallelism (DeepSpeed-Ulysses splits the sequence another way).
//! - torchtitan (`fsdp`): FSDP2 shards weights, gradients and optimizer state together
//!   (ZeRO-3, or ZeRO-2 with `fsdp_reshard_after_forward = "never"`); DDP only when data
//!   parallelism is the sole parallelism; `enable_cpu_offload` moves weights, gradients and
//!   optimizer state to the host together; tensor parallelism always shards norms along the
//!   sequence; activation checkpointing is none, selective or every layer. DeepSpeed and
//!   torchtitan recompute no module but the attention core on its own.
//! - Hybrid sharding (`dp_shard` below `dp`: state sharded within groups, replicated across
//!   them): Megatron-LM's `--num-distributed-optimizer-instances` (distributed optimizer,
//!   ZeRO-1), which Megatron-FSDP also takes for its HSDP at any sharding strategy; DeepSpeed's
//!   MiCS (`mics_shard_size`, ZeRO-3); torchtitan's `data_parallel_replicate_degree` with
//!   `data_parallel_shard_degree` (FSDP2's HSDP).
//! - Tessel's runtime (`tessel`, `tessel launch`, docs/RUNTIME-NOTES.md): ZeRO 0–3 with any
//!   pipeline, interleaving and context parallelism, the first N layers of a stage recomputed,
//!   any fraction of any state offloaded, and a different recompute and offload on every
//!   pipeline stage. None of the other four applies more than one recompute or offload setting
//!   to a job (Megatron-LM's `--recompute-*` and offload flags, DeepSpeed's `activation_checkpointing`
//!   and `zero_optimization`, torchtitan's `[activation_checkpoint]` are global).

use std::fmt;

use crate::chunks::stage_totals;
use crate::spec::{Framework, Offload, Recompute, RecomputeModules, Strategy};

/// One thing a framework cannot run: the `strategy` field that asks for it and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    /// `zero`, `pp`, `interleave`, `cp`, `etp`, `dp_shard`, `sequence_parallel`, `recompute` or
    /// `offload`.
    pub field: &'static str,
    /// `zero = 3: Megatron-LM runs ZeRO stages [0, 1]; …`
    pub reason: String,
}

impl Limit {
    fn new(field: &'static str, reason: String) -> Limit {
        Limit { field, reason }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

/// How a framework offloads optimizer state to host memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptimizerOffload {
    /// Not at all.
    Never,
    /// Any fraction, with at least this ZeRO stage (Megatron-LM's distributed optimizer).
    AnyFraction { min_zero: u8 },
    /// All of it with ZeRO ≥ 1, a fraction under ZeRO-3 (DeepSpeed's `ratio`).
    WholeOrFractionUnderZero3,
    /// Only with the weights and gradients, all of each, under ZeRO-3 (FSDP2's CPU offload).
    WithWeightsAndGradients,
}

/// How a framework keeps weights in host memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightOffload {
    /// Not at all (or only as FSDP2's offload of everything, [`OptimizerOffload::WithWeightsAndGradients`]).
    Never,
    /// All of them under ZeRO-3 (DeepSpeed's `offload_param`).
    AllUnderZero3,
    /// Any fraction at any ZeRO stage.
    AnyFraction,
}

/// How a framework moves gradients to host memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GradientOffload {
    /// Not at all (or only with FSDP2's offload of everything).
    Never,
    /// With the optimizer state, for a host optimizer step (DeepSpeed's ZeRO-Offload).
    WithOptimizer,
    /// Any fraction.
    AnyFraction,
}

/// Which layers a framework can recompute in full when not all of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartialRecompute {
    /// None: recompute is none, selective or every layer.
    Never,
    /// The first N layers of each virtual stage (Megatron-LM's `--recompute-method block
    /// --recompute-num-layers N`), so with interleaving a stage recomputes a multiple of its
    /// virtual stages.
    FirstLayers,
    /// The first N layers of each pipeline stage, across its virtual stages (Tessel's runtime).
    FirstLayersOfStage,
    /// Every k-th layer (torchtitan's `selective_ac_option = "k"`), so N must be the stage's
    /// layers over k.
    EveryKthLayer,
}

impl PartialRecompute {
    /// Whether `full_layers` of a stage of `stage_layers` layers can be the recomputed ones.
    pub fn runs(self, full_layers: u64, stage_layers: u64) -> bool {
        match self {
            PartialRecompute::Never => false,
            PartialRecompute::FirstLayers | PartialRecompute::FirstLayersOfStage => true,
            PartialRecompute::EveryKthLayer => {
                full_layers > 0 && (2..=stage_layers).any(|k| stage_layers / k == full_layers)
            }
        }
    }
}

/// How a framework offloads activations to host memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActivationOffload {
    Never,
    /// Without pipeline parallelism and without recompute (Megatron-LM's
    /// `--cpu-offloading-num-layers`).
    WithoutPipelineOrRecompute,
    /// All the checkpoints of whole-layer recompute (DeepSpeed's `cpu_checkpointing`).
    OfCheckpointedLayers,
    /// Any fraction, with or without recompute and pipelining.
    AnyFraction,
}

/// What one framework executes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// ZeRO stages it runs without pipeline parallelism.
    pub zero_stages: &'static [u8],
    /// ZeRO stages it runs with pipeline parallelism (empty: no pipeline parallelism).
    pub zero_stages_with_pipeline: &'static [u8],
    /// Interleaved (virtual-stage) pipeline schedules.
    pub interleave: bool,
    /// Ring-attention context parallelism.
    pub context_parallel: bool,
    /// ZeRO-0 alongside tensor, pipeline, context or expert parallelism.
    pub zero0_with_model_parallelism: bool,
    /// Tensor parallelism without sequence parallelism.
    pub tp_without_sequence_parallel: bool,
    /// Experts with a tensor-parallel degree of their own below `tp`, their expert-parallel
    /// ranks drawn from tp·dp·cp (Megatron-Core's MoE parallel folding,
    /// `--expert-tensor-parallel-size`).
    pub expert_folding: bool,
    /// ZeRO stages at which it shards state over part of the data-parallel ranks and
    /// replicates it over the rest (`dp_shard` below `dp`); empty: never.
    pub hybrid_sharding: &'static [u8],
    /// Which `recompute = { full_layers = N }` it runs.
    pub partial_recompute: PartialRecompute,
    /// The modules it can recompute on their own (`selective` is the attention core).
    pub recompute_modules: RecomputeModules,
    pub optimizer_offload: OptimizerOffload,
    pub weight_offload: WeightOffload,
    pub gradient_offload: GradientOffload,
    pub activation_offload: ActivationOffload,
    /// A different recompute and offload on each pipeline stage.
    pub per_stage_options: bool,
}

impl Framework {
    /// Every framework, in the order the language lists them.
    pub const ALL: [Framework; 5] = [
        Framework::Megatron,
        Framework::MegatronFsdp,
        Framework::Deepspeed,
        Framework::Fsdp,
        Framework::Tessel,
    ];

    /// The table: what this framework runs.
    pub fn capabilities(self) -> Capabilities {
        match self {
            Framework::Megatron => Capabilities {
                zero_stages: &[0, 1],
                zero_stages_with_pipeline: &[0, 1],
                interleave: true,
                context_parallel: true,
                zero0_with_model_parallelism: true,
                tp_without_sequence_parallel: true,
                expert_folding: true,
                hybrid_sharding: &[1],
                partial_recompute: PartialRecompute::FirstLayers,
                recompute_modules: RecomputeModules::ALL,
                optimizer_offload: OptimizerOffload::AnyFraction { min_zero: 1 },
                weight_offload: WeightOffload::Never,
                gradient_offload: GradientOffload::Never,
                activation_offload: ActivationOffload::WithoutPipelineOrRecompute,
                per_stage_options: false,
            },
            Framework::MegatronFsdp => Capabilities {
                zero_stages: &[0, 1, 2, 3],
                zero_stages_with_pipeline: &[],
                interleave: false,
                context_parallel: true,
                zero0_with_model_parallelism: true,
                tp_without_sequence_parallel: true,
                expert_folding: true,
                hybrid_sharding: &[1, 2, 3],
                partial_recompute: PartialRecompute::FirstLayers,
                recompute_modules: RecomputeModules::ALL,
                optimizer_offload: OptimizerOffload::Never,
                weight_offload: WeightOffload::Never,
                gradient_offload: GradientOffload::Never,
                activation_offload: ActivationOffload::Never,
                per_stage_options: false,
            },
            Framework::Deepspeed => Capabilities {
                zero_stages: &[0, 1, 2, 3],
                zero_stages_with_pipeline: &[0, 1],
                interleave: false,
                context_parallel: false,
                zero0_with_model_parallelism: true,
                tp_without_sequence_parallel: true,
                expert_folding: false,
                hybrid_sharding: &[3],
                partial_recompute: PartialRecompute::FirstLayers,
                recompute_modules: RecomputeModules::CORE_ATTN,
                optimizer_offload: OptimizerOffload::WholeOrFractionUnderZero3,
                weight_offload: WeightOffload::AllUnderZero3,
                gradient_offload: GradientOffload::WithOptimizer,
                activation_offload: ActivationOffload::OfCheckpointedLayers,
                per_stage_options: false,
            },
            Framework::Fsdp => Capabilities {
                zero_stages: &[0, 2, 3],
                zero_stages_with_pipeline: &[2, 3],
                interleave: true,
                context_parallel: true,
                zero0_with_model_parallelism: false,
                tp_without_sequence_parallel: false,
                expert_folding: false,
                hybrid_sharding: &[2, 3],
                partial_recompute: PartialRecompute::EveryKthLayer,
                recompute_modules: RecomputeModules::CORE_ATTN,
                optimizer_offload: OptimizerOffload::WithWeightsAndGradients,
                weight_offload: WeightOffload::Never,
                gradient_offload: GradientOffload::Never,
                activation_offload: ActivationOffload::Never,
                per_stage_options: false,
            },
            Framework::Tessel => Capabilities {
                zero_stages: &[0, 1, 2, 3],
                zero_stages_with_pipeline: &[0, 1, 2, 3],
                interleave: true,
                context_parallel: true,
                zero0_with_model_parallelism: true,
                tp_without_sequence_parallel: true,
                expert_folding: false,
                hybrid_sharding: &[],
                partial_recompute: PartialRecompute::FirstLayersOfStage,
                recompute_modules: RecomputeModules::CORE_ATTN,
                optimizer_offload: OptimizerOffload::AnyFraction { min_zero: 0 },
                weight_offload: WeightOffload::AnyFraction,
                gradient_offload: GradientOffload::AnyFraction,
                activation_offload: ActivationOffload::AnyFraction,
                per_stage_options: true,
            },
        }
    }

    /// The software's own name, for messages.
    pub fn software(self) -> &'static str {
        match self {
            Framework::Megatron => "Megatron-LM",
            Framework::MegatronFsdp => "Megatron-FSDP",
            Framework::Deepspeed => "DeepSpeed",
            Framework::Fsdp => "torchtitan",
            Framework::Tessel => "Tessel's runtime",
        }
    }

    /// Why this framework cannot run the parallel layout (degrees, ZeRO stage, interleaving,
    /// sequence parallelism) of `strategy`, one limit per reason; empty when it can.
    pub fn layout_limits(self, strategy: &Strategy) -> Vec<Limit> {
        let can = self.capabilities();
        let name = self.software();
        let mut limits = Vec::new();
        let stages = if strategy.pp > 1 {
            can.zero_stages_with_pipeline
        } else {
            can.zero_stages
        };
        if strategy.pp > 1 && can.zero_stages_with_pipeline.is_empty() {
            limits.push(Limit::new(
                "pp",
                format!("pp = {}: {name} has no pipeline parallelism", strategy.pp),
            ));
        } else if !stages.contains(&strategy.zero) {
            let with = if strategy.pp > 1 { " with pp > 1" } else { "" };
            limits.push(Limit::new(
                "zero",
                format!(
                    "zero = {}: {name} runs ZeRO stages {stages:?}{with}{}",
                    strategy.zero,
                    self.zero_hint(strategy.zero)
                ),
            ));
        }
        let model_parallel =
            strategy.tp > 1 || strategy.pp > 1 || strategy.cp > 1 || strategy.ep > 1;
        if strategy.zero == 0 && model_parallel && !can.zero0_with_model_parallelism {
            limits.push(Limit::new(
                "zero",
                format!(
                    "zero = 0: {name} runs unsharded data parallelism (DDP) only as the sole \
                     parallelism; use zero = 2 or 3"
                ),
            ));
        }
        if strategy.interleave > 1 && !can.interleave {
            limits.push(Limit::new(
                "interleave",
                format!(
                    "interleave = {}: {name} has no interleaved pipeline schedule",
                    strategy.interleave
                ),
            ));
        }
        if strategy.cp > 1 && !can.context_parallel {
            limits.push(Limit::new(
                "cp",
                format!(
                    "cp = {}: {name} has no ring-attention context parallelism",
                    strategy.cp
                ),
            ));
        }
        if strategy.expert_tp() != strategy.tp && !can.expert_folding {
            limits.push(Limit::new(
                "etp",
                format!(
                    "etp = {}: {name} splits experts over tp ({}), with no folding of its own",
                    strategy.expert_tp(),
                    strategy.tp
                ),
            ));
        }
        if strategy.shard_degree() < strategy.dp && !can.hybrid_sharding.contains(&strategy.zero) {
            limits.push(Limit::new(
                "dp_shard",
                format!(
                    "dp_shard = {}: {name} {}",
                    strategy.shard_degree(),
                    if can.hybrid_sharding.is_empty() {
                        "shards ZeRO state over every data-parallel rank".to_string()
                    } else {
                        format!(
                            "shards over part of the data-parallel ranks at ZeRO stages {:?} \
                             only",
                            can.hybrid_sharding
                        )
                    }
                ),
            ));
        }
        if strategy.tp > 1 && !strategy.sequence_parallel && !can.tp_without_sequence_parallel {
            limits.push(Limit::new(
                "sequence_parallel",
                format!(
                    "sequence_parallel = false: {name}'s tensor parallelism always shards norms \
                     along the sequence; use sequence_parallel = true"
                ),
            ));
        }
        limits
    }

    /// Why this framework cannot run the recompute and offload of one pipeline stage of
    /// `stage_layers` layers under the layout of `strategy` (its ZeRO stage and pipeline
    /// depth); empty when it can.
    pub fn stage_limits(
        self,
        strategy: &Strategy,
        stage_layers: u64,
        recompute: Recompute,
        offload: &Offload,
    ) -> Vec<Limit> {
        let mut limits: Vec<Limit> = self
            .recompute_limits(strategy, stage_layers, recompute)
            .into_iter()
            .map(|reason| Limit::new("recompute", reason))
            .collect();
        limits.extend(
            self.offload_limits(strategy, recompute, offload)
                .into_iter()
                .map(|reason| Limit::new("offload", reason)),
        );
        limits
    }

    fn recompute_limits(
        self,
        strategy: &Strategy,
        stage_layers: u64,
        recompute: Recompute,
    ) -> Vec<String> {
        let can = self.capabilities();
        let name = self.software();
        let mut reasons = Vec::new();
        if let Recompute::Partial { full_layers } = recompute {
            let v = strategy.interleave.max(1);
            if can.partial_recompute == PartialRecompute::FirstLayers && full_layers % v != 0 {
                reasons.push(format!(
                    "recompute = {recompute} with interleave = {v}: {name} recomputes the first \
                     N layers of each of the {v} virtual stages, so a stage recomputes a \
                     multiple of {v}"
                ));
            } else if !can.partial_recompute.runs(full_layers, stage_layers) {
                reasons.push(format!(
                    "recompute = {recompute}: {name} {}",
                    match can.partial_recompute {
                        PartialRecompute::EveryKthLayer => format!(
                            "recomputes every k-th layer, so of a stage's {stage_layers} layers \
                             {stage_layers}/k"
                        ),
                        _ => "recomputes no layers, selected modules or every layer".to_string(),
                    }
                ));
            }
        }
        let missing = recompute.modules().without(can.recompute_modules);
        if missing != RecomputeModules::NONE {
            reasons.push(format!(
                "recompute = {recompute}: {name} recomputes {}, not {missing}",
                if can.recompute_modules == RecomputeModules::CORE_ATTN {
                    "the attention core alone (selective) among modules".to_string()
                } else {
                    format!("only the modules {}", can.recompute_modules)
                }
            ));
        }
        reasons
    }

    fn offload_limits(
        self,
        strategy: &Strategy,
        recompute: Recompute,
        offload: &Offload,
    ) -> Vec<String> {
        let can = self.capabilities();
        let name = self.software();
        let zero = strategy.zero;
        let mut reasons = Vec::new();
        let fraction = |x: f64| x > 0.0 && x < 1.0;
        let optimizer_ok = match can.optimizer_offload {
            _ if offload.optimizer == 0.0 => true,
            OptimizerOffload::Never => false,
            OptimizerOffload::AnyFraction { min_zero } => zero >= min_zero,
            OptimizerOffload::WholeOrFractionUnderZero3 => {
                zero >= 1 && (!fraction(offload.optimizer) || zero == 3)
            }
            OptimizerOffload::WithWeightsAndGradients => zero == 3 && offload.optimizer == 1.0,
        };
        if !optimizer_ok {
            reasons.push(format!(
                "offload.optimizer = {}: {}",
                offload.optimizer,
                match can.optimizer_offload {
                    OptimizerOffload::Never => format!("{name} keeps optimizer state on the GPU"),
                    OptimizerOffload::AnyFraction { min_zero } => format!(
                        "{name} offloads optimizer state with its distributed optimizer \
                         (zero ≥ {min_zero})"
                    ),
                    OptimizerOffload::WholeOrFractionUnderZero3 => format!(
                        "{name} offloads optimizer state with ZeRO ≥ 1, a fraction of it under \
                         ZeRO-3 only"
                    ),
                    OptimizerOffload::WithWeightsAndGradients => format!(
                        "{name} offloads optimizer state, weights and gradients together, all of \
                         them, under zero = 3"
                    ),
                }
            ));
        }
        let together = can.optimizer_offload == OptimizerOffload::WithWeightsAndGradients;
        let all_three =
            offload.optimizer == 1.0 && offload.weights == 1.0 && offload.gradients == 1.0;
        let none_of_three =
            offload.optimizer == 0.0 && offload.weights == 0.0 && offload.gradients == 0.0;
        if together {
            if !all_three && !none_of_three && optimizer_ok {
                reasons.push(format!(
                    "offload = {{ optimizer = {}, weights = {}, gradients = {} }}: {name} offloads \
                     all three together or none",
                    offload.optimizer, offload.weights, offload.gradients
                ));
            }
        } else {
            let weights_ok = offload.weights == 0.0
                || match can.weight_offload {
                    WeightOffload::Never => false,
                    WeightOffload::AllUnderZero3 => zero == 3 && offload.weights == 1.0,
                    WeightOffload::AnyFraction => true,
                };
            if !weights_ok {
                reasons.push(format!(
                    "offload.weights = {}: {}",
                    offload.weights,
                    if can.weight_offload == WeightOffload::AllUnderZero3 {
                        format!("{name} keeps all weights in host memory under zero = 3, or none")
                    } else {
                        format!("{name} keeps weights on the GPU")
                    }
                ));
            }
            let gradients_ok = offload.gradients == 0.0
                || match can.gradient_offload {
                    GradientOffload::Never => false,
                    GradientOffload::WithOptimizer => offload.optimizer > 0.0 && optimizer_ok,
                    GradientOffload::AnyFraction => true,
                };
            if !gradients_ok {
                reasons.push(format!(
                    "offload.gradients = {}: {}",
                    offload.gradients,
                    if can.gradient_offload == GradientOffload::WithOptimizer {
                        format!("{name} moves gradients to the host only with the optimizer state")
                    } else {
                        format!("{name} keeps gradient buffers on the GPU")
                    }
                ));
            }
        }
        if offload.activations > 0.0 {
            let why = match can.activation_offload {
                ActivationOffload::Never => Some("has no activation offload"),
                ActivationOffload::WithoutPipelineOrRecompute
                    if strategy.pp > 1 || recompute != Recompute::None =>
                {
                    Some("offloads activations only without pipeline parallelism and without recompute")
                }
                ActivationOffload::OfCheckpointedLayers
                    if !matches!(recompute, Recompute::Full | Recompute::Partial { .. }) =>
                {
                    Some("offloads only the checkpoints of whole-layer recompute")
                }
                ActivationOffload::OfCheckpointedLayers if offload.activations < 1.0 => {
                    Some("offloads every checkpoint of whole-layer recompute (cpu_checkpointing) or none")
                }
                _ => None,
            };
            if let Some(why) = why {
                reasons.push(format!(
                    "offload.activations = {}: {name} {why}",
                    offload.activations
                ));
            }
        }
        reasons
    }

    /// Everything about `strategy` for a model of `layers` layers that this framework cannot
    /// run: its layout, whether its stages differ, and each stage's recompute and offload.
    pub fn limits(self, strategy: &Strategy, layers: u64) -> Vec<Limit> {
        let mut limits = self.layout_limits(strategy);
        let name = self.software();
        if !self.capabilities().per_stage_options {
            if let Some(stages) = &strategy.stage_recompute {
                let each: Vec<String> = stages.iter().map(Recompute::to_string).collect();
                limits.push(Limit::new(
                    "recompute",
                    format!(
                        "recompute = [{}]: {name} applies one recompute to every pipeline stage",
                        each.join(", ")
                    ),
                ));
            }
            if strategy.stage_offload.is_some() {
                limits.push(Limit::new(
                    "offload",
                    format!("offload differs by pipeline stage: {name} applies one offload to every stage"),
                ));
            }
        }
        let pp = strategy.pp.max(1);
        let totals = strategy
            .stages
            .as_ref()
            .map(|chunks| stage_totals(chunks, pp));
        for stage in 0..pp {
            let stage_layers = totals
                .as_ref()
                .and_then(|t| t.get(stage as usize).copied())
                .unwrap_or_else(|| layers.div_ceil(pp));
            let recompute = strategy.recompute_of(stage);
            let offload = strategy.offload_of(stage);
            for limit in self.stage_limits(strategy, stage_layers, recompute, &offload) {
                if !limits.contains(&limit) {
                    limits.push(limit);
                }
            }
        }
        limits
    }

    /// Where to go for a ZeRO stage this framework does not run.
    fn zero_hint(self, zero: u8) -> &'static str {
        match (self, zero) {
            (Framework::Megatron, 2 | 3) => {
                "; for ZeRO-2/3 use framework = megatron_fsdp (Megatron-FSDP), fsdp or deepspeed"
            }
            (Framework::Fsdp, 1) => {
                "; FSDP2 shards gradients and weights with optimizer state: use zero = 2"
            }
            _ => "",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strategy(tp: u64, pp: u64, zero: u8) -> Strategy {
        Strategy {
            name: "s".into(),
            dp: 8,
            tp,
            pp,
            sequence_parallel: tp > 1,
            zero,
            ..Strategy::default()
        }
    }

    #[test]
    fn megatron_runs_no_zero3_and_megatron_fsdp_no_pipeline() {
        assert!(Framework::Megatron
            .limits(&strategy(8, 1, 1), 32)
            .is_empty());
        let zero3 = Framework::Megatron.limits(&strategy(2, 1, 3), 32);
        assert_eq!(zero3.len(), 1);
        assert!(zero3[0].reason.contains("megatron_fsdp"), "{zero3:?}");
        assert_eq!(zero3[0].field, "zero");
        assert!(Framework::MegatronFsdp
            .limits(&strategy(2, 1, 3), 32)
            .is_empty());
        assert!(Framework::MegatronFsdp.limits(&strategy(2, 4, 3), 32)[0]
            .reason
            .contains("no pipeline"));
    }

    #[test]
    fn deepspeed_pipeline_takes_zero_0_or_1() {
        assert!(Framework::Deepspeed
            .limits(&strategy(1, 4, 1), 32)
            .is_empty());
        assert!(!Framework::Deepspeed
            .limits(&strategy(1, 4, 2), 32)
            .is_empty());
        assert!(Framework::Deepspeed
            .limits(&strategy(1, 1, 3), 32)
            .is_empty());
    }

    #[test]
    fn torchtitan_recomputes_every_kth_layer() {
        let mut s = strategy(1, 1, 3);
        s.recompute = Recompute::Partial { full_layers: 16 };
        assert!(Framework::Fsdp.limits(&s, 32).is_empty());
        s.recompute = Recompute::Partial { full_layers: 24 };
        assert_eq!(Framework::Fsdp.limits(&s, 32).len(), 1);
        s.zero = 1;
        assert!(Framework::Megatron.limits(&s, 32).is_empty());
    }

    #[test]
    fn offload_follows_each_framework() {
        let mut s = strategy(1, 1, 3);
        s.offload = Offload {
            optimizer: 1.0,
            activations: 0.5,
            ..Offload::default()
        };
        // Megatron: no ZeRO-3, but the offloads themselves are fine at pp = 1, no recompute.
        let megatron = Framework::Megatron.limits(&s, 32);
        assert_eq!(megatron.len(), 1, "{megatron:?}");
        // torchtitan: optimizer alone is not how FSDP2 offloads, and no activation offload.
        assert_eq!(Framework::Fsdp.limits(&s, 32).len(), 2);
        s.offload = Offload {
            optimizer: 1.0,
            weights: 1.0,
            gradients: 1.0,
            activations: 0.0,
        };
        assert!(Framework::Fsdp.limits(&s, 32).is_empty());
        // DeepSpeed: weights with ZeRO-3, gradients with the optimizer state.
        assert!(Framework::Deepspeed.limits(&s, 32).is_empty());
        s.offload.optimizer = 0.0;
        assert_eq!(Framework::Deepspeed.limits(&s, 32).len(), 1);
    }

    #[test]
    fn only_tessels_runtime_runs_options_that_differ_by_stage() {
        let mut s = strategy(1, 2, 1);
        s.set_stage_options(
            vec![Recompute::Full, Recompute::Selective],
            vec![
                Offload {
                    optimizer: 1.0,
                    ..Offload::default()
                },
                Offload::default(),
            ],
        );
        for framework in [Framework::Megatron, Framework::Deepspeed] {
            let fields: Vec<&str> = framework.limits(&s, 32).iter().map(|l| l.field).collect();
            assert_eq!(fields, ["recompute", "offload"], "{framework:?}");
        }
        assert!(Framework::Tessel.limits(&s, 32).is_empty());
        // Any ZeRO stage with a pipeline, any fraction of any state, partial recompute across
        // virtual stages.
        let mut s = strategy(2, 4, 3);
        s.interleave = 2;
        s.recompute = Recompute::Partial { full_layers: 3 };
        s.offload = Offload {
            optimizer: 0.5,
            weights: 0.25,
            gradients: 0.5,
            activations: 0.5,
        };
        assert!(Framework::Tessel.limits(&s, 32).is_empty());
        assert!(Framework::Megatron.limits(&s, 32).len() >= 3);
    }
}
