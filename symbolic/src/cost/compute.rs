//! Compute time of one transformer layer and of the embedding and logits, per GPU and
//! micro-batch, as expressions. Matmuls run at the size-dependent matmul efficiency (backward
//! is two GEMMs of the forward's size: data and weight gradients), the attention core at the
//! flash-attention efficiency or as batched GEMMs plus a memory-bound softmax, and everything
//! elementwise at a fraction of HBM bandwidth with its bytes counted.

use tessel_grammar::Fp8Scaling;

use super::context::{k, Ctx};
use crate::Expr;

/// Seconds of the pieces of one (average) layer for one micro-batch on one GPU.
pub(crate) struct LayerTimes {
    /// QKV and output projections, forward.
    pub attention_gemm_fwd: Expr,
    /// Scores, softmax and values, forward.
    pub attention_core_fwd: Expr,
    pub attention_core_bwd: Expr,
    /// Dense MLP or router + experts + shared experts, forward GEMMs.
    pub mlp_gemm_fwd: Expr,
    /// Norms, activations, dropout, residual adds, rotary embeddings, fp8 casts.
    pub elementwise_fwd: Expr,
    pub elementwise_bwd: Expr,
}

impl LayerTimes {
    pub fn forward(&self, ctx: &Ctx) -> Expr {
        Expr::sum([
            self.attention_gemm_fwd.clone(),
            self.attention_core_fwd.clone(),
            self.mlp_gemm_fwd.clone(),
            self.elementwise_fwd.clone(),
            k(ctx.cal.layer_overhead_s),
        ])
    }

    pub fn backward(&self, ctx: &Ctx) -> Expr {
        Expr::sum([
            k(2.0) * self.attention_gemm_fwd.clone(),
            self.attention_core_bwd.clone(),
            k(2.0) * self.mlp_gemm_fwd.clone(),
            self.elementwise_bwd.clone(),
            k(ctx.cal.layer_overhead_s),
        ])
    }
}

/// Backward of the flash-attention kernel relative to its forward: it recomputes the scores
/// (one extra QKᵀ) besides the two gradient GEMMs per forward GEMM, 5 GEMMs against 2.
const FLASH_BACKWARD_RATIO: f64 = 2.5;
/// Causal masking halves the attention work when the kernel skips masked blocks.
const CAUSAL_FRACTION: f64 = 0.5;
/// HBM bytes per attention-score element of the unfused path (fp16/bf16): forward the fused
/// scale-mask-softmax reads and writes 2 + 2, backward softmax reads the gradient and the
/// probabilities and writes 2 + 2 + 2. Dropout adds, forward, a read of 2 and writes of 2 and
/// a 1-byte mask, backward a read of the gradient and mask and a write, 2 + 1 + 2.
const SCORE_BYTES_FWD: f64 = 4.0;
const SCORE_BYTES_BWD: f64 = 6.0;
const SCORE_DROPOUT_BYTES_FWD: f64 = 5.0;
const SCORE_DROPOUT_BYTES_BWD: f64 = 5.0;

/// HBM bytes per element of an FP8 GEMM input to cast it. Delayed scaling knows the scale
/// beforehand: read 2, write 1 (Transformer Engine fuses the transposed copy into the same
/// pass). Tensor-wise dynamic scaling first reads the tensor for its amax: 2 more. Row-wise
/// scaling needs row scales for the GEMM and column scales for its transpose in the other
/// gradient GEMM: one pass reading 2 and writing 1 for the rows, an amax pass and a cast of
/// the columns, 2 + 2 + 1.
fn fp8_cast_bytes(scaling: Fp8Scaling) -> f64 {
    match scaling {
        Fp8Scaling::Delayed => 3.0,
        Fp8Scaling::Tensorwise => 5.0,
        Fp8Scaling::Rowwise => 8.0,
    }
}

