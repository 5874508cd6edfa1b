//! Exact output of `tessel` commands (exit code, stdout, stderr) against reviewed snapshots in
//! `tests/snapshots/`. `TESSEL_BLESS=1 cargo test --test cli_snapshots` rewrites them: read every
//! change before committing it.

use std::path::Path;
use std::process::Command;

/// Each case: the snapshot's name and the command line after `tessel`.
const CASES: &[(&str, &[&str])] = &[
    (
        "estimate_llama3_70b_table",
        &["estimate", "specs/llama3-70b.tsl"],
    ),
    (
        "estimate_bloom_deepspeed",
        &["estimate", "specs/bloom-176b.tsl"],
    ),
    (
        "estimate_gpt3_175b_json",
        &[
            "estimate",
            "specs/gpt3-175b.tsl",
            "--strategy",
            "korthikanti_reference",
            "--format",
            "json",
        ],
    ),
    (
        "estimate_overrides",
        &[
            "estimate",
            "specs/llama3-70b.tsl",
            "--tp",
            "4",
            "--pp",
            "8",
            "--interleave",
            "1",
            "--recompute",
            "full",
            "--zero",
            "2",
        ],
    ),
    (
        "estimate_mixtral_table",
        &["estimate", "specs/mixtral-8x7b.tsl"],
    ),
    (
        "estimate_needs_a_strategy_name",
        &["estimate", "specs/gpt3-175b.tsl"],
    ),
    (
        "estimate_unknown_strategy",
        &["estimate", "specs/llama3-70b.tsl", "--strategy", "fast"],
    ),
    (
        "estimate_invalid_degrees",
        &["estimate", "specs/llama3-70b.tsl", "--tp", "3"],
    ),
    (
        "estimate_bad_recompute",
        &["estimate", "specs/llama3-70b.tsl", "--recompute", "most"],
    ),
    (
        "plan_llama3_70b_explain",
        &["plan", "specs/llama3-70b.tsl", "--explain"],
    ),
    (
        "plan_mixtral_markdown",
        &[
            "plan",
            "specs/mixtral-8x7b.tsl",
            "--format",
            "markdown",
            "--top",
            "2",
        ],
    ),
    (
        "plan_fixed_gpt3",
        &[
            "plan",
            "specs/gpt3-175b.tsl",
            "--strategy",
            "korthikanti_reference",
        ],
    ),
    (
        "plan_per_stage_recompute",
        &["plan", "tests/specs/llama3-70b-on-24.tsl", "--explain"],
    ),
    (
        "estimate_per_stage_options",
        &[
            "estimate",
            "tests/specs/per-stage-options.tsl",
            "--strategy",
            "mixed",
        ],
    ),
    (
        "plan_nothing_fits",
        &["plan", "tests/specs/405b-on-one-node.tsl"],
    ),
    (
        "plan_fixed_does_not_fit",
        &[
            "plan",
            "specs/qwen2-72b.tsl",
            "--dp",
            "32",
            "--tp",
            "4",
            "--pp",
            "2",
        ],
    ),
    (
        "plan_on_fewer_gpus",
        &["plan", "specs/llama3-70b.tsl", "--gpus", "32"],
    ),
    (
        "estimate_on_one_node",
        &[
            "estimate",
            "specs/llama3-8b.tsl",
            "--strategy",
            "tp2",
            "--nodes",
            "1",
        ],
    ),
    (
        "plan_gpus_not_whole_nodes",
        &["plan", "specs/llama3-70b.tsl", "--gpus", "12"],
    ),
    (
        "check_moe_expert_width_default",
        &["check", "tests/specs/moe-expert-width-default.tsl"],
    ),
    (
        "plan_serve_llama3_8b_explain",
        &["plan", "specs/serve-llama3-8b.tsl", "--explain"],
    ),
    (
        "plan_serve_llama3_70b_markdown",
        &["plan", "specs/serve-llama3-70b.tsl", "--format", "markdown"],
    ),
    (
        "plan_serve_on_too_few_gpus",
        &["plan", "specs/serve-llama3-70b.tsl", "--gpus", "1"],
    ),
    (
        "estimate_refuses_a_serving_spec",
        &["estimate", "specs/serve-llama3-8b.tsl"],
    ),
];

fn render(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_tessel"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the tessel binary runs");
    format!(
        "$ tessel {}\nexit code: {}\n--- stdout\n{}--- stderr\n{}",
        args.join(" "),
        output
            .status
            .code()
            .map_or("killed by a signal".to_string(), |c| c.to_string()),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn command_output_matches_snapshots() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots");
    let bless = std::env::var_os("TESSEL_BLESS").is_some_and(|v| v == "1");
    let mut mismatches = Vec::new();
    for (name, args) in CASES {
        let actual = render(args);
        let path = dir.join(format!("{name}.snap"));
        if bless {
            std::fs::write(&path, &actual).expect("the snapshot is writable");
            continue;
        }
        let expected = std::fs::read_to_string(&path).unwrap_or_default();
        if expected != actual {
            mismatches.push(format!(
                "--- {name}: expected\n{expected}\n--- actual\n{actual}"
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} snapshots differ (TESSEL_BLESS=1 rewrites them):\n{}",
        mismatches.len(),
        CASES.len(),
        mismatches.join("\n")
    );
}
