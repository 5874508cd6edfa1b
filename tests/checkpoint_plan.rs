//! Plans of jobs that fail (`train.failures`): the checkpoint target with the best goodput,
//! its interval in steps and seconds, and what else was weighed, through the binary.

mod common;

use common::{stdout, tessel};

fn planned(spec: &std::path::Path) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("plan.json");
    stdout(&tessel(&[
        "plan",
        spec.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]));
    serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap()
}

#[test]
fn llama3_405b_snapshots_to_host_memory_and_says_what_failures_cost() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let plan = planned(&root.join("specs/llama3-405b.tsl"));
    let c = &plan["checkpoints"];
    let chosen = &c["chosen"];
    assert_eq!(chosen["target"], "host");
    // 405.9 B parameters × 12 bytes over 16,384 GPUs.
    let bytes = chosen["bytes_per_gpu"].as_f64().unwrap();
    assert!((bytes / 297.3e6 - 1.0).abs() < 0.01, "{bytes}");
    // 50,000 GPU-hours over 16,384 GPUs.
    let mtbf = chosen["job_mtbf_s"].as_f64().unwrap();
    assert!((mtbf - 50_000.0 * 3600.0 / 16_384.0).abs() < 1.0, "{mtbf}");
    let goodput = chosen["goodput"].as_f64().unwrap();
    assert!(goodput > 0.9 && goodput < 0.97, "{goodput}");
    let lost = chosen["lost_to_failures_per_day_s"].as_f64().unwrap()
        + chosen["checkpointing_per_day_s"].as_f64().unwrap();
    assert!((lost - 86_400.0 * (1.0 - goodput)).abs() < 1.0, "{lost}");
    assert!(c["interval_steps"].as_u64().unwrap() >= 1);
    // Tectonic's 2 TB/s shared by 16,384 GPUs: a 2.4 s write, a lower goodput.
    let disk = &c["alternatives"][0];
    assert_eq!(disk["target"], "disk");
    assert!(
        (disk["write_s"].as_f64().unwrap() - 2.436).abs() < 0.01,
        "{disk}"
    );
    assert!(disk["goodput"].as_f64().unwrap() < goodput);

    let text = stdout(&tessel(&["plan", "specs/llama3-405b.tsl", "--explain"]));
    assert!(text.contains("  checkpoints  every "), "{text}");
    assert!(text.contains("to host memory"), "{text}");
    assert!(text.contains("  disk instead: every "), "{text}");
    // The exported launch configuration checkpoints at that interval.
    let script = stdout(&tessel(&[
        "export",
        "specs/llama3-405b.tsl",
        "--strategy",
        "meta_reference",
        "--to",
        "megatron",
    ]));
    assert!(script.contains("--save-interval "), "{script}");
    // `estimate` states it for the fixed configuration too.
    let text = stdout(&tessel(&["estimate", "specs/llama3-405b.tsl"]));
    assert!(text.contains("checkpoints               every "), "{text}");
}

#[test]
fn one_node_has_no_peer_for_host_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("tests/launch/dense8.tsl"))
        .unwrap()
        .replace(
            "../../specs/clusters",
            root.join("specs/clusters").to_str().unwrap(),
        )
        .replace(
            "  optimizer    = adam\n",
            "  optimizer    = adam\n  failures     = { mtbf_per_gpu = 50000 h }\n",
        );
    let spec = dir.path().join("one-node.tsl");
    std::fs::write(&spec, text).unwrap();
    let plan = planned(&spec);
    assert!(plan["checkpoints"]["chosen"].is_null(), "{plan}");
    let out = stdout(&tessel(&["plan", spec.to_str().unwrap()]));
    assert!(
        out.contains(
            "checkpoints  none possible (host: one node has no peer to hold its snapshot's \
             replica; disk: no disk bandwidth"
        ),
        "{out}"
    );
}