pub(crate) fn layer_times(ctx: &Ctx) -> LayerTimes {
    let t = ctx.t.clone();
    let tokens = ctx.tokens();
    let h = ctx.hidden;
    let act = ctx.bytes.activation / 2.0;
    let rep = ctx.replicated_divisor();

    // Key/value heads replicated past `kv_split` are projected on every rank that holds them.
    let qkv_width = k(ctx.q_dim) / t.clone() + k(2.0 * ctx.kv_dim) / ctx.kv_split();
    let qkv = ctx.gemm(
        k(2.0 * h) * qkv_width.clone() * tokens.clone(),
        vec![tokens.clone(), k(h), qkv_width],
    );
    let proj = ctx.gemm(
        k(2.0 * h * ctx.q_dim) * tokens.clone() / t.clone(),
        vec![tokens.clone(), k(h), k(ctx.q_dim) / t.clone()],
    );
    let attention_gemm_fwd = qkv + proj;

    let (attention_core_fwd, attention_core_bwd) = if ctx.flash {
        let flops = k(4.0 * ctx.seq * ctx.q_dim * CAUSAL_FRACTION) * tokens.clone() / t.clone();
        let fwd = flops / (ctx.attention_peak * ctx.efficiency.attention);
        (fwd.clone(), k(FLASH_BACKWARD_RATIO) * fwd)
    } else {
        let flops = k(4.0 * ctx.seq * ctx.q_dim) * tokens.clone() / t.clone();
        let mut bmm = ctx.gemm(flops, vec![ctx.local_seq(), k(ctx.head_dim), k(ctx.seq)]);
        if misaligned_heads(ctx) {
            bmm = bmm / ctx.cal.misaligned_matmul;
        }
        let scores = k(ctx.heads * ctx.seq) * tokens.clone() / t.clone();
        let dropout = ctx.dropout;
        let fwd_bytes = SCORE_BYTES_FWD + dropout * SCORE_DROPOUT_BYTES_FWD;
        let bwd_bytes = SCORE_BYTES_BWD + dropout * SCORE_DROPOUT_BYTES_BWD;
        let fwd = bmm.clone() + ctx.memory_bound(scores.clone() * (fwd_bytes * act));
        let bwd = k(2.0) * bmm + ctx.memory_bound(scores * (bwd_bytes * act));
        (fwd, bwd)
    };

    let dense_mlp = mlp_gemms(ctx, tokens.clone(), ctx.ffn);
    let (mlp_gemm_fwd, mlp_width) = match &ctx.moe {
        None => (dense_mlp, k(ctx.ffn)),
        Some(moe) => {
            let router = ctx.gemm(
                k(2.0 * h * moe.experts) * tokens.clone(),
                vec![tokens.clone(), k(h), k(moe.experts)],
            );
            let routed = tokens.clone() * (moe.top_k * moe.capacity);
            let per_expert = routed.clone() * ctx.e.clone() / moe.experts;
            let experts = mlp_gemms_rows(ctx, routed, per_expert, moe.expert_ffn);
            let shared = if moe.shared > 0.0 {
                mlp_gemms(ctx, tokens.clone(), moe.expert_ffn * moe.shared)
            } else {
                k(0.0)
            };
            let moe_fwd = router + experts + shared;
            let fraction = ctx.moe_fraction();
            let mixed = (k(1.0) - fraction.clone()) * dense_mlp + fraction.clone() * moe_fwd;
            let moe_width = moe.expert_ffn * (moe.top_k * moe.capacity + moe.shared);
            let width = k(ctx.ffn) + fraction * (moe_width - ctx.ffn);
            (mixed, width)
        }
    };

    // Elementwise HBM bytes per token (2-byte elements). Forward: two norms (read + write
    // 2h each), two fused bias-residual adds (read 2h + 2h, write 2h; with dropout also a
    // mask h), activation (gelu: read + write the ffn width; swiglu: read two, write one).
    // Backward: norms 6h each, residual-gradient add 4h each and with dropout its backward
    // 5h each, activation gelu 6·ffn, swiglu 10·ffn.
    let (act_fwd, act_bwd) = if ctx.mlp_matrices > 2.0 {
        (6.0, 10.0)
    } else {
        (4.0, 6.0)
    };
    let replicated_fwd = k((20.0 + 2.0 * ctx.dropout) * h * act) * tokens.clone() / rep.clone();
    // Compiled blocks write the norms' outputs (2h each) and the down projection's input
    // again in backward, where the weight gradients need them (see `cost::memory`).
    let (rebuilt_norms, rebuilt_down_input) = if ctx.compiled { (4.0, 2.0) } else { (0.0, 0.0) };
    let replicated_bwd =
        k((20.0 + rebuilt_norms + 10.0 * ctx.dropout) * h * act) * tokens.clone() / rep.clone();
    let sharded_fwd = k(act_fwd * act) * mlp_width.clone() * tokens.clone() / t.clone();
    let sharded_bwd =
        k((act_bwd + rebuilt_down_input) * act) * mlp_width.clone() * tokens.clone() / t.clone();
    let rotary = if ctx.rope {
        k(4.0 * act) * tokens.clone() * (k(ctx.q_dim) / t.clone() + k(ctx.kv_dim) / ctx.kv_split())
    } else {
        k(0.0)
    };
    // FP8 GEMMs cast their inputs in forward and their output gradients in backward.
    let casts = if ctx.is_fp8() {
        k(fp8_cast_bytes(ctx.fp8_scaling))
            * tokens.clone()
            * (k(2.0 * h) / rep.clone() + (mlp_width + ctx.q_dim) / t.clone())
    } else {
        k(0.0)
    };
    let elementwise_fwd = ctx.memory_bound(Expr::sum([
        replicated_fwd,
        sharded_fwd,
        rotary.clone(),
        casts.clone(),
    ]));
    let elementwise_bwd = ctx.memory_bound(Expr::sum([replicated_bwd, sharded_bwd, rotary, casts]));

    LayerTimes {
        attention_gemm_fwd: ctx.bind(attention_gemm_fwd),
        attention_core_fwd: ctx.bind(attention_core_fwd),
        attention_core_bwd: ctx.bind(attention_core_bwd),
        mlp_gemm_fwd: ctx.bind(mlp_gemm_fwd),
        elementwise_fwd: ctx.bind(elementwise_fwd),
        elementwise_bwd: ctx.bind(elementwise_bwd),
    }
}

