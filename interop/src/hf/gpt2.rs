//! GPT-2 (`GPT2LMHeadModel`): learned positions, LayerNorm, two-matrix GELU MLP, biases
//! everywhere, tied embeddings.

use tessel_grammar::{ModelSpec, NormKind, PositionKind};

use super::activation::plain_mlp;
use super::config::HfConfig;
use super::error::ImportError;
use super::note::Note;
use super::shape::read_heads;

pub(crate) fn import(
    config: &HfConfig,
    name: String,
) -> Result<(ModelSpec, Vec<Note>), ImportError> {
    let mut notes = Vec::new();
    let hidden = config.positive("n_embd")?;
    let layers = config.layers("n_layer")?;
    let heads = read_heads(config, hidden, "n_head", None, None)?;
    // `n_inner: null` means 4 × n_embd (GPT2Config).
    let ffn_hidden = config.positive_opt("n_inner")?.unwrap_or(4 * hidden);
    let vocab = config.positive("vocab_size")?;
    let positions = config.positive("n_positions")?;
    let mlp = plain_mlp(config, "activation_function", "gelu_new", &mut notes)?;
    // PretrainedConfig's default, which GPT-2 keeps: input and output embeddings are shared.
    let tie_embeddings = config.boolean("tie_word_embeddings")?.unwrap_or(true);
    let spec = ModelSpec {
        name,
        layers,
        hidden,
        heads: heads.heads,
        kv_heads: heads.kv_heads,
        head_dim: heads.head_dim,
        ffn_hidden,
        vocab,
        mlp,
        norm: NormKind::Layernorm,
        tie_embeddings,
        bias: true,
        max_seq_len: Some(positions),
        position: PositionKind::Learned,
        moe: None,
        encoders: Vec::new(),
    };
    Ok((spec, notes))
}
