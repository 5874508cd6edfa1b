//! The search's optimum equals brute force over the same space on many small generated
//! instances: every outer configuration, every split of the layers, every option on every stage
//! (one option for all stages where the framework applies one).

mod common;

use common::synthetic_model::SyntheticModel;
use common::*;
use tessel_grammar::{Choice, Framework, MlpKind, Offload, Recompute, Spec};
use tessel_planner::{
    outer_configs, plan, stage_options, OuterConfig, PlanError, PlanOptions, StageCostModel,
    StageOption,
};
use tessel_symbolic::cost::StageCost;

/// A small deterministic generator (64-bit LCG, Knuth's constants).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn pick<T: Copy>(&mut self, values: &[T]) -> T {
        values[(self.next() % values.len() as u64) as usize]
    }
}

fn instance(seed: u64) -> Spec {
    let mut rng = Lcg(seed);
    let layers = rng.pick(&[2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 13, 16]);
    let hidden = rng.pick(&[1024, 2048, 4096]);
    let heads = rng.pick(&[8, 16]);
    let kv_heads = rng.pick(&[heads, 2, 4]);
    let mlp = rng.pick(&[MlpKind::Gelu, MlpKind::Swiglu]);
    let model = dense_model(
        "generated",
        layers,
        hidden,
        heads,
        kv_heads,
        4 * hidden,
        32000,
        mlp,
    );
    let gpus_per_node = rng.pick(&[2, 4, 8]);
    let nodes = rng.pick(&[1, 2, 4, 8]);
    let memory = rng.pick(&[1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 80.0]);
    let seq = rng.pick(&[1024, 2048, 4096]);
    let batch = rng.pick(&[8, 16, 32, 64]);
    let mut spec = spec(
        model,
        h100_cluster(nodes, gpus_per_node, memory),
        seq,
        batch,
    );
    // Small models rarely need a pipeline; most instances insist on one so that the MILP decides.
    if !rng.next().is_multiple_of(4) {
        spec.search.pp = Choice::Values(vec![2, 3, 4]);
    }
    // Half the instances may choose options per stage (Tessel's runtime), half one option for
    // every stage (Megatron-LM).
    if seed.is_multiple_of(2) {
        spec.train.framework = Framework::Tessel;
    }
    if rng.next().is_multiple_of(2) {
        spec.search.recompute = Choice::Values(vec![
            Recompute::None,
            Recompute::Full,
            Recompute::Partial { full_layers: 1 },
        ]);
        spec.search.offload = Choice::Values(vec![
            Offload::default(),
            Offload {
                optimizer: 1.0,
                ..Offload::default()
            },
        ]);
    }
    spec
}

/// The points of one stage no other option beats on both time and tail: any split is at least
/// as good with one of them, so enumerating their combinations is exhaustive.
fn pareto(mut points: Vec<StageCost>) -> Vec<StageCost> {
    points.sort_by(|a, b| {
        a.microbatch_s
            .total_cmp(&b.microbatch_s)
            .then(a.tail_s.total_cmp(&b.tail_s))
    });
    let mut kept: Vec<StageCost> = Vec::new();
    for p in points {
        if kept.iter().all(|q| q.tail_s > p.tail_s) {
            kept.push(p);
        }
    }
    kept
}

