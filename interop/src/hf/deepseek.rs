//! DeepSeek-V2 and DeepSeek-V3 (`DeepseekV2ForCausalLM`, `DeepseekV3ForCausalLM`): fine-grained
//! MoE with shared experts and leading dense blocks, and multi-head latent attention (MLA).
//!
//! Tessel's attention is grouped-query attention, `heads · head_dim` wide. MLA compresses keys
//! and values into one latent shared by all heads (and, in V3, queries into another) and
//! expands them per head, so its projections hold far fewer weights than an attention of the
//! same per-head widths. The import keeps the head count and picks `kv_heads` and `head_dim` so
//! that the projection weights per block equal MLA's: parameter counts, optimizer state and
//! matmul FLOPs then match, and the attention-score width `heads · head_dim` comes out smaller
//! than MLA's. The output comment states both differences in numbers.

use tessel_grammar::{ModelSpec, MoeSpec, NormKind, PositionKind};

use super::activation::gated_mlp;
use super::config::HfConfig;
use super::error::ImportError;
use super::moe::{self, check_top_k, dropless_note, note_inexact_layout};
use super::note::Note;
use super::shape::{note_partial_bias, note_rope_scaling};
use crate::number_format::{percent_change, thousands};

/// KV heads of the approximation: MLA's keys and values come from one latent shared by all
/// heads, so few KV heads fit it best; eight keeps tensor parallelism up to a node's eight GPUs
/// expressible when the planner requires `kv_heads` to divide by `tp`.
const MAX_APPROX_KV_HEADS: u64 = 8;

/// The shape of multi-head latent attention, from the config.
#[derive(Clone, Copy, Debug)]
struct Mla {
    q_lora_rank: Option<u64>,
    kv_lora_rank: u64,
    qk_nope_head_dim: u64,
    qk_rope_head_dim: u64,
    v_head_dim: u64,
}

impl Mla {
    /// Weights of the query, key/value and output projections of one block.
    fn matmul_params(&self, hidden: u64, heads: u64) -> u128 {
        let (h, n) = (hidden as u128, heads as u128);
        let qk = (self.qk_nope_head_dim + self.qk_rope_head_dim) as u128;
        let query = match self.q_lora_rank {
            Some(r) => h * r as u128 + r as u128 * n * qk,
            None => h * n * qk,
        };
        let kv_lora = self.kv_lora_rank as u128;
        let key_value = h * (kv_lora + self.qk_rope_head_dim as u128)
            + kv_lora * n * (self.qk_nope_head_dim + self.v_head_dim) as u128;
        let output = n * self.v_head_dim as u128 * h;
        query + key_value + output
    }

    /// Norm weights on the latents, which Tessel's block does not have.
    fn latent_norm_params(&self) -> u64 {
        self.q_lora_rank.unwrap_or(0) + self.kv_lora_rank
    }

    /// The width attention scores and values run over, per token: QKᵀ over the query/key
    /// head width, AV over the value head width; Tessel's cost uses one width for both.
    fn score_width(&self, heads: u64) -> f64 {
        let qk = (self.qk_nope_head_dim + self.qk_rope_head_dim) as f64;
        heads as f64 * (qk + self.v_head_dim as f64) / 2.0
    }
}

/// The largest divisor of `heads` not above [`MAX_APPROX_KV_HEADS`].
fn approx_kv_heads(heads: u64) -> u64 {
    (1..=MAX_APPROX_KV_HEADS.min(heads))
        .rev()
        .find(|d| heads.is_multiple_of(*d))
        .unwrap_or(1)
}

