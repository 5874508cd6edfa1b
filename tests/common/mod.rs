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
