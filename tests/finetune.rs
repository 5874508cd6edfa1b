//! Adapter fine-tuning through the binary: `method = auto` resolved in the plan, said by
//! `--explain`, and a committed plan of it current under `plan --check`.

mod common;

use common::{stdout, tessel};

#[test]
fn auto_resolves_explains_and_checks() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let plan = dir.path().join("lora.json").display().to_string();
    let shown = stdout(&tessel(&[
        "plan",
        "specs/llama3-8b-lora.tsl",
        "--explain",
        "-o",
        &plan,
    ]));
    assert!(
        shown.contains("finetune     lora rank 16 on qkv, o, mlp, the model frozen"),
        "{shown}"
    );
    assert!(
        shown.contains("finetune: lora, as memory does not bind it"),
        "{shown}"
    );
    let check = stdout(&tessel(&[
        "plan",
        "specs/llama3-8b-lora.tsl",
        "--check",
        &plan,
    ]));
    assert!(check.starts_with("current:"), "{check}");
    // Launching refuses what the runtime does not run, with exit 1 and why.
    let launch = tessel(&["launch", &plan, "--backend", "cpu", "--steps", "1"]);
    assert_eq!(launch.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&launch.stderr);
    assert!(stderr.contains("fine-tuning with adapters"), "{stderr}");
}
