//! A plan file through the library: `ExecutionPlan::from_plan` keeps the plan's layout,
//! `scale_plan` keeps its degrees, and the CPU backend's weights, gradients and optimizer
//! states equal the cost model's prediction for the same scaled configuration byte for byte
//! (ZeRO 1–3).

use std::path::Path;
use tessel_grammar::Strategy;
use tessel_planner::{plan_fixed, Plan};
use tessel_runtime::{auto_scale, launch_cpu, scale_plan, ExecutionPlan, LaunchOptions};
use tessel_symbolic::cost::CostModel;

fn plan_of(spec_name: &str, dp: u64, tp: u64, pp: u64, zero: u8) -> Plan {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/launch")
        .join(spec_name);
    let spec = tessel_grammar::load_file(&path).expect("spec loads");
    let cost = CostModel::new(&spec).expect("cost model");
    let strategy = Strategy {
        name: "test".into(),
        dp,
        tp,
        pp,
        zero,
        ..Strategy::default()
    };
    plan_fixed(&spec, &cost, &strategy).expect("plan")
}

#[test]
fn from_plan_matches_from_strategy() {
    let plan = plan_of("dense8.tsl", 2, 2, 2, 1);
    let from_plan = ExecutionPlan::from_plan(&plan).unwrap();
    let from_strategy = ExecutionPlan::from_strategy(
        &plan.spec.model,
        &plan.strategy(),
        plan.global_batch,
        plan.seq_len,
    )
    .unwrap();
    assert_eq!(from_plan, from_strategy);
}

/// ZeRO 1–3: the gradients are reduce-scattered into the shard piece by piece and ZeRO-3's
/// gathered layers are buffers, so the states equal the prediction byte for byte, and the four
/// components' peak is within 15% of the predicted four (but on one stage, see below).
#[test]
fn scaled_states_equal_the_prediction() {
    for zero in 1..=3 {
        let plan = plan_of("dense8.tsl", 4, 1, 2, zero);
        let scaled = scale_plan(&plan, 0.5).unwrap();
        assert_eq!(
            (
                scaled.execution.dp,
                scaled.execution.pp,
                scaled.execution.zero
            ),
            (4, 2, zero)
        );
        assert_eq!(scaled.model().layers, 4);
        assert_eq!(scaled.execution.seq_len, 16);
        let predicted = scaled.predicted_memory().unwrap();
        let report = launch_cpu(scaled.model(), &scaled.execution, &LaunchOptions::new(1)).unwrap();
        for rank in &report.peak_memory {
            let p = predicted[rank.rank / 4];
            let d = rank.device;
            let at = format!("ZeRO-{zero} rank {}", rank.rank);
            assert_eq!(d.weights as f64, p.weights.round(), "{at}");
            assert_eq!(d.grads as f64, p.grads.round(), "{at}");
            assert_eq!(d.optimizer as f64, p.optimizer.round(), "{at}");
            let ratio = rank.device_total as f64 / p.measured_total();
            println!(
                "{at}: total {ratio:.3}, activations {:.3}",
                d.activations as f64 / p.activations
            );
            assert!((0.85..=1.15).contains(&ratio), "{at}: total {ratio:.3}");
            assert_eq!(d.buffers > 0, zero >= 2, "{at}: buffers {}", d.buffers);
            assert!(p.not_measured > 0.0);
        }
    }
}

#[test]
fn the_automatic_scale_of_a_70b_model_is_one_sixty_fourth() {
    // The spec's `lean` strategy: ZeRO-3 with the model state on the host, the way 70B
    // parameters fit on 8 GPUs.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/launch/llama70b8.tsl");
    let spec = tessel_grammar::load_file(&path).expect("spec loads");
    let cost = CostModel::new(&spec).expect("cost model");
    let lean = spec.strategy("lean").expect("the lean strategy");
    let plan = plan_fixed(&spec, &cost, lean).expect("plan");
    assert_eq!((plan.config.tp, plan.config.pp), (2, 2));
    assert_eq!(auto_scale(&plan.spec.model, 2), 1.0 / 64.0);
    assert!(scale_plan(&plan, 0.0).is_err());
    assert!(scale_plan(&plan, 1.5).is_err());
}

