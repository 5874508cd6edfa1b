//! `tessel diff` through the binary against exact expected output, in every format, for plan
//! pairs that cover what a reviewer meets: no change, a degree change that loses throughput, a
//! recompute change after which a stage no longer fits, a spec edit, and moved stage
//! boundaries. `TESSEL_BLESS=1 cargo test --test diff_golden` rewrites the expected files.

use std::path::Path;
use std::process::{Command, Output};

/// Name, old plan, new plan, expected exit status with `--fail-on-regression 5`.
const PAIRS: [(&str, &str, &str, i32); 5] = [
    ("identical", "llama3-8b", "llama3-8b", 0),
    ("degree-regression", "llama3-8b", "llama3-8b-tp2", 3),
    (
        "stage-no-longer-fits",
        "llama3-70b-partial-recompute",
        "llama3-70b-selective-recompute",
        3,
    ),
    ("spec-change", "llama3-8b", "llama3-8b-batch1024", 0),
    (
        "stage-boundaries",
        "llama3-70b-selective-recompute",
        "llama3-70b-uneven-stages",
        3,
    ),
];

const FORMATS: [(&str, &str); 3] = [("text", "txt"), ("markdown", "md"), ("json", "json")];

fn diff(old: &str, new: &str, format: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessel"))
        .args([
            "diff",
            &format!("tests/workflow/plans/{old}.json"),
            &format!("tests/workflow/plans/{new}.json"),
            "--format",
            format,
            "--fail-on-regression",
            "5",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the tessel binary runs")
}

#[test]
fn every_format_of_every_pair_matches_its_golden_file() {
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workflow/golden");
    let bless = std::env::var_os("TESSEL_BLESS").is_some();
    let mut mismatches = Vec::new();
    for (name, old, new, status) in PAIRS {
        for (format, extension) in FORMATS {
            let output = diff(old, new, format);
            assert_eq!(
                output.status.code(),
                Some(status),
                "{name} ({format}): stderr {}",
                String::from_utf8_lossy(&output.stderr)
            );
            let actual = String::from_utf8(output.stdout).expect("UTF-8 output");
            let path = golden.join(format!("{name}.{extension}"));
            if bless {
                std::fs::write(&path, &actual).expect("the golden file is writable");
                continue;
            }
            let expected = std::fs::read_to_string(&path).unwrap_or_default();
            if actual != expected {
                mismatches.push(format!(
                    "{}:\n--- expected\n{expected}\n--- actual\n{actual}",
                    path.display()
                ));
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} golden files differ (TESSEL_BLESS=1 rewrites them):\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

#[test]
fn a_failing_diff_says_why_on_stderr() {
    let output = diff(
        "llama3-70b-partial-recompute",
        "llama3-70b-selective-recompute",
        "text",
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("regression: stage 0 no longer fits: 79.29 GiB per GPU of 73.60 GiB"),
        "{stderr}"
    );
    let output = diff("llama3-8b", "llama3-8b-tp2", "text");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("regression: throughput fell 5.4%, more than the allowed 5%"),
        "{stderr}"
    );
}
