//! On clusters made of two pools, the search over a pipeline through both equals brute force:
//! every outer configuration that splits the pools into whole stages, every split of the
//! layers, every option, each stage held to its own pool's memory. The exactness check runs on
//! the analytic model of each pool (convex and monotone as the search's bounds assume, which
//! the calibrated model need not be everywhere), placed stage by stage as
//! `PooledCostModel` places them; the other tests run the calibrated model. And the plan of a
//! mixed cluster is never slower than the best plan on its faster pool.

mod common;

use common::synthetic_model::SyntheticModel;
use common::*;
use tessel_grammar::{ClusterSpec, Link, MlpKind, Offload, Recompute, Spec, Strategy};
use tessel_planner::{
    outer_configs, plan, plan_on_pools, stage_options, PlanOptions, StageCostModel, ACROSS_POOLS,
};
use tessel_symbolic::cost::{
    pipeline_order, pool_spec, CostModel, Estimate, PipelineShape, PooledCostModel, StageCost,
};

/// The analytic model of each pool, stage by stage where `PooledCostModel` puts them.
struct PooledSynthetic {
    placement: PooledCostModel,
    pools: Vec<SyntheticModel>,
}

impl PooledSynthetic {
    fn new(spec: &Spec) -> PooledSynthetic {
        PooledSynthetic {
            placement: PooledCostModel::new(spec).unwrap(),
            pools: pipeline_order(&spec.cluster)
                .into_iter()
                .map(|pool| SyntheticModel::new(pool_spec(spec, pool)))
                .collect(),
        }
    }

    fn pool(&self, strategy: &Strategy, stage: u64) -> Option<&SyntheticModel> {
        self.placement
            .stage_pool(strategy, stage)
            .map(|p| &self.pools[p])
    }
}

impl StageCostModel for PooledSynthetic {
    fn stage_cost(
        &self,
        strategy: &Strategy,
        stage: u64,
        layers: u64,
        recompute: Recompute,
        offload: Offload,
    ) -> StageCost {
        self.pool(strategy, stage)
            .expect("the search places only configurations the pools split into")
            .stage_cost(strategy, stage, layers, recompute, offload)
    }

    fn pipeline_shape(&self, strategy: &Strategy) -> PipelineShape {
        self.pools[0].pipeline_shape(strategy)
    }

    fn memory_capacity(&self) -> f64 {
        self.pools
            .iter()
            .map(|p| p.memory_capacity())
            .fold(0.0, f64::max)
    }

    fn stage_memory_capacity(&self, strategy: &Strategy, stage: u64) -> f64 {
        self.pool(strategy, stage)
            .map_or(self.memory_capacity(), |p| p.memory_capacity())
    }

    fn places(&self, strategy: &Strategy) -> bool {
        self.placement.stages_per_pool(strategy).is_some()
    }

    /// The first pool's estimate with the step time of the stages as placed: these tests read
    /// only the step time.
    fn estimate(&self, strategy: &Strategy) -> Result<Estimate, String> {
        let mut estimate = self.pools[0].estimate(strategy)?;
        let costs: Vec<StageCost> = estimate
            .stages
            .iter()
            .map(|s| {
                self.stage_cost(
                    strategy,
                    s.stage,
                    s.layers,
                    strategy.recompute_of(s.stage),
                    strategy.offload_of(s.stage),
                )
            })
            .collect();
        estimate.step_time_s = self.pipeline_shape(strategy).step_time(&costs);
        Ok(estimate)
    }
}

/// A pool of `nodes × per_node` GPUs: H100s, or a slower, smaller GPU (a third of the
/// compute and bandwidth, `memory_gib` of memory) on slower links.
fn pool(name: &str, nodes: u64, per_node: u64, slow: bool, memory_gib: f64) -> ClusterSpec {
    let mut pool = h100_cluster(nodes, per_node, memory_gib);
    pool.name = name.to_string();
    if slow {
        pool.gpu.name = "SLOW".to_string();
        pool.gpu.peak.bf16 /= 3.0;
        pool.gpu.peak.fp16 /= 3.0;
        pool.gpu.hbm_bandwidth /= 3.0;
        pool.intra_node.bandwidth = 32e9;
        pool.inter_node.bandwidth = 12.5e9;
    }
    pool
}

