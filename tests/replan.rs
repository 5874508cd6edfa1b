//! `tessel replan` through the binary: the plan for fewer or more GPUs (or a grown pool of a
//! cluster of pools), chosen with the cost of moving counted, and its resharding map against what the runtime actually reads when it resumes a
//! checkpoint of the old plan under the new one.

mod common;

use common::{launch_cpu, stdout, tessel};
use std::collections::BTreeSet;
use std::path::Path;

/// `tests/launch/dense8.tsl` on `nodes` nodes of 8, written into `dir`.
fn dense8_on(dir: &Path, nodes: u64) -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("tests/launch/dense8.tsl"))
        .unwrap()
        .replace(
            "../../specs/clusters",
            root.join("specs/clusters").to_str().unwrap(),
        )
        .replace("cluster      = dgx_h100", "cluster      = two")
        .replace(
            "\ntrain {",
            &format!("\ncluster two extends dgx_h100 {{ nodes = {nodes} }}\n\ntrain {{"),
        );
    let spec = dir.join("dense8.tsl");
    std::fs::write(&spec, text).unwrap();
    spec
}

/// `tests/launch/dense8.tsl` on a cluster of two pools of one node each: `own`, `own_gpus`
/// H100s, and `loan`, `loan_gpus` GPUs of type `loan_gpu` behind a 100 Gb/s network; two
/// pipeline stages and a global batch of `batch`, written into `dir`.
fn dense8_on_pools(
    dir: &Path,
    own_gpus: u64,
    loan_gpus: u64,
    loan_gpu: &str,
    batch: u64,
) -> std::path::PathBuf {
    let spec = dense8_on(dir, 1);
    let text = std::fs::read_to_string(&spec)
        .unwrap()
        .replace("global_batch = 16", &format!("global_batch = {batch}"))
        .replace(
            "cluster two extends dgx_h100 { nodes = 1 }",
            &format!(
                "cluster two {{\n  pool own {{ gpu = H100_SXM; nodes = 1; gpus_per_node = {own_gpus}; \
                 intra_node = {{ bandwidth = 450 GB/s }}; inter_node = {{ bandwidth = 400 Gb/s }} }}\n  \
                 pool loan {{ gpu = {loan_gpu}; nodes = 1; gpus_per_node = {loan_gpus}; \
                 intra_node = {{ bandwidth = 32 GB/s }}; inter_node = {{ bandwidth = 100 Gb/s }} }}\n\
                 between_pools = {{ bandwidth = 100 Gb/s }}\n}}\nsearch {{ tp = 1; pp = 2 }}"
            ),
        );
    std::fs::write(&spec, text).unwrap();
    spec
}

/// The pools a plan file's placement uses, by name.
fn pools_used(plan: &Path) -> Vec<String> {
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(plan).unwrap()).unwrap();
    plan["placement"]["pools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect()
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The resharding map `replan` prints, and what the runtime read resuming under its plan.
fn map_against_runtime(spec: &Path, degrees: &[&str], change: &[&str]) {
    let dir = spec.parent().unwrap();
    let (old, new) = (dir.join("old.json"), dir.join("new.json"));
    let mut args = vec!["plan", path(spec), "-o", path(&old)];
    args.extend_from_slice(degrees);
    stdout(&tessel(&args));
    let mut args = vec!["replan", path(&old), "--format", "json", "-o", path(&new)];
    args.extend_from_slice(change);
    let replanned: serde_json::Value = serde_json::from_str(&stdout(&tessel(&args))).unwrap();
    let map: BTreeSet<(u64, u64, u64)> = replanned["resharding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let n = |k: &str| m[k].as_u64().unwrap();
            (n("from"), n("to"), n("elements"))
        })
        .collect();
    assert!(!map.is_empty());

    let checkpoint = dir.join("checkpoint");
    launch_cpu(&old, "1", &["--save", path(&checkpoint)]);
    let resumed = launch_cpu(&new, "1", &["--resume", path(&checkpoint)]);
    let read: BTreeSet<(u64, u64, u64)> = resumed["resharded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let n = |k: &str| m[k].as_u64().unwrap();
            (n("from"), n("to"), n("elements"))
        })
        .collect();
    assert_eq!(map, read);
}

#[test]
fn removing_a_node_moves_what_the_runtime_moves() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dense8_on(dir.path(), 2);
    map_against_runtime(
        &spec,
        &["--tp", "2", "--pp", "2", "--dp", "4"],
        &["--remove-nodes", "1"],
    );
}

