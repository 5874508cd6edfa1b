//! `tessel check` on the example specs: published parameter counts, exit codes, and the exact
//! summary of the README's quick-start spec.

use std::process::{Command, Output};

fn check(path: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessel"))
        .args(["check", path])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the tessel binary runs")
}

fn stdout_ok(path: &str) -> String {
    let output = check(path);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{path} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The exact parameter counts on the `parameters` line: (total, active).
fn parameters(stdout: &str) -> (u64, u64) {
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("parameters"))
        .expect("a parameters line");
    let counts: Vec<u64> = line
        .split_whitespace()
        .filter(|w| w.contains(',') && w.chars().all(|c| c.is_ascii_digit() || c == ','))
        .map(|w| w.replace(',', "").parse().unwrap())
        .collect();
    match counts.as_slice() {
        [total] => (*total, *total),
        [total, active] => (*total, *active),
        other => panic!("unexpected parameters line {line:?}: {other:?}"),
    }
}

/// Billions, rounded to one decimal as papers quote them.
fn billions(n: u64) -> f64 {
    (n as f64 / 1e8).round() / 10.0
}

#[test]
fn llama3_counts_match_meta() {
    assert_eq!(
        billions(parameters(&stdout_ok("specs/llama3-8b.tsl")).0),
        8.0
    );
    assert_eq!(
        parameters(&stdout_ok("specs/llama3-8b.tsl")).0 / 10_000_000,
        803
    );
    assert_eq!(
        billions(parameters(&stdout_ok("specs/llama3-70b.tsl")).0),
        70.6
    );
    assert_eq!(
        billions(parameters(&stdout_ok("specs/llama3-405b.tsl")).0),
        405.9
    );
}

#[test]
fn gpt3_count_matches_megatron_formula() {
    let (total, active) = parameters(&stdout_ok("specs/gpt3-175b.tsl"));
    assert_eq!(total, active);
    assert_eq!(billions(total), 174.6);
    // Narayanan et al. (2021), eq. 2: 12·l·h²·(1 + 13/12h + (V + s)/12lh), plus the final
    // LayerNorm's 2h which the formula leaves out.
    let (l, h, v, s) = (96.0f64, 12288.0f64, 51200.0f64, 2048.0f64);
    let formula = 12.0 * l * h * h * (1.0 + 13.0 / (12.0 * h) + (v + s) / (12.0 * l * h));
    assert_eq!(total, formula.round() as u64 + 2 * 12288);
}

#[test]
fn megatron_1t_is_a_trillion() {
    let (total, _) = parameters(&stdout_ok("specs/megatron-1t.tsl"));
    let (l, h, v, s) = (128.0f64, 25600.0f64, 51200.0f64, 2048.0f64);
    let formula = 12.0 * l * h * h * (1.0 + 13.0 / (12.0 * h) + (v + s) / (12.0 * l * h));
    assert_eq!(total, formula.round() as u64 + 2 * 25600);
    assert_eq!(billions(total), 1008.0);
}

#[test]
fn bloom_count_matches_bigscience_but_the_embedding_norm() {
    let stdout = stdout_ok("specs/bloom-176b.tsl");
    // Le Scao et al. (2022): 176,247,271,424, which includes the embedding LayerNorm (2h).
    assert_eq!(parameters(&stdout).0 + 2 * 14336, 176_247_271_424);
    assert!(
        stdout.contains("\n  framework       deepspeed\n"),
        "{stdout}"
    );
}

#[test]
fn mixtral_total_and_active_match_mistral() {
    let (total, active) = parameters(&stdout_ok("specs/mixtral-8x7b.tsl"));
    assert_eq!(billions(total), 46.7);
    assert_eq!(billions(active), 12.9);
}

#[test]
fn deepseek_v2_lite_total_is_close_to_published() {
    // MLA approximated as MHA adds about 0.08 B to DeepSeek's 15.7 B (see the spec's comment).
    let (total, active) = parameters(&stdout_ok("specs/deepseek-moe.tsl"));
    assert!((15.7e9..15.85e9).contains(&(total as f64)), "{total}");
    assert!(active < total / 5, "{active}");
}

#[test]
fn cluster_files_check_on_their_own() {
    for file in ["specs/clusters/dgx-a100.tsl", "specs/clusters/dgx-h100.tsl"] {
        let stdout = stdout_ok(file);
        assert!(stdout.contains("8 × "), "{stdout}");
    }
}

#[test]
fn every_example_spec_checks() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("specs");
    let mut count = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".tsl") {
            let stdout = stdout_ok(&format!("specs/{name}"));
            if stdout.contains("\nserve\n") {
                // A serving spec has its SLO instead of strategies and a search block.
                assert!(stdout.contains("  slo "), "{name}");
                count += 1;
                continue;
            }
            // A cluster of pools has none: a fixed strategy runs on one GPU type.
            assert!(
                stdout.contains("\nstrategy ") || stdout.contains(" pools, "),
                "{name} has no reference strategy"
            );
            assert!(stdout.contains("\nsearch\n"), "{name}");
            count += 1;
        }
    }
    assert!(count >= 7);
}

#[test]
fn a_cluster_of_pools_prints_each_pool() {
    let stdout = stdout_ok("specs/mixed-a100-l40s.tsl");
    assert!(stdout.contains("GPUs            96 in 2 pools"), "{stdout}");
    assert!(stdout.contains("between pools   12.5 GB/s"), "{stdout}");
    let train = stdout.find("  pool train\n    GPUs            32 × A100_80GB (4 nodes × 8)");
    let loan = stdout.find("  pool loan\n    GPUs            64 × L40S (8 nodes × 8)");
    assert!(train.is_some() && loan > train, "{stdout}");
}

#[test]
fn llama3_70b_summary_is_exact() {
    assert_eq!(
        stdout_ok("specs/llama3-70b.tsl"),
        include_str!("check_llama3_70b.expected")
    );
}

#[test]
fn missing_file_is_bad_input() {
    let output = check("specs/no-such-spec.tsl");
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "error: cannot read `specs/no-such-spec.tsl`: no such file\n --> specs/no-such-spec.tsl\n\n\
         error: `specs/no-such-spec.tsl` has 1 error\n"
    );
}

#[test]
fn usage_errors_are_bad_input_and_help_is_not() {
    let tessel = || Command::new(env!("CARGO_BIN_EXE_tessel"));
    assert_eq!(
        tessel().arg("check").output().unwrap().status.code(),
        Some(1)
    );
    assert_eq!(
        tessel().arg("frobnicate").output().unwrap().status.code(),
        Some(1)
    );
    let help = tessel().arg("--help").output().unwrap();
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).contains("check"));
}

#[test]
fn fsdp_job_names_its_framework_and_compilation() {
    let stdout = stdout_ok("tests/specs/torchtitan-8b-compiled.tsl");
    assert!(stdout.contains("\n  framework       fsdp\n"), "{stdout}");
    assert!(
        stdout.contains("\n  compile         torch.compile of each block\n"),
        "{stdout}"
    );
}
