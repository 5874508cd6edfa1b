//! What several runtime test binaries share.

use tessel_grammar::{MlpKind, ModelSpec, NormKind, PositionKind};

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
    }
}
