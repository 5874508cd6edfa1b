//! The regimes of published runs no calibration sees (`data/regimes/runs.csv`), each
//! written as a spec from its paper: the trend each shows is a mechanism the cost model must
//! have, and the level is the error the README reports.

use std::collections::BTreeMap;

use tessel_grammar::OverlapSpec;
use tessel_symbolic::cost::CostModel;
use tessel_symbolic::validation::{
    default_regimes_path, evaluate_regimes, load_regime_cases, RegimeOutcome,
};

fn outcomes() -> Vec<RegimeOutcome> {
    let cases = load_regime_cases(&default_regimes_path()).expect("data/regimes/runs.csv");
    evaluate_regimes(&cases).expect("every regime row is costable")
}

fn regime<'a>(all: &'a [RegimeOutcome], name: &str, model: &str) -> Vec<&'a RegimeOutcome> {
    let mut rows: Vec<_> = all
        .iter()
        .filter(|o| o.case.regime == name && o.case.model.contains(model))
        .collect();
    rows.sort_by_key(|o| o.case.gpus);
    rows
}

#[test]
fn zero3_step_time_stays_flat_as_gpus_double_at_a_fixed_batch() {
    // Narayanan et al. 2021, Table 2: GPT-3 175B under DeepSpeed ZeRO-3 at batch 1536 on 384,
    // 768 and 1,536 A100s runs 144, 88 and 44 TFLOP/s per GPU: step times 81.6, 66.8, 66.8 s.
    // Per-layer gathers over the whole data-parallel group pay a ring step per rank, so the
    // communication grows as the compute per GPU shrinks.
    let all = outcomes();
    let rows = regime(&all, "zero3_scale", "174.6B");
    let steps: Vec<f64> = rows.iter().map(|o| o.estimate.step_time_s).collect();
    assert_eq!(steps.len(), 3);
    assert!(steps[2] / steps[1] > 0.85, "1536 vs 768 GPUs: {steps:?}");
    assert!(steps[1] / steps[0] > 0.6, "768 vs 384 GPUs: {steps:?}");
    for o in &rows {
        assert!(
            o.step_error.abs() < 0.12,
            "{} GPUs: {:+.3}",
            o.case.gpus,
            o.step_error
        );
    }
}

#[test]
fn overlapped_gradient_reduction_hides_behind_the_backward_pass() {
    // Llama 3 405B (Dubey et al. 2024, Table 4) at 8,192 and 16,384 H100s, the same 16
    // sequences per data-parallel rank: 430 and 400 TFLOP/s per GPU. Megatron-style
    // bucketed reduction behind the backward pass leaves at most the last bucket exposed, so
    // doubling the data-parallel group costs little.
    let all = outcomes();
    let rows = regime(&all, "llama3_405b", "405B");
    for o in rows.iter().filter(|o| o.case.spec.train.seq_len == 8192) {
        let step = o.estimate.step_time_s;
        assert!(
            o.estimate.time.dp_comm < 0.05 * step,
            "{}: {:?}",
            o.case.gpus,
            o.estimate.time
        );
        // The same run with the reduction after the backward pass exposes all of it.
        let mut spec = o.case.spec.clone();
        spec.train.overlap = Some(OverlapSpec {
            grad_reduce: Some(false),
            param_gather: Some(false),
            tp_comm: None,
        });
        let exposed = CostModel::new(&spec)
            .unwrap()
            .estimate(&spec.strategies[0])
            .unwrap();
        assert!(exposed.time.dp_comm > 1.5 * o.estimate.time.dp_comm);
        // At 16,384 GPUs most of what remains is the pipeline bubble of 16 micro-batches on
        // 16 stages: the paper does not give its interleaving (the spec takes 2 chunks).
        assert!(
            o.step_error.abs() < 0.3,
            "{}: {:+.3}",
            o.case.gpus,
            o.step_error
        );
    }
}

