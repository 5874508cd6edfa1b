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
use tessel_symbolic::cost::{
    pipeline_order, pool_spec, pooled_search_spec, replicas_across_pools, CostModel, Estimate,
    PooledCostModel, ReplicaShares,
};

use crate::error::PlanError;
use crate::plan::{spec_digest, Plan};
use crate::planning::{plan, PlanOptions, PlanOutcome};
use crate::rank_map::{MeshShape, RankMap};

/// The placement name of one pipeline through every pool.
pub const ACROSS_POOLS: &str = "pipeline across pools";

/// The placement name of data-parallel replicas on every pool with uneven shares of the batch,
/// followed by whose shape they take (` (shape of pool NAME)`).
pub const REPLICAS_ACROSS_POOLS: &str = "replicas across pools";

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

/// One pool of a plan: global ranks `[first, last)` and pipeline stages `[first, last)`; with
/// replicas across pools, also the data-parallel replicas `[first, last)` on it and the
/// micro-batches each of them runs per step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlacedPool {
    pub name: String,
    pub gpu: String,
    pub ranks: [u64; 2],
    pub stages: [u64; 2],
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<[u64; 2]>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub microbatches: Option<u64>,
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
    // Each pool's best shape again as replicas on every pool, the batch split unevenly.
    let replicated: Vec<(
        String,
        Result<PlanOutcome, PlanError>,
        Option<ReplicaShares>,
    )> = placements
        .iter()
        .zip(&outcomes)
        .filter_map(|(placement, outcome)| Some((placement.as_ref()?, outcome.as_ref().ok()?)))
        .map(|(pool, alone)| {
            let name = format!("{REPLICAS_ACROSS_POOLS} (shape of pool {})", pool.name);
            match replicas_across_pools(spec, &alone.plan.strategy()) {
                Ok(shares) => {
                    let plan = replicas_plan(spec, &alone.plan, &shares);
                    let outcome = PlanOutcome {
                        plan,
                        timings: alone.timings,
                    };
                    (name, Ok(outcome), Some(shares))
                }
                Err(e) => (name, Err(cost_error(e.to_string())), None),
            }
        })
        .collect();
    let mut names: Vec<String> = placements.iter().map(|&p| placement_name(p)).collect();
    let mut shares: Vec<Option<ReplicaShares>> = vec![None; placements.len()];
    for (name, outcome, split) in replicated {
        names.push(name);
        outcomes.push(outcome);
        shares.push(split);
    }
    let tried: Vec<PlacementOutcome> = names
        .iter()
        .zip(&outcomes)
        .map(|(placement, outcome)| PlacementOutcome {
            placement: placement.clone(),
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
    let placement = names.swap_remove(best);
    let split = shares.swap_remove(best);
    let mut outcome = outcomes.swap_remove(best)?;
    let plan = &mut outcome.plan;
    let config = plan.config;
    let per_stage = config.tp * config.cp * config.dp;
    let mut first = 0;
    let pools: Vec<PlacedPool> = match (placements.get(best), split) {
        (_, Some(split)) => {
            let per_replica = config.tp * config.cp * config.pp;
            let mut first_replica = 0;
            pipeline_order(&spec.cluster)
                .into_iter()
                .zip(split.replicas.iter().zip(&split.microbatches))
                .map(|(pool, (&replicas, &m))| {
                    let placed = PlacedPool {
                        replicas: Some([first_replica, first_replica + replicas]),
                        microbatches: Some(m),
                        ..placed_pool(
                            pool,
                            [first, first + replicas * per_replica],
                            [0, config.pp],
                        )
                    };
                    first += replicas * per_replica;
                    first_replica += replicas;
                    placed
                })
                .collect()
        }
        (Some(None), None) => pipeline_order(&spec.cluster)
            .into_iter()
            .zip(across.stages_per_pool(&plan.strategy()).unwrap_or_default())
            .map(|(pool, count)| {
                let placed = placed_pool(
                    pool,
                    [first * per_stage, (first + count) * per_stage],
                    [first, first + count],
                );
                first += count;
                placed
            })
            .collect(),
        (Some(Some(pool)), None) => {
            vec![placed_pool(pool, [0, pool.total_gpus()], [0, config.pp])]
        }
        (None, None) => unreachable!("a replicated placement has its shares"),
    };
    plan.placement = Some(PoolPlacement {
        cluster: spec.cluster.clone(),
        placement,
        pools,
        tried,
    });
    outcome.timings.wall_s = started.elapsed().as_secs_f64();
    Ok(outcome)
}

fn placed_pool(pool: &ClusterSpec, ranks: [u64; 2], stages: [u64; 2]) -> PlacedPool {
    PlacedPool {
        name: pool.name.clone(),
        gpu: pool.gpu.name.clone(),
        ranks,
        stages,
        replicas: None,
        microbatches: None,
    }
}

/// The plan of `base`'s shape as replicas on every pool with `shares` of the batch: every
/// pool's GPUs in one cluster, ranks pool by pool (each pool's replicas laid out as the mesh
/// lays out any, data-parallel coordinates counted on from the pool before), and the
/// prediction of the split.
fn replicas_plan(spec: &Spec, base: &Plan, shares: &ReplicaShares) -> Plan {
    let search = pooled_search_spec(spec);
    let c = base.config;
    let mut ranks = Vec::new();
    let (mut first_rank, mut first_node, mut first_replica) = (0, 0, 0);
    for (pool, &replicas) in pipeline_order(&spec.cluster)
        .into_iter()
        .zip(&shares.replicas)
    {
        let local = RankMap::build(&MeshShape {
            tp: c.tp,
            cp: c.cp,
            dp: replicas,
            pp: c.pp,
            ep: c.ep,
            etp: c.etp.unwrap_or(c.tp),
            gpus_per_node: pool.gpus_per_node,
        });
        for row in &local.ranks {
            let [rank, node, local_gpu, pp, dp, cp, tp, ep] = *row;
            ranks.push([
                rank + first_rank,
                node + first_node,
                local_gpu,
                pp,
                dp + first_replica,
                cp,
                tp,
                ep,
            ]);
        }
        first_rank += local.ranks.len() as u64;
        first_node += pool.nodes;
        first_replica += replicas;
    }
    let mut plan = base.clone();
    plan.rank_map.ranks = ranks;
    plan.config.dp = first_replica;
    // The most any replica runs; each pool's count is in the placement.
    plan.config.microbatches = shares.microbatches.iter().copied().max().unwrap_or(1);
    plan.gpus = first_rank;
    plan.gpus_per_node = search.cluster.gpus_per_node;
    plan.cluster = search.cluster.name.clone();
    plan.spec_digest = spec_digest(&search);
    plan.checkpoints = crate::checkpoint_plan(&search, shares.estimate.step_time_s);
    plan.spec = search;
    plan.prediction = shares.estimate.clone();
    // The split is searched exhaustively on the shape the pool's search solved for.
    plan.solver.objective_s = shares.estimate.step_time_s;
    // Its alternatives are the other placements, listed with them.
    plan.runners_up.clear();
    plan
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
    if placement.uneven_replicas() {
        return replicas_across_pools(spec, &strategy)
            .map(|shares| shares.estimate)
            .map_err(|e| e.to_string());
    }
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
    /// Whether the replicas of the plan run different micro-batch counts (replicas across
    /// pools), which the runtime does not execute.
    pub fn uneven_replicas(&self) -> bool {
        self.pools.iter().any(|p| p.microbatches.is_some())
    }

    /// A plan of `stages` stages on `pool` alone, of the cluster of pools `cluster`, where no
    /// other placement was tried (a fixed shape re-costed by `replan`).
    pub fn one_pool(cluster: &ClusterSpec, pool: &ClusterSpec, stages: u64) -> PoolPlacement {
        PoolPlacement {
            cluster: cluster.clone(),
            placement: placement_name(Some(pool)),
            pools: vec![placed_pool(pool, [0, pool.total_gpus()], [0, stages])],
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
