//! The plan file: canonical JSON that reads back to the same plan, clear errors for bad files,
//! fixed strategies, and agreement between the plan's prediction and `estimate`.

mod common;

use common::synthetic_model::SyntheticModel;
use common::*;
use tessel_grammar::{Recompute, Strategy};
use tessel_planner::{
    plan, plan_fixed, render_explain, render_markdown, render_table, spec_digest, Plan, PlanError,
    PlanOptions, SolverStatus, StageCostModel, PLAN_FORMAT,
};

fn small_spec() -> tessel_grammar::Spec {
    spec(gpt3_175b(), h100_cluster(16, 8, 80.0), 2048, 256)
}

fn searched_plan() -> (tessel_grammar::Spec, Plan) {
    let spec = small_spec();
    let model = SyntheticModel::new(spec.clone());
    let plan = plan(&spec, &model, &PlanOptions::default())
        .expect("a plan")
        .plan;
    (spec, plan)
}

#[test]
fn json_round_trips_byte_for_byte() {
    let (_, plan) = searched_plan();
    let text = plan.to_json();
    let read = Plan::from_json(&text).expect("reads back");
    assert_eq!(read.to_json(), text);
    assert_eq!(read.format, PLAN_FORMAT);
    assert!(text.contains("\"format\": \"tessel-plan/1\""));
}

#[test]
fn keys_are_sorted_at_the_top_level() {
    let (_, plan) = searched_plan();
    let text = plan.to_json();
    let keys: Vec<&str> = text
        .lines()
        .filter(|line| line.starts_with("  \"") && !line.starts_with("   "))
        .map(|line| line.trim().split('"').nth(1).unwrap_or(""))
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    assert_eq!(
        keys,
        vec![
            "cluster",
            "config",
            "format",
            "global_batch",
            "gpus",
            "gpus_per_node",
            "model",
            "objective",
            "prediction",
            "rank_map",
            "runners_up",
            "search",
            "seq_len",
            "solver",
            "spec",
            "spec_digest",
            "stages"
        ]
    );
}

#[test]
fn floats_are_rounded_to_six_significant_digits() {
    let (_, plan) = searched_plan();
    let text = plan.to_json();
    let value: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let step = value["prediction"]["step_time_s"]
        .as_f64()
        .expect("a number");
    let digits: String = format!("{step:e}")
        .split('e')
        .next()
        .unwrap_or("")
        .chars()
        .filter(|c| c.is_ascii_digit())
        .collect();
    assert!(
        digits.len() <= 6,
        "{step} has more than 6 significant digits"
    );
    assert!((step - plan.prediction.step_time_s).abs() <= 1e-5 * step);
}

#[test]
fn bad_files_give_clear_errors() {
    let (_, plan) = searched_plan();
    let text = plan.to_json();

    let truncated = &text[..text.len() / 2];
    match Plan::from_json(truncated) {
        Err(PlanError::Json { message }) => assert!(message.contains("ends early"), "{message}"),
        other => panic!("expected a JSON error, got {other:?}"),
    }

    let other_version = text.replace("tessel-plan/1", "tessel-plan/9");
    assert_eq!(
        Plan::from_json(&other_version),
        Err(PlanError::WrongFormat {
            found: "tessel-plan/9".to_string()
        })
    );
    let message = Plan::from_json(&other_version).unwrap_err().to_string();
    assert!(message.contains("tessel-plan/9") && message.contains("tessel-plan/1"));

    let mut value: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    value
        .as_object_mut()
        .expect("an object")
        .remove("prediction");
    assert_eq!(
        Plan::from_json(&value.to_string()),
        Err(PlanError::MissingField {
            field: "prediction".to_string()
        })
    );
    assert_eq!(
        Plan::from_json("{\"stages\": []}"),
        Err(PlanError::MissingField {
            field: "format".to_string()
        })
    );
}

#[test]
fn prediction_is_what_estimate_says_for_the_plan() {
    let (spec, plan) = searched_plan();
    let model = SyntheticModel::new(spec.clone());
    let estimate = model.estimate(&plan.strategy()).expect("an estimate");
    assert_eq!(plan.prediction, estimate);
    assert!((plan.solver.objective_s - estimate.step_time_s).abs() <= 1e-9 * estimate.step_time_s);
    assert!(plan.prediction.fits);
    assert_eq!(plan.spec_digest, spec_digest(&spec));
    assert_eq!(plan.spec_digest.len(), 64);
}

