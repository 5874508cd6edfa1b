//! Shrinking a model for tests and CPU runs while keeping every structural feature: the
//! grouped-query ratio, MLP and norm kinds, biases, tying, positions, and the expert count,
//! top-k, pattern and shared experts of a mixture of experts.

use tessel_grammar::ModelSpec;

fn scaled(v: u64, factor: f64, multiple: u64, floor: u64) -> u64 {
    let x = ((v as f64 * factor) / multiple as f64).round() as u64 * multiple;
    x.max(floor)
}

/// Scales widths, vocabulary, head counts and depth by `factor` (in (0, 1]). Widths are kept
/// multiples of 8 so that common tensor-parallel degrees still divide them.
pub fn scale_model(model: &ModelSpec, factor: f64) -> ModelSpec {
    let factor = factor.clamp(f64::MIN_POSITIVE, 1.0);
    let ratio = (model.heads / model.kv_heads.max(1)).max(1);
    let kv_heads = scaled(model.kv_heads, factor, 1, 1).min(model.kv_heads.max(1));
    let head_dim = scaled(model.head_dim, factor, 2, 2).min(model.head_dim.max(2));
    let mut out = model.clone();
    out.kv_heads = kv_heads;
    out.heads = kv_heads * ratio;
    out.head_dim = head_dim;
    out.hidden = scaled(model.hidden, factor, 8, 8);
    out.ffn_hidden = scaled(model.ffn_hidden, factor, 8, 8);
    out.vocab = scaled(model.vocab, factor, 8, 16);
    let min_layers = model.moe.as_ref().map_or(1, |m| m.first_dense + m.every);
    out.layers = scaled(model.layers, factor, 1, min_layers).min(model.layers.max(min_layers));
    if let (Some(moe), Some(src)) = (out.moe.as_mut(), model.moe.as_ref()) {
        moe.expert_ffn_hidden = scaled(src.expert_ffn_hidden, factor, 8, 8);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessel_grammar::{MlpKind, MoeSpec, NormKind, PositionKind};

    #[test]
    fn keeps_structure_while_shrinking() {
        let m = ModelSpec {
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
        };
        let s = scale_model(&m, 1.0 / 64.0);
        assert_eq!(s.heads / s.kv_heads, 4);
        assert_eq!(s.hidden, 64);
        assert_eq!(s.layers, 1);
        assert_eq!(s.head_dim, 2);
        assert_eq!(s.vocab, 504);
        assert_eq!(s.mlp, MlpKind::Swiglu);
        let moe = s.moe.as_ref().unwrap();
        assert_eq!((moe.experts, moe.top_k), (8, 2));
        assert_eq!(moe.expert_ffn_hidden, 224);
        assert_eq!(scale_model(&m, 1.0), m);
    }
}
