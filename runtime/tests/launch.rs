//! The launch entry point: reports, traces, token files, and clear errors for bad input.

mod common;

use common::tiny_model;
use std::io::Write;
use tessel_grammar::{MlpKind, NormKind, PositionKind, Strategy};
use tessel_runtime::{
    launch_cpu, DataSource, ExecutionPlan, LaunchOptions, RuntimeError, TokenWidth,
};

fn strategy(tp: u64, pp: u64, dp: u64) -> Strategy {
    Strategy {
        name: "s".into(),
        dp,
        tp,
        pp,
        ..Strategy::default()
    }
}

#[test]
fn report_has_one_entry_per_step_and_rank() {
    let m = tiny_model();
    let plan = ExecutionPlan::from_strategy(&m, &strategy(2, 2, 1), 4, 8).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.json");
    let options = LaunchOptions {
        trace: Some(trace.clone()),
        ..LaunchOptions::new(3)
    };
    let r = launch_cpu(&m, &plan, &options).unwrap();
    assert_eq!(r.losses.len(), 3);
    assert_eq!(r.step_time_s.len(), 3);
    assert!(r.tokens_per_s > 0.0);
    assert_eq!(r.peak_memory.len(), 4);
    for mem in &r.peak_memory {
        assert!(mem.device.weights > 0 && mem.device.optimizer == 2 * mem.device.weights);
        assert!(mem.device.activations > 0);
        assert!(mem.device_total >= mem.device.weights + mem.device.optimizer);
    }
    let text = std::fs::read_to_string(&trace).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let forwards = events.iter().filter(|e| e["cat"] == "forward").count();
    // 4 micro-batches × 3 steps on each of 4 ranks.
    assert_eq!(forwards, 4 * 3 * 4);
    let tids: std::collections::BTreeSet<u64> =
        events.iter().map(|e| e["tid"].as_u64().unwrap()).collect();
    assert_eq!(tids.len(), 4);
    assert!(events.iter().any(|e| e["cat"] == "comm"));
}

#[test]
fn trains_from_a_token_file() {
    let m = tiny_model();
    let mut f = tempfile::NamedTempFile::new().unwrap();
    for i in 0..200u32 {
        f.write_all(&((i * 7) % 64).to_le_bytes()).unwrap();
    }
    let plan = ExecutionPlan::from_strategy(&m, &strategy(1, 1, 2), 4, 8).unwrap();
    let options = LaunchOptions {
        data: DataSource::TokenFile {
            path: f.path().to_path_buf(),
            width: TokenWidth::U32,
        },
        ..LaunchOptions::new(2)
    };
    let r = launch_cpu(&m, &plan, &options).unwrap();
    assert!(r.losses.iter().all(|l| l.is_finite() && *l > 0.0));
    let bad = LaunchOptions {
        data: DataSource::TokenFile {
            path: f.path().to_path_buf(),
            width: TokenWidth::U16,
        },
        ..LaunchOptions::new(1)
    };
    // Read as u16 the high halves are zeros and values stay in range; a missing file is not.
    assert!(launch_cpu(&m, &plan, &bad).is_ok());
    let missing = LaunchOptions {
        data: DataSource::TokenFile {
            path: "/nonexistent/tokens.bin".into(),
            width: TokenWidth::U16,
        },
        ..LaunchOptions::new(1)
    };
    let err = launch_cpu(&m, &plan, &missing).unwrap_err();
    assert!(matches!(err, RuntimeError::Data { .. }), "{err}");
}

#[test]
fn plans_that_do_not_fit_the_model_are_errors() {
    let m = tiny_model();
    let err = |s: Strategy, batch| {
        ExecutionPlan::from_strategy(&m, &s, batch, 8)
            .unwrap_err()
            .to_string()
    };
    assert!(err(strategy(3, 1, 1), 4).contains("tp = 3 does not divide attention heads = 4"));
    let mut mqa = tiny_model();
    mqa.heads = 6;
    mqa.kv_heads = 3;
    let e = ExecutionPlan::from_strategy(&mqa, &strategy(2, 1, 1), 4, 8).unwrap_err();
    assert!(
        e.to_string()
            .contains("tp = 2 does not divide key/value heads = 3"),
        "{e}"
    );
    assert!(err(strategy(1, 3, 1), 3).contains("2 layers cannot fill 3 pipeline stages"));
    assert!(
        err(strategy(1, 1, 3), 4).contains("global batch 4 is not a multiple of dp·microbatch = 3")
    );
    let mut s = strategy(1, 1, 1);
    s.interleave = 2;
    assert_eq!(
        err(s, 4),
        "not supported by the runtime yet: interleaving without pipeline parallelism"
    );
    let mut s = strategy(1, 2, 1);
    s.interleave = 2;
    assert!(err(s, 4).contains("2 layers cannot fill 4 pipeline stages"));
    let mut s = strategy(1, 1, 1);
    s.ep = 2;
    assert!(err(s, 4).contains("expert parallelism needs a mixture-of-experts model"));
    let mut s = strategy(1, 1, 1);
    s.zero = 4;
    assert!(err(s, 4).contains("ZeRO stage 4"));
    let mut s = strategy(1, 1, 1);
    s.cp = 3;
    assert!(err(s, 4)
        .contains("2·cp (two chunks per context rank) = 6 does not divide sequence length = 8"));
    let mut s = strategy(1, 2, 1);
    s.stages = Some(vec![2, 1]);
    assert!(err(s, 4).contains("stages hold 3 layers but the model has 2"));
}

