//! Resharding through the binary: `tessel launch A --steps 2 --save DIR`, then `tessel launch
//! B --steps 2 --resume DIR` under other degrees (rank count, pipeline depth, tensor and expert
//! parallelism, ZeRO stage); the four losses equal an uninterrupted single-rank run of four
//! steps within a relative 1e-4.

mod common;

use common::{launch_cpu, stdout, tessel};
use std::path::{Path, PathBuf};

/// `tests/launch/NAME` planned with `degrees` (`--gpus` among them) into `dir/label.json`.
fn plan(dir: &Path, spec: &str, label: &str, degrees: &[&str]) -> PathBuf {
    let out = dir.join(format!("{label}.json"));
    let spec = format!("tests/launch/{spec}");
    let mut args = vec!["plan", spec.as_str(), "-o", out.to_str().unwrap()];
    args.extend_from_slice(degrees);
    stdout(&tessel(&args));
    out
}

/// The losses of `steps` steps of `plan` at full size, with `extra` flags.
fn losses(plan: &Path, steps: &str, extra: &[&str]) -> Vec<f64> {
    launch_cpu(plan, steps, extra)["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_f64().unwrap())
        .collect()
}

fn assert_close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-4 * w.abs(),
            "{what}: {got:?} vs {want:?}"
        );
    }
}

/// Trains `a` two steps, saves, resumes under `b` for two more, against the reference.
fn reshard(spec: &str, a: &[&str], b: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let reference = plan(dir, spec, "ref", &["--gpus", "1"]);
    let want = losses(&reference, "4", &[]);
    let checkpoint = dir.join("checkpoint");
    let checkpoint = checkpoint.to_str().unwrap();
    let (plan_a, plan_b) = (plan(dir, spec, "a", a), plan(dir, spec, "b", b));
    let what = format!("{a:?} → {b:?}");
    let first = losses(&plan_a, "2", &["--save", checkpoint]);
    assert_close(&first, &want[..2], &what);
    let then = losses(&plan_b, "2", &["--resume", checkpoint]);
    assert_close(&then, &want[2..], &what);
}

#[test]
fn more_gpus_after_the_checkpoint() {
    reshard(
        "dense8.tsl",
        &["--gpus", "2", "--dp", "2"],
        &["--gpus", "4", "--dp", "4", "--zero", "1"],
    );
}

#[test]
fn a_deeper_pipeline() {
    reshard(
        "dense8.tsl",
        &["--gpus", "2", "--pp", "2", "--dp", "1", "--microbatch", "4"],
        &["--gpus", "4", "--pp", "4", "--dp", "1", "--microbatch", "2"],
    );
}

#[test]
fn tensor_parallelism_on_a_sharded_optimizer() {
    reshard(
        "dense8.tsl",
        &["--gpus", "2", "--dp", "2", "--zero", "2"],
        &["--gpus", "4", "--tp", "2", "--dp", "2", "--zero", "1"],
    );
}

#[test]
fn zero_3_shards_to_tensor_and_pipeline_ranks() {
    reshard(
        "dense8.tsl",
        &["--gpus", "4", "--dp", "4", "--zero", "3"],
        &["--gpus", "4", "--tp", "2", "--pp", "2", "--dp", "1"],
    );
}

#[test]
fn from_no_zero_to_zero_3() {
    reshard(
        "dense8.tsl",
        &["--gpus", "2", "--tp", "2", "--dp", "1"],
        &["--gpus", "2", "--dp", "2", "--zero", "3"],
    );
}

#[test]
fn eight_ranks_down_to_one() {
    reshard(
        "dense8.tsl",
        &[
            "--gpus", "8", "--tp", "2", "--pp", "2", "--dp", "2", "--zero", "1",
        ],
        &["--gpus", "1"],
    );
}

#[test]
fn experts_move_between_ranks() {
    reshard(
        "moe8.tsl",
        &["--gpus", "2", "--dp", "2", "--ep", "2"],
        &["--gpus", "2", "--tp", "2", "--dp", "1", "--ep", "1"],
    );
}

