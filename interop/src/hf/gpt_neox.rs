//! GPT-NeoX (`GPTNeoXForCausalLM`: GPT-NeoX-20B, Pythia): LayerNorm, partial rotary
//! embeddings, two-matrix GELU MLP, biases, parallel attention and MLP, untied embeddings.

use tessel_grammar::{ModelSpec, NormKind, PositionKind};

use super::activation::plain_mlp;
use super::config::HfConfig;
use super::error::ImportError;
use super::note::Note;
use super::shape::{note_partial_bias, note_rope_scaling, read_heads};

pub(crate) fn import(
    config: &HfConfig,
    name: String,
) -> Result<(ModelSpec, Vec<Note>), ImportError> {
    let mut notes = Vec::new();
    let hidden = config.positive("hidden_size")?;
    let layers = config.layers("num_hidden_layers")?;
    let heads = read_heads(config, hidden, "num_attention_heads", None, None)?;
    let ffn_hidden = config.positive("intermediate_size")?;
    let vocab = config.positive("vocab_size")?;
    let max_seq_len = config.length_opt("max_position_embeddings")?;
    let mlp = plain_mlp(config, "hidden_act", "gelu", &mut notes)?;
    let tie_embeddings = config.boolean("tie_word_embeddings")?.unwrap_or(false);

    // GPTNeoXConfig's default rotary fraction is 0.25; newer releases also spell it
    // `partial_rotary_factor`.
    let (rotary_field, rotary) = match config.number("rotary_pct")? {
        Some(x) => ("rotary_pct", x),
        None => (
            "partial_rotary_factor",
            config.number("partial_rotary_factor")?.unwrap_or(0.25),
        ),
    };
    if !(rotary > 0.0 && rotary <= 1.0) {
        return Err(config.unsupported(
            rotary_field,
            rotary.to_string(),
            "the rotary fraction must be in (0, 1]",
        ));
    }
    if rotary < 1.0 {
        notes.push(Note::on(
            "position",
            format!(
                "rotary embeddings on {}% of each head's dimensions ({rotary_field} = {rotary}); \
                 RoPE has no parameters, so this changes nothing Tessel counts",
                rotary * 100.0
            ),
        ));
    }
    note_rope_scaling(config, &mut notes)?;

    if config.boolean("use_parallel_residual")?.unwrap_or(true) {
        notes.push(Note::general(
            "use_parallel_residual: attention and MLP read the same block input and their \
             outputs are summed; not modelled (Tessel's sequential block has the same parameters \
             and FLOPs)",
        ));
    }

    // `attention_bias` (default true) covers the attention projections; the MLP always has
    // biases.
    let bias = if config.boolean("attention_bias")?.unwrap_or(true) {
        true
    } else {
        note_partial_bias(&mut notes, "the MLP", layers * (ffn_hidden + hidden));
        false
    };

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
        bias,
        max_seq_len,
        position: PositionKind::Rope,
        moe: None,
        encoders: Vec::new(),
    };
    Ok((spec, notes))
}
