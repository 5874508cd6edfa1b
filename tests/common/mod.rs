//! What the integration tests share: running the real `tessel` binary from the repository root.
// Each test crate includes this module and uses part of it.
#![allow(dead_code)]

use std::process::{Command, Output};

/// Runs `tessel ARGS` in the repository root.
pub fn tessel(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessel"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the tessel binary runs")
}

/// The standard output of a command that must succeed (its standard error in the failure).
pub fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A JSON file the binary wrote (a plan, a report).
pub fn read_json(path: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `tessel launch PLAN --backend cpu --scale 1 --steps STEPS --format json EXTRA...`, its
/// report.
pub fn launch_cpu(plan: &std::path::Path, steps: &str, extra: &[&str]) -> serde_json::Value {
    launch_cpu_scaled(plan.to_str().expect("a UTF-8 path"), "1", steps, extra)
}

/// `tessel launch PLAN --backend cpu --scale SCALE --steps STEPS --format json EXTRA...`, its
/// report.
pub fn launch_cpu_scaled(
    plan: &str,
    scale: &str,
    steps: &str,
    extra: &[&str],
) -> serde_json::Value {
    let mut args = vec![
        "launch",
        plan,
        "--backend",
        "cpu",
        "--scale",
        scale,
        "--steps",
        steps,
        "--format",
        "json",
    ];
    args.extend_from_slice(extra);
    serde_json::from_str(&stdout(&tessel(&args))).expect("launch prints JSON")
}

/// `tessel plan SPEC --explain -o PLAN`'s output, after checking that `tessel plan SPEC --check
/// PLAN` finds the plan it wrote current.
pub fn plan_explained_and_current(spec: &str, plan: &str) -> String {
    plan_explained_and_current_with(spec, plan, &[])
}

/// The same, with further `tessel plan` options (an objective) for the plan and its check.
pub fn plan_explained_and_current_with(spec: &str, plan: &str, options: &[&str]) -> String {
    let mut args = vec!["plan", spec, "--explain", "-o", plan];
    args.extend_from_slice(options);
    let shown = stdout(&tessel(&args));
    let mut args = vec!["plan", spec, "--check", plan];
    args.extend_from_slice(options);
    let check = stdout(&tessel(&args));
    assert!(check.starts_with("current:"), "{check}");
    shown
}