/// LoRA and LoRA-FA: the frozen weights, the adapters and their gradients and Adam moments
/// equal the prediction byte for byte, and the four components' peak is within 15% of the
/// predicted four, LoRA-FA's below LoRA's in both.
#[test]
fn adapter_fine_tuning_memory_equals_the_prediction() {
    use tessel_grammar::{FinetuneMethod, FinetuneSpec, LoraTargets};
    let mut peaks = Vec::new();
    for method in [FinetuneMethod::Lora, FinetuneMethod::LoraFa] {
        let mut plan = plan_of("dense8.tsl", 2, 2, 2, 1);
        plan.spec.train.finetune = Some(FinetuneSpec {
            method,
            rank: 8,
            targets: LoraTargets::ALL,
        });
        plan.spec_digest = tessel_planner::spec_digest(&plan.spec);
        let scaled = scale_plan(&plan, 0.5).unwrap();
        assert!(scaled.execution.adapters.is_some());
        let predicted = scaled.predicted_memory().unwrap();
        let report = launch_cpu(scaled.model(), &scaled.execution, &LaunchOptions::new(1)).unwrap();
        let (mut measured, mut expected) = (0, 0.0);
        for rank in &report.peak_memory {
            let p = predicted[rank.rank / 4];
            let d = rank.device;
            let at = format!("{} rank {}", method.name(), rank.rank);
            assert_eq!(d.weights as f64, p.weights.round(), "{at}");
            assert_eq!(d.grads as f64, p.grads.round(), "{at}");
            assert_eq!(d.optimizer as f64, p.optimizer.round(), "{at}");
            let ratio = rank.device_total as f64 / p.measured_total();
            println!(
                "{at}: total {ratio:.3}, activations {:.3} ({} of {:.0} bytes)",
                d.activations as f64 / p.activations,
                d.activations,
                p.activations
            );
            assert!((0.85..=1.15).contains(&ratio), "{at}: total {ratio:.3}");
            measured = measured.max(d.activations);
            expected = f64::max(expected, p.activations);
        }
        peaks.push((measured, expected));
    }
    let [(lora, lora_predicted), (fa, fa_predicted)] = peaks[..] else {
        unreachable!()
    };
    assert!(fa < lora && fa_predicted < lora_predicted);
}

/// Tempo's memory-saving kernels: the activations a plan keeps fall by exactly the bytes the
/// cost model says they fall by (the norms' inputs; for gelu, GELU's input for a one-bit
/// mask), and the run trains the same losses as without them (within 1e-5).
#[test]
fn memory_saving_kernels_keep_what_the_prediction_says() {
    use tessel_grammar::{MemorySavingKernels, MlpKind, NormKind};
    for mlp in [MlpKind::Swiglu, MlpKind::Gelu] {
        let mut results = Vec::new();
        for saving in [false, true] {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/launch/dense8.tsl");
            let mut spec = tessel_grammar::load_file(&path).expect("spec loads");
            spec.model.mlp = mlp;
            if mlp == MlpKind::Gelu {
                spec.model.norm = NormKind::Layernorm;
            }
            spec.train.memory_saving_kernels = if saving {
                MemorySavingKernels::On
            } else {
                MemorySavingKernels::Off
            };
            let cost = CostModel::new(&spec).expect("cost model");
            let strategy = Strategy {
                name: "test".into(),
                dp: 2,
                tp: 2,
                pp: 2,
                zero: 1,
                sequence_parallel: true,
                ..Strategy::default()
            };
            let plan = plan_fixed(&spec, &cost, &strategy).expect("plan");
            let scaled = scale_plan(&plan, 0.5).unwrap();
            assert_eq!(scaled.execution.memory_saving_kernels, saving);
            let predicted = scaled.predicted_memory().unwrap();
            let report =
                launch_cpu(scaled.model(), &scaled.execution, &LaunchOptions::new(2)).unwrap();
            let measured: Vec<u64> = report
                .peak_memory
                .iter()
                .map(|r| r.device.activations)
                .collect();
            let expected: Vec<f64> = report
                .peak_memory
                .iter()
                .map(|r| predicted[r.rank / 4].activations)
                .collect();
            results.push((report.losses, measured, expected));
        }
        let (base, tempo) = (&results[0], &results[1]);
        for (a, b) in tempo.0.iter().zip(&base.0) {
            assert!(((a - b) / b).abs() < 1e-5, "{mlp:?}: loss {a} vs {b}");
        }
        for rank in 0..base.1.len() {
            let saved = base.1[rank] as f64 - tempo.1[rank] as f64;
            let predicted = base.2[rank] - tempo.2[rank];
            println!(
                "{mlp:?} rank {rank}: saved {saved} of {} bytes, predicted {predicted:.0} of {:.0}",
                base.1[rank], base.2[rank]
            );
            assert!(saved > 0.0, "{mlp:?} rank {rank}");
            assert_eq!(saved, predicted.round(), "{mlp:?} rank {rank}");
        }
    }
}
