//! When no configuration fits, the error says how much memory the leanest one needs, what
//! dominates it, how far it is short, and what would help.

mod common;

use common::synthetic_model::SyntheticModel;
use common::*;
use tessel_grammar::{Choice, Framework, Offload, Recompute, Spec};
use tessel_planner::{even_split, outer_configs, plan, PlanError, PlanOptions, StageCostModel};

fn least_lean_memory(spec: &Spec, model: &SyntheticModel) -> f64 {
    let lean_offload = Offload {
        optimizer: 1.0,
        ..Offload::default()
    };
    let (configs, _) = outer_configs(spec);
    configs
        .iter()
        .map(|outer| {
            let strategy = outer.strategy("lean", Recompute::Full, lean_offload, None);
            even_split(spec.model.layers, outer.pp, outer.interleave)
                .iter()
                .enumerate()
                .map(|(stage, &layers)| {
                    model
                        .stage_cost(
                            &strategy,
                            stage as u64,
                            layers,
                            Recompute::Full,
                            lean_offload,
                        )
                        .memory
                        .total()
                })
                .fold(0.0, f64::max)
        })
        .fold(f64::INFINITY, f64::min)
}

/// GPT-3 175B on one node of 8 H100, under DeepSpeed with ZeRO-1, whose leanest stage option
/// is the one `least_lean_memory` assumes (DeepSpeed offloads the optimizer state under ZeRO-1,
/// and of the activations every checkpoint or none, which the default space does not offer;
/// `tessel_grammar::Capabilities`).
fn lean_spec() -> Spec {
    let mut spec = spec(gpt3_175b(), h100_cluster(1, 8, 80.0), 2048, 64);
    spec.train.framework = Framework::Deepspeed;
    spec.search.zero = Choice::Values(vec![1]);
    spec
}

#[test]
fn gpt3_on_one_node_does_not_fit_and_says_why() {
    let spec = lean_spec();
    let model = SyntheticModel::new(spec.clone());
    let explanation = match plan(&spec, &model, &PlanOptions::default()) {
        Err(PlanError::NothingFits { explanation }) => explanation,
        other => panic!("expected nothing to fit, got {other:?}"),
    };

    // Independently: the least peak memory over every configuration at its even split with the
    // leanest options searched (full recompute, all optimizer states offloaded).
    let least = least_lean_memory(&spec, &model);
    let capacity = model.memory_capacity();
    assert!((explanation.least_need_gib - least / GIB).abs() < 1e-9);
    assert!((explanation.capacity_gib - capacity / GIB).abs() < 1e-9);
    assert!((explanation.short_by_gib - (least - capacity) / GIB).abs() < 1e-9);
    assert!(explanation.short_by_gib > 0.0);
    // 175 B parameters over 8 GPUs: weights and gradients alone are ~87 GB per GPU.
    assert!(
        explanation.dominant == "weights" || explanation.dominant == "gradients",
        "{}",
        explanation.dominant
    );
    let more_gpus = explanation
        .suggestions
        .iter()
        .find(|s| s.change.contains("GPUs"))
        .expect("a suggestion of more GPUs");
    assert!(more_gpus.estimated && more_gpus.fits);
    assert!(explanation
        .suggestions
        .iter()
        .any(|s| s.change.contains("offload") && !s.estimated));

    let message = PlanError::NothingFits {
        explanation: explanation.clone(),
    }
    .to_string();
    assert!(message.contains("no configuration fits"));
    assert!(message.contains("short"));
    assert!(message.contains("what would help"));
}

#[test]
fn an_impossible_search_space_is_reported() {
    let mut spec = spec(gpt3_175b(), h100_cluster(16, 8, 80.0), 2048, 256);
    spec.search.tp = tessel_grammar::Choice::Values(vec![3]);
    let model = SyntheticModel::new(spec.clone());
    match plan(&spec, &model, &PlanOptions::default()) {
        Err(PlanError::EmptySearchSpace { reason }) => assert!(reason.contains("128 GPUs")),
        other => panic!("expected an empty search space, got {other:?}"),
    }
}

#[test]
fn with_a_model_factory_more_nodes_are_tried() {
    let spec = lean_spec();
    let model = SyntheticModel::new(spec.clone());
    let factory = |changed: &Spec| -> Result<Box<dyn StageCostModel>, String> {
        Ok(Box::new(SyntheticModel::new(changed.clone())))
    };
    let options = PlanOptions {
        model_for_spec: Some(&factory),
        ..PlanOptions::default()
    };
    let explanation = match plan(&spec, &model, &options) {
        Err(PlanError::NothingFits { explanation }) => explanation,
        other => panic!("expected nothing to fit, got {other:?}"),
    };
    let tried: Vec<_> = explanation
        .suggestions
        .iter()
        .filter(|s| s.change.contains("the nodes"))
        .collect();
    assert!(!tried.is_empty());
    assert!(tried.iter().all(|s| !s.estimated));
    // Nodes are doubled until the leanest configuration fits, and no further.
    let last = tried.last().expect("a tried change");
    assert!(last.fits, "{:?}", explanation.suggestions);
    assert!(tried[..tried.len() - 1].iter().all(|s| !s.fits));
    let factor = 1u64 << tried.len();
    let mut bigger = spec.clone();
    bigger.cluster.nodes *= factor;
    let bigger_model = SyntheticModel::new(bigger.clone());
    let expected = least_lean_memory(&bigger, &bigger_model);
    assert!((last.need_gib - expected / GIB).abs() < 1e-9);
    assert!(last.change.contains(&format!("{} GPUs", 8 * factor)));
}
