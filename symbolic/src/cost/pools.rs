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
use crate::uncertainty::{PredictionInterval, RunTraits};
use crate::GIB;

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
            None,
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

/// Data-parallel replicas of one shape on every pool, each pool's replicas taking the share of
/// the batch that evens their step times out.
#[derive(Clone, Debug)]
pub struct ReplicaShares {
    /// Per pool in pipeline order: its replicas.
    pub replicas: Vec<u64>,
    /// Per pool in pipeline order: micro-batches each of its replicas runs per step.
    pub microbatches: Vec<u64>,
    /// The step: the slowest pool's replicas, then the gradient exchange between pools.
    pub estimate: Estimate,
}

/// The best split of the batch over data-parallel replicas of `shape` (its tp, pp, cp,
/// micro-batch, stages and per-stage options; its dp is ignored) on every pool of `spec`'s
/// cluster, found by trying every split of the micro-batches. Each pool's replicas are costed by
/// the pool's own model with their share of the batch (so their pipeline bubble, memory in
/// flight and gradient reduction are their own); the step ends when the slowest pool's
/// replicas are done and every rank has exchanged its gradients with its counterparts in the
/// other pools over `between_pools` (a ring over the pools, not overlapped). ZeRO-3 is not
/// costed this way: its weights are sharded across the very replicas that would straddle pools.
pub fn replicas_across_pools(spec: &Spec, shape: &Strategy) -> Result<ReplicaShares, CostError> {
    let pools = pipeline_order(&spec.cluster);
    let fail = |reason: String| CostError::strategy(&shape.name, reason);
    if pools.len() < 2 {
        return Err(fail(format!(
            "cluster `{}` has no pools",
            spec.cluster.name
        )));
    }
    if shape.zero >= 3 {
        return Err(fail(
            "ZeRO-3 shards weights across replicas that would straddle pools".into(),
        ));
    }
    let per_replica = shape.tp * shape.pp * shape.cp;
    let replicas: Vec<u64> = pools
        .iter()
        .map(|p| {
            (per_replica > 0 && p.total_gpus().is_multiple_of(per_replica))
                .then(|| p.total_gpus() / per_replica)
        })
        .collect::<Option<_>>()
        .filter(|r: &Vec<u64>| r.iter().all(|&n| n > 0))
        .ok_or_else(|| {
            fail(format!(
                "{per_replica} GPUs per replica do not divide every pool"
            ))
        })?;
    let microbatch = shape.microbatch.max(1);
    if !spec.train.global_batch.is_multiple_of(microbatch) {
        return Err(fail(format!(
            "the global batch of {} is not a multiple of the micro-batch {microbatch}",
            spec.train.global_batch
        )));
    }
    let total = spec.train.global_batch / microbatch;
    // Each pool's replicas with `m` micro-batches each: their estimate, when it fits (each
    // costed once, with a model of its own: the micro-batch count is the spec's batch).
    let mut costed: Vec<std::collections::BTreeMap<u64, Option<Estimate>>> =
        vec![Default::default(); pools.len()];
    let mut estimate_of = |pool: usize, m: u64| -> Option<Estimate> {
        costed[pool]
            .entry(m)
            .or_insert_with(|| {
                if shape.interleave > 1 && !m.is_multiple_of(shape.pp) {
                    return None;
                }
                let mut one = pool_spec(spec, pools[pool]);
                one.train.global_batch = replicas[pool] * m * microbatch;
                let strategy = Strategy {
                    dp: replicas[pool],
                    ..shape.clone()
                };
                let estimate = CostModel::for_few_estimates(&one)
                    .and_then(|model| model.estimate(&strategy))
                    .ok()?;
                estimate.fits.then_some(estimate)
            })
            .clone()
    };
    let best = best_shares(&replicas, total, &mut |pool, m| {
        estimate_of(pool, m).map(|e| e.step_time_s)
    })
    .ok_or_else(|| fail("no split of the batch over the pools' replicas fits".into()))?;
    let estimates: Vec<Estimate> = best
        .iter()
        .enumerate()
        .map(|(pool, &m)| estimate_of(pool, m).expect("the chosen split was costed"))
        .collect();
    let slowest = (0..estimates.len())
        .max_by(|&a, &b| {
            estimates[a]
                .step_time_s
                .total_cmp(&estimates[b].step_time_s)
        })
        .unwrap_or(0);
    let between = spec
        .cluster
        .between_pools
        .clone()
        .unwrap_or_else(|| spec.cluster.inter_node.clone());
    // Each rank exchanges the gradients of the weights it holds (the training-precision weights
    // of its stage, the largest stage's) with its counterpart in every other pool.
    let gradient_bytes = estimates
        .iter()
        .flat_map(|e| e.stages.iter().map(|s| s.memory.weights * GIB))
        .fold(0.0, f64::max);
    let n = pools.len() as f64;
    let exchange = 2.0 * (n - 1.0) / n * gradient_bytes / between.bandwidth
        + 2.0 * (n - 1.0) * between.latency;
    let mut estimate = estimates[slowest].clone();
    let step = estimate.step_time_s + exchange;
    let gpus: u64 = pools.iter().map(|p| p.total_gpus()).sum();
    let peak: f64 = pools
        .iter()
        .map(|p| peak_for(&pool_spec(spec, p)) * p.total_gpus() as f64)
        .sum();
    let tokens_per_s = (spec.train.global_batch * spec.train.seq_len) as f64 / step;
    let flops_per_token = spec
        .model
        .job_flops_per_token(spec.train.seq_len, spec.train.finetune.as_ref());
    let recompute_ratio = estimate.hardware_tflops_per_gpu / estimate.model_tflops_per_gpu;
    let model_flops = flops_per_token * tokens_per_s;
    estimate.time.dp_comm += exchange;
    estimate.step_time_s = step;
    estimate.tokens_per_s = tokens_per_s;
    estimate.tokens_per_s_per_gpu = tokens_per_s / gpus as f64;
    estimate.model_tflops_per_gpu = model_flops / gpus as f64 / 1e12;
    estimate.hardware_tflops_per_gpu = estimate.model_tflops_per_gpu * recompute_ratio;
    estimate.mfu = model_flops / peak;
    estimate.hfu = estimate.mfu * recompute_ratio;
    // The pool nearest its memory speaks for the plan's.
    let binding = estimates
        .iter()
        .max_by(|a, b| {
            (a.peak_memory_gib / a.memory_capacity_gib)
                .total_cmp(&(b.peak_memory_gib / b.memory_capacity_gib))
        })
        .expect("every pool has an estimate");
    estimate.peak_memory_gib = binding.peak_memory_gib;
    estimate.memory_capacity_gib = binding.memory_capacity_gib;
    let whole = Strategy {
        dp: replicas.iter().sum(),
        ..shape.clone()
    };
    estimate.interval = Some(PredictionInterval::around(
        step,
        tokens_per_s,
        &RunTraits::of(&pooled_search_spec(spec), &whole),
    ));
    Ok(ReplicaShares {
        replicas,
        microbatches: best,
        estimate,
    })
}

