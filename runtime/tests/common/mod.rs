//! What several runtime test binaries share.
// Each test crate includes this module and uses part of it.
#![allow(dead_code)]

use tessel_grammar::{MlpKind, ModelSpec, NormKind, PositionKind};
use tessel_runtime::backend::AdamParams;
use tessel_runtime::{LaunchOptions, LaunchReport};

/// A two-layer swiglu/RMSNorm/RoPE model with grouped-query attention and tied embeddings,
/// small enough for many ranks in one test.
pub fn tiny_model() -> ModelSpec {
    ModelSpec {
        name: "tiny".into(),
        layers: 2,
        hidden: 16,
        heads: 4,
        kv_heads: 2,
        head_dim: 4,
        ffn_hidden: 32,
        vocab: 64,
        mlp: MlpKind::Swiglu,
        norm: NormKind::Rmsnorm,
        tie_embeddings: true,
        bias: false,
        max_seq_len: None,
        position: PositionKind::Rope,
        moe: None,
        encoders: Vec::new(),
    }
}

/// Four gelu/LayerNorm layers with biases, learned positions and tied embeddings (the GPT
/// shape), 16 wide.
pub fn gelu_layernorm() -> ModelSpec {
    ModelSpec {
        name: "tiny-gelu".into(),
        layers: 4,
        hidden: 16,
        heads: 4,
        kv_heads: 2,
        head_dim: 4,
        ffn_hidden: 32,
        vocab: 32,
        mlp: MlpKind::Gelu,
        norm: NormKind::Layernorm,
        tie_embeddings: true,
        bias: true,
        max_seq_len: Some(16),
        position: PositionKind::Learned,
        moe: None,
        encoders: Vec::new(),
    }
}

/// The same with swiglu, RMSNorm, rotary positions, no biases and untied embeddings (the
/// Llama shape).
pub fn swiglu_rmsnorm() -> ModelSpec {
    ModelSpec {
        name: "tiny-swiglu".into(),
        mlp: MlpKind::Swiglu,
        norm: NormKind::Rmsnorm,
        tie_embeddings: false,
        bias: false,
        position: PositionKind::Rope,
        max_seq_len: None,
        ..gelu_layernorm()
    }
}

/// `steps` Adam steps collecting the final parameters. A larger epsilon keeps Adam from
/// turning rounding noise in gradients that are zero in exact arithmetic (the key bias:
/// softmax ignores a per-query constant) into full-size steps.
pub fn comparison_options(steps: u64) -> LaunchOptions {
    LaunchOptions {
        adam: AdamParams {
            lr: 3e-2,
            eps: 1e-4,
            ..AdamParams::default()
        },
        collect_parameters: true,
        seed: 11,
        ..LaunchOptions::new(steps)
    }
}

/// The largest difference between `a` and `b`, relative to `b`'s largest magnitude.
pub fn rel(a: &[f32], b: &[f32]) -> f64 {
    let scale = b
        .iter()
        .fold(0.0f64, |m, &x| m.max(f64::from(x).abs()))
        .max(1e-6);
    let diff = a
        .iter()
        .zip(b)
        .fold(0.0f64, |m, (&x, &y)| m.max(f64::from(x - y).abs()));
    diff / scale
}

/// `got` trained what `expect` trained: every step's loss and every final parameter within
/// relative error `tol`.
pub fn assert_same_run(got: &LaunchReport, expect: &LaunchReport, tol: f64) {
    assert_eq!(got.losses.len(), expect.losses.len());
    for (step, (a, b)) in got.losses.iter().zip(&expect.losses).enumerate() {
        assert!(((a - b) / b).abs() <= tol, "step {step}: loss {a} vs {b}");
    }
    let (gp, ep) = (
        got.parameters.as_ref().expect("parameters collected"),
        expect.parameters.as_ref().expect("parameters collected"),
    );
    assert_eq!(gp.keys().collect::<Vec<_>>(), ep.keys().collect::<Vec<_>>());
    for (name, want) in ep {
        let e = rel(&gp[name], want);
        assert!(e <= tol, "{name}: relative error {e}");
    }
}
