//! Malformed specs in `tests/corpus/*.tsl` and what `tessel check` says about each: exit code,
//! stdout and stderr must match `*.snap` byte for byte. `TESSEL_BLESS=1 cargo test` rewrites the
//! snapshots (read every change before committing it).

use std::path::Path;
use std::process::Command;

fn render(path: &str) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_tessel"))
        .args(["check", path])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("the tessel binary runs");
    format!(
        "exit code: {}\n--- stdout\n{}--- stderr\n{}",
        output
            .status
            .code()
            .map_or("killed by a signal".to_string(), |c| c.to_string()),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn corpus_diagnostics_match_snapshots() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut cases: Vec<String> = std::fs::read_dir(&corpus)
        .expect("tests/corpus exists")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".tsl"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 40, "only {} corpus cases", cases.len());
    let bless = std::env::var_os("TESSEL_BLESS").is_some_and(|v| v == "1");
    let mut mismatches = Vec::new();
    for case in &cases {
        let actual = render(&format!("tests/corpus/{case}"));
        assert!(
            actual.starts_with("exit code: 1\n"),
            "{case} should be rejected with exit code 1:\n{actual}"
        );
        assert!(!actual.contains("panicked"), "{case} panicked:\n{actual}");
        let snapshot = corpus.join(case.replace(".tsl", ".snap"));
        if bless {
            std::fs::write(&snapshot, &actual).expect("snapshot is writable");
            continue;
        }
        let expected = std::fs::read_to_string(&snapshot).unwrap_or_default();
        if expected != actual {
            mismatches.push(format!(
                "{case}:\n--- expected\n{expected}\n--- actual\n{actual}"
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} snapshot(s) differ (TESSEL_BLESS=1 rewrites them):\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}
