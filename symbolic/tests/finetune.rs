//! Adapter fine-tuning in the cost model against closed forms: LoRA's adapter count (PEFT's
//! 41,943,040 for Llama 3 8B at rank 16 on every projection), gradients and optimizer states
//! for the adapters alone, LoRA-FA's trained `B` and the activations it does not keep, and a
//! backward without the frozen weights' gradients.

use tessel_grammar::{
    load_str, FinetuneMethod, FinetuneSpec, LoraTargets, Offload, Spec, Strategy,
};
use tessel_symbolic::cost::{Calibration, CostModel, StageCost};

const LLAMA3_8B: &str = r#"
model llama3_8b {
  layers = 32; hidden = 4096; heads = 32; kv_heads = 8; ffn_hidden = 14336; vocab = 128256
  mlp = swiglu; norm = rmsnorm; tie_embeddings = false; max_seq_len = 8192
}
cluster node { gpu = H100_SXM; nodes = 1; gpus_per_node = 8
               intra_node = { bandwidth = 450 GB/s } }
train { model = llama3_8b; cluster = node; seq_len = 4096; global_batch = 8 }
"#;

fn spec(method: Option<FinetuneMethod>) -> Spec {
    let mut spec = load_str("ft.tsl", LLAMA3_8B).unwrap();
    spec.train.finetune = method.map(|method| FinetuneSpec {
        method,
        rank: 16,
        targets: LoraTargets::ALL,
    });
    spec
}

fn strategy() -> Strategy {
    Strategy {
        name: "one".into(),
        dp: 8,
        microbatch: 1,
        ..Strategy::default()
    }
}

/// The one stage's cost with `layers` layers: one micro-batch in flight.
fn stage(spec: &Spec, layers: u64) -> StageCost {
    let model = CostModel::with_calibration(spec, Calibration::default()).unwrap();
    let s = strategy();
    model.stage_cost(&s, 0, layers, s.recompute, Offload::default())
}

/// One layer's share of a memory component: two layers less one.
fn per_layer(spec: &Spec, pick: fn(&StageCost) -> f64) -> f64 {
    pick(&stage(spec, 2)) - pick(&stage(spec, 1))
}

/// LoRA's adapters of one Llama 3 8B layer at rank 16: q, k, v (A 4096×16 each, B 16×4096,
/// 16×1024, 16×1024), o (A 4096×16, B 16×4096), gate and up (A 4096×16, B 16×14336), down
/// (A 14336×16, B 16×4096).
const LORA_PER_LAYER: f64 = 1_310_720.0;
/// LoRA-FA trains the `B`s only.
const LORA_FA_PER_LAYER: f64 = 688_128.0;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs().max(1.0)
}

#[test]
fn adapters_alone_have_gradients_and_optimizer_states() {
    let lora = spec(Some(FinetuneMethod::Lora));
    assert_eq!(LORA_PER_LAYER * 32.0, 41_943_040.0);
    assert_eq!(
        lora.model.lora_params_per_token(16, LoraTargets::ALL),
        41_943_040
    );
    // fp32 gradients; ZeRO 0: master and Adam's moments, 12 bytes, unsharded.
    let grads = per_layer(&lora, |c| c.memory.gradients);
    assert!(close(grads, 4.0 * LORA_PER_LAYER), "{grads}");
    let optimizer = per_layer(&lora, |c| c.memory.optimizer);
    assert!(close(optimizer, 12.0 * LORA_PER_LAYER), "{optimizer}");
    // The frozen layer keeps its bf16 weights, and the adapters theirs.
    let full = spec(None);
    let full_weights = per_layer(&full, |c| c.memory.weights);
    let weights = per_layer(&lora, |c| c.memory.weights);
    assert!(
        close(weights - full_weights, 2.0 * LORA_PER_LAYER),
        "{weights}"
    );
    let fa = spec(Some(FinetuneMethod::LoraFa));
    let grads = per_layer(&fa, |c| c.memory.gradients);
    assert!(close(grads, 4.0 * LORA_FA_PER_LAYER), "{grads}");
    assert!(close(per_layer(&fa, |c| c.memory.weights), weights));
}

#[test]
fn lora_fa_keeps_no_inputs_of_the_frozen_projections() {
    let (s, b, h, ffn) = (4096.0, 1.0, 4096.0, 14336.0);
    let full = per_layer(&spec(None), |c| c.memory.activations);
    let lora = per_layer(&spec(Some(FinetuneMethod::Lora)), |c| c.memory.activations);
    let fa = per_layer(&spec(Some(FinetuneMethod::LoraFa)), |c| {
        c.memory.activations
    });
    // Seven adapters each keep their input's product with A: 16 wide, bf16.
    assert!(
        close(lora - full, 7.0 * 16.0 * 2.0 * s * b),
        "{}",
        lora - full
    );
    // LoRA-FA drops the two norms' outputs (the QKV and MLP inputs) and the down projection's
    // input, bf16.
    assert!(
        close(lora - fa, 2.0 * (2.0 * h + ffn) * s * b),
        "{}",
        lora - fa
    );
}

#[test]
fn frozen_weights_skip_their_weight_gradients() {
    let time = |spec: &Spec| stage(spec, 2).microbatch_s - stage(spec, 1).microbatch_s;
    let full = time(&spec(None));
    let lora = time(&spec(Some(FinetuneMethod::Lora)));
    let fa = time(&spec(Some(FinetuneMethod::LoraFa)));
    // Forward 1 and backward 2 GEMMs of each weight become forward 1 and backward 1; the
    // attention core and the rest are unchanged, and the adapters add a little.
    assert!(lora < 0.85 * full && lora > 0.6 * full, "{lora} vs {full}");
    assert!(fa < lora, "{fa} vs {lora}");
}
