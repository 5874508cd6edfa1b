//! The library entry points the CLI calls: search a spec into a plan, or turn a fixed strategy
//! into a plan file.

use std::time::Instant;

use tessel_grammar::{Offload, Recompute, Spec, Strategy};

use crate::cost_model::StageCostModel;
use crate::error::PlanError;
use crate::layers::{chunk_ranges, even_chunks, stage_chunks, stage_totals};
use crate::losses::loss_reason;
use crate::milp::MilpSettings;
use crate::nothing_fits::{FixedDoesNotFit, ModelFactory};
use crate::objective::{Objective, RankingFactor};
use crate::plan::{
    spec_digest, Plan, PlanConfig, PlanStage, RunnerUp, SearchStats, SolverReport, SolverStatus,
    PLAN_FORMAT,
};
use crate::rank_map::{MeshShape, RankMap};
use crate::search::{search, SearchProgress, Solved};
use crate::space::OuterConfig;

/// Runners-up kept when neither the options nor the spec say.
pub const DEFAULT_TOP: usize = 3;

/// How to search. Threads come from rayon's global pool (or the pool the call runs in).
#[derive(Clone, Copy, Default)]
pub struct PlanOptions<'a> {
    /// Runners-up to keep; `None` uses the spec's `top`, else [`DEFAULT_TOP`].
    pub top: Option<usize>,
    /// MILP limits; `None` uses the defaults, with the spec's `time_limit` as the solver's.
    pub milp: Option<MilpSettings>,
    /// Called after each round of the search.
    pub progress: Option<&'a (dyn Fn(&SearchProgress) + Sync)>,
    /// Builds cost models for changed specs, so that "nothing fits" can try more nodes and
    /// shorter sequences instead of estimating them.
    pub model_for_spec: Option<ModelFactory<'a>>,
    /// What configurations are ranked by (the library's default: the expected step time).
    pub objective: Objective,
    /// Search only configurations whose every mechanism some validated run near them shares.
    pub validated_only: bool,
}

/// Timings of a search, kept out of the plan file so that it stays byte-stable.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SearchTimings {
    pub wall_s: f64,
}

#[derive(Clone, Debug)]
pub struct PlanOutcome {
    pub plan: Plan,
    pub timings: SearchTimings,
}

fn config_of(outer: &OuterConfig) -> PlanConfig {
    PlanConfig {
        dp: outer.dp,
        tp: outer.tp,
        pp: outer.pp,
        cp: outer.cp,
        ep: outer.ep,
        etp: (outer.etp != outer.tp).then_some(outer.etp),
        dp_shard: (outer.dp_shard != outer.dp).then_some(outer.dp_shard),
        interleave: outer.interleave,
        microbatch: outer.microbatch,
        microbatches: outer.microbatches,
        zero: outer.zero,
        sequence_parallel: outer.sequence_parallel,
    }
}

/// Partial recompute of at least every layer of a stage is full recompute, and of no layer is
/// none; the cost model accepts only counts within the stage.
fn canonical_recompute(recompute: Recompute, stage_layers: u64) -> Recompute {
    match recompute {
        Recompute::Partial { full_layers: 0 } => Recompute::None,
        Recompute::Partial { full_layers } if full_layers >= stage_layers => Recompute::Full,
        other => other,
    }
}

fn strategy_of(solved: &Solved) -> Strategy {
    let mut strategy = solved.outer.strategy(
        "plan",
        Recompute::None,
        Offload::default(),
        Some(stage_chunks(&solved.stages, solved.outer.interleave)),
    );
    let canonical: Vec<Recompute> = solved
        .options
        .iter()
        .zip(&solved.stages)
        .map(|(option, &layers)| canonical_recompute(option.recompute, layers))
        .collect();
    // One recompute on every stage stays one, as frameworks without per-stage options write it
    // (`{ full_layers = 1 }` on a stage of one layer is still the same flag everywhere).
    // Not when a stage holds fewer layers than the count (a first stage shortened for a
    // multimodal model's encoders): that stage's is full recompute.
    let uniform = |r: &[Recompute]| r.windows(2).all(|w| w[0] == w[1]);
    let chosen: Vec<Recompute> = solved.options.iter().map(|o| o.recompute).collect();
    let within = chosen
        .iter()
        .zip(&solved.stages)
        .all(|(r, &layers)| match r {
            Recompute::Partial { full_layers } => *full_layers <= layers,
            _ => true,
        });
    strategy.set_stage_options(
        if uniform(&chosen) && !uniform(&canonical) && within {
            chosen
        } else {
            canonical
        },
        solved.options.iter().map(|option| option.offload).collect(),
    );
    strategy
}