/// Whether the score and value GEMMs run on misaligned operands. Q, K and V are slices of the
/// fused QKV projection's output, each head `head_dim` elements: unless `head_dim` elements
/// fill whole 16-byte words, cuBLAS cannot use its vectorised tensor-core kernels (NVIDIA's
/// Matrix Multiplication Background User's Guide, "Tensor Core Requirements"), and those GEMMs
/// run at the calibrated `misaligned_matmul` fraction of the aligned rate.
fn misaligned_heads(ctx: &Ctx) -> bool {
    (ctx.head_dim * ctx.bytes.activation) % GEMM_ALIGNMENT_BYTES != 0.0
}

/// Operand alignment tensor-core GEMMs need for full speed.
const GEMM_ALIGNMENT_BYTES: f64 = 16.0;

/// Forward GEMMs of an MLP of width `ffn` over `rows` tokens, sharded over tp.
fn mlp_gemms(ctx: &Ctx, rows: Expr, ffn: f64) -> Expr {
    mlp_gemms_rows(ctx, rows.clone(), rows, ffn)
}

/// MLP GEMMs over `rows` tokens in total, each GEMM having `gemm_rows` rows (fewer for
/// experts, which split the routed tokens).
fn mlp_gemms_rows(ctx: &Ctx, rows: Expr, gemm_rows: Expr, ffn: f64) -> Expr {
    let t = ctx.t.clone();
    let h = ctx.hidden;
    let up_width = (ctx.mlp_matrices - 1.0) * ffn;
    let up = ctx.gemm(
        k(2.0 * h * up_width) * rows.clone() / t.clone(),
        vec![gemm_rows.clone(), k(h), k(up_width) / t.clone()],
    );
    let down = ctx.gemm(
        k(2.0 * h * ffn) * rows / t.clone(),
        vec![gemm_rows, k(h), k(ffn) / t],
    );
    up + down
}

/// Seconds of the embedding (first device) for one micro-batch, forward and backward: a
/// gather writing `2h` bytes per token, and a scatter-add of the gradient reading 2 and
/// updating 8 bytes per element.
pub(crate) fn embedding_time(ctx: &Ctx) -> Expr {
    ctx.memory_bound(ctx.tokens() * (12.0 * ctx.hidden))
}

/// Seconds of the final norm, the logits GEMM and the cross-entropy (last device) for one
/// micro-batch, forward and backward. The vocabulary is split over tp.
pub(crate) fn head_time(ctx: &Ctx) -> Expr {
    let t = ctx.t.clone();
    let tokens = ctx.tokens();
    let h = ctx.hidden;
    let logits = ctx.gemm(
        k(2.0 * h * ctx.vocab) * tokens.clone() / t.clone(),
        vec![tokens.clone(), k(h), k(ctx.vocab) / t.clone()],
    );
    // Cross-entropy: fp32 upcast, softmax and its gradient, about 18 bytes per logit.
    let cross_entropy = ctx.memory_bound(k(18.0 * ctx.vocab) * tokens.clone() / t);
    let norm = ctx.memory_bound(k(10.0 * h) * tokens / ctx.replicated_divisor());
    k(3.0) * logits + cross_entropy + norm
}
