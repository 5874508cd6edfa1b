//! Full-space search time for three published-scale cases, with the real cost model (the
//! example specs in `specs/`, every search key `auto`) and with the analytic test cost model.
//! Prints a JSON report: median wall time over several runs, configurations screened per second,
//! and what the search did. Run with `cargo bench -p tessel-planner --bench plan_search`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use common::synthetic_model::SyntheticModel;
use common::*;
use serde_json::json;
use tessel_grammar::{SearchSpace, Spec};
use tessel_planner::{plan, PlanOptions, StageCostModel};
use tessel_symbolic::cost::CostModel;

const RUNS: usize = 5;

/// An example spec with its search block replaced by the full space and `nodes` nodes.
fn example(file: &str, nodes: u64) -> Spec {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../specs")
        .join(file);
    let mut spec = tessel_grammar::load_file(&path)
        .unwrap_or_else(|diagnostics| panic!("{file} loads:\n{diagnostics}"));
    spec.search = SearchSpace::default();
    spec.cluster.nodes = nodes;
    spec
}

fn case(name: &str, spec: Spec, model: &dyn StageCostModel) -> serde_json::Value {
    let mut times = Vec::with_capacity(RUNS);
    let mut last = None;
    for _ in 0..RUNS {
        let started = Instant::now();
        let outcome = plan(&spec, model, &PlanOptions::default()).expect("a plan");
        times.push(started.elapsed().as_secs_f64());
        last = Some(outcome.plan);
    }
    times.sort_by(f64::total_cmp);
    let median = times[RUNS / 2];
    let plan = last.expect("at least one run");
    let s = &plan.search;
    let c = &plan.config;
    json!({
        "case": name,
        "gpus": plan.gpus,
        "median_wall_s": median,
        "min_wall_s": times[0],
        "max_wall_s": times[RUNS - 1],
        "configurations_screened": s.screened,
        "configurations_per_s": s.screened as f64 / median,
        "stage_evaluations": s.stage_evaluations,
        "stage_evaluations_per_s": s.stage_evaluations as f64 / median,
        "evaluated": s.evaluated,
        "milps_solved": s.milps_solved,
        "solver_status": plan.solver.status.as_str(),
        "chosen": format!(
            "tp{} pp{} dp{} cp{} ep{} v{} mb{}x{} zero{} sp={}",
            c.tp, c.pp, c.dp, c.cp, c.ep, c.interleave, c.microbatch, c.microbatches, c.zero,
            c.sequence_parallel
        ),
        "step_time_s": plan.prediction.step_time_s,
        "mfu": plan.prediction.mfu,
    })
}

fn main() {
    let threads = rayon::current_num_threads();
    let published = [
        ("gpt3_175b_1024_a100", example("gpt3-175b.tsl", 128)),
        ("llama3_405b_16384_h100", example("llama3-405b.tsl", 2048)),
        ("mixtral_8x7b_256_h100", example("mixtral-8x7b.tsl", 32)),
    ];
    let real: Vec<_> = published
        .into_iter()
        .map(|(name, spec)| {
            let model = CostModel::new(&spec).expect("a cost model");
            case(name, spec, &model)
        })
        .collect();
    let synthetic: Vec<_> = [
        (
            "gpt3_175b_1024",
            spec(gpt3_175b(), h100_cluster(128, 8, 80.0), 2048, 1536),
        ),
        (
            "llama3_405b_16384",
            spec(llama3_405b(), h100_cluster(2048, 8, 80.0), 8192, 2048),
        ),
        (
            "mixtral_8x7b_256",
            spec(mixtral_8x7b(), h100_cluster(32, 8, 80.0), 4096, 512),
        ),
    ]
    .into_iter()
    .map(|(name, spec)| {
        let model = SyntheticModel::new(spec.clone());
        case(name, spec, &model)
    })
    .collect();
    let report = json!({
        "benchmark": "plan_search",
        "threads": threads,
        "runs": RUNS,
        "cost_model": real,
        "synthetic_model": synthetic,
    });
    println!(
        "{}",
        serde_json::to_string_pretty(&report).unwrap_or_default()
    );
}
