//! The CI recipe docs/ci/tessel-plans.yml: it parses as YAML with the shape GitHub Actions
//! needs, every tessel command and flag it runs exists, and its check-and-diff script, run here
//! by bash in a scratch git repository, passes an unchanged plan and fails a regressing one with
//! the markdown diff in the comment.

mod common;

use common::tessel;
use std::path::Path;
use std::process::Command;

use yaml_rust2::{Yaml, YamlLoader};

const RECIPE: &str = "docs/ci/tessel-plans.yml";
const SCRIPT_STEP: &str = "Check and diff the committed plans";

fn recipe() -> Yaml {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(RECIPE))
        .expect("the recipe reads");
    let mut documents = YamlLoader::load_from_str(&text).expect("the recipe is YAML");
    assert_eq!(documents.len(), 1);
    documents.remove(0)
}

fn steps(recipe: &Yaml) -> Vec<Yaml> {
    recipe["jobs"]["plans"]["steps"]
        .as_vec()
        .expect("a steps list")
        .clone()
}

fn script(recipe: &Yaml) -> String {
    steps(recipe)
        .iter()
        .find(|s| s["name"].as_str() == Some(SCRIPT_STEP))
        .and_then(|s| s["run"].as_str())
        .expect("the check-and-diff step")
        .to_string()
}

#[test]
fn the_recipe_is_a_pull_request_workflow_that_comments() {
    let recipe = recipe();
    assert!(!recipe["on"]["pull_request"].is_badvalue());
    assert_eq!(
        recipe["permissions"]["pull-requests"].as_str(),
        Some("write")
    );
    let steps = steps(&recipe);
    let uses: Vec<&str> = steps.iter().filter_map(|s| s["uses"].as_str()).collect();
    assert!(uses.contains(&"actions/checkout@v4"), "{uses:?}");
    assert!(uses.contains(&"actions/github-script@v7"), "{uses:?}");
    let last = steps.last().expect("steps");
    assert!(last["if"].as_str().is_some_and(|c| c.contains("failed")));
}

#[test]
fn every_tessel_command_the_recipe_runs_exists() {
    let script = script(&recipe());
    let help = String::from_utf8_lossy(&tessel(&["--help"]).stdout).into_owned();
    let mut seen = Vec::new();
    for line in script.lines() {
        let Some((_, rest)) = line.split_once("\"$TESSEL\" ") else {
            continue;
        };
        let command = rest.split_whitespace().next().expect("a subcommand");
        assert!(
            help.lines()
                .any(|l| l.split_whitespace().next() == Some(command)),
            "`tessel {command}` is not in tessel --help"
        );
        let command_help =
            String::from_utf8_lossy(&tessel(&[command, "--help"]).stdout).into_owned();
        let flags = script
            .split_whitespace()
            .filter(|w| w.starts_with("--"))
            .filter(|w| rest.contains(*w) || script_continues(&script, line, w));
        for flag in flags {
            assert!(
                command_help.contains(flag),
                "`tessel {command}` has no {flag}"
            );
        }
        seen.push(command.to_string());
    }
    assert_eq!(seen, ["plan", "diff"]);
}

/// Whether `flag` appears in the continuation lines of the command starting at `line`.
fn script_continues(script: &str, line: &str, flag: &str) -> bool {
    let mut lines = script.lines().skip_while(|l| *l != line);
    let mut current = lines.next();
    while let Some(l) = current {
        if l.contains(flag) {
            return true;
        }
        if !l.trim_end().ends_with('\\') {
            return false;
        }
        current = lines.next();
    }
    false
}

fn git(repo: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .args(args)
        .current_dir(repo)
        .output()
        .expect("git runs");
    assert!(
        output.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// Runs the recipe's script in `repo` against `base`; returns whether it marked the job failed
/// and the comment it wrote.
fn run_script(repo: &Path, base: &str, scratch: &Path) -> (bool, String) {
    let outputs = scratch.join("github_output");
    std::fs::write(&outputs, "").expect("the output file writes");
    let status = Command::new("bash")
        .args(["-c", &script(&recipe())])
        .current_dir(repo)
        .env("TESSEL", env!("CARGO_BIN_EXE_tessel"))
        .env("BASE_SHA", base)
        .env("RUNNER_TEMP", scratch)
        .env("GITHUB_OUTPUT", &outputs)
        .env("PLAN_THRESHOLD", "1")
        .env("REGRESSION_THRESHOLD", "2")
        .output()
        .expect("bash runs");
    assert!(status.status.success(), "the script itself failed");
    let outputs = std::fs::read_to_string(&outputs).expect("the outputs read");
    let comment = std::fs::read_to_string(scratch.join("tessel-plans/comment.md"))
        .expect("the comment was written");
    (outputs.contains("failed=1"), comment)
}

#[test]
fn the_script_passes_a_current_plan_and_fails_a_regression() {
    let repo = tempfile::tempdir().expect("a temporary directory");
    let repo = repo.path();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workflow");
    std::fs::create_dir_all(repo.join("specs/clusters")).expect("folders");
    std::fs::create_dir_all(repo.join("plans")).expect("folders");
    for file in ["llama3-8b.tsl", "clusters/dgx-h100.tsl"] {
        std::fs::copy(
            fixtures.join("specs").join(file),
            repo.join("specs").join(file),
        )
        .expect("the spec copies");
    }
    // The committed plan is the one this build writes, so that it is current whatever the
    // cost model predicts.
    let plan = |extra: &[&str]| {
        let (spec, out) = (
            repo.join("specs/llama3-8b.tsl"),
            repo.join("plans/llama3-8b.json"),
        );
        let mut args = vec!["plan", spec.to_str().unwrap(), "-o", out.to_str().unwrap()];
        args.extend_from_slice(extra);
        assert!(tessel(&args).status.success(), "tessel plan {extra:?}");
    };
    plan(&[]);
    git(repo, &["init", "-q"]);
    git(repo, &["add", "."]);
    git(
        repo,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "base",
        ],
    );
    let base = git(repo, &["rev-parse", "HEAD"]);

    let scratch = tempfile::tempdir().expect("a temporary directory");
    let (failed, comment) = run_script(repo, &base, scratch.path());
    assert!(!failed, "{comment}");
    assert!(comment.starts_with("<!-- tessel-plans -->\n"), "{comment}");
    assert!(
        comment.contains("current: plans/llama3-8b.json"),
        "{comment}"
    );
    assert!(comment.contains("**no change**"), "{comment}");

    // The pull request replaces the plan with a slower one: the spec's tp2 strategy stretched
    // to eight-way tensor parallelism over two pipeline stages, for an 8B model.
    plan(&["--strategy", "tp2", "--tp", "8", "--pp", "2"]);
    let scratch = tempfile::tempdir().expect("a temporary directory");
    let (failed, comment) = run_script(repo, &base, scratch.path());
    assert!(failed, "{comment}");
    assert!(comment.contains("stale: a better plan exists"), "{comment}");
    assert!(
        comment.contains(
            "### Tessel plan diff: `base/plans/llama3-8b.json` → `pr/plans/llama3-8b.json`"
        ),
        "{comment}"
    );
    assert!(
        comment.contains("**:x: throughput −") && comment.contains("% (regression)**"),
        "{comment}"
    );
}
