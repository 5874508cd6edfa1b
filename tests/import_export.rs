//! `tessel import hf` and `tessel export` through the real binary: every imported fixture is a
//! model block that `tessel check` accepts with the same parameter count, and export writes what
//! the library writes.

mod common;

use common::tessel;
use std::path::Path;
use std::process::Output;

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The `parameters` line of `tessel check`: the first grouped number on it.
fn checked_parameters(check_stdout: &str) -> u64 {
    let line = check_stdout
        .lines()
        .find(|l| l.trim_start().starts_with("parameters"))
        .expect("a parameters line");
    line.split_whitespace()
        .find(|w| w.contains(','))
        .expect("a grouped count")
        .replace(',', "")
        .parse()
        .expect("a number")
}

#[test]
fn every_imported_fixture_checks_with_the_same_parameter_count() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("interop/tests/fixtures");
    let out_dir = tempfile::tempdir().expect("a temporary directory");
    let mut names: Vec<_> = std::fs::read_dir(&fixtures)
        .expect("the fixtures exist")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "json"))
        .collect();
    names.sort();
    assert!(names.len() >= 10, "only {} fixtures", names.len());
    for config in names {
        let imported = tessel_interop::import_hf_file(&config).expect("the fixture imports");
        let tsl = out_dir
            .path()
            .join(config.file_stem().expect("a file name"))
            .with_extension("tsl");
        let output = tessel(&[
            "import",
            "hf",
            config.to_str().expect("a UTF-8 path"),
            "-o",
            tsl.to_str().expect("a UTF-8 path"),
        ]);
        assert!(output.status.success(), "import of {config:?} failed");
        let check = tessel(&["check", tsl.to_str().expect("a UTF-8 path")]);
        assert!(
            check.status.success(),
            "{tsl:?} does not check:\n{}",
            String::from_utf8_lossy(&check.stderr)
        );
        assert_eq!(
            checked_parameters(&stdout(&check)),
            imported.spec.parameter_count().total,
            "{config:?}"
        );
    }
}

#[test]
fn import_of_a_foreign_file_names_the_problem() {
    let output = tessel(&["import", "hf", "specs/llama3-70b.tsl"]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "error: specs/llama3-70b.tsl:1:1: not valid JSON: expected value\n"
    );
}

#[test]
fn export_prints_the_library_output_and_its_losses() {
    let spec = tessel_grammar::load_file(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("specs/llama3-70b.tsl"),
    )
    .expect("the example spec loads");
    let strategy = spec
        .strategy("megatron_reference")
        .expect("the strategy exists");
    for (target, name) in tessel_interop::ExportTarget::ALL
        .into_iter()
        .map(|t| (t, t.name()))
    {
        let expected = tessel_interop::export(&spec, strategy, target);
        let output = tessel(&[
            "export",
            "specs/llama3-70b.tsl",
            "--strategy",
            "megatron_reference",
            "--to",
            name,
        ]);
        assert!(output.status.success(), "{name}");
        assert_eq!(stdout(&output), expected.text, "{name}");
        assert_eq!(
            String::from_utf8_lossy(&output.stderr),
            expected.summary(),
            "{name}"
        );
    }
}

#[test]
fn export_of_an_unknown_strategy_lists_the_known_ones() {
    let output = tessel(&[
        "export",
        "specs/llama3-70b.tsl",
        "--strategy",
        "nope",
        "--to",
        "megatron",
    ]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "error: `specs/llama3-70b.tsl` has no strategy `nope`; it has megatron_reference\n"
    );
}