#[test]
fn adding_a_node_moves_what_the_runtime_moves() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dense8_on(dir.path(), 2);
    map_against_runtime(
        &spec,
        &["--gpus", "8", "--tp", "2", "--dp", "4", "--zero", "1"],
        &["--nodes", "2"],
    );
}

#[test]
fn halving_the_gpus_moves_what_the_runtime_moves() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dense8_on(dir.path(), 1);
    map_against_runtime(
        &spec,
        &["--dp", "4", "--tp", "2", "--zero", "1"],
        &["--gpus", "4"],
    );
}

#[test]
fn adding_a_pool_moves_what_the_runtime_moves() {
    // Two stages of equal GPU counts cannot be laid out on 4 + 2 GPUs: the plan runs on `own`
    // alone. Two more loaned GPUs make a pipeline of one stage on each pool, twice the replicas,
    // predicted faster (ranked by the prediction itself: the interval of a pipeline across GPU
    // types is wider, and the pessimistic default would keep this tiny job on `own`).
    let dir = tempfile::tempdir().unwrap();
    let spec = dense8_on_pools(dir.path(), 4, 2, "H100_SXM", 256);
    map_against_runtime(&spec, &[], &["--add", "loan:1", "--objective", "expected"]);
    assert_eq!(pools_used(&dir.path().join("old.json")), ["own"]);
    let new = dir.path().join("new.json");
    assert_eq!(pools_used(&new), ["own", "loan"]);
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&new).unwrap()).unwrap();
    let loan = &plan["placement"]["cluster"]["pools"][1];
    assert_eq!(
        (loan["name"].as_str(), loan["nodes"].as_u64()),
        (Some("loan"), Some(2))
    );
}

#[test]
fn growing_a_pool_moves_what_the_runtime_moves() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dense8_on_pools(dir.path(), 4, 4, "L40S", 256);
    map_against_runtime(&spec, &[], &["--add", "own:1"]);
}

#[test]
fn adding_to_a_pool_the_plan_does_not_have_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dense8_on_pools(dir.path(), 4, 2, "L40S", 256);
    let old = dir.path().join("old.json");
    stdout(&tessel(&["plan", path(&spec), "-o", path(&old)]));
    for (add, says) in [
        ("spare:1", "no pool `spare`"),
        ("loan:0", "POOL:NODES"),
        ("loan", "POOL:NODES"),
    ] {
        let out = tessel(&["replan", path(&old), "--add", add]);
        assert_eq!(out.status.code(), Some(1), "{add}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(says), "{add}");
    }
    let plain = dense8_on(dir.path(), 1);
    stdout(&tessel(&["plan", path(&plain), "-o", path(&old)]));
    let out = tessel(&["replan", path(&old), "--add", "loan:1"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("has no pools"));
}

#[test]
fn with_no_steps_left_the_smaller_move_wins() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dense8_on(dir.path(), 2);
    let old = dir.path().join("old.json");
    stdout(&tessel(&[
        "plan",
        path(&spec),
        "--tp",
        "2",
        "--pp",
        "2",
        "--dp",
        "4",
        "-o",
        path(&old),
    ]));
    let replan = |steps: &str| -> serde_json::Value {
        let args = [
            "replan",
            path(&old),
            "--remove-nodes",
            "1",
            "--remaining-steps",
            steps,
            "--format",
            "json",
        ];
        serde_json::from_str(&stdout(&tessel(&args))).unwrap()
    };
    let none_left = replan("0");
    let candidates = none_left["candidates"].as_array().unwrap();
    let chosen = &candidates[none_left["chosen"].as_u64().unwrap() as usize];
    let least = candidates
        .iter()
        .map(|c| c["transfer_s"].as_f64().unwrap())
        .fold(f64::INFINITY, f64::min);
    assert_eq!(chosen["transfer_s"].as_f64().unwrap(), least, "{none_left}");
    // With many steps left the faster plan wins whatever it moves.
    let many = replan("1000000");
    let candidates = many["candidates"].as_array().unwrap();
    let chosen = &candidates[many["chosen"].as_u64().unwrap() as usize];
    let fastest = candidates
        .iter()
        .map(|c| c["step_time_s"].as_f64().unwrap())
        .fold(f64::INFINITY, f64::min);
    assert_eq!(chosen["step_time_s"].as_f64().unwrap(), fastest, "{many}");
}

#[test]
fn nothing_left_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dense8_on(dir.path(), 2);
    let old = dir.path().join("old.json");
    stdout(&tessel(&["plan", path(&spec), "-o", path(&old)]));
    let out = tessel(&["replan", path(&old), "--remove-nodes", "2"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("leaves nothing"));
}
