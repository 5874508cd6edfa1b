//! Bad specs and strategies give errors, never panics.

mod common;

use common::synthetic_model::SyntheticModel;
use common::*;
use tessel_grammar::{Choice, Strategy};
use tessel_planner::{plan, plan_fixed, PlanError, PlanOptions};

fn strategy(dp: u64, tp: u64, pp: u64, interleave: u64) -> Strategy {
    Strategy {
        name: "hostile".to_string(),
        dp,
        tp,
        pp,
        interleave,
        ..Strategy::default()
    }
}

#[test]
fn degenerate_specs_are_errors() {
    let base = spec(gpt3_175b(), h100_cluster(4, 8, 80.0), 2048, 64);
    // Head counts the grammar would reject: the planner must not divide by them.
    for (heads, kv_heads) in [(96, 0), (0, 96), (0, 0)] {
        let mut s = base.clone();
        s.model.heads = heads;
        s.model.kv_heads = kv_heads;
        let model = SyntheticModel::new(s.clone());
        let _ = plan(&s, &model, &PlanOptions::default());
    }
    let mut cases = Vec::new();
    let mut s = base.clone();
    s.cluster.gpus_per_node = 0;
    cases.push(s);
    let mut s = base.clone();
    s.train.global_batch = 0;
    cases.push(s);
    let mut s = base.clone();
    s.model.layers = 0;
    cases.push(s);
    let mut s = base.clone();
    s.search.tp = Choice::Values(vec![0, u64::MAX]);
    s.search.pp = Choice::Values(vec![0, u64::MAX, 1 << 40]);
    s.search.interleave = Choice::Values(vec![0, u64::MAX]);
    s.search.microbatch = Choice::Values(vec![0]);
    cases.push(s);
    for (i, spec) in cases.iter().enumerate() {
        let model = SyntheticModel::new(spec.clone());
        match plan(spec, &model, &PlanOptions::default()) {
            Err(PlanError::EmptySearchSpace { .. }) | Err(PlanError::NothingFits { .. }) => {}
            other => panic!("case {i}: expected an error, got {other:?}"),
        }
    }
}

#[test]
fn absurd_strategies_are_errors() {
    let spec = spec(gpt3_175b(), h100_cluster(4, 8, 80.0), 2048, 64);
    let model = SyntheticModel::new(spec.clone());
    let huge = u64::MAX / 2;
    for strategy in [
        strategy(0, 8, 4, 1),
        strategy(huge, huge, huge, 1),
        strategy(1, 8, 4, huge),
        Strategy {
            stages: Some(vec![u64::MAX, u64::MAX, 1, 1]),
            ..strategy(1, 8, 4, 1)
        },
        Strategy {
            ep: 0,
            ..strategy(1, 8, 4, 1)
        },
    ] {
        assert!(matches!(
            plan_fixed(&spec, &model, &strategy),
            Err(PlanError::InvalidStrategy { .. })
        ));
    }
}
