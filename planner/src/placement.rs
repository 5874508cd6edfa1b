//! Plans for a cluster made of pools of different GPUs: where the work goes.
//!
//! Placements tried: one pipeline through every pool (each stage on one pool, the MILP giving
//! each stage the layers its pool sustains, see `tessel_symbolic::cost::PooledCostModel`), and
//! each pool alone. The plan is the placement ranked best by the search's objective (the global
//! batch is the same, so the step time decides: by default the high end of its 80 % interval);
//! it lists every placement tried with its step time or why it has none, so that a plan on one
//! pool says why the others lost.

use std::time::Instant;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use tessel_grammar::{ClusterSpec, Spec};
use tessel_symbolic::cost::{pipeline_order, pool_spec, CostModel, Estimate, PooledCostModel};

use crate::error::PlanError;
use crate::plan::Plan;
use crate::planning::{plan, PlanOptions, PlanOutcome};

/// The placement name of one pipeline through every pool.
pub const ACROSS_POOLS: &str = "pipeline across pools";

/// Where a plan on a cluster of pools runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolPlacement {
    /// The cluster of pools the plan was made for, as the spec writes it (the plan's own spec
    /// holds the cluster its placement's search saw): what `replan` grows.
    pub cluster: ClusterSpec,
    /// [`ACROSS_POOLS`], or `pool NAME` for one pool alone.
    pub placement: String,
    /// The pools the plan uses, in pipeline order, with the ranks and stages on each.
    pub pools: Vec<PlacedPool>,
    /// Every placement tried.
    pub tried: Vec<PlacementOutcome>,
}

/// One pool of a plan: global ranks `[first, last)` and pipeline stages `[first, last)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlacedPool {
    pub name: String,
    pub gpu: String,
    pub ranks: [u64; 2],
    pub stages: [u64; 2],
}

/// A placement's best plan, or why it has none.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlacementOutcome {
    pub placement: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_time_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why_not: Option<String>,
}

/// Plans a spec whose cluster has pools: every placement, the fastest kept.
pub fn plan_on_pools(spec: &Spec, options: &PlanOptions<'_>) -> Result<PlanOutcome, PlanError> {
    let started = Instant::now();
    let cost_error = |message: String| PlanError::CostModel { message };
    // "Nothing fits" suggestions resize a homogeneous cluster; a placement that fits nowhere
    // is reported here instead.
    let options = PlanOptions {
        model_for_spec: None,
        ..*options
    };
    let across = PooledCostModel::new(spec).map_err(|e| cost_error(e.to_string()))?;
    // `None`: the pipeline across every pool; a pool: that pool alone.
    let mut placements: Vec<Option<&ClusterSpec>> = vec![None];
    placements.extend(pipeline_order(&spec.cluster).into_iter().map(Some));
    // The placements' searches are independent: they run side by side.
    let mut outcomes: Vec<Result<PlanOutcome, PlanError>> = placements
        .par_iter()
        .map(|placement| match placement {
            None => plan(across.search_spec(), &across, &options),
            Some(pool) => {
                let one = pool_spec(spec, pool);
                CostModel::new(&one)
                    .map_err(|e| cost_error(e.to_string()))
                    .and_then(|model| plan(&one, &model, &options))
            }
        })
        .collect();
    let tried: Vec<PlacementOutcome> = placements
        .iter()
        .zip(&outcomes)
        .map(|(&placement, outcome)| PlacementOutcome {
            placement: placement_name(placement),
            step_time_s: outcome.as_ref().ok().map(|o| o.plan.prediction.step_time_s),
            why_not: outcome.as_ref().err().map(|e| first_line(&e.to_string())),
        })
        .collect();
    // Ranked as each search ranked its configurations (by default the high end of the 80 %
    // interval, which is wider across pools: no validated run mixes GPU types).
    let ranked = |o: &PlanOutcome| options.objective.ranked_step_time(&o.plan.prediction);
    let best = outcomes
        .iter()
        .enumerate()
        .filter_map(|(i, o)| o.as_ref().ok().map(|o| (i, ranked(o))))
        .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
        .map(|(i, _)| i);
    let Some(best) = best else {
        // Nothing fits anywhere: the pipeline's own explanation says what is short.
        return outcomes.swap_remove(0);
    };
    let mut outcome = outcomes.swap_remove(best)?;
    let plan = &mut outcome.plan;
    // The pools used, in pipeline order, with the stages each holds.
    let used: Vec<(&ClusterSpec, u64)> = match placements[best] {
        None => pipeline_order(&spec.cluster)
            .into_iter()
            .zip(across.stages_per_pool(&plan.strategy()).unwrap_or_default())
            .collect(),
        Some(pool) => vec![(pool, plan.config.pp)],
    };
    let per_stage = plan.config.tp * plan.config.cp * plan.config.dp;
    let mut first = 0;
    let pools = used
        .into_iter()
        .map(|(pool, count)| {
            let placed = PlacedPool {
                name: pool.name.clone(),
                gpu: pool.gpu.name.clone(),
                ranks: [first * per_stage, (first + count) * per_stage],
                stages: [first, first + count],
            };
            first += count;
            placed
        })
        .collect();
    plan.placement = Some(PoolPlacement {
        cluster: spec.cluster.clone(),
        placement: placement_name(placements[best]),
        pools,
        tried,
    });
    outcome.timings.wall_s = started.elapsed().as_secs_f64();
    Ok(outcome)
}

