//! Golden-file comparison shared by the integration tests.

use std::path::PathBuf;

/// Compares `actual` with the golden file `tests/golden/<name>`; `TESSEL_BLESS=1` rewrites it.
pub fn check_golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var("TESSEL_BLESS").as_deref() == Ok("1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read golden file {}: {e}; run with TESSEL_BLESS=1 to create it",
            path.display()
        )
    });
    if expected != actual {
        let first_difference = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(expected.lines().count().min(actual.lines().count()));
        panic!(
            "{} differs from the output at line {}:\n--- golden\n{}\n--- actual\n{}\n\
             (TESSEL_BLESS=1 rewrites golden files)",
            path.display(),
            first_difference + 1,
            expected
                .lines()
                .nth(first_difference)
                .unwrap_or("<end of file>"),
            actual
                .lines()
                .nth(first_difference)
                .unwrap_or("<end of output>")
        );
    }
}
