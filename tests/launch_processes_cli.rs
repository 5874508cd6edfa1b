//! `tessel launch` with several processes: the ranks rendezvous over loopback TCP and train the
//! same losses as the one-process run; the CUDA backend explains what is missing.

mod common;

use common::tessel;
use std::path::Path;

fn small_plan(dir: &Path) -> String {
    let plan = dir.join("plan.json").to_str().expect("UTF-8").to_string();
    let output = tessel(&[
        "plan",
        "tests/launch/dense8.tsl",
        "--tp",
        "2",
        "--pp",
        "2",
        "-o",
        &plan,
    ]);
    assert!(output.status.success(), "{output:?}");
    plan
}

#[test]
fn processes_train_the_same_losses_as_threads() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let plan = small_plan(dir.path());
    let threads = tessel(&[
        "launch",
        &plan,
        "--backend",
        "cpu",
        "--steps",
        "3",
        "--format",
        "json",
    ]);
    assert!(threads.status.success(), "{threads:?}");
    let report: serde_json::Value = serde_json::from_slice(&threads.stdout).expect("a JSON report");
    let expected: Vec<String> = report["losses"]
        .as_array()
        .expect("losses")
        .iter()
        .map(|loss| format!("{:.6}", loss.as_f64().expect("a number")))
        .collect();

    let processes = tessel(&[
        "launch",
        &plan,
        "--backend",
        "cpu",
        "--steps",
        "3",
        "--nproc-per-node",
        "8",
    ]);
    assert!(processes.status.success(), "{processes:?}");
    let stdout = String::from_utf8_lossy(&processes.stdout);
    let losses: Vec<String> = stdout
        .lines()
        .filter(|line| line.starts_with("step"))
        .map(|line| line.split_whitespace().nth(3).expect("a loss").to_string())
        .collect();
    assert_eq!(losses, expected, "{stdout}");
}

#[test]
fn cuda_without_the_feature_says_so_once() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let plan = small_plan(dir.path());
    let output = tessel(&["launch", &plan, "--backend", "cuda", "--steps", "1"]);
    assert_eq!(output.status.code(), Some(4));
    let stderr = String::from_utf8_lossy(&output.stderr);
    if cfg!(feature = "cuda") {
        assert!(
            stderr.starts_with("error: the CUDA backend cannot run here: "),
            "{stderr}"
        );
    } else {
        assert_eq!(
            stderr,
            "error: the CUDA backend cannot run here: built without the cuda feature; rebuild with --features cuda\n"
        );
    }
}