#[test]
fn another_model_is_refused_with_the_parameter_that_differs() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let dense = plan(dir, "dense8.tsl", "dense", &["--gpus", "1"]);
    let checkpoint = dir.join("checkpoint");
    losses(&dense, "1", &["--save", checkpoint.to_str().unwrap()]);
    let moe = plan(dir, "moe8.tsl", "moe", &["--gpus", "1"]);
    let out = tessel(&[
        "launch",
        moe.to_str().unwrap(),
        "--backend",
        "cpu",
        "--resume",
        checkpoint.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("checkpoint: "), "{stderr}");
    assert!(stderr.contains("this plan's model"), "{stderr}");
    let out = tessel(&[
        "launch",
        moe.to_str().unwrap(),
        "--backend",
        "cpu",
        "--resume",
        dir.join("nowhere").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("manifest.json"));
    // Only the one-process CPU launch writes and reads them so far, and says so.
    let out = tessel(&[
        "launch",
        dense.to_str().unwrap(),
        "--backend",
        "cpu",
        "--nproc-per-node",
        "2",
        "--save",
        checkpoint.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("one-process CPU launch"));
}

#[test]
fn a_killed_rank_resumes_from_the_last_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let reference = plan(dir, "dense8.tsl", "ref", &["--gpus", "1"]);
    let want = losses(&reference, "6", &[]);
    let a = plan(dir, "dense8.tsl", "a", &["--gpus", "2", "--dp", "2"]);
    let snapshots = dir.join("snapshots");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessel"))
        .args([
            "launch",
            a.to_str().unwrap(),
            "--backend",
            "cpu",
            "--scale",
            "1",
        ])
        .args([
            "--steps",
            "6",
            "--save",
            snapshots.to_str().unwrap(),
            "--save-every",
            "2",
        ])
        .env("TESSEL_INJECT_FAILURE", "1:5")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("rank 1 failed: failure injected as step 5 started"),
        "{stderr}"
    );
    // Steps 2 and 4 were snapshotted; the newest is named and the older removed.
    assert_eq!(
        std::fs::read_to_string(snapshots.join("latest")).unwrap(),
        "step4\n"
    );
    assert!(!snapshots.join("step2").exists());
    let b = plan(
        dir,
        "dense8.tsl",
        "b",
        &["--gpus", "4", "--tp", "2", "--pp", "2"],
    );
    let then = losses(&b, "2", &["--resume", snapshots.to_str().unwrap()]);
    assert_close(&then, &want[4..], "resumed after the failure");
}

#[test]
fn snapshots_default_to_the_plans_checkpoint_interval() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    // A spec that fails absurdly often, for an interval of a few steps of this tiny model.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("tests/launch/dense8.tsl"))
        .unwrap()
        .replace("../../specs/clusters", root.join("specs/clusters").to_str().unwrap())
        .replace(
            "  optimizer    = adam\n",
            "  optimizer    = adam\n  failures     = { mtbf = 5 ms, restart = 0 s }\n  checkpoint   = { to = disk, bandwidth = 4 GB/s }\n",
        );
    let spec = dir.join("failing.tsl");
    std::fs::write(&spec, text).unwrap();
    let out = dir.join("plan.json");
    stdout(&tessel(&[
        "plan",
        spec.to_str().unwrap(),
        "--gpus",
        "1",
        "-o",
        out.to_str().unwrap(),
    ]));
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let every = written["checkpoints"]["interval_steps"].as_u64().unwrap();
    assert_eq!(written["checkpoints"]["chosen"]["target"], "disk");
    let snapshots = dir.join("snapshots");
    let steps = (2 * every + 1).to_string();
    losses(&out, &steps, &["--save", snapshots.to_str().unwrap()]);
    // The last step's snapshot, after one at each interval.
    assert_eq!(
        std::fs::read_to_string(snapshots.join("latest")).unwrap(),
        format!("step{steps}\n")
    );
}
