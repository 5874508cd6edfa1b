//! `tessel diff` on files that are not plans, and its JSON against numbers computed here from
//! the plan files themselves.

mod common;

use common::tessel;
use std::path::Path;

use serde_json::Value;

const PLAN: &str = "tests/workflow/plans/llama3-8b.json";

#[test]
fn a_file_that_is_not_a_plan_is_bad_input_named_with_its_problem() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let good = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(PLAN))
        .expect("the fixture reads");
    let cases = [
        (
            "truncated.json",
            good[..good.len() - 40].to_string(),
            "truncated",
        ),
        (
            "future.json",
            good.replace("\"tessel-plan/1\"", "\"tessel-plan/9\""),
            "format `tessel-plan/9`, this version reads `tessel-plan/1`",
        ),
        (
            "array.json",
            "[1, 2, 3]".to_string(),
            "lacks the field `format`",
        ),
        (
            "no-prediction.json",
            good.replace("\"prediction\"", "\"forecast\""),
            "lacks the field `prediction`",
        ),
        (
            "spec.tsl",
            "model m { layers = 2 }\n".to_string(),
            "not valid JSON",
        ),
    ];
    for (name, contents, expected) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, contents).expect("the file writes");
        let path = path.to_str().expect("a UTF-8 path");
        for args in [["diff", PLAN, path], ["diff", path, PLAN]] {
            let output = tessel(&args);
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(1), "{name}: {stderr}");
            assert!(output.stdout.is_empty(), "{name}: printed a diff");
            assert!(
                stderr.contains(name) && stderr.contains(expected),
                "{name}: {stderr}"
            );
        }
    }
    let output = tessel(&["diff", PLAN, "tests/workflow/plans/absent.json"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot read"));
    for bad in ["--fail-on-regression=-3", "--fail-on-regression=lots"] {
        let output = tessel(&["diff", PLAN, PLAN, bad]);
        assert_eq!(output.status.code(), Some(1), "{bad}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("is not a percentage"), "{bad}: {stderr}");
    }
}

#[test]
fn a_hand_edited_digest_does_not_break_the_diff() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let good = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(PLAN))
        .expect("the fixture reads");
    let value: Value = serde_json::from_str(&good).expect("JSON");
    let digest = value["spec_digest"].as_str().expect("a digest");
    let edited = dir.path().join("edited.json");
    std::fs::write(&edited, good.replace(digest, "ééééééééééééé")).expect("the file writes");
    let edited = edited.to_str().expect("a UTF-8 path");
    let output = tessel(&["diff", PLAN, edited]);
    assert_eq!(output.status.code(), Some(0));
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(
        shown.contains("digest 2c9c04899d10 → éééééééééééé\n"),
        "{shown}"
    );
}

fn read_json(path: &str) -> Value {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .expect("the file reads");
    serde_json::from_str(&text).expect("valid JSON")
}

fn diff_json(old: &str, new: &str) -> Value {
    let output = tessel(&["diff", old, new, "--format", "json"]);
    serde_json::from_slice(&output.stdout).expect("the diff is JSON")
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-5 * a.abs().max(b.abs()).max(1e-9)
}

#[test]
fn the_json_diff_agrees_with_the_plans_and_reverses() {
    let old_path = "tests/workflow/plans/llama3-70b-partial-recompute.json";
    let new_path = "tests/workflow/plans/llama3-70b-selective-recompute.json";
    let (old, new) = (read_json(old_path), read_json(new_path));
    let forward = diff_json(old_path, new_path);
    let backward = diff_json(new_path, old_path);
    assert_eq!(forward["format"], "tessel-diff/1");
    for (i, metric) in ["step_time_s", "tokens_per_s", "mfu", "peak_memory_gib"]
        .iter()
        .enumerate()
    {
        let a = old["prediction"][metric].as_f64().expect("a number");
        let b = new["prediction"][metric].as_f64().expect("a number");
        let m = &forward["metrics"][i];
        assert_eq!(m["metric"], *metric);
        assert!(close(
            m["change_pct"].as_f64().expect("a number"),
            (b - a) / a * 100.0
        ));
        let r = &backward["metrics"][i];
        assert!(close(
            r["change_pct"].as_f64().expect("a number"),
            (a - b) / b * 100.0
        ));
    }
    let capacity = new["prediction"]["memory_capacity_gib"]
        .as_f64()
        .expect("a number");
    let stages = new["prediction"]["stages"].as_array().expect("stages");
    let unfit: Vec<u64> = stages
        .iter()
        .filter(|s| {
            let total: f64 = s["memory"]
                .as_object()
                .expect("a memory breakdown")
                .values()
                .map(|v| v.as_f64().expect("GiB"))
                .sum();
            total > capacity
        })
        .map(|s| s["stage"].as_u64().expect("a stage number"))
        .collect();
    assert_eq!(forward["no_longer_fit"], serde_json::json!(unfit));
    assert_eq!(backward["now_fit"], serde_json::json!(unfit));
    assert_eq!(backward["no_longer_fit"], serde_json::json!([]));
}

#[test]
fn rank_moves_are_counted_from_the_rank_maps() {
    let old_path = "tests/workflow/plans/llama3-8b.json";
    let new_path = "tests/workflow/plans/llama3-8b-tp2.json";
    let (old, new) = (read_json(old_path), read_json(new_path));
    let rows = |plan: &Value| plan["rank_map"]["ranks"].as_array().expect("rows").clone();
    let moved = rows(&old)
        .iter()
        .zip(rows(&new).iter())
        .filter(|(a, b)| a != b)
        .count();
    let diff = diff_json(old_path, new_path);
    assert_eq!(diff["rank_map"]["moved"], moved);
    assert_eq!(diff["rank_map"]["old_ranks"], 64);
}
