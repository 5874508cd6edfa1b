//! `tessel plan SPEC --check PLAN` end to end: a plan written from the spec is current; after
//! the spec is edited it is stale by digest; a committed plan slower than the best by more than
//! the threshold is stale; a damaged plan file is bad input that names the problem.

mod common;

use common::tessel;
use std::path::{Path, PathBuf};
use std::process::Output;

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A copy of the workflow fixture spec (and the cluster file it uses) in a temporary folder.
fn spec_copy(dir: &Path) -> PathBuf {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workflow/specs");
    std::fs::create_dir_all(dir.join("clusters")).expect("a clusters folder");
    std::fs::copy(
        fixtures.join("clusters/dgx-h100.tsl"),
        dir.join("clusters/dgx-h100.tsl"),
    )
    .expect("the cluster copies");
    let spec = dir.join("llama3-8b.tsl");
    std::fs::copy(fixtures.join("llama3-8b.tsl"), &spec).expect("the spec copies");
    spec
}

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

fn write_plan(spec: &Path, plan: &Path, extra: &[&str]) {
    let mut args = vec!["plan", path(spec), "-o", path(plan)];
    args.extend_from_slice(extra);
    let output = tessel(&args);
    assert!(output.status.success(), "{}", text(&output));
}

#[test]
fn a_fresh_plan_is_current() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let spec = spec_copy(dir.path());
    let plan = dir.path().join("plan.json");
    write_plan(&spec, &plan, &[]);
    let output = tessel(&["plan", path(&spec), "--check", path(&plan)]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    assert!(text(&output).starts_with("current: "), "{}", text(&output));
}

#[test]
fn editing_the_spec_makes_the_plan_stale_by_digest() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let spec = spec_copy(dir.path());
    let plan = dir.path().join("plan.json");
    write_plan(&spec, &plan, &[]);
    let source = std::fs::read_to_string(&spec).expect("the spec reads");
    assert!(source.contains("global_batch = 512"));
    std::fs::write(
        &spec,
        source.replace("global_batch = 512", "global_batch = 1024"),
    )
    .expect("the spec writes");
    let output = tessel(&["plan", path(&spec), "--check", path(&plan)]);
    assert_eq!(output.status.code(), Some(3), "{}", text(&output));
    let shown = text(&output);
    assert!(
        shown.starts_with("stale: ") && shown.contains("digest"),
        "{shown}"
    );
}

#[test]
fn a_slower_committed_plan_is_stale_beyond_the_threshold_only() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let spec = spec_copy(dir.path());
    let plan = dir.path().join("plan.json");
    // The best plan's pessimistic bound is 5.0% below the tp2 strategy's.
    write_plan(&spec, &plan, &["--strategy", "tp2"]);
    let output = tessel(&["plan", path(&spec), "--check", path(&plan)]);
    assert_eq!(output.status.code(), Some(3), "{}", text(&output));
    let shown = text(&output);
    assert!(shown.contains("a better plan exists"), "{shown}");
    assert!(shown.contains("5.0% faster, threshold 1%"), "{shown}");
    let output = tessel(&[
        "plan",
        path(&spec),
        "--check",
        path(&plan),
        "--threshold",
        "20",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    // Checked against the same fixed strategy, the plan is what it should be.
    let output = tessel(&[
        "plan",
        path(&spec),
        "--strategy",
        "tp2",
        "--check",
        path(&plan),
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
}

#[test]
fn a_damaged_plan_file_is_bad_input_that_names_the_problem() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let spec = spec_copy(dir.path());
    let plan = dir.path().join("plan.json");
    write_plan(&spec, &plan, &[]);
    let good = std::fs::read_to_string(&plan).expect("the plan reads");
    let cases = [
        (
            "truncated.json",
            good[..good.len() / 2].to_string(),
            "truncated",
        ),
        (
            "version.json",
            good.replace("\"tessel-plan/1\"", "\"tessel-plan/2\""),
            "format `tessel-plan/2`, this version reads `tessel-plan/1`",
        ),
        (
            "foreign.json",
            "{\"name\": \"not a plan\"}".to_string(),
            "lacks the field `format`",
        ),
    ];
    for (name, contents, expected) in cases {
        let damaged = dir.path().join(name);
        std::fs::write(&damaged, contents).expect("the file writes");
        let output = tessel(&["plan", path(&spec), "--check", path(&damaged)]);
        assert_eq!(output.status.code(), Some(1), "{name}: {}", text(&output));
        let shown = text(&output);
        assert!(
            shown.contains(name) && shown.contains(expected),
            "{name}: {shown}"
        );
    }
    let missing = dir.path().join("missing.json");
    let output = tessel(&["plan", path(&spec), "--check", path(&missing)]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert!(text(&output).contains("missing.json"), "{}", text(&output));
}
