//! Parameter counts and training FLOPs of a [`ModelSpec`], straight from its shape.
//!
//! Conventions (Megatron-LM's, so that published figures can be compared):
//! - parameters count every weight, bias, norm, embedding and (when untied) output matrix;
//! - training FLOPs per token are `6 ×` the matmul parameters a token touches (forward 2,
//!   backward 4), including the logits layer, plus `12 · layers · seq_len · heads · head_dim`
//!   for attention scores and values, without halving for causal masking. For a GPT block this
//!   is exactly `72·B·L·s·h²·(1 + s/6h + V/12hL)` per batch of `B·s` tokens.

use crate::spec::{
    EncoderSpec, FinetuneSpec, LoraTargets, MlpKind, ModelSpec, MoeSpec, NormKind, PositionKind,
    ProjectorKind,
};

/// Parameters of a model: everything stored, and what one token's forward pass uses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ParameterCount {
    pub total: u64,
    /// Parameters used per token; equals `total` for dense models.
    pub active: u64,
}

impl ModelSpec {
    /// Width of the attention's query (and output) projection: `heads · head_dim`.
    pub fn q_dim(&self) -> u64 {
        self.heads * self.head_dim
    }

    /// Width of each of the key and value projections: `kv_heads · head_dim`.
    pub fn kv_dim(&self) -> u64 {
        self.kv_heads * self.head_dim
    }

    /// Whether block `layer` (0-based) carries experts instead of a dense MLP.
    pub fn is_moe_layer(&self, layer: u64) -> bool {
        match &self.moe {
            None => false,
            Some(moe) => {
                layer >= moe.first_dense && (layer - moe.first_dense + 1).is_multiple_of(moe.every)
            }
        }
    }

    /// Number of blocks with experts.
    pub fn moe_layers(&self) -> u64 {
        (0..self.layers).filter(|&l| self.is_moe_layer(l)).count() as u64
    }

    /// Matmul weights of one MLP of width `ffn`.
    pub fn mlp_matmul_params(&self, ffn: u64) -> u64 {
        let matrices = match self.mlp {
            MlpKind::Gelu => 2,
            MlpKind::Swiglu => 3,
        };
        matrices * self.hidden * ffn
    }

    /// Matmul weights of the attention projections of one block.
    pub fn attention_matmul_params(&self) -> u64 {
        2 * self.hidden * self.q_dim() + 2 * self.hidden * self.kv_dim()
    }

    fn mlp_bias_params(&self, ffn: u64) -> u64 {
        if !self.bias {
            return 0;
        }
        match self.mlp {
            MlpKind::Gelu => ffn + self.hidden,
            MlpKind::Swiglu => 2 * ffn + self.hidden,
        }
    }

    fn norm_params(&self) -> u64 {
        match self.norm {
            NormKind::Layernorm => 2 * self.hidden,
            NormKind::Rmsnorm => self.hidden,
        }
    }

    /// Parameters of one block other than its MLP: attention, its biases, two norms.
    fn block_params_without_mlp(&self) -> u64 {
        let bias = if self.bias {
            self.q_dim() + 2 * self.kv_dim() + self.hidden
        } else {
            0
        };
        self.attention_matmul_params() + bias + 2 * self.norm_params()
    }

    fn embedding_params(&self) -> u64 {
        let positions = match self.position {
            PositionKind::Rope => 0,
            PositionKind::Learned => self.max_seq_len.unwrap_or(0) * self.hidden,
        };
        let output = if self.tie_embeddings {
            0
        } else {
            self.vocab * self.hidden
        };
        self.vocab * self.hidden + positions + output + self.norm_params()
    }

    fn expert_params(&self, moe: &MoeSpec) -> u64 {
        self.mlp_matmul_params(moe.expert_ffn_hidden) + self.mlp_bias_params(moe.expert_ffn_hidden)
    }

    /// Total and per-token active parameter counts.
    pub fn parameter_count(&self) -> ParameterCount {
        let dense_mlp =
            self.mlp_matmul_params(self.ffn_hidden) + self.mlp_bias_params(self.ffn_hidden);
        let moe_layers = self.moe_layers();
        let dense_layers = self.layers - moe_layers;
        let encoders: u64 = self
            .encoders
            .iter()
            .map(|e| e.parameters(self.hidden))
            .sum();
        let shared = self.embedding_params()
            + self.layers * self.block_params_without_mlp()
            + dense_layers * dense_mlp
            + encoders;
        match &self.moe {
            None => ParameterCount {
                total: shared,
                active: shared,
            },
            Some(moe) => {
                let expert = self.expert_params(moe);
                let router = self.hidden * moe.experts;
                let per_layer_total = (moe.experts + moe.shared_experts) * expert + router;
                let per_layer_active = (moe.top_k + moe.shared_experts) * expert + router;
                ParameterCount {
                    total: shared + moe_layers * per_layer_total,
                    active: shared + moe_layers * per_layer_active,
                }
            }
        }
    }

