//! Serving-plan search time for the three serving examples in `specs/`: median wall time over
//! several runs, instance configurations simulated and deployments ranked, and the chosen
//! deployment. Prints a JSON report. Run with `cargo bench -p tessel-planner --bench
//! serving_plan`; the goal is under a second each.

use std::time::Instant;

use serde_json::json;
use tessel_grammar::{load_job, Job};
use tessel_planner::serving::plan::plan_serving;

const RUNS: usize = 5;

fn main() {
    let cases: Vec<_> = [
        "serve-llama3-8b.tsl",
        "serve-llama3-70b.tsl",
        "serve-mixtral-8x7b.tsl",
    ]
    .iter()
    .map(|file| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../specs")
            .join(file);
        let spec = match load_job(&path) {
            Ok(Job::Serve(spec)) => *spec,
            _ => panic!("{file} is a serving spec"),
        };
        let mut times = Vec::with_capacity(RUNS);
        let mut last = None;
        for _ in 0..RUNS {
            let started = Instant::now();
            last = Some(plan_serving(&spec, None, None).expect("a serving plan"));
            times.push(started.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        let plan = last.expect("at least one run");
        json!({
            "case": file,
            "median_wall_s": times[RUNS / 2],
            "min_wall_s": times[0],
            "max_wall_s": times[RUNS - 1],
            "configurations_simulated": plan.search.configurations,
            "deployments_ranked": plan.search.deployments,
            "chosen": plan.chosen.kind,
            "gpus": plan.chosen.gpus,
            "goodput_per_gpu": plan.chosen.goodput_per_gpu,
        })
    })
    .collect();
    let report = json!({
        "benchmark": "serving_plan",
        "threads": rayon::current_num_threads(),
        "runs": RUNS,
        "cases": cases,
    });
    println!(
        "{}",
        serde_json::to_string_pretty(&report).unwrap_or_default()
    );
}
