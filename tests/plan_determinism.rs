//! `tessel plan` writes byte-identical plan files across runs and thread counts, and the plan's
//! prediction is exactly what `tessel estimate` prints for the same configuration.

use std::process::Command;

fn plan_json(spec: &str, threads: &str) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_tessel"))
        .args(["plan", spec, "--format", "json"])
        .env("RAYON_NUM_THREADS", threads)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the tessel binary runs");
    assert!(
        output.status.success(),
        "{spec}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

#[test]
fn plan_files_do_not_depend_on_threads_or_runs() {
    for spec in [
        "specs/llama3-70b.tsl",
        "specs/mixtral-8x7b.tsl",
        "specs/mixed-a100-l40s.tsl",
    ] {
        let one = plan_json(spec, "1");
        assert_eq!(one, plan_json(spec, "2"), "{spec}: 1 vs 2 threads");
        assert_eq!(one, plan_json(spec, "4"), "{spec}: 1 vs 4 threads");
        assert_eq!(one, plan_json(spec, "1"), "{spec}: two runs");
    }
}

#[test]
fn plan_prediction_equals_estimate() {
    let text = plan_json("specs/llama3-70b.tsl", "2");
    let plan = tessel_planner::Plan::from_json(&text).expect("a valid plan file");
    let model = tessel_symbolic::cost::CostModel::new(&plan.spec).expect("a cost model");
    let estimate = model.estimate(&plan.strategy()).expect("an estimate");
    // Both through the plan file's canonical writer: the file holds rounded numbers.
    let canonical = |estimate: &tessel_symbolic::cost::Estimate| {
        tessel_planner::canonical_json::to_canonical_string(
            &serde_json::to_value(estimate).expect("an estimate serialises"),
        )
    };
    assert_eq!(canonical(&estimate), canonical(&plan.prediction));
}