#[test]
fn megatron_on_h100_overlaps_only_the_last_micro_batch_of_its_reduction() {
    // Megatron-LM's README (Megatron-Core r0.8.0, images/model_table.png): GPT 1.7B to 462B on
    // 48 to 6,144 H100s, 48 data-parallel ranks each, with --overlap-grad-reduce and
    // --overlap-param-gather on, 408.8 to 489.1 TFLOP/s per GPU. Gradients accumulate over
    // the micro-batches, so the distributed optimizer's reduce-scatter starts only in the last
    // one's backward pass (Megatron-Core's `register_grad_ready`) and its all-gather hides
    // behind the first one's forward: with the table's 16 to 64 micro-batches per pipeline
    // most of the traffic stays exposed, and the pipelined rows land within 8 % with it (6 %
    // while Hopper's FP8 level was fitted apart from its bf16 one, which now carries the FP8
    // runs too and refitted 3 % higher).
    let all = outcomes();
    let rows = regime(&all, "megatron_h100", "GPT");
    assert_eq!(rows.len(), 11);
    for o in rows.iter().filter(|o| o.case.spec.strategies[0].pp > 2) {
        assert!(
            o.step_error.abs() < 0.08,
            "{}: {:+.3}",
            o.case.model,
            o.step_error
        );
        let mut spec = o.case.spec.clone();
        spec.train.overlap = Some(OverlapSpec {
            grad_reduce: Some(false),
            param_gather: Some(false),
            tp_comm: Some(true),
        });
        let exposed = CostModel::new(&spec)
            .unwrap()
            .estimate(&spec.strategies[0])
            .unwrap();
        let (hidden, all) = (o.estimate.time.dp_comm, exposed.time.dp_comm);
        let table_row = !o.case.model.contains("strong scaling");
        assert!(
            hidden < all && (hidden > 0.5 * all || !table_row),
            "{}: {hidden} s exposed with the overlaps on, {all} s with them off",
            o.case.model
        );
    }
    // The README's "superlinear" weak scaling: 41 % MFU for 1.7B on 48 GPUs, 47 % for 7.1B on
    // 96, the smaller model's narrower GEMMs filling less of each wave.
    let mfu = |model: &str| {
        rows.iter()
            .find(|o| o.case.model == model)
            .expect(model)
            .estimate
            .mfu
    };
    assert!(mfu("GPT 1.7B") < mfu("GPT 7.1B"));
    // Its strong scaling of the 177B at a fixed 1,152 sequences, 96 to 4,608 GPUs: 47 % to 42 %
    // MFU, "communication becomes more exposed at larger scale" (576 micro-batches per pipeline
    // become 12, behind the last of which the reduction must hide).
    let strong = regime(&all, "megatron_h100", "strong scaling");
    assert_eq!(strong.len(), 2);
    assert!(strong[1].estimate.mfu < 0.95 * strong[0].estimate.mfu);
}

#[test]
fn small_models_run_below_the_efficiency_of_large_ones() {
    // Narayanan et al. 2021, Table 1: 137 TFLOP/s per GPU for 1.7B on 32 A100s, 163 for 1T
    // on 3,072: narrow GEMMs fill fewer tiles per wave and the fixed per-layer costs weigh
    // more.
    let all = outcomes();
    let rows: Vec<_> = all
        .iter()
        .filter(|o| o.case.regime == "megatron_a100" && o.case.spec_text.contains("Table 1"))
        .collect();
    assert_eq!(rows.len(), 10);
    let smallest = rows.iter().min_by_key(|o| o.case.gpus).unwrap();
    let largest = rows.iter().max_by_key(|o| o.case.gpus).unwrap();
    assert!(
        smallest.estimate.hardware_tflops_per_gpu < largest.estimate.hardware_tflops_per_gpu,
        "{} vs {}",
        smallest.estimate.hardware_tflops_per_gpu,
        largest.estimate.hardware_tflops_per_gpu
    );
    for o in &rows {
        assert!(
            o.step_error.abs() < 0.2,
            "{}: {:+.3}",
            o.case.model,
            o.step_error
        );
    }
}