#[test]
fn hand_built_plans_are_validated() {
    let m = tiny_model();
    let mut plan = ExecutionPlan::single_rank(&m, 2, 8).unwrap();
    plan.microbatches = 0;
    let e = launch_cpu(&m, &plan, &LaunchOptions::new(1)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the plan cannot run: micro-batch count must be at least 1"
    );
    let mut plan = ExecutionPlan::single_rank(&m, 2, 8).unwrap();
    plan.chunk_layers = vec![(0, 1)];
    let e = launch_cpu(&m, &plan, &LaunchOptions::new(1)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the plan cannot run: stages hold 1 layers but the model has 2"
    );
}

#[test]
fn bad_models_are_errors_not_panics() {
    let plan = ExecutionPlan::single_rank(&tiny_model(), 2, 8).unwrap();
    let mut m = tiny_model();
    m.kv_heads = 3;
    let e = launch_cpu(&m, &plan, &LaunchOptions::new(1)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the model cannot be built: 4 heads cannot share 3 key/value heads"
    );
    let mut m = tiny_model();
    m.head_dim = 3;
    let e = launch_cpu(&m, &plan, &LaunchOptions::new(1)).unwrap_err();
    assert!(e.to_string().contains("even head_dim"));
}

#[test]
fn uneven_stage_sizes_are_honoured() {
    let mut m = tiny_model();
    m.layers = 3;
    let mut s = strategy(1, 2, 1);
    s.stages = Some(vec![1, 2]);
    let plan = ExecutionPlan::from_strategy(&m, &s, 2, 8).unwrap();
    assert_eq!(plan.chunk_layers, vec![(0, 1), (1, 3)]);
    let reference = ExecutionPlan::single_rank(&m, 2, 8).unwrap();
    let options = LaunchOptions::new(2);
    let a = launch_cpu(&m, &plan, &options).unwrap();
    let b = launch_cpu(&m, &reference, &options).unwrap();
    for (x, y) in a.losses.iter().zip(&b.losses) {
        assert!(((x - y) / y).abs() < 1e-5);
    }
}

#[test]
fn weight_accounting_matches_the_parameter_count() {
    let dense = tiny_model();
    let mut gelu = tiny_model();
    gelu.mlp = MlpKind::Gelu;
    gelu.norm = NormKind::Layernorm;
    gelu.bias = true;
    gelu.tie_embeddings = false;
    gelu.position = PositionKind::Learned;
    gelu.max_seq_len = Some(8);
    let mut moe = tiny_model();
    moe.moe = Some(tessel_grammar::MoeSpec {
        experts: 4,
        top_k: 2,
        every: 2,
        expert_ffn_hidden: 8,
        shared_experts: 1,
        capacity_factor: 1.0,
        first_dense: 0,
    });
    for m in [dense, gelu, moe] {
        let plan = ExecutionPlan::single_rank(&m, 2, 8).unwrap();
        let r = launch_cpu(&m, &plan, &LaunchOptions::new(1)).unwrap();
        assert_eq!(
            r.peak_memory[0].device.weights,
            4 * m.parameter_count().total,
            "{m:?}"
        );
    }
}

#[test]
fn tensor_parallel_splits_everything_but_the_norms() {
    let m = tiny_model();
    let plan = ExecutionPlan::from_strategy(&m, &strategy(2, 1, 1), 2, 8).unwrap();
    let r = launch_cpu(&m, &plan, &LaunchOptions::new(1)).unwrap();
    // RMS norm weights (two per block and the final one) stay whole on every rank.
    let norms = (2 * m.layers + 1) * m.hidden;
    let expect = 4 * ((m.parameter_count().total - norms) / 2 + norms);
    for mem in &r.peak_memory {
        assert_eq!(mem.device.weights, expect);
    }
}