#[test]
fn stages_and_rank_map_cover_the_model_and_cluster() {
    let (spec, plan) = searched_plan();
    let c = &plan.config;
    assert_eq!(c.dp * c.tp * c.pp * c.cp, spec.cluster.total_gpus());
    assert_eq!(plan.stages.len() as u64, c.pp);
    let mut covered: Vec<[u64; 2]> = plan
        .stages
        .iter()
        .flat_map(|s| s.layer_ranges.iter().copied())
        .collect();
    covered.sort();
    let mut next = 0;
    for [first, last] in covered {
        assert_eq!(first, next);
        next = last;
    }
    assert_eq!(next, spec.model.layers);
    assert_eq!(plan.rank_map.ranks.len() as u64, spec.cluster.total_gpus());
    for (i, row) in plan.rank_map.ranks.iter().enumerate() {
        assert_eq!(row[0], i as u64);
        assert_eq!(row[1], row[0] / 8);
        assert!(row[3] < c.pp && row[4] < c.dp && row[5] < c.cp && row[6] < c.tp);
    }
}

#[test]
fn digest_changes_with_the_spec() {
    let spec = small_spec();
    let mut longer = spec.clone();
    longer.train.seq_len = 4096;
    assert_ne!(spec_digest(&spec), spec_digest(&longer));
    assert_eq!(spec_digest(&spec), spec_digest(&small_spec()));
}

#[test]
fn fixed_strategy_plans_agree_with_estimate() {
    let spec = small_spec();
    let model = SyntheticModel::new(spec.clone());
    let strategy = Strategy {
        name: "megatron".to_string(),
        dp: 4,
        tp: 8,
        pp: 4,
        interleave: 2,
        recompute: Recompute::Selective,
        sequence_parallel: true,
        zero: 1,
        ..Strategy::default()
    };
    let plan = plan_fixed(&spec, &model, &strategy).expect("a plan");
    assert_eq!(plan.solver.status, SolverStatus::Fixed);
    assert_eq!(plan.config.microbatches, 64);
    let layers: Vec<u64> = plan.stages.iter().map(|s| s.layers).collect();
    assert_eq!(layers, vec![24, 24, 24, 24]);
    assert_eq!(plan.stages[0].layer_ranges, vec![[0, 12], [48, 60]]);
    assert_eq!(
        plan.prediction,
        model.estimate(&plan.strategy()).expect("estimate")
    );
    assert!(plan.runners_up.is_empty());

    let wrong = Strategy {
        dp: 3,
        ..strategy.clone()
    };
    match plan_fixed(&spec, &model, &wrong) {
        Err(PlanError::InvalidStrategy { reason }) => {
            assert!(reason.contains("96"), "{reason}");
            assert!(reason.contains("128 GPUs"), "{reason}");
        }
        other => panic!("expected an invalid strategy, got {other:?}"),
    }
    assert_eq!(plan.strategy().stages, Some(vec![12; 8]));
    let bad_stages = Strategy {
        stages: Some(vec![24, 24, 24, 24]),
        ..strategy.clone()
    };
    assert!(matches!(
        plan_fixed(&spec, &model, &bad_stages),
        Err(PlanError::InvalidStrategy { .. })
    ));
    let uneven = Strategy {
        stages: Some(vec![11, 12, 12, 12, 12, 12, 12, 13]),
        ..strategy
    };
    let plan = plan_fixed(&spec, &model, &uneven).expect("a plan");
    let layers: Vec<u64> = plan.stages.iter().map(|s| s.layers).collect();
    assert_eq!(layers, vec![23, 24, 24, 25]);
    assert_eq!(plan.stages[3].layer_ranges, vec![[35, 47], [83, 96]]);
    assert_eq!(plan.strategy().stages, uneven.stages);
}

#[test]
fn renders_name_the_configuration_and_the_binding_constraint() {
    let (_, plan) = searched_plan();
    let table = render_table(&plan);
    assert!(table.contains(&format!("tp {}", plan.config.tp)));
    assert!(table.contains("step time"));
    assert!(table.contains("capacity"));
    let markdown = render_markdown(&plan);
    assert!(markdown.contains("| stage | layers |"));
    let explain = render_explain(&plan);
    assert!(explain.contains("binds"));
    for runner in &plan.runners_up {
        assert!(explain.contains(&runner.loses_on));
    }
    assert_eq!(plan.runners_up.len(), 3);
    for pair in plan.runners_up.windows(2) {
        assert!(pair[0].step_time_s <= pair[1].step_time_s);
    }
    assert!(plan.runners_up[0].step_time_s >= plan.prediction.step_time_s);
}