/// [`ACROSS_POOLS`], or `pool NAME` for one pool alone.
fn placement_name(placement: Option<&ClusterSpec>) -> String {
    placement.map_or(ACROSS_POOLS.to_string(), |pool| {
        format!("pool {}", pool.name)
    })
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or("").to_string()
}

/// What the cost model predicts today for a plan made on a cluster of pools, under the
/// placement the plan records (for `plan --check`).
pub fn estimate_placed(spec: &Spec, plan: &Plan) -> Result<Estimate, String> {
    let placement = plan
        .placement
        .as_ref()
        .ok_or_else(|| "the plan records no placement on the cluster's pools".to_string())?;
    let strategy = plan.strategy();
    if placement.placement == ACROSS_POOLS {
        return PooledCostModel::new(spec)
            .and_then(|model| model.estimate(&strategy))
            .map_err(|e| e.to_string());
    }
    let name = placement
        .pools
        .first()
        .map(|p| p.name.as_str())
        .unwrap_or_default();
    let pool = spec
        .cluster
        .pool(name)
        .ok_or_else(|| format!("the spec's cluster has no pool `{name}`"))?;
    CostModel::new(&pool_spec(spec, pool))
        .and_then(|model| model.estimate(&strategy))
        .map_err(|e| e.to_string())
}

impl PoolPlacement {
    /// A plan of `stages` stages on `pool` alone, of the cluster of pools `cluster`, where no
    /// other placement was tried (a fixed shape re-costed by `replan`).
    pub fn one_pool(cluster: &ClusterSpec, pool: &ClusterSpec, stages: u64) -> PoolPlacement {
        PoolPlacement {
            cluster: cluster.clone(),
            placement: placement_name(Some(pool)),
            pools: vec![PlacedPool {
                name: pool.name.clone(),
                gpu: pool.gpu.name.clone(),
                ranks: [0, pool.total_gpus()],
                stages: [0, stages],
            }],
            tried: Vec::new(),
        }
    }

    /// Where global rank `rank` runs: its pool, its index among the pool's GPUs, and the pool.
    pub fn gpu_of(&self, rank: u64) -> Option<(&ClusterSpec, u64)> {
        let placed = self
            .pools
            .iter()
            .find(|p| (p.ranks[0]..p.ranks[1]).contains(&rank))?;
        Some((self.cluster.pool(&placed.name)?, rank - placed.ranks[0]))
    }
}