/// Searches the spec's space and returns the best plan with its runners-up.
pub fn plan(
    spec: &Spec,
    model: &dyn StageCostModel,
    options: &PlanOptions<'_>,
) -> Result<PlanOutcome, PlanError> {
    let started = Instant::now();
    let top = options
        .top
        .or(spec.search.top.map(|top| top as usize))
        .unwrap_or(DEFAULT_TOP);
    let settings = options.milp.unwrap_or_else(|| {
        let defaults = MilpSettings::default();
        MilpSettings {
            time_limit_s: spec
                .search
                .time_limit
                .filter(|limit| *limit > 0.0)
                .map_or(defaults.time_limit_s, |limit| {
                    limit.min(defaults.time_limit_s)
                }),
            ..defaults
        }
    });
    let ranking = RankingFactor::new(spec, options.objective, options.validated_only);
    let result = search(
        spec,
        model,
        &ranking,
        top + 1,
        &settings,
        options.progress,
        options.model_for_spec,
    )?;
    // The solver ranks by the stage costs it optimises; the estimate adds what those leave out
    // (an encoder's uneven items per step), so the finalists are ranked again on their
    // estimates, each under the factor the search gave it.
    let mut finalists = result
        .ranked
        .iter()
        .map(|solved| {
            let estimate = model
                .estimate(&strategy_of(solved))
                .map_err(|message| PlanError::CostModel { message })?;
            let factor = if solved.step_time_s > 0.0 {
                solved.ranked_s / solved.step_time_s
            } else {
                1.0
            };
            Ok((solved, estimate.step_time_s * factor, estimate))
        })
        .collect::<Result<Vec<_>, PlanError>>()?;
    finalists.sort_by(|a, b| a.1.total_cmp(&b.1));
    // Plans tied with the best rank within the objective's margin are told apart by their
    // expected step time.
    let limit = options.objective.tie_limit(finalists[0].1);
    let chosen = (0..finalists.len())
        .take_while(|&i| finalists[i].1 <= limit)
        .min_by(|&a, &b| {
            finalists[a]
                .2
                .step_time_s
                .total_cmp(&finalists[b].2.step_time_s)
                .then(a.cmp(&b))
        })
        .unwrap_or(0);
    let (best, _, best_estimate) = finalists.remove(chosen);
    finalists.truncate(top);
    let mut runners_up = Vec::new();
    for (solved, _, estimate) in finalists {
        let strategy = strategy_of(solved);
        let (loses_on, reason) = loss_reason(&best_estimate, &estimate, options.objective);
        runners_up.push(RunnerUp {
            config: config_of(&solved.outer),
            recompute: strategy.recompute,
            offload: strategy.offload,
            stage_recompute: strategy.stage_recompute,
            stage_offload: strategy.stage_offload,
            stages: solved.stages.clone(),
            step_time_s: estimate.step_time_s,
            tokens_per_s: estimate.tokens_per_s,
            mfu: estimate.mfu,
            loses_on,
            reason,
        });
    }
    let mut plan = assemble(
        spec,
        &best.outer,
        &strategy_of(best),
        best_estimate,
        SolverReport {
            status: best.status,
            objective_s: best.step_time_s,
        },
        result.stats,
        runners_up,
    );
    plan.objective = options.objective;
    Ok(PlanOutcome {
        plan,
        timings: SearchTimings {
            wall_s: started.elapsed().as_secs_f64(),
        },
    })
}