#[test]
fn moe_layers_cost_their_expert_loop_and_permutations() {
    // MegaScale-MoE (Jin et al. 2025, Table 3): a 352B MoE (32 experts, top-3, experts split
    // by tensor parallelism) under Megatron-LM on 240 to 1,440 H800s at a fixed batch of 720:
    // 39.9 s to 7.9 s, 630 to 519 tokens/s per GPU. Megatron-Core runs the 32 experts one
    // after another from Python, 768 tokens each: the loop runs at the host's pace (measured,
    // `EAGER_EXPERT_HOST`), not its GEMMs'. The per-GPU rate falls as the pipeline bubble and
    // the data-parallel traffic grow.
    let all = outcomes();
    let rows = regime(&all, "moe_h800", "352B");
    assert_eq!(rows.len(), 5);
    let rate = |o: &RegimeOutcome| o.estimate.tokens_per_s_per_gpu;
    assert!(
        rate(rows[4]) < 0.95 * rate(rows[0]),
        "{} vs {}",
        rate(rows[4]),
        rate(rows[0])
    );
    for o in &rows {
        assert!(
            o.step_error.abs() < 0.15,
            "{} GPUs: {:+.3}",
            o.case.gpus,
            o.step_error
        );
    }
}

#[test]
fn no_regime_is_biased_beyond_its_reported_bound() {
    let all = outcomes();
    let mut by_regime: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for o in &all {
        by_regime
            .entry(&o.case.regime)
            .or_default()
            .push(o.step_error);
    }
    let mut total = Vec::new();
    for (name, errors) in &by_regime {
        let bias = errors.iter().sum::<f64>() / errors.len() as f64;
        // The target: no regime biased beyond 10 %. The largest is torchao's float8
        // at −8.8 %; MegaScale's 175B was −12.6 % while its baseline was costed with
        // flash attention, which Megatron-LM's commit 285068c8 does not run by default.
        assert!(bias.abs() < 0.10, "{name}: bias {bias:+.3}");
        total.extend(errors.iter().map(|e| e.abs()));
    }
    let mean = total.iter().sum::<f64>() / total.len() as f64;
    assert!(mean < 0.08, "mean {mean:.3}");
}

#[test]
fn float8_recipes_cost_their_gemms_casts_and_gathers() {
    // torchao's float8 benchmark (pytorch/ao torchao/float8/README.md, 2025-03): torchtitan's
    // Llama 3 8B on one node of 8 H100s under FSDP2, compiled, 6,150 tokens/s per GPU in
    // bf16, 7,689.5 with tensor-wise float8 (and float8 all-gathers), 6,768 row-wise: 25 % and
    // 10 % faster. Each recipe's gain is its FP8 GEMMs at the measured rates less its casts,
    // which the row-wise recipe makes on more bytes (column scales, a transposed copy).
    let all = outcomes();
    let rows = regime(&all, "torchao_float8", "Llama3-8b");
    assert_eq!(rows.len(), 3);
    let step = |recipe: &str| {
        rows.iter()
            .find(|o| o.case.model.contains(recipe))
            .expect(recipe)
            .estimate
            .step_time_s
    };
    let tensorwise = step("bf16") / step("tensorwise");
    let rowwise = step("bf16") / step("rowwise");
    assert!(
        (1.12..1.30).contains(&tensorwise),
        "tensor-wise over bf16: {tensorwise:.3}"
    );
    assert!(
        (1.03..1.15).contains(&rowwise) && rowwise < tensorwise,
        "row-wise over bf16: {rowwise:.3}"
    );
    for o in &rows {
        assert!(
            o.step_error.abs() < 0.12,
            "{}: {:+.3}",
            o.case.model,
            o.step_error
        );
    }
}