    /// Matmul parameters one token passes through, including the logits layer (and the router).
    pub fn active_matmul_params(&self) -> u64 {
        let moe_layers = self.moe_layers();
        let dense_layers = self.layers - moe_layers;
        let mut total = self.layers * self.attention_matmul_params()
            + dense_layers * self.mlp_matmul_params(self.ffn_hidden)
            + self.vocab * self.hidden;
        if let Some(moe) = &self.moe {
            let per_token = (moe.top_k + moe.shared_experts)
                * self.mlp_matmul_params(moe.expert_ffn_hidden)
                + self.hidden * moe.experts;
            total += moe_layers * per_token;
        }
        total
    }

    /// Model training FLOPs per token (forward and backward, no recompute) at `seq_len`.
    pub fn training_flops_per_token(&self, seq_len: u64) -> f64 {
        6.0 * self.active_matmul_params() as f64
            + 12.0 * (self.layers * seq_len * self.q_dim()) as f64
    }

    /// LoRA adapters of rank `rank` on `targets` that one token passes through: `A` and `B`
    /// beside each targeted projection (every expert's, for the experts it visits).
    pub fn lora_params_per_token(&self, rank: u64, targets: LoraTargets) -> u64 {
        let (h, q, kv) = (self.hidden, self.q_dim(), self.kv_dim());
        let mut per_layer = 0;
        if targets.qkv {
            per_layer += rank * (3 * h + q + 2 * kv);
        }
        if targets.o {
            per_layer += rank * (q + h);
        }
        let mlp = |ffn: u64| {
            let up = match self.mlp {
                MlpKind::Gelu => 1,
                MlpKind::Swiglu => 2,
            };
            rank * (up * (h + ffn) + ffn + h)
        };
        let mut total = self.layers * per_layer;
        if targets.mlp {
            let moe_layers = self.moe_layers();
            total += (self.layers - moe_layers) * mlp(self.ffn_hidden);
            if let Some(moe) = &self.moe {
                total += moe_layers * (moe.top_k + moe.shared_experts) * mlp(moe.expert_ffn_hidden);
            }
        }
        total
    }

    /// Training FLOPs per token of a job: [`Self::training_flops_per_token`], or under adapter
    /// fine-tuning the forward and the input gradients of the frozen model (4 per matmul
    /// parameter, no weight gradients) with the attention as before, plus the adapters trained
    /// as any parameter (6 each).
    /// With encoders, their training FLOPs per sample spread over its `seq_len` tokens.
    pub fn job_flops_per_token(&self, seq_len: u64, finetune: Option<&FinetuneSpec>) -> f64 {
        let language = match finetune.filter(|f| f.is_adapter()) {
            None => self.training_flops_per_token(seq_len),
            Some(f) => {
                4.0 * self.active_matmul_params() as f64
                    + 12.0 * (self.layers * seq_len * self.q_dim()) as f64
                    + 6.0 * self.lora_params_per_token(f.rank, f.targets) as f64
            }
        };
        let encoders: f64 = self
            .encoders
            .iter()
            .map(|e| e.items_per_sample.mean * e.training_flops_per_item(self.hidden))
            .sum();
        language + encoders / seq_len.max(1) as f64
    }
}

impl EncoderSpec {
    /// Matmul parameters of one encoder layer: attention (four `h × h`) and the MLP.
    pub fn layer_matmul_params(&self) -> u64 {
        let up = match self.mlp {
            MlpKind::Gelu => 1,
            MlpKind::Swiglu => 2,
        };
        4 * self.hidden * self.hidden + (up + 1) * self.hidden * self.ffn_hidden
    }

    /// Matmul parameters of the projector into a language model of width `llm_hidden`.
    pub fn projector_matmul_params(&self, llm_hidden: u64) -> u64 {
        match self.projector {
            ProjectorKind::Linear => self.projector_input() * llm_hidden,
            ProjectorKind::Mlp => {
                let middle = self.projector_middle(llm_hidden);
                self.projector_input() * middle + middle * llm_hidden
            }
        }
    }

    /// Width between an MLP projector's matrices.
    pub fn projector_middle(&self, llm_hidden: u64) -> u64 {
        self.projector_hidden.unwrap_or(llm_hidden)
    }

