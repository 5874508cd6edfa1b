//! LoRA and LoRA-FA fine-tuning: every parallel configuration trains the same adapters as one
//! rank (losses and final parameters within 1e-4), the model's own weights (and LoRA-FA's
//! `A`s) do not move, and the adapters learn.

mod common;

use common::{assert_same_run, comparison_options, gelu_layernorm, rel, swiglu_rmsnorm};
use std::collections::BTreeMap;
use tessel_grammar::{LoraTargets, ModelSpec, Recompute, Strategy};
use tessel_runtime::backend::AdamParams;
use tessel_runtime::checkpoint::reshard_sources;
use tessel_runtime::model::lora::Adapters;
use tessel_runtime::{launch_cpu, ExecutionPlan, LaunchOptions, LaunchReport, RuntimeError};

const GLOBAL_BATCH: u64 = 8;
const SEQ: u64 = 8;
const STEPS: u64 = 5;
const TOL: f64 = 1e-4;

fn lora(frozen_a: bool) -> Adapters {
    Adapters {
        rank: 4,
        targets: LoraTargets::ALL,
        frozen_a,
    }
}

fn options() -> LaunchOptions {
    comparison_options(STEPS)
}

fn strategy(dp: u64, tp: u64, pp: u64, microbatch: u64) -> Strategy {
    Strategy {
        name: "test".into(),
        dp,
        tp,
        pp,
        microbatch,
        ..Strategy::default()
    }
}

fn run(model: &ModelSpec, s: &Strategy, adapters: Adapters) -> LaunchReport {
    let mut plan = ExecutionPlan::from_strategy(model, s, GLOBAL_BATCH, SEQ).unwrap();
    plan.seed = 5;
    plan.adapters = Some(adapters);
    launch_cpu(model, &plan, &options()).unwrap()
}

fn assert_same_training(model: &ModelSpec, s: Strategy, adapters: Adapters) {
    let expect = run(model, &strategy(1, 1, 1, GLOBAL_BATCH), adapters);
    assert_same_run(&run(model, &s, adapters), &expect, TOL);
}

/// Parameters after zero steps: the model as it starts.
fn initial(model: &ModelSpec, adapters: Adapters) -> BTreeMap<String, Vec<f32>> {
    let mut plan = ExecutionPlan::single_rank(model, GLOBAL_BATCH, SEQ).unwrap();
    plan.seed = 5;
    plan.adapters = Some(adapters);
    let options = LaunchOptions {
        adam: AdamParams {
            lr: 0.0,
            ..options().adam
        },
        ..options()
    };
    launch_cpu(
        model,
        &plan,
        &LaunchOptions {
            steps: 1,
            ..options
        },
    )
    .unwrap()
    .parameters
    .unwrap()
}

#[test]
fn only_the_adapters_train_and_they_learn() {
    for frozen_a in [false, true] {
        let model = swiglu_rmsnorm();
        let start = initial(&model, lora(frozen_a));
        let report = run(&model, &strategy(1, 1, 1, GLOBAL_BATCH), lora(frozen_a));
        let end = report.parameters.as_ref().unwrap();
        let adapters = start.keys().filter(|n| n.contains(".lora_")).count();
        // 4 layers × (q, k, v, o, gate, up, down) × (A, B).
        assert_eq!(adapters, 4 * 7 * 2);
        for (name, before) in &start {
            let moved = rel(&end[name], before) > 1e-6;
            let trains = name.ends_with(".lora_b") || (name.ends_with(".lora_a") && !frozen_a);
            assert_eq!(moved, trains, "{name} (LoRA-FA: {frozen_a})");
            if name.ends_with(".lora_b") {
                assert!(before.iter().all(|&x| x == 0.0), "{name} starts at zero");
            }
        }
        let losses = &report.losses;
        assert!(
            losses[STEPS as usize - 1] < losses[0] - 0.01,
            "LoRA-FA {frozen_a}: the adapters must learn: {losses:?}"
        );
    }
}

#[test]
fn lora_tp2() {
    assert_same_training(&swiglu_rmsnorm(), strategy(1, 2, 1, 4), lora(false));
}

#[test]
fn lora_fa_tp2_gelu_with_biases() {
    assert_same_training(&gelu_layernorm(), strategy(1, 2, 1, 4), lora(true));
}

/// Four tensor ranks over two key/value heads: the key and value `B`s are replicated in pairs.
#[test]
fn lora_tp4_replicated_kv_heads() {
    assert_same_training(&swiglu_rmsnorm(), strategy(1, 4, 1, 8), lora(false));
}

#[test]
fn lora_pp2_tied_embeddings() {
    assert_same_training(&gelu_layernorm(), strategy(1, 1, 2, 2), lora(false));
}

#[test]
fn lora_fa_dp2_zero1() {
    let s = Strategy {
        zero: 1,
        ..strategy(2, 1, 1, 2)
    };
    assert_same_training(&swiglu_rmsnorm(), s, lora(true));
}

