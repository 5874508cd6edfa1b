//! The Llama family and its relatives that share its config layout: Llama, Mistral, Mixtral,
//! Qwen2 and Qwen2-MoE (pre-norm RMSNorm blocks, rotary positions, gated MLP).

use tessel_grammar::{ModelSpec, MoeSpec, NormKind, PositionKind};

use super::activation::gated_mlp;
use super::config::HfConfig;
use super::error::ImportError;
use super::moe::{self, check_top_k, dropless_note, note_inexact_layout};
use super::note::Note;
use super::shape::{note_partial_bias, note_rope_scaling, note_sliding_window, read_heads};
use crate::number_format::thousands;

pub(crate) fn import(
    config: &HfConfig,
    name: String,
) -> Result<(ModelSpec, Vec<Note>), ImportError> {
    let model_type = config.model_type().to_string();
    let mut notes = Vec::new();
    let hidden = config.positive("hidden_size")?;
    let layers = config.layers("num_hidden_layers")?;
    let heads = read_heads(
        config,
        hidden,
        "num_attention_heads",
        Some("num_key_value_heads"),
        Some("head_dim"),
    )?;
    let ffn_hidden = config.positive("intermediate_size")?;
    let vocab = config.positive("vocab_size")?;
    let mlp = gated_mlp(config, "hidden_act", "silu", &mut notes)?;
    let tie_embeddings = config.boolean("tie_word_embeddings")?.unwrap_or(false);
    let max_seq_len = config.length_opt("max_position_embeddings")?;
    note_rope_scaling(config, &mut notes)?;
    note_sliding_window(config, &mut notes)?;

    let q_dim = heads.heads * heads.head_dim;
    let kv_dim = heads.kv_heads * heads.head_dim;
    let bias = match model_type.as_str() {
        "qwen2" | "qwen2_moe" => {
            // Qwen2 hard-codes biases on q, k and v and nowhere else.
            note_partial_bias(
                &mut notes,
                "the q, k and v projections",
                layers * (q_dim + 2 * kv_dim),
            );
            false
        }
        "llama" => {
            let attention = config.boolean("attention_bias")?.unwrap_or(false);
            let mlp_bias = config.boolean("mlp_bias")?.unwrap_or(false);
            match (attention, mlp_bias) {
                (true, true) => true,
                (false, false) => false,
                (true, false) => {
                    note_partial_bias(
                        &mut notes,
                        "the attention projections",
                        layers * (q_dim + 2 * kv_dim + hidden),
                    );
                    false
                }
                (false, true) => {
                    note_partial_bias(&mut notes, "the MLP", layers * (2 * ffn_hidden + hidden));
                    false
                }
            }
        }
        _ => false,
    };

    let moe = match model_type.as_str() {
        "mixtral" => Some(mixtral_experts(config, ffn_hidden, &mut notes)?),
        "qwen2_moe" => Some(qwen2_moe_experts(config, layers, hidden, &mut notes)?),
        _ => None,
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
        norm: NormKind::Rmsnorm,
        tie_embeddings,
        bias,
        max_seq_len,
        position: PositionKind::Rope,
        moe,
        encoders: Vec::new(),
    };
    Ok((spec, notes))
}

fn mixtral_experts(
    config: &HfConfig,
    ffn_hidden: u64,
    notes: &mut Vec<Note>,
) -> Result<MoeSpec, ImportError> {
    let experts = config.positive("num_local_experts")?;
    let top_k = config.positive("num_experts_per_tok")?;
    check_top_k(config, "num_experts_per_tok", top_k, experts)?;
    notes.push(dropless_note());
    Ok(MoeSpec {
        experts,
        top_k,
        every: 1,
        expert_ffn_hidden: ffn_hidden,
        shared_experts: 0,
        capacity_factor: 1.0,
        first_dense: 0,
    })
}

fn qwen2_moe_experts(
    config: &HfConfig,
    layers: u64,
    hidden: u64,
    notes: &mut Vec<Note>,
) -> Result<MoeSpec, ImportError> {
    let experts = config.positive("num_experts")?;
    let top_k = config.positive("num_experts_per_tok")?;
    check_top_k(config, "num_experts_per_tok", top_k, experts)?;
    let expert_ffn_hidden = config.positive("moe_intermediate_size")?;
    let shared_width = config
        .small_count("shared_expert_intermediate_size")?
        .unwrap_or(0);
    let step = config.positive_opt("decoder_sparse_step")?.unwrap_or(1);
    let dense_only = config.count_list("mlp_only_layers")?;
    if let Some(&bad) = dense_only.iter().find(|&&l| l >= layers) {
        return Err(config.unsupported(
            "mlp_only_layers",
            bad.to_string(),
            format!("the model has only {layers} blocks"),
        ));
    }
    // Qwen2-MoE: experts in block l when (l + 1) % decoder_sparse_step == 0, except the
    // blocks listed in mlp_only_layers.
    let source: Vec<bool> = (0..layers)
        .map(|l| !dense_only.contains(&l) && (l + 1) % step == 0)
        .collect();
    let layout = moe::fit(&source).ok_or_else(|| {
        config.unsupported(
            "mlp_only_layers",
            format!("{dense_only:?}"),
            "it leaves no block with experts",
        )
    })?;
    note_inexact_layout(&layout, notes);

    // One shared expert of width `shared_width`; Tessel counts shared experts in units of
    // `expert_ffn_hidden`.
    let shared_experts = if shared_width == 0 {
        0
    } else {
        let units = (shared_width as f64 / expert_ffn_hidden as f64)
            .round()
            .max(1.0) as u64;
        if units * expert_ffn_hidden != shared_width {
            notes.push(Note::on(
                "moe",
                format!(
                    "the shared expert is {shared_width} wide, not a multiple of \
                     moe_intermediate_size {expert_ffn_hidden}; written as {units} shared \
                     experts of {expert_ffn_hidden}"
                ),
            ));
        } else if units > 1 {
            notes.push(Note::on(
                "moe",
                format!(
                    "the one shared expert of width {shared_width} is written as {units} shared \
                     experts of {expert_ffn_hidden} (the same parameters and FLOPs)"
                ),
            ));
        }
        notes.push(Note::on(
            "moe",
            format!(
                "the shared expert's sigmoid gate ({} parameters per expert block) is left out",
                thousands(hidden)
            ),
        ));
        units
    };
    notes.push(dropless_note());
    Ok(MoeSpec {
        experts,
        top_k,
        every: layout.every,
        expert_ffn_hidden,
        shared_experts,
        capacity_factor: 1.0,
        first_dense: layout.first_dense,
    })
}
