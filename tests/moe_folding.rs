//! Issue 17's MoE case through the binary: a Qwen3-235B-A22B-style model on 256 H100 with its
//! experts folded over tp × dp (`etp = 1`), recompute of the norms and the experts' activation,
//! and an embedding-only first chunk is written (`specs/qwen3-235b-a22b.tsl`), checked,
//! estimated, planned and exported to Megatron-LM with nothing the target cannot express.

mod common;

use common::{stdout, tessel};

const SPEC: &str = "specs/qwen3-235b-a22b.tsl";

#[test]
fn check_prints_the_folded_experts_and_the_published_size() {
    let text = stdout(&tessel(&["check", SPEC]));
    assert!(text.contains("235.09 B) total"), "{text}");
    assert!(text.contains("22.19 B) active"), "{text}");
    assert!(
        text.contains("ep 16 × etp 1 (experts folded over tp·dp·cp)"),
        "{text}"
    );
    assert!(
        text.contains("recompute { modules = [layernorm, moe_act] }"),
        "{text}"
    );
}

#[test]
fn the_folded_strategy_is_estimated_and_fits() {
    let text = stdout(&tessel(&["estimate", SPEC, "--strategy", "folded"]));
    assert!(
        text.contains("recompute modules (layernorm, moe_act)"),
        "{text}"
    );
    assert!(text.contains("ep 16 · etp 1 |"), "{text}");
    assert!(text.contains("(fits)"), "{text}");
}

#[test]
fn the_folded_plan_exports_to_megatron_with_nothing_unexpressed() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let plan = dir.path().join("folded.json");
    let plan = plan.to_str().expect("utf-8 path");
    stdout(&tessel(&["plan", SPEC, "--strategy", "folded", "-o", plan]));
    let output = tessel(&["export", plan, "--to", "megatron"]);
    let script = stdout(&output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("not expressible"), "{stderr}");
    assert!(!script.contains("Not expressible"), "{script}");
    for flag in [
        "--tensor-model-parallel-size 4 \\\n",
        "--expert-model-parallel-size 16 \\\n",
        "--expert-tensor-parallel-size 1 \\\n",
        "--recompute-granularity selective \\\n",
        "--recompute-modules layernorm moe_act \\\n",
        "--pipeline-model-parallel-layout 'E|t*3|t*3|",
    ] {
        assert!(script.contains(flag), "{flag} missing from\n{script}");
    }
}

#[test]
fn the_search_plans_the_model_with_what_megatron_runs() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let plan = dir.path().join("plan.json");
    let plan = plan.to_str().expect("utf-8 path");
    stdout(&tessel(&["plan", SPEC, "-o", plan]));
    let output = tessel(&["export", plan, "--to", "megatron"]);
    stdout(&output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // Every degree, ZeRO stage and recompute module the search chose is Megatron-LM's. What is
    // left is a known gap (issue 17): the search may still recompute differently per stage,
    // which Megatron-LM cannot.
    let inexpressible: Vec<&str> = stderr
        .lines()
        .skip_while(|line| !line.starts_with("not expressible"))
        .skip(1)
        .take_while(|line| line.starts_with("  - "))
        .filter(|line| !line.contains("recompute differs by pipeline stage"))
        .collect();
    assert!(inexpressible.is_empty(), "{stderr}");
}