/// Checks a fixed strategy against the spec.
fn check_strategy(spec: &Spec, strategy: &Strategy) -> Result<(), PlanError> {
    let invalid = |reason: String| Err(PlanError::InvalidStrategy { reason });
    let degrees = [
        ("dp", strategy.dp),
        ("tp", strategy.tp),
        ("pp", strategy.pp),
        ("cp", strategy.cp),
        ("ep", strategy.ep),
        ("microbatch", strategy.microbatch),
        ("interleave", strategy.interleave),
    ];
    if let Some((name, _)) = degrees.iter().find(|(_, value)| *value == 0) {
        return invalid(format!("`{name}` must be at least 1"));
    }
    let gpus = spec.cluster.total_gpus();
    let product = strategy
        .dp
        .saturating_mul(strategy.tp)
        .saturating_mul(strategy.pp)
        .saturating_mul(strategy.cp);
    if product != gpus {
        return invalid(format!(
            "dp·tp·pp·cp = {}·{}·{}·{} = {product}, but the cluster has {gpus} GPUs",
            strategy.dp, strategy.tp, strategy.pp, strategy.cp
        ));
    }
    let per_step = strategy.dp.saturating_mul(strategy.microbatch);
    if !spec.train.global_batch.is_multiple_of(per_step) {
        return invalid(format!(
            "the global batch of {} is not a multiple of dp·microbatch = {per_step}",
            spec.train.global_batch
        ));
    }
    if let Some(reason) = strategy.expert_layout_error(&spec.model) {
        return invalid(reason);
    }
    if strategy.pp.saturating_mul(strategy.interleave) > spec.model.layers {
        return invalid(format!(
            "pp·interleave = {} chunks exceeds the model's {} layers",
            strategy.pp.saturating_mul(strategy.interleave),
            spec.model.layers
        ));
    }
    if let Some(stages) = &strategy.stages {
        let chunks = strategy.pp.saturating_mul(strategy.interleave);
        if stages.len() as u64 != chunks {
            return invalid(format!(
                "`stages` lists {} entries but pp·interleave = {chunks} (one per chunk)",
                stages.len()
            ));
        }
        let total = stages.iter().fold(0u64, |sum, &l| sum.saturating_add(l));
        if total != spec.model.layers {
            return invalid(format!(
                "`stages` hold {total} layers, the model has {}",
                spec.model.layers
            ));
        }
        if let Some(reason) = tessel_grammar::empty_chunk_error(stages) {
            return invalid(format!("`stages`: {reason}"));
        }
    }
    if strategy.zero > 3 {
        return invalid(format!("ZeRO stage {} does not exist", strategy.zero));
    }
    Ok(())
}

/// A plan file for a fixed strategy (`tessel plan --strategy NAME`). Its `stages`, when given,
/// list the layers of every chunk (`pp·interleave` entries); otherwise layers are spread evenly.
pub fn plan_fixed(
    spec: &Spec,
    model: &dyn StageCostModel,
    strategy: &Strategy,
) -> Result<Plan, PlanError> {
    check_strategy(spec, strategy)?;
    let mut fixed = strategy.clone();
    if fixed.stages.is_none() {
        fixed.stages = Some(even_chunks(
            spec.model.layers,
            strategy.pp,
            strategy.interleave,
        ));
    }
    let estimate = model
        .estimate(&fixed)
        .map_err(|message| PlanError::CostModel { message })?;
    let outer = OuterConfig::of_strategy(&fixed, spec.train.global_batch);
    if !estimate.fits {
        return Err(PlanError::FixedDoesNotFit {
            explanation: Box::new(FixedDoesNotFit::of(outer.label(), &estimate)),
        });
    }
    let step = estimate.step_time_s;
    Ok(assemble(
        spec,
        &outer,
        &fixed,
        estimate,
        SolverReport {
            status: SolverStatus::Fixed,
            objective_s: step,
        },
        SearchStats::default(),
        Vec::new(),
    ))
}

fn assemble(
    spec: &Spec,
    outer: &OuterConfig,
    strategy: &Strategy,
    prediction: tessel_symbolic::cost::Estimate,
    solver: SolverReport,
    search: SearchStats,
    runners_up: Vec<RunnerUp>,
) -> Plan {
    let chunks = strategy.stages.clone().unwrap_or_default();
    let stage_layers = stage_totals(&chunks, strategy.pp);
    let ranges = chunk_ranges(&chunks, strategy.pp);
    let stages = stage_layers
        .iter()
        .zip(ranges)
        .enumerate()
        .map(|(stage, (&layers, layer_ranges))| PlanStage {
            stage: stage as u64,
            layers,
            layer_ranges,
            recompute: strategy.recompute_of(stage as u64),
            offload: strategy.offload_of(stage as u64),
        })
        .collect();
    let rank_map = RankMap::build(&MeshShape {
        tp: outer.tp,
        cp: outer.cp,
        dp: outer.dp,
        pp: outer.pp,
        ep: outer.ep,
        etp: outer.etp,
        gpus_per_node: spec.cluster.gpus_per_node,
    });
    let checkpoints = crate::checkpoint_plan(spec, prediction.step_time_s);
    Plan {
        format: PLAN_FORMAT.to_string(),
        spec_digest: spec_digest(spec),
        spec: spec.clone(),
        model: spec.model.name.clone(),
        cluster: spec.cluster.name.clone(),
        gpus: spec.cluster.total_gpus(),
        gpus_per_node: spec.cluster.gpus_per_node,
        seq_len: spec.train.seq_len,
        global_batch: spec.train.global_batch,
        config: config_of(outer),
        stages,
        rank_map,
        prediction,
        // A fixed configuration ranks nothing; `plan` sets the objective it searched by.
        objective: Objective::Expected,
        solver,
        search,
        runners_up,
        checkpoints,
        placement: None,
        finetune_choice: None,
        kernels_choice: None,
        compression_choice: None,
        placement_choice: None,
    }
}
