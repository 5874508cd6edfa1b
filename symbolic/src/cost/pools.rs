//! [`PooledCostModel`]: the cost of a pipeline whose stages run on pools of different GPUs.
//!
//! A cluster made of pools (`pool NAME { … }`) runs one pipeline through all of them: every
//! stage is `tp·cp·dp` GPUs of one pool, a pool holds as many whole stages as its GPUs make, and
//! the pools follow one another in the pipeline, the one with the most memory per GPU first
//! (under 1F1B the first stages hold the most micro-batches in flight). Each stage is costed by
//! the cost model of its own pool, so it computes at its GPU's rates, reduces its gradients over
//! its pool's links and is held to its GPU's memory; only the activations crossing from one pool
//! to the next travel over the link between pools. The planner's MILP then gives each stage the
//! layers its pool sustains.

use tessel_grammar::{ClusterSpec, Offload, Recompute, Spec, Strategy};

use super::model::{estimate_stages, peak_for};
use super::slots::Output;
use super::{CostError, CostModel, Estimate, PipelineShape, StageCost, StageOutputs};

/// One pool as the pipeline sees it.
#[derive(Clone, Debug)]
struct PoolModel {
    name: String,
    gpus: u64,
    /// The pool as a cluster of its own.
    model: CostModel,
    /// The same pool whose pipeline sends cross the link between pools: what a stage at a
    /// pool's edge pays for them.
    edge: CostModel,
}

/// The cost model of a spec whose cluster has pools. `Send + Sync`.
#[derive(Clone, Debug)]
pub struct PooledCostModel {
    /// The spec as the search sees it: every pool's GPUs in one cluster (see
    /// [`pooled_search_spec`]).
    spec: Spec,
    /// In pipeline order.
    pools: Vec<PoolModel>,
}

/// The spec with one pool as its whole cluster.
pub fn pool_spec(spec: &Spec, pool: &ClusterSpec) -> Spec {
    let mut one = spec.clone();
    one.cluster = ClusterSpec {
        name: format!("{}.{}", spec.cluster.name, pool.name),
        ..pool.clone()
    };
    one
}

/// The pools of `cluster` in pipeline order: most memory per GPU first, then as written.
pub fn pipeline_order(cluster: &ClusterSpec) -> Vec<&ClusterSpec> {
    let mut pools: Vec<&ClusterSpec> = cluster.pools.iter().collect();
    pools.sort_by(|a, b| b.gpu.memory.total_cmp(&a.gpu.memory));
    pools
}