/// The best step time of each outer configuration, by brute force: every split of the layers,
/// and every stage taking any option on its own.
fn brute_force(spec: &Spec, model: &SyntheticModel) -> Vec<(f64, OuterConfig)> {
    let (configs, _) = outer_configs(spec);
    let capacity = model.memory_capacity();
    let mut best = Vec::new();
    for outer in configs {
        let least = if outer.pp == 1 {
            spec.model.layers
        } else {
            outer.interleave
        };
        let options = stage_options(spec, &outer);
        let strategy = outer.strategy("brute", Recompute::None, Offload::default(), None);
        let shape = model.pipeline_shape(&strategy);
        let mut outer_best = f64::INFINITY;
        let cost = |stage: usize, layers: u64, o: &StageOption| {
            model.stage_cost(&strategy, stage as u64, layers, o.recompute, o.offload)
        };
        for split in splits(spec.model.layers, outer.pp, least) {
            if !spec.train.framework.capabilities().per_stage_options {
                // One option on every stage: no Pareto pruning across options.
                for o in &options {
                    let costs: Vec<StageCost> = split
                        .iter()
                        .enumerate()
                        .map(|(stage, &layers)| cost(stage, layers, o))
                        .collect();
                    if costs.iter().all(|c| c.memory.total() <= capacity) {
                        outer_best = outer_best.min(shape.step_time(&costs));
                    }
                }
                continue;
            }
            let per_stage: Vec<Vec<StageCost>> = split
                .iter()
                .enumerate()
                .map(|(stage, &layers)| {
                    let fitting = options
                        .iter()
                        .map(|o| cost(stage, layers, o))
                        .filter(|c| c.memory.total() <= capacity)
                        .collect();
                    pareto(fitting)
                })
                .collect();
            let mut choice = vec![0; per_stage.len()];
            'combinations: loop {
                if per_stage.iter().any(Vec::is_empty) {
                    break;
                }
                let costs: Vec<StageCost> = choice
                    .iter()
                    .zip(&per_stage)
                    .map(|(&i, points)| points[i])
                    .collect();
                outer_best = outer_best.min(shape.step_time(&costs));
                for stage in 0..choice.len() {
                    choice[stage] += 1;
                    if choice[stage] < per_stage[stage].len() {
                        continue 'combinations;
                    }
                    choice[stage] = 0;
                }
                break;
            }
        }
        if outer_best.is_finite() {
            best.push((outer_best, outer));
        }
    }
    best.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
    best
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(b.abs())
}

#[test]
fn search_matches_brute_force_on_generated_instances() {
    let mut checked = 0;
    let mut infeasible = 0;
    let mut memory_shaped = 0;
    let mut uneven = 0;
    let mut mixed = 0;
    for seed in 0..60 {
        let spec = instance(seed);
        let model = SyntheticModel::new(spec.clone());
        let expected = brute_force(&spec, &model);
        let options = PlanOptions {
            top: Some(2),
            ..PlanOptions::default()
        };
        match plan(&spec, &model, &options) {
            Ok(outcome) => {
                let plan = outcome.plan;
                assert!(
                    !expected.is_empty(),
                    "seed {seed}: plan found, brute force none"
                );
                assert!(
                    close(plan.solver.objective_s, expected[0].0),
                    "seed {seed}: search {} vs brute force {} ({:?})",
                    plan.solver.objective_s,
                    expected[0].0,
                    expected[0].1
                );
                assert!(close(plan.prediction.step_time_s, expected[0].0));
                // The runners-up are the next best configurations, in order.
                for (i, runner) in plan.runners_up.iter().enumerate() {
                    assert!(
                        close(runner.step_time_s, expected[i + 1].0),
                        "seed {seed}: runner-up {i} {} vs {}",
                        runner.step_time_s,
                        expected[i + 1].0
                    );
                }
                assert_eq!(plan.runners_up.len(), (expected.len() - 1).min(2));
                if plan
                    .stages
                    .iter()
                    .any(|s| s.recompute != Recompute::None || !s.offload.is_none())
                {
                    memory_shaped += 1;
                }
                let first = &plan.stages[0];
                if plan
                    .stages
                    .iter()
                    .any(|s| s.recompute != first.recompute || s.offload != first.offload)
                {
                    assert!(
                        spec.train.framework.capabilities().per_stage_options,
                        "seed {seed}: options differ by stage under {:?}",
                        spec.train.framework
                    );
                    mixed += 1;
                }
                let layers: Vec<u64> = plan.stages.iter().map(|s| s.layers).collect();
                let even = tessel_planner::even_split(
                    spec.model.layers,
                    plan.config.pp,
                    plan.config.interleave,
                );
                if layers != even {
                    uneven += 1;
                }
                checked += 1;
            }
            Err(PlanError::NothingFits { .. }) => {
                assert!(
                    expected.is_empty(),
                    "seed {seed}: brute force fits, search found nothing"
                );
                infeasible += 1;
            }
            Err(other) => panic!("seed {seed}: {other}"),
        }
    }
    // The generator must exercise both outcomes.
    assert!(checked >= 30, "only {checked} feasible instances");
    assert!(infeasible >= 1, "no infeasible instance generated");
    assert!(
        memory_shaped >= 5,
        "only {memory_shaped} plans needed recompute or offload"
    );
    assert!(uneven >= 3, "only {uneven} plans split the layers unevenly");
    assert!(
        mixed >= 3,
        "only {mixed} plans chose different options per stage"
    );
}