#[test]
fn lora_tp2_sp_pp2_dp2_zero2() {
    let s = Strategy {
        zero: 2,
        sequence_parallel: true,
        ..strategy(2, 2, 2, 2)
    };
    assert_same_training(&swiglu_rmsnorm(), s, lora(false));
}

#[test]
fn lora_fa_tp2_pp2_full_recompute_and_cp2() {
    let s = Strategy {
        cp: 2,
        recompute: Recompute::Full,
        ..strategy(1, 2, 2, 2)
    };
    assert_same_training(&gelu_layernorm(), s, lora(true));
}

#[test]
fn targets_subset_trains_only_those_adapters() {
    let attention_only = Adapters {
        targets: LoraTargets {
            qkv: true,
            o: false,
            mlp: false,
        },
        ..lora(false)
    };
    let s = strategy(1, 2, 2, 2);
    assert_same_training(&swiglu_rmsnorm(), s, attention_only);
    let names = initial(&swiglu_rmsnorm(), attention_only);
    let adapters: Vec<&String> = names.keys().filter(|n| n.contains(".lora_")).collect();
    assert_eq!(adapters.len(), 4 * 3 * 2);
    assert!(adapters.iter().all(|n| n.contains(".attn.w")));
}

#[test]
fn unsupported_combinations_are_refused() {
    let mut plan = ExecutionPlan::single_rank(&swiglu_rmsnorm(), GLOBAL_BATCH, SEQ).unwrap();
    plan.adapters = Some(lora(false));
    plan.zero = 3;
    let err = launch_cpu(&swiglu_rmsnorm(), &plan, &options()).unwrap_err();
    assert!(matches!(err, RuntimeError::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("ZeRO-3"), "{err}");
}

/// A plan of `s` with `adapters`, seeded as the other runs.
fn plan_of(s: &Strategy, adapters: Option<Adapters>) -> ExecutionPlan {
    let mut plan = ExecutionPlan::from_strategy(&swiglu_rmsnorm(), s, GLOBAL_BATCH, SEQ).unwrap();
    plan.seed = 5;
    plan.adapters = adapters;
    plan
}

fn run_with(
    plan: &ExecutionPlan,
    steps: u64,
    resume: Option<&std::path::Path>,
    save: Option<&std::path::Path>,
) -> LaunchReport {
    let options = LaunchOptions {
        resume_from: resume.map(Into::into),
        checkpoint_to: save.map(Into::into),
        ..LaunchOptions { steps, ..options() }
    };
    launch_cpu(&swiglu_rmsnorm(), plan, &options).unwrap()
}

/// Fine-tuning starts from a pretraining checkpoint: its first loss is the pretrained model's
/// (the adapters' `B` start at zero) and the model's weights stay the checkpoint's. Its own
/// checkpoint (weights, adapters and their moments) resumes under another plan and continues
/// as the uninterrupted run does.
#[test]
fn fine_tuning_resumes_pretraining_and_its_own_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let (pretrained, tuned) = (dir.path().join("pretrained"), dir.path().join("tuned"));
    let one = strategy(1, 1, 1, GLOBAL_BATCH);
    let full = run_with(&plan_of(&one, None), 4, None, None);
    run_with(&plan_of(&one, None), 3, None, Some(&pretrained));
    let lora_plan = plan_of(&one, Some(lora(false)));
    let whole = run_with(&lora_plan, 4, Some(&pretrained), None);
    assert!(
        ((whole.losses[0] - full.losses[3]) / full.losses[3]).abs() < 1e-6,
        "{} vs {}",
        whole.losses[0],
        full.losses[3]
    );
    let start = run_with(&plan_of(&one, None), 3, None, None);
    let (before, after) = (
        start.parameters.as_ref().unwrap(),
        whole.parameters.as_ref().unwrap(),
    );
    for (name, value) in before {
        assert_eq!(&after[name], value, "{name} is frozen");
    }
    // What the run read is what `tessel replan` prices: the model's weights alone.
    let sources = reshard_sources(&swiglu_rmsnorm(), &plan_of(&one, None), &lora_plan);
    assert_eq!(whole.resharded, sources);
    // Two steps, saved, then two more under tp 2: weights, adapters and their moments.
    let first = run_with(&lora_plan, 2, Some(&pretrained), Some(&tuned));
    let tp2 = plan_of(&strategy(1, 2, 1, 4), Some(lora(false)));
    let second = run_with(&tp2, 2, Some(&tuned), None);
    assert_eq!(
        second.resharded,
        reshard_sources(&swiglu_rmsnorm(), &lora_plan, &tp2)
    );
    let resumed: Vec<f64> = first.losses.iter().chain(&second.losses).copied().collect();
    for (step, (a, b)) in resumed.iter().zip(&whole.losses).enumerate() {
        assert!(((a - b) / b).abs() <= TOL, "step {step}: {a} vs {b}");
    }
}