/// The spec the search enumerates for a pipeline through every pool: a cluster of all their
/// GPUs, nodes as large as the greatest common node size (so that a tensor-parallel group stays
/// inside a node of every pool), described otherwise by the first pool of the pipeline.
pub fn pooled_search_spec(spec: &Spec) -> Spec {
    let pools = pipeline_order(&spec.cluster);
    let gpus: u64 = pools.iter().map(|p| p.total_gpus()).sum();
    let per_node = pools
        .iter()
        .map(|p| p.gpus_per_node)
        .reduce(gcd)
        .unwrap_or(1)
        .max(1);
    let mut search = spec.clone();
    if let Some(first) = pools.first() {
        search.cluster = ClusterSpec {
            name: spec.cluster.name.clone(),
            nodes: gpus / per_node,
            gpus_per_node: per_node,
            pools: spec.cluster.pools.clone(),
            between_pools: spec.cluster.between_pools.clone(),
            ..(*first).clone()
        };
    }
    search
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl PooledCostModel {
    /// Builds one cost model per pool (and one for its edge); an error when the cluster has no
    /// pools.
    pub fn new(spec: &Spec) -> Result<PooledCostModel, CostError> {
        if spec.cluster.pools.len() < 2 {
            return Err(CostError::spec(format!(
                "cluster `{}` has no pools to plan across",
                spec.cluster.name
            )));
        }
        let between = spec
            .cluster
            .between_pools
            .clone()
            .unwrap_or_else(|| spec.cluster.inter_node.clone());
        let pools = pipeline_order(&spec.cluster)
            .into_iter()
            .map(|pool| {
                let own = pool_spec(spec, pool);
                // One GPU per node: every pipeline send leaves the node, over the link between
                // pools. Only this model's pipeline sends are read.
                let mut edge = own.clone();
                edge.cluster.nodes = pool.total_gpus();
                edge.cluster.gpus_per_node = 1;
                edge.cluster.inter_node = between.clone();
                Ok(PoolModel {
                    name: pool.name.clone(),
                    gpus: pool.total_gpus(),
                    model: CostModel::new(&own)?,
                    edge: CostModel::new(&edge)?,
                })
            })
            .collect::<Result<Vec<_>, CostError>>()?;
        Ok(PooledCostModel {
            spec: pooled_search_spec(spec),
            pools,
        })
    }

    /// The spec the search enumerates (every pool's GPUs in one cluster).
    pub fn search_spec(&self) -> &Spec {
        &self.spec
    }

    /// For each pool in pipeline order, how many stages it holds under `strategy`; `None` when
    /// some pool's GPUs are not a whole number of stages (`tp·cp·dp` GPUs each).
    pub fn stages_per_pool(&self, strategy: &Strategy) -> Option<Vec<u64>> {
        let per_stage = strategy.tp * strategy.cp * strategy.dp;
        if per_stage == 0 {
            return None;
        }
        let counts: Vec<u64> = self
            .pools
            .iter()
            .map(|p| {
                p.gpus
                    .is_multiple_of(per_stage)
                    .then_some(p.gpus / per_stage)
            })
            .collect::<Option<_>>()?;
        (counts.iter().sum::<u64>() == strategy.pp && counts.iter().all(|&c| c > 0))
            .then_some(counts)
    }

    /// The pool (index in pipeline order) that runs `stage`.
    pub fn stage_pool(&self, strategy: &Strategy, stage: u64) -> Option<usize> {
        pool_of(&self.stages_per_pool(strategy)?, stage)
    }

    /// Every output of one stage: its pool's, with the pipeline sends of a stage next to another
    /// pool over the link between pools. `None` when the strategy does not place on the pools.
    pub fn stage_outputs(
        &self,
        strategy: &Strategy,
        stage: u64,
        layers: u64,
        recompute: Recompute,
        offload: Offload,
    ) -> Option<StageOutputs> {
        let counts = self.stages_per_pool(strategy)?;
        let pool = pool_of(&counts, stage)?;
        let own = &self.pools[pool];
        let mut out = own
            .model
            .stage_outputs(strategy, stage, layers, recompute, offload);
        let elsewhere = |other: Option<u64>| {
            other
                .and_then(|s| pool_of(&counts, s))
                .is_some_and(|p| p != pool)
        };
        if elsewhere(stage.checked_sub(1)) || elsewhere(Some(stage + 1)) {
            let edge = own
                .edge
                .stage_outputs(strategy, stage, layers, recompute, offload);
            let pp = Output::PpComm.index();
            out[pp] = out[pp].max(edge[pp]);
        }
        Some(out)
    }

    /// What one stage costs; a stage the strategy cannot place costs infinite time.
    pub fn stage_cost(
        &self,
        strategy: &Strategy,
        stage: u64,
        layers: u64,
        recompute: Recompute,
        offload: Offload,
    ) -> StageCost {
        match self.stage_outputs(strategy, stage, layers, recompute, offload) {
            Some(out) => super::model::stage_cost_from_outputs(&out),
            None => StageCost {
                microbatch_s: f64::INFINITY,
                tail_s: f64::INFINITY,
                memory: Default::default(),
            },
        }
    }

    /// Usable bytes per GPU of the stage's pool (of the largest, for a stage not placed).
    pub fn stage_memory_capacity(&self, strategy: &Strategy, stage: u64) -> f64 {
        match self.stage_pool(strategy, stage) {
            Some(pool) => self.pools[pool].model.memory_capacity(),
            None => self.memory_capacity(),
        }
    }

    /// The largest usable bytes per GPU of any pool.
    pub fn memory_capacity(&self) -> f64 {
        self.pools
            .iter()
            .map(|p| p.model.memory_capacity())
            .fold(0.0, f64::max)
    }

    pub fn pipeline_shape(&self, strategy: &Strategy) -> PipelineShape {
        self.pools[0].model.pipeline_shape(strategy)
    }

    /// Predicts one fixed configuration across the pools.
    pub fn estimate(&self, strategy: &Strategy) -> Result<Estimate, CostError> {
        let gpus: u64 = self.pools.iter().map(|p| p.gpus).sum();
        let peak: f64 = self
            .pools
            .iter()
            .map(|p| peak_for(p.model.spec()) * p.gpus as f64)
            .sum();
        estimate_stages(
            &self.spec,
            strategy,
            &|stage, layers| {
                let outputs = self
                    .stage_outputs(
                        strategy,
                        stage,
                        layers,
                        strategy.recompute_of(stage),
                        strategy.offload_of(stage),
                    )
                    .ok_or_else(|| self.unplaced(strategy))?;
                Ok((outputs, self.stage_memory_capacity(strategy, stage)))
            },
            peak / gpus as f64,
            self.pipeline_shape(strategy),
        )
    }

    /// Why `strategy`'s stages do not lay out on the pools.
    fn unplaced(&self, strategy: &Strategy) -> CostError {
        let sizes: Vec<String> = self
            .pools
            .iter()
            .map(|p| format!("`{}` {} GPUs", p.name, p.gpus))
            .collect();
        CostError::strategy(
            &strategy.name,
            format!(
                "tp·cp·dp = {} GPUs per stage does not split the pools ({}) into whole stages",
                strategy.tp * strategy.cp * strategy.dp,
                sizes.join(", ")
            ),
        )
    }
}

/// The pool holding `stage` when the pools hold `counts` stages each, in pipeline order.
fn pool_of(counts: &[u64], stage: u64) -> Option<usize> {
    let mut first = 0;
    counts.iter().position(|count| {
        first += count;
        stage < first
    })
}