fn mixed(fast: ClusterSpec, slow: ClusterSpec) -> ClusterSpec {
    ClusterSpec {
        name: "mixed".to_string(),
        pools: vec![fast.clone(), slow],
        between_pools: Some(Link {
            bandwidth: 12.5e9,
            latency: 10e-6,
        }),
        ..fast
    }
}

fn instance(layers: u64, fast: ClusterSpec, slow: ClusterSpec, batch: u64) -> Spec {
    let model = dense_model("small", layers, 2048, 16, 4, 8192, 32000, MlpKind::Swiglu);
    let mut spec = spec(model, mixed(fast, slow), 2048, batch);
    spec.search.recompute = tessel_grammar::Choice::Values(vec![Recompute::None, Recompute::Full]);
    spec.search.offload = tessel_grammar::Choice::Values(vec![Offload::default()]);
    spec
}

/// The best step time over every placeable configuration, split and option (one option on
/// every stage and per stage alike: every combination).
fn brute_force(spec: &Spec, model: &PooledSynthetic) -> Option<f64> {
    let (configs, _) = outer_configs(spec);
    let mut best = f64::INFINITY;
    for outer in configs {
        let strategy = outer.strategy("brute", Recompute::None, Offload::default(), None);
        if !StageCostModel::places(model, &strategy) {
            continue;
        }
        let least = if outer.pp == 1 {
            spec.model.layers
        } else {
            outer.interleave
        };
        let options = stage_options(spec, &outer);
        let shape = StageCostModel::pipeline_shape(model, &strategy);
        for split in splits(spec.model.layers, outer.pp, least) {
            // Per stage, the options that fit there, by option index.
            let per_stage: Vec<Vec<(usize, StageCost)>> = split
                .iter()
                .enumerate()
                .map(|(stage, &layers)| {
                    let capacity = model.stage_memory_capacity(&strategy, stage as u64);
                    options
                        .iter()
                        .enumerate()
                        .filter(|(_, o)| {
                            spec.train
                                .framework
                                .stage_limits(&strategy, layers, o.recompute, &o.offload)
                                .is_empty()
                        })
                        .map(|(i, o)| {
                            let cost = model.stage_cost(
                                &strategy,
                                stage as u64,
                                layers,
                                o.recompute,
                                o.offload,
                            );
                            (i, cost)
                        })
                        .filter(|(_, c)| c.memory.total() <= capacity)
                        .collect()
                })
                .collect();
            if per_stage.iter().any(Vec::is_empty) {
                continue;
            }
            let per_stage_options = spec.train.framework.capabilities().per_stage_options;
            let mut choice = vec![0usize; per_stage.len()];
            loop {
                let picked: Vec<(usize, StageCost)> = choice
                    .iter()
                    .zip(&per_stage)
                    .map(|(&i, points)| points[i])
                    .collect();
                // Without per-stage options, one option on every stage.
                if per_stage_options || picked.windows(2).all(|w| w[0].0 == w[1].0) {
                    let costs: Vec<StageCost> = picked.iter().map(|(_, c)| *c).collect();
                    best = best.min(shape.step_time(&costs));
                }
                let mut stage = 0;
                while stage < choice.len() {
                    choice[stage] += 1;
                    if choice[stage] < per_stage[stage].len() {
                        break;
                    }
                    choice[stage] = 0;
                    stage += 1;
                }
                if stage == choice.len() {
                    break;
                }
            }
        }
    }
    best.is_finite().then_some(best)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(b.abs())
}

fn instances() -> Vec<Spec> {
    vec![
        // Memory decides: 12 GiB slow GPUs hold fewer layers than the 80 GiB fast ones.
        instance(
            8,
            pool("fast", 1, 4, false, 80.0),
            pool("slow", 1, 4, true, 12.0),
            16,
        ),
        // Speed decides: the slow pool is three times slower per GPU and twice as large.
        instance(
            12,
            pool("fast", 1, 4, false, 80.0),
            pool("slow", 2, 4, true, 80.0),
            32,
        ),
        // Uneven pools, odd layer count.
        instance(
            9,
            pool("fast", 1, 2, false, 40.0),
            pool("slow", 1, 4, true, 24.0),
            8,
        ),
    ]
}

