//! The same spec gives a byte-identical plan file on any number of threads and on every run.

mod common;

use common::synthetic_model::SyntheticModel;
use common::*;
use tessel_planner::{plan, PlanOptions};

fn plan_json(threads: usize, spec: &tessel_grammar::Spec) -> String {
    let model = SyntheticModel::new(spec.clone());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool");
    pool.install(|| {
        plan(spec, &model, &PlanOptions::default())
            .expect("a plan")
            .plan
            .to_json()
    })
}

#[test]
fn plan_json_is_identical_across_thread_counts_and_runs() {
    let specs = [
        spec(gpt3_175b(), h100_cluster(32, 8, 80.0), 2048, 512),
        spec(llama3_405b(), h100_cluster(64, 8, 80.0), 8192, 256),
        spec(mixtral_8x7b(), h100_cluster(8, 8, 80.0), 4096, 256),
    ];
    for spec in &specs {
        let one = plan_json(1, spec);
        let four = plan_json(4, spec);
        let again = plan_json(4, spec);
        assert_eq!(one, four, "1 vs 4 threads differ for {}", spec.model.name);
        assert_eq!(four, again, "two runs differ for {}", spec.model.name);
        assert!(one.starts_with("{\n  \"cluster\": "));
    }
}
