//! The compiled stage-cost program against tree evaluation of the same expressions, over every
//! published configuration (each of its pipeline devices) and a spread of recompute and offload
//! choices: the planner's fast path must give the numbers the reference gives.

use tessel_grammar::{Offload, Recompute};
use tessel_symbolic::cost::{
    microbatches, slot_values, stage_layers, validate_strategy, CostModel,
};
use tessel_symbolic::validation::{default_data_path, load_cases};

fn close(a: f64, b: f64) -> bool {
    a == b || (a - b).abs() <= 1e-11 * a.abs().max(b.abs())
}

#[test]
fn compiled_program_matches_tree_evaluation_on_published_configurations() {
    let path = default_data_path();
    if !path.exists() {
        println!("published runs not found at {}: skipped", path.display());
        return;
    }
    let (cases, _) = load_cases(&path).expect("the published runs are readable");
    let offloads = [
        Offload::default(),
        Offload {
            optimizer: 1.0,
            weights: 0.5,
            gradients: 0.25,
            activations: 0.75,
        },
    ];
    let mut compared = 0usize;
    for case in &cases {
        let Ok(model) = CostModel::new(&case.spec) else {
            continue;
        };
        let strategy = &case.strategy;
        if validate_strategy(&case.spec, strategy).is_err() {
            continue;
        }
        let m = microbatches(&case.spec, strategy).max(1);
        for (stage, &layers) in stage_layers(&case.spec, strategy).iter().enumerate() {
            for recompute in [
                Recompute::None,
                Recompute::Selective,
                Recompute::Full,
                Recompute::Partial { full_layers: 1 },
            ] {
                for offload in offloads {
                    let stage = stage as u64;
                    let values = slot_values(strategy, m, stage, layers, recompute, offload);
                    let tree = model.staged_exprs().eval(&values);
                    let compiled = model.stage_outputs(strategy, stage, layers, recompute, offload);
                    for (index, (a, b)) in tree.iter().zip(&compiled).enumerate() {
                        assert!(
                            close(*a, *b),
                            "{}: stage {stage}, {recompute:?}, {offload:?}, output {index}: \
                             tree {a} vs compiled {b}",
                            case.model
                        );
                    }
                    compared += 1;
                }
            }
        }
    }
    assert!(
        compared > 10_000,
        "only {compared} stage evaluations compared"
    );
}