/// More two-pool instances: layer counts, pool sizes and memories crossed.
fn generated() -> Vec<Spec> {
    let mut specs = Vec::new();
    for layers in [6, 10, 13] {
        for (fast_gpus, slow_gpus) in [(2, 2), (2, 6), (4, 4)] {
            for slow_memory in [10.0, 40.0] {
                specs.push(instance(
                    layers,
                    pool("fast", 1, fast_gpus, false, 80.0),
                    pool("slow", 1, slow_gpus, true, slow_memory),
                    16,
                ));
            }
        }
    }
    specs
}

#[test]
fn a_pipeline_across_pools_matches_brute_force() {
    for (index, spec) in instances().iter().chain(&generated()).enumerate() {
        let model = PooledSynthetic::new(spec);
        let search = model.placement.search_spec().clone();
        let expected = brute_force(&search, &model);
        let options = PlanOptions {
            top: Some(1),
            ..PlanOptions::default()
        };
        match (plan(&search, &model, &options), expected) {
            (Ok(outcome), Some(best)) => assert!(
                close(outcome.plan.solver.objective_s, best),
                "instance {index}: search {} vs brute force {best}",
                outcome.plan.solver.objective_s
            ),
            (Err(error), None) => assert!(error.to_string().contains("fit"), "{error}"),
            (planned, expected) => panic!(
                "instance {index}: search {:?} vs brute force {expected:?}",
                planned.map(|o| o.plan.solver.objective_s)
            ),
        }
    }
}

#[test]
fn stages_on_the_slow_pool_hold_fewer_layers_and_its_memory_binds_there() {
    let spec = &instances()[0];
    let model = PooledCostModel::new(spec).unwrap();
    let outcome = plan(model.search_spec(), &model, &PlanOptions::default()).unwrap();
    let plan = outcome.plan;
    let strategy = plan.strategy();
    let counts = model.stages_per_pool(&strategy).unwrap();
    let fast_layers: u64 = plan.stages[..counts[0] as usize]
        .iter()
        .map(|s| s.layers)
        .sum::<u64>();
    let slow_layers: u64 = plan.stages[counts[0] as usize..]
        .iter()
        .map(|s| s.layers)
        .sum::<u64>();
    let per_stage = |layers: u64, stages: u64| layers as f64 / stages as f64;
    assert!(
        per_stage(fast_layers, counts[0]) > per_stage(slow_layers, counts[1]),
        "fast pool {fast_layers} layers on {} stages, slow {slow_layers} on {}",
        counts[0],
        counts[1]
    );
    for (stage, estimate) in plan.prediction.stages.iter().enumerate() {
        let capacity = model.stage_memory_capacity(&strategy, stage as u64) / (1u64 << 30) as f64;
        assert!(estimate.memory.total() <= capacity + 1e-9);
    }
}

#[test]
fn a_mixed_plan_is_never_slower_than_the_faster_pool_alone() {
    for spec in instances() {
        let fast = pool_spec(&spec, &spec.cluster.pools[0]);
        let alone = plan(
            &fast,
            &CostModel::new(&fast).unwrap(),
            &PlanOptions::default(),
        );
        let mixed = plan_on_pools(&spec, &PlanOptions::default()).unwrap().plan;
        let placement = mixed.placement.as_ref().unwrap();
        if let Ok(alone) = alone {
            assert!(mixed.prediction.step_time_s <= alone.plan.prediction.step_time_s + 1e-12);
        }
        let ranks: u64 = placement
            .pools
            .iter()
            .map(|p| p.ranks[1] - p.ranks[0])
            .sum();
        assert_eq!(ranks, mixed.gpus, "every rank of the plan is on one pool");
        if placement.placement == ACROSS_POOLS {
            assert_eq!(placement.pools.len(), 2);
            assert_eq!(placement.pools[0].ranks[1], placement.pools[1].ranks[0]);
        }
        assert_eq!(
            placement.tried.len(),
            5,
            "across, each pool alone, each pool's shape as replicas"
        );
    }
}
