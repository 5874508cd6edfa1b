//! Whole searches on published-scale models: a plan is found, fits, agrees with its own
//! prediction, ranks its runners-up, and the statistics add up.

mod common;

use common::synthetic_model::SyntheticModel;
use common::*;
use tessel_grammar::{Choice, Framework, Spec};
use tessel_planner::{plan, PlanOptions, SearchProgress, SolverStatus};

fn check(spec: &Spec) -> tessel_planner::Plan {
    let model = SyntheticModel::new(spec.clone());
    let rounds = std::sync::atomic::AtomicU64::new(0);
    let progress = |_: &SearchProgress| {
        rounds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    };
    let options = PlanOptions {
        progress: Some(&progress),
        ..PlanOptions::default()
    };
    let outcome = plan(spec, &model, &options).expect("a plan");
    let plan = outcome.plan;
    assert!(rounds.into_inner() >= 1);
    assert!(plan.prediction.fits);
    assert!(plan.prediction.peak_memory_gib <= plan.prediction.memory_capacity_gib);
    let objective = plan.solver.objective_s;
    assert!((plan.prediction.step_time_s - objective).abs() <= 1e-9 * objective);
    assert!(matches!(
        plan.solver.status,
        SolverStatus::Optimal | SolverStatus::GapLimit | SolverStatus::Enumerated
    ));
    assert_eq!(
        plan.stages.iter().map(|s| s.layers).sum::<u64>(),
        spec.model.layers
    );
    let s = &plan.search;
    assert_eq!(
        s.candidates_enumerated - s.rejected_divisibility - s.rejected_framework,
        s.screened
    );
    assert!(s.pruned_memory + s.pruned_bound <= s.screened);
    assert!(s.evaluated >= 1 && s.stage_evaluations > s.screened);
    // Only what the spec's framework runs, stage by stage at the stage's own size.
    let framework = spec.train.framework;
    let strategy = plan.strategy();
    assert_eq!(framework.limits(&strategy, spec.model.layers), Vec::new());
    let mut previous = plan.prediction.step_time_s;
    for runner in &plan.runners_up {
        assert!(runner.step_time_s >= previous * (1.0 - 1e-9));
        previous = runner.step_time_s;
        assert!(!runner.reason.is_empty());
    }
    plan
}

#[test]
fn gpt3_175b_on_1024_gpus() {
    let plan = check(&spec(gpt3_175b(), h100_cluster(128, 8, 80.0), 2048, 1536));
    // 175 B parameters cannot sit on a single pipeline stage of 80 GB GPUs without sharding.
    assert!(plan.config.tp * plan.config.pp > 1 || plan.config.zero == 3);
}

#[test]
fn gpt3_175b_under_torchtitan_runs_only_what_torchtitan_runs() {
    let mut spec = spec(gpt3_175b(), h100_cluster(112, 8, 80.0), 2048, 1536);
    spec.train.framework = Framework::Fsdp;
    // 96 layers over 7 stages: sizes differ, and which every-k-th recompute a stage can run
    // depends on its size.
    spec.search.pp = Choice::Values(vec![7]);
    let plan = check(&spec);
    assert!(plan.config.zero >= 2 || plan.config.tp * plan.config.pp * plan.config.cp == 1);
}

#[test]
fn llama3_405b_on_16384_gpus() {
    let plan = check(&spec(
        llama3_405b(),
        h100_cluster(2048, 8, 80.0),
        8192,
        2048,
    ));
    assert_eq!(plan.rank_map.ranks.len(), 16384);
}

#[test]
fn mixtral_8x7b_on_256_gpus() {
    let plan = check(&spec(mixtral_8x7b(), h100_cluster(32, 8, 80.0), 4096, 512));
    assert_eq!(
        (plan.config.dp * plan.config.cp) % plan.config.ep,
        0,
        "expert parallel ranks come from data and context parallel ranks"
    );
}

#[test]
fn long_sequences_search_context_parallelism() {
    let long = spec(llama3_405b(), h100_cluster(64, 8, 80.0), 131072, 64);
    let (configs, _) = tessel_planner::outer_configs(&long);
    assert!(configs.iter().any(|c| c.cp > 1));
    let short = spec(llama3_405b(), h100_cluster(64, 8, 80.0), 8192, 64);
    let (configs, _) = tessel_planner::outer_configs(&short);
    assert!(configs.iter().all(|c| c.cp == 1));
}