/// Micro-batches per replica of each pool, `Σ replicas[p]·m[p] = total` with every `m ≥ 1`,
/// that make the slowest pool fastest (`step(p, m)`: `None` when `m` does not run there);
/// every split is tried, a partial one abandoned once it is no better than the best found.
fn best_shares(
    replicas: &[u64],
    total: u64,
    step: &mut dyn FnMut(usize, u64) -> Option<f64>,
) -> Option<Vec<u64>> {
    fn walk(
        pool: usize,
        left: u64,
        slowest: f64,
        replicas: &[u64],
        step: &mut dyn FnMut(usize, u64) -> Option<f64>,
        chosen: &mut Vec<u64>,
        best: &mut Option<(f64, Vec<u64>)>,
    ) {
        let beaten = |time: f64, best: &Option<(f64, Vec<u64>)>| {
            best.as_ref().is_some_and(|(b, _)| time >= *b)
        };
        if pool + 1 == replicas.len() {
            if left == 0 || !left.is_multiple_of(replicas[pool]) {
                return;
            }
            let Some(time) = step(pool, left / replicas[pool]) else {
                return;
            };
            let slowest = slowest.max(time);
            if !beaten(slowest, best) {
                chosen.push(left / replicas[pool]);
                *best = Some((slowest, chosen.clone()));
                chosen.pop();
            }
            return;
        }
        let others: u64 = replicas[pool + 1..].iter().sum();
        let most = left.saturating_sub(others) / replicas[pool];
        for m in 1..=most {
            let Some(time) = step(pool, m) else {
                continue;
            };
            let slowest = slowest.max(time);
            // A pool's step grows with its micro-batches: more cannot do better.
            if beaten(slowest, best) {
                break;
            }
            chosen.push(m);
            walk(
                pool + 1,
                left - m * replicas[pool],
                slowest,
                replicas,
                step,
                chosen,
                best,
            );
            chosen.pop();
        }
    }
    let mut best = None;
    walk(0, total, 0.0, replicas, step, &mut Vec::new(), &mut best);
    best.map(|(_, shares)| shares)
}

#[cfg(test)]
mod tests {
    use super::best_shares;

    #[test]
    fn shares_even_out_replicas_of_different_speeds() {
        // Pool 0's replicas take 1 s a micro-batch, pool 1's 3 s; 4 replicas each, 32
        // micro-batches in all: 6 and 2 each (6 s on both) is the only even split.
        let mut step = |pool: usize, m: u64| Some(m as f64 * if pool == 0 { 1.0 } else { 3.0 });
        assert_eq!(best_shares(&[4, 4], 32, &mut step), Some(vec![6, 2]));
        // Counts a pool cannot run are skipped; no split at all is none.
        let mut odd_only = |_: usize, m: u64| (m % 2 == 1).then_some(m as f64);
        assert_eq!(best_shares(&[1, 1], 4, &mut odd_only), Some(vec![1, 3]));
        assert_eq!(best_shares(&[3, 3], 4, &mut step), None);
    }
}