    /// Every weight: the layers with their biases and two norms each (ViTs carry biases), the
    /// final norm and the projector with its biases. The patch (frame) embedding is left out:
    /// its size depends on a patch size the spec does not give, and it is under 0.2 % of a ViT.
    pub fn parameters(&self, llm_hidden: u64) -> u64 {
        let h = self.hidden;
        let biases = 4 * h + self.ffn_hidden * if self.mlp == MlpKind::Swiglu { 2 } else { 1 } + h;
        let norm = match self.norm {
            NormKind::Layernorm => 2 * h,
            NormKind::Rmsnorm => h,
        };
        let projector_biases = match self.projector {
            ProjectorKind::Linear => llm_hidden,
            ProjectorKind::Mlp => self.projector_middle(llm_hidden) + llm_hidden,
        };
        self.layers * (self.layer_matmul_params() + biases + 2 * norm)
            + norm
            + self.projector_matmul_params(llm_hidden)
            + projector_biases
    }

    /// Forward FLOPs of the encoder's layers on one item: the matmuls, and attention scores and
    /// values over all its tokens (bidirectional: nothing masked).
    pub fn layers_forward_flops_per_item(&self) -> f64 {
        let t = self.tokens_per_item as f64;
        let layers = self.layers as f64;
        layers * (2.0 * t * self.layer_matmul_params() as f64 + 4.0 * t * t * self.hidden as f64)
    }

    /// Forward FLOPs of the projector on one item's merged tokens.
    pub fn projector_forward_flops_per_item(&self, llm_hidden: u64) -> f64 {
        2.0 * self.llm_tokens_per_item() as f64 * self.projector_matmul_params(llm_hidden) as f64
    }

    /// Training FLOPs of one item, Megatron's convention (backward twice the forward): the
    /// projector always trains; a frozen encoder runs forward only (it is the first module, so
    /// no gradient flows through it).
    pub fn training_flops_per_item(&self, llm_hidden: u64) -> f64 {
        let layers = if self.frozen { 1.0 } else { 3.0 };
        layers * self.layers_forward_flops_per_item()
            + 3.0 * self.projector_forward_flops_per_item(llm_hidden)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llama(layers: u64, hidden: u64, heads: u64, kv: u64, ffn: u64) -> ModelSpec {
        ModelSpec {
            name: "llama".into(),
            layers,
            hidden,
            heads,
            kv_heads: kv,
            head_dim: hidden / heads,
            ffn_hidden: ffn,
            vocab: 128_256,
            mlp: MlpKind::Swiglu,
            norm: NormKind::Rmsnorm,
            tie_embeddings: false,
            bias: false,
            max_seq_len: None,
            position: PositionKind::Rope,
            moe: None,
            encoders: Vec::new(),
        }
    }

    fn billions(n: u64) -> f64 {
        (n as f64 / 1e8).round() / 10.0
    }

    #[test]
    fn llama3_counts_match_published() {
        assert_eq!(
            billions(llama(32, 4096, 32, 8, 14336).parameter_count().total),
            8.0
        );
        assert_eq!(
            billions(llama(80, 8192, 64, 8, 28672).parameter_count().total),
            70.6
        );
        assert_eq!(
            billions(llama(126, 16384, 128, 8, 53248).parameter_count().total),
            405.9
        );
    }

    #[test]
    fn gpt3_matches_megatron_formula() {
        let gpt3 = ModelSpec {
            name: "gpt3".into(),
            layers: 96,
            hidden: 12288,
            heads: 96,
            kv_heads: 96,
            head_dim: 128,
            ffn_hidden: 4 * 12288,
            vocab: 51200,
            mlp: MlpKind::Gelu,
            norm: NormKind::Layernorm,
            tie_embeddings: true,
            bias: true,
            max_seq_len: Some(2048),
            position: PositionKind::Learned,
            moe: None,
            encoders: Vec::new(),
        };
        let (l, h, v, s): (f64, f64, f64, f64) = (96.0, 12288.0, 51200.0, 2048.0);
        let megatron = 12.0 * l * h * h * (1.0 + 13.0 / (12.0 * h) + (v + s) / (12.0 * l * h));
        // The formula leaves out the final layernorm (2h).
        assert_eq!(
            gpt3.parameter_count().total,
            megatron.round() as u64 + 2 * 12288
        );
        assert_eq!(billions(gpt3.parameter_count().total), 174.6);
        // 72·B·L·s·h²·(1 + s/6h + V/12hL) per B·s tokens.
        let per_token = 72.0 * l * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * h * l));
        let ours = gpt3.training_flops_per_token(2048);
        assert!(
            (ours - per_token).abs() / per_token < 1e-12,
            "{ours} vs {per_token}"
        );
    }

    #[test]
    fn mixtral_total_and_active() {
        let mut m = llama(32, 4096, 32, 8, 14336);
        m.vocab = 32000;
        m.moe = Some(MoeSpec {
            experts: 8,
            top_k: 2,
            every: 1,
            expert_ffn_hidden: 14336,
            shared_experts: 0,
            capacity_factor: 1.0,
            first_dense: 0,
        });
        let count = m.parameter_count();
        assert_eq!(billions(count.total), 46.7);
        assert_eq!(billions(count.active), 12.9);
    }
}
