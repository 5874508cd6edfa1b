//! `tessel export PLAN --to ...` through the binary: a plan made from a spec's strategy exports
//! exactly what the strategy itself exports (only the strategy's name in the header differs),
//! uneven stages come through, and a damaged plan or a misplaced --strategy is bad input.

mod common;

use common::{stdout, tessel};

const SPEC: &str = "tests/workflow/specs/llama3-70b-128.tsl";

/// Fixture plans and the strategy blocks they were made from.
const PLANS: [(&str, &str); 3] = [
    ("llama3-70b-uneven-stages", "uneven_stages"),
    ("llama3-70b-partial-recompute", "partial_recompute"),
    ("llama3-70b-selective-recompute", "selective_recompute"),
];

#[test]
fn a_plan_exports_what_its_strategy_exports() {
    for (plan, strategy) in PLANS {
        for target in ["megatron", "torchtitan", "deepspeed"] {
            let path = format!("tests/workflow/plans/{plan}.json");
            let from_plan = stdout(&tessel(&["export", &path, "--to", target]));
            let from_spec = stdout(&tessel(&[
                "export",
                SPEC,
                "--strategy",
                strategy,
                "--to",
                target,
            ]));
            assert_eq!(
                from_plan,
                from_spec.replace(strategy, plan),
                "{plan} to {target}"
            );
        }
    }
}

#[test]
fn uneven_stages_of_a_plan_reach_megatron() {
    let script = stdout(&tessel(&[
        "export",
        "tests/workflow/plans/llama3-70b-uneven-stages.json",
        "--to",
        "megatron",
    ]));
    // The plan's stages hold 18, 22, 22 and 18 layers.
    assert!(script.contains("--decoder-first-pipeline-num-layers 18 \\\n"));
    assert!(script.contains("--decoder-last-pipeline-num-layers 18 \\\n"));
    assert!(script.contains("--pipeline-model-parallel-size 4 \\\n"));
}

#[test]
fn a_searched_plan_exports_its_configuration() {
    let config = stdout(&tessel(&[
        "export",
        "tests/workflow/plans/llama3-8b.json",
        "--to",
        "deepspeed",
    ]));
    let config: serde_json::Value = serde_json::from_str(&config).expect("DeepSpeed JSON");
    // The plan: dp 32 · pp 2, micro-batch 1 × 16 per step, ZeRO 1, nothing offloaded.
    assert_eq!(config["train_batch_size"], 512);
    assert_eq!(config["train_micro_batch_size_per_gpu"], 1);
    assert_eq!(config["gradient_accumulation_steps"], 16);
    assert_eq!(config["zero_optimization"]["stage"], 1);
    assert!(config["zero_optimization"]["offload_optimizer"].is_null());
}

#[test]
fn misuse_is_bad_input_with_a_reason() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let truncated = dir.path().join("plan.json");
    let good = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/workflow/plans/llama3-8b.json"),
    )
    .expect("the fixture reads");
    std::fs::write(&truncated, &good[..100]).expect("the file writes");
    let truncated = truncated.to_str().expect("a UTF-8 path");
    let cases: [(Vec<&str>, &str); 4] = [
        (vec!["export", truncated, "--to", "megatron"], "truncated"),
        (
            vec![
                "export",
                "tests/workflow/plans/llama3-8b.json",
                "--strategy",
                "tp2",
                "--to",
                "megatron",
            ],
            "is a plan file",
        ),
        (
            vec!["export", SPEC, "--to", "megatron"],
            "needs --strategy NAME",
        ),
        (
            vec!["export", SPEC, "--strategy", "nope", "--to", "megatron"],
            "has no strategy `nope`",
        ),
    ];
    for (args, expected) in cases {
        let output = tessel(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

#[test]
fn interleaved_stages_that_do_not_divide_export_as_a_custom_layout() {
    // The plan: pp 2 with 3 chunks per stage, stages of 17 and 15 layers. The chunks, in model
    // order, hold 6, 5, 6, 5, 5, 5 layers (a stage's earlier chunks take the remainder), which
    // --num-virtual-stages-per-pipeline-rank cannot say and Megatron-Core's layout can.
    let output = tessel(&[
        "export",
        "tests/workflow/plans/llama3-8b.json",
        "--to",
        "megatron",
    ]);
    let script = stdout(&output);
    assert!(
        script.contains("--pipeline-model-parallel-layout 'E,t*6|t*5|t*6|t*5|t*5|t*5,L' \\\n"),
        "{script}"
    );
    assert!(!script.contains("--num-virtual-stages-per-pipeline-rank"));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("not expressible"), "{stderr}");
}