pub(crate) fn import(
    config: &HfConfig,
    name: String,
) -> Result<(ModelSpec, Vec<Note>), ImportError> {
    let mut notes = Vec::new();
    let hidden = config.positive("hidden_size")?;
    let layers = config.layers("num_hidden_layers")?;
    let heads = config.positive("num_attention_heads")?;
    let ffn_hidden = config.positive("intermediate_size")?;
    let vocab = config.positive("vocab_size")?;
    let mlp = gated_mlp(config, "hidden_act", "silu", &mut notes)?;
    let tie_embeddings = config.boolean("tie_word_embeddings")?.unwrap_or(false);
    let max_seq_len = config.length_opt("max_position_embeddings")?;

    let mla = Mla {
        q_lora_rank: config.positive_opt("q_lora_rank")?,
        kv_lora_rank: config.positive("kv_lora_rank")?,
        qk_nope_head_dim: config.positive("qk_nope_head_dim")?,
        qk_rope_head_dim: config.positive("qk_rope_head_dim")?,
        v_head_dim: config.positive("v_head_dim")?,
    };
    let target = mla.matmul_params(hidden, heads);
    let kv_heads = approx_kv_heads(heads);
    let per_head_dim = 2 * hidden as u128 * (heads + kv_heads) as u128;
    let head_dim = ((target + per_head_dim / 2) / per_head_dim).max(1) as u64;
    let approx = per_head_dim * head_dim as u128;
    let q_rank = mla
        .q_lora_rank
        .map_or("none".to_string(), |r| r.to_string());
    notes.push(Note::on(
        "head_dim",
        format!(
            "multi-head latent attention (q_lora_rank {q_rank}, kv_lora_rank {}, \
             qk_nope_head_dim {}, qk_rope_head_dim {}, v_head_dim {}) is approximated as \
             grouped-query attention with {kv_heads} KV heads and head_dim {head_dim}, chosen so \
             the projection weights per block match MLA's: {} against {} ({}). Attention \
             scores are costed over heads·head_dim = {} against MLA's {}·({} + {})/2 = {} ({}); \
             the latent norms ({} parameters per block) are left out",
            mla.kv_lora_rank,
            mla.qk_nope_head_dim,
            mla.qk_rope_head_dim,
            mla.v_head_dim,
            thousands(approx as u64),
            thousands(target as u64),
            percent_change(approx as f64, target as f64),
            heads * head_dim,
            heads,
            mla.qk_nope_head_dim + mla.qk_rope_head_dim,
            mla.v_head_dim,
            mla.score_width(heads),
            percent_change((heads * head_dim) as f64, mla.score_width(heads)),
            thousands(mla.latent_norm_params()),
        ),
    ));
    note_rope_scaling(config, &mut notes)?;

    // Biases on MLA's projections have no counterpart in the approximation's shapes.
    if config.boolean("attention_bias")?.unwrap_or(false) {
        note_partial_bias(
            &mut notes,
            "the attention projections",
            layers * (heads * head_dim + 2 * kv_heads * head_dim + hidden),
        );
    }

    let moe = match config.positive_opt("n_routed_experts")? {
        None => None,
        Some(experts) => Some(experts_of(config, layers, experts, &mut notes)?),
    };

    if let Some(mtp) = config.positive_opt("num_nextn_predict_layers")? {
        notes.push(Note::general(format!(
            "{mtp} multi-token-prediction module(s) (num_nextn_predict_layers) not modelled; \
             DeepSeek's published parameter totals leave them out too"
        )));
    }

    let spec = ModelSpec {
        name,
        layers,
        hidden,
        heads,
        kv_heads,
        head_dim,
        ffn_hidden,
        vocab,
        mlp,
        norm: NormKind::Rmsnorm,
        tie_embeddings,
        bias: false,
        max_seq_len,
        position: PositionKind::Rope,
        moe,
        encoders: Vec::new(),
    };
    Ok((spec, notes))
}

fn experts_of(
    config: &HfConfig,
    layers: u64,
    experts: u64,
    notes: &mut Vec<Note>,
) -> Result<MoeSpec, ImportError> {
    let top_k = config.positive("num_experts_per_tok")?;
    check_top_k(config, "num_experts_per_tok", top_k, experts)?;
    let expert_ffn_hidden = config.positive("moe_intermediate_size")?;
    let shared_experts = config.small_count("n_shared_experts")?.unwrap_or(0);
    let first_k_dense = config.small_count("first_k_dense_replace")?.unwrap_or(0);
    let freq = config.positive_opt("moe_layer_freq")?.unwrap_or(1);
    // DeepSeek: experts in block l when l >= first_k_dense_replace and l % moe_layer_freq == 0.
    let source: Vec<bool> = (0..layers)
        .map(|l| l >= first_k_dense && l % freq == 0)
        .collect();
    let layout = moe::fit(&source).ok_or_else(|| {
        config.unsupported(
            "first_k_dense_replace",
            first_k_dense.to_string(),
            format!("it leaves no block of the {layers} with experts"),
        )
    })?;
    note_inexact_layout(&layout, notes);
    notes.push(dropless_note());
    let groups = config.small_count("n_group")?.unwrap_or(1);
    if groups > 1 {
        let top_groups = config.small_count("topk_group")?.unwrap_or(groups);
        notes.push(Note::general(format!(
            "group-limited routing (n_group {groups}, topk_group {top_groups}) is not modelled: \
             it bounds how many expert groups one token's all-to-all reaches"
        )));
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_heads_divide_heads() {
        assert_eq!(approx_kv_heads(128), 8);
        assert_eq!(approx_kv_heads(16), 8);
        assert_eq!(approx_kv_heads(6), 6);
        assert_eq!(approx_kv_heads(12), 6);
        assert_eq!(approx_kv_heads(7), 7);
        assert_eq!(approx_kv_heads(11), 1);
    }

    #[test]
    fn v3_mla_projection_weights() {
        // DeepSeek-V3: hidden 7168, 128 heads; per-block projections from the paper's shapes.
        let mla = Mla {
            q_lora_rank: Some(1536),
            kv_lora_rank: 512,
            qk_nope_head_dim: 128,
            qk_rope_head_dim: 64,
            v_head_dim: 128,
        };
        let by_matrix =
            7168 * 1536 + 1536 * 128 * 192 + 7168 * (512 + 64) + 512 * 128 * 256 + 128 * 128 * 7168;
        assert_eq!(mla.matmul_params(7168, 128), by_matrix as u128);
        assert_eq!(mla.score_width(128), 20480.0);
    }
}
