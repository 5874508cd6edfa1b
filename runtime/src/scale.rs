//! Shrinking a model for tests and CPU runs while keeping every structural feature: the head
//! and key/value-head counts (so every tensor-parallel degree that divided them still does),
//! MLP and norm kinds, biases, tying, positions, and the expert count, top-k, pattern and
//! shared experts of a mixture of experts.

use tessel_grammar::ModelSpec;

/// Widths are rounded to multiples of this, so tensor-parallel degrees up to it still divide
/// the MLP width and the vocabulary.
const WIDTH_MULTIPLE: u64 = 64;

fn scaled(v: u64, factor: f64, multiple: u64) -> u64 {
    let x = ((v as f64 * factor) / multiple as f64).round() as u64 * multiple;
    x.max(multiple).min(v.max(multiple))
}

/// Scales head size, hidden and MLP widths, vocabulary and depth by `factor` (clamped to
/// (0, 1]). The depth stays at least `min_layers` (say `pp · interleave` of the plan to run)
/// and at least one expert block for a mixture of experts.
pub fn scale_model(model: &ModelSpec, factor: f64, min_layers: u64) -> ModelSpec {
    let factor = if factor > 0.0 { factor.min(1.0) } else { 1.0 };
    let mut out = model.clone();
    out.head_dim = scaled(model.head_dim, factor, 2);
    out.hidden = if model.hidden == model.heads * model.head_dim {
        model.heads * out.head_dim
    } else {
        scaled(model.hidden, factor, 8)
    };
    out.ffn_hidden = scaled(model.ffn_hidden, factor, WIDTH_MULTIPLE);
    out.vocab = scaled(model.vocab, factor, WIDTH_MULTIPLE);
    let moe_floor = model.moe.as_ref().map_or(1, |m| m.first_dense + m.every);
    let floor = min_layers.max(moe_floor);
    out.layers = ((model.layers as f64 * factor).round() as u64).max(floor);
    if let (Some(moe), Some(src)) = (out.moe.as_mut(), model.moe.as_ref()) {
        moe.expert_ffn_hidden = scaled(src.expert_ffn_hidden, factor, WIDTH_MULTIPLE);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessel_grammar::{MlpKind, MoeSpec, NormKind, PositionKind};

    fn mixtral() -> ModelSpec {
        ModelSpec {
            name: "mixtral-ish".into(),
            layers: 32,
            hidden: 4096,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            ffn_hidden: 14336,
            vocab: 32000,
            mlp: MlpKind::Swiglu,
            norm: NormKind::Rmsnorm,
            tie_embeddings: false,
            bias: false,
            max_seq_len: Some(4096),
            position: PositionKind::Rope,
            moe: Some(MoeSpec {
                experts: 8,
                top_k: 2,
                every: 1,
                expert_ffn_hidden: 14336,
                shared_experts: 0,
                capacity_factor: 1.25,
                first_dense: 0,
            }),
            encoders: Vec::new(),
        }
    }

    #[test]
    fn keeps_structure_while_shrinking() {
        let m = mixtral();
        let s = scale_model(&m, 1.0 / 64.0, 4);
        assert_eq!((s.heads, s.kv_heads), (32, 8));
        assert_eq!(s.head_dim, 2);
        assert_eq!(s.hidden, 64);
        assert_eq!(s.layers, 4);
        assert_eq!(s.ffn_hidden, 256);
        assert_eq!(s.vocab, 512);
        assert_eq!(s.mlp, MlpKind::Swiglu);
        let moe = s.moe.as_ref().unwrap();
        assert_eq!((moe.experts, moe.top_k), (8, 2));
        assert_eq!(moe.expert_ffn_hidden, 256);
        assert_eq!(scale_model(&m, 1.0, 1), m);
        assert_eq!(scale_model(&m, 0.0, 1), m);
    }

    #[test]
    fn a_scaled_model_trains_under_the_original_parallel_degrees() {
        use crate::{launch_cpu, ExecutionPlan, LaunchOptions};
        let s = scale_model(&mixtral(), 1.0 / 128.0, 2);
        let strategy = tessel_grammar::Strategy {
            name: "t".into(),
            dp: 2,
            tp: 8,
            ep: 2,
            recompute: tessel_grammar::Recompute::None,
            sequence_parallel: true,
            zero: 1,
            offload: Default::default(),
            ..tessel_grammar::Strategy::default()
        };
        let plan = ExecutionPlan::from_strategy(&s, &strategy, 2, 16).unwrap();
        let r = launch_cpu(&s, &plan, &LaunchOptions::new(1)).unwrap();
        assert!(r.losses[0].is_finite());
    }
}
