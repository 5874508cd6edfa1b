//! A cluster made of pools through the binary: `plan` places the work and records where, `plan
//! --check` re-predicts it under that placement, and the commands that cost or export one GPU
//! type refuse a cluster of pools with exit 1 (a plan across pools launches: tests/replan.rs).

mod common;

use common::{stdout, tessel};

const SPEC: &str = "specs/mixed-a100-l40s.tsl";

fn plan_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("mixed.json");
    let output = tessel(&["plan", SPEC, "-o", path.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stdout(&output));
    path
}

#[test]
fn the_plan_says_which_ranks_run_on_which_pool() {
    let dir = tempfile::tempdir().unwrap();
    let path = plan_file(dir.path());
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let placement = &plan["placement"];
    let gpus = plan["gpus"].as_u64().unwrap();
    assert_eq!(gpus, 96);
    let pools = placement["pools"].as_array().unwrap();
    // Every rank on exactly one pool, pools back to back, stages likewise.
    let mut next_rank = 0;
    let mut next_stage = 0;
    for pool in pools {
        assert_eq!(pool["ranks"][0].as_u64().unwrap(), next_rank);
        assert_eq!(pool["stages"][0].as_u64().unwrap(), next_stage);
        next_rank = pool["ranks"][1].as_u64().unwrap();
        next_stage = pool["stages"][1].as_u64().unwrap();
    }
    assert_eq!(next_rank, gpus);
    assert_eq!(next_stage, plan["config"]["pp"].as_u64().unwrap());
    // The plan is the fastest placement tried, and at least as fast as either pool alone.
    let step = plan["prediction"]["step_time_s"].as_f64().unwrap();
    let tried = placement["tried"].as_array().unwrap();
    assert_eq!(tried.len(), 3);
    for other in tried {
        if let Some(time) = other["step_time_s"].as_f64() {
            assert!(step <= time, "{other}");
        }
    }
    let table = stdout(&tessel(&["plan", SPEC]));
    assert!(table.contains("  pools        "), "{table}");
    assert!(
        table.contains("  placements   pipeline across pools"),
        "{table}"
    );
}

#[test]
fn check_re_predicts_the_placement_the_plan_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = plan_file(dir.path());
    let output = tessel(&["plan", SPEC, "--check", path.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stdout(&output));
    assert!(stdout(&output).starts_with("current:"));
}

#[test]
fn one_gpu_type_commands_refuse_pools() {
    let dir = tempfile::tempdir().unwrap();
    let path = plan_file(dir.path());
    let plan = path.to_str().unwrap();
    for args in [
        vec!["estimate", SPEC, "--tp", "1", "--pp", "3", "--dp", "32"],
        vec!["export", plan, "--to", "megatron"],
        vec!["plan", SPEC, "--gpus", "32"],
    ] {
        let output = tessel(&args);
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("made of pools"), "{args:?}: {stderr}");
    }
}
