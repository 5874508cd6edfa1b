//! `tessel launch` on real plan files: a 70B plan shrunk by the automatic scale, the Chrome
//! trace, and the errors for files that are not runnable plans (exit 1).

mod common;

use common::tessel;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn spec(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/launch")
        .join(name)
}

fn write_plan(dir: &Path, spec_name: &str, degrees: &[&str]) -> PathBuf {
    let out = dir.join("plan.json");
    let spec = spec(spec_name);
    let mut args = vec!["plan", spec.to_str().unwrap()];
    args.extend_from_slice(degrees);
    args.extend_from_slice(&["-o", out.to_str().unwrap()]);
    let result = tessel(&args);
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    out
}

fn launch_error(plan: &Path) -> String {
    let out = tessel(&["launch", plan.to_str().unwrap(), "--backend", "cpu"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_70b_plan_shrinks_to_run_in_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let plan = write_plan(dir.path(), "llama70b8.tsl", &["--strategy", "lean"]);
    let trace = dir.path().join("trace.json");
    let out = tessel(&[
        "launch",
        plan.to_str().unwrap(),
        "--backend",
        "cpu",
        "--steps",
        "2",
        "--trace",
        trace.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // 2^-6 is the largest power-of-two factor that brings 70.55 B parameters under 2 M.
    assert!(
        stdout.contains(
            "llama3_70b scaled by 0.015625: 2 layers, hidden 128, 64 heads (8 key/value) of 2, \
             ffn 448, vocab 1984"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("sequence length 128, global batch 8"),
        "{stdout}"
    );
    let table: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("step"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect();
    assert_eq!(table.len(), 2, "{stdout}");
    let trace: Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let ranks: std::collections::BTreeSet<u64> = events
        .iter()
        .filter(|e| e["ph"] != "M")
        .filter_map(|e| e["tid"].as_u64())
        .collect();
    assert_eq!(ranks.len(), 8, "trace covers ranks {ranks:?}");
}

#[test]
fn json_reports_losses_and_memory_per_rank() {
    let dir = tempfile::tempdir().unwrap();
    let plan = write_plan(dir.path(), "dense8.tsl", &["--pp", "2", "--tp", "2"]);
    let out = tessel(&[
        "launch",
        plan.to_str().unwrap(),
        "--backend",
        "cpu",
        "--steps",
        "3",
        "--format",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["losses"].as_array().unwrap().len(), 3);
    assert_eq!(report["step_time_s"].as_array().unwrap().len(), 3);
    assert!(report["tokens_per_s"].as_f64().unwrap() > 0.0);
    let ranks = report["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 8);
    for rank in ranks {
        assert!(rank["peak_memory_bytes"].as_u64().unwrap() > 0);
        assert!(rank["predicted_peak_memory_bytes"].as_u64().unwrap() > 0);
    }
}

#[test]
fn missing_truncated_and_foreign_files_are_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.json");
    assert!(launch_error(&missing).contains("cannot read"));
    let plan = write_plan(dir.path(), "dense8.tsl", &["--tp", "2"]);
    let text = std::fs::read_to_string(&plan).unwrap();
    let truncated = dir.path().join("truncated.json");
    std::fs::write(&truncated, &text[..text.len() / 2]).unwrap();
    assert!(launch_error(&truncated).contains("truncated"));
    let no_data = dir.path().join("tokens.bin");
    let out = tessel(&[
        "launch",
        plan.to_str().unwrap(),
        "--backend",
        "cpu",
        "--data",
        no_data.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
    let foreign = dir.path().join("foreign.json");
    std::fs::write(&foreign, r#"{"format": "megatron-args/1"}"#).unwrap();
    assert!(launch_error(&foreign).contains("is not a plan file"));
}

fn edited(dir: &Path, edit: impl Fn(&mut Value)) -> PathBuf {
    let plan = write_plan(dir, "dense8.tsl", &["--tp", "2", "--pp", "2"]);
    let mut value: Value = serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    edit(&mut value);
    let out = dir.join("edited.json");
    std::fs::write(&out, value.to_string()).unwrap();
    out
}

#[test]
fn hand_edited_plans_that_do_not_add_up_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let short = edited(dir.path(), |v| {
        v["rank_map"]["ranks"].as_array_mut().unwrap().pop();
    });
    let message = launch_error(&short);
    assert!(
        message.contains("the rank map lists 7 ranks but dp·tp·pp·cp = 2·2·2·1 = 8"),
        "{message}"
    );
    let gap = edited(dir.path(), |v| {
        v["stages"][1]["layer_ranges"][0][0] = Value::from(5);
        v["stages"][1]["layers"] = Value::from(3);
    });
    let message = launch_error(&gap);
    assert!(message.contains("do not cover layers 0..8"), "{message}");
    let other_model = edited(dir.path(), |v| {
        v["spec"]["model"]["layers"] = Value::from(12);
    });
    let message = launch_error(&other_model);
    assert!(message.contains("spec_digest"), "{message}");
}

#[test]
fn plans_wider_than_max_ranks_are_refused_with_advice() {
    let dir = tempfile::tempdir().unwrap();
    let plan = write_plan(dir.path(), "dense8.tsl", &["--tp", "2"]);
    let out = tessel(&[
        "launch",
        plan.to_str().unwrap(),
        "--backend",
        "cpu",
        "--max-ranks",
        "4",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("has 8 ranks"), "{stderr}");
    // The advice is a command that works: it plans the same job on 4 GPUs, and that plan runs.
    let advice = "`tessel plan SPEC --gpus 4 -o small.json`";
    assert!(stderr.contains(advice), "{stderr}");
    let small = dir.path().join("small.json");
    let spec = spec("dense8.tsl");
    let planned = tessel(&[
        "plan",
        spec.to_str().unwrap(),
        "--gpus",
        "4",
        "-o",
        small.to_str().unwrap(),
    ]);
    assert!(planned.status.success(), "{planned:?}");
    let ran = tessel(&[
        "launch",
        small.to_str().unwrap(),
        "--backend",
        "cpu",
        "--steps",
        "1",
        "--max-ranks",
        "4",
    ]);
    assert!(ran.status.success(), "{ran:?}");
}
