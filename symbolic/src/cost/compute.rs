//! Compute time of one transformer layer and of the embedding and logits, per GPU and
//! micro-batch, as expressions. Matmuls run at the size-dependent matmul efficiency (backward
//! is two GEMMs of the forward's size: data and weight gradients), the attention core at the
//! flash-attention efficiency or as batched GEMMs plus a memory-bound softmax, and everything
//! elementwise at a fraction of HBM bandwidth with its bytes counted.

use tessel_grammar::{Fp8Scaling, Framework};

use super::context::{k, Adapters, Ctx, Matmul};
use crate::primitives::{
    EAGER_EXPERT_HOST, GELU_BYTES, NORM_BYTES, RESIDUAL_ADD_BYTES, SWIGLU_BYTES,
};
use crate::Expr;

/// Seconds of the pieces of one (average) layer for one micro-batch on one GPU.
pub(crate) struct LayerTimes {
    /// QKV and output projections, forward and backward.
    pub attention_gemm_fwd: Expr,
    pub attention_gemm_bwd: Expr,
    /// Scores, softmax and values, forward.
    pub attention_core_fwd: Expr,
    pub attention_core_bwd: Expr,
    /// Dense MLP or router + experts + shared experts, forward and backward GEMMs.
    pub mlp_gemm_fwd: Expr,
    pub mlp_gemm_bwd: Expr,
    /// Norms, activations, dropout, residual adds, rotary embeddings, fp8 casts.
    pub elementwise_fwd: Expr,
    pub elementwise_bwd: Expr,
    /// Of the elementwise forward, the two norms (what recomputing them re-runs).
    pub norms_fwd: Expr,
    /// Of the elementwise forward, the experts' activation function.
    pub moe_act_fwd: Expr,
    /// Fixed host time of one pass: `layer_overhead_s` for the block, and as much again for
    /// each local expert an expert loop runs as a module of its own.
    pub overhead: Expr,
    /// Of the GEMMs' forward, the row-parallel ones whose outputs the tensor-parallel group
    /// reduces: the output projection, and the dense MLP's down projection.
    pub row_parallel_fwd: Expr,
}

impl LayerTimes {
    pub fn forward(&self) -> Expr {
        Expr::sum([
            self.attention_gemm_fwd.clone(),
            self.attention_core_fwd.clone(),
            self.mlp_gemm_fwd.clone(),
            self.elementwise_fwd.clone(),
            self.overhead.clone(),
        ])
    }

    pub fn backward(&self) -> Expr {
        Expr::sum([
            self.attention_gemm_bwd.clone(),
            self.attention_core_bwd.clone(),
            self.mlp_gemm_bwd.clone(),
            self.elementwise_bwd.clone(),
            self.overhead.clone(),
        ])
    }
}

/// Backward of the flash-attention kernel relative to its forward: it recomputes the scores
/// (one extra QKᵀ) besides the two gradient GEMMs per forward GEMM, 5 GEMMs against 2.
const FLASH_BACKWARD_RATIO: f64 = 2.5;
/// HBM bytes per attention-score element of the unfused path (fp16/bf16): forward the fused
/// scale-mask-softmax reads and writes 2 + 2, backward softmax reads the gradient and the
/// probabilities and writes 2 + 2 + 2. Dropout adds, forward, a read of 2 and writes of 2 and
/// a 1-byte mask, backward a read of the gradient and mask and a write, 2 + 1 + 2.
const SCORE_BYTES_FWD: f64 = 4.0;
const SCORE_BYTES_BWD: f64 = 6.0;
const SCORE_DROPOUT_BYTES_FWD: f64 = 5.0;
const SCORE_DROPOUT_BYTES_BWD: f64 = 5.0;
/// Rebuilding the dropout output in backward from the softmax output and the mask (Tempo's
/// attention): read 2 + 1, write 2.
const SCORE_DROPOUT_REBUILD_BYTES: f64 = 5.0;

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
    let qkv = ctx.weight_matmul(tokens.clone(), qkv_width.clone(), k(h), k(1.0));
    let proj = ctx.weight_matmul(tokens.clone(), k(h), k(ctx.q_dim) / t.clone(), k(1.0));
    let attention_adapters = attention_adapter_gemms(ctx, tokens.clone(), qkv_width);
    let attention_gemm_fwd = qkv.forward + proj.forward.clone() + attention_adapters.forward;
    let attention_gemm_bwd = qkv.backward + proj.backward + attention_adapters.backward;

    let (attention_core_fwd, attention_core_bwd) = if ctx.flash {
        let flops =
            k(4.0 * ctx.seq * ctx.q_dim * ctx.attended_fraction) * tokens.clone() / t.clone();
        let (forward_rate, backward_rate) = ctx.attention_rates();
        (
            flops.clone() / forward_rate,
            k(FLASH_BACKWARD_RATIO) * flops / backward_rate,
        )
    } else {
        // Per head: scores `s/c × s` over `head_dim`, then values `s/c × head_dim` over `s`.
        let heads = ctx.b.clone() * ctx.heads / t.clone();
        let scores = ctx.matmul(ctx.local_seq(), k(ctx.seq), k(ctx.head_dim), heads.clone());
        let values = ctx.matmul(ctx.local_seq(), k(ctx.head_dim), k(ctx.seq), heads);
        let misaligned = if misaligned_heads(ctx) {
            1.0 / ctx.cal.misaligned_matmul
        } else {
            1.0
        };
        let bmm_fwd = (scores.forward + values.forward) * misaligned;
        let bmm_bwd = (scores.backward + values.backward) * misaligned;
        let scores = k(ctx.heads * ctx.seq) * tokens.clone() / t.clone();
        let dropout = ctx.dropout;
        let fwd_bytes = SCORE_BYTES_FWD + dropout * SCORE_DROPOUT_BYTES_FWD;
        // Tempo's attention rebuilds the dropout output in backward instead of keeping it.
        let rebuilt = if ctx.memory_saving_kernels {
            SCORE_DROPOUT_REBUILD_BYTES
        } else {
            0.0
        };
        let bwd_bytes = SCORE_BYTES_BWD + dropout * (SCORE_DROPOUT_BYTES_BWD + rebuilt);
        let fwd = bmm_fwd + ctx.memory_bound(scores.clone() * (fwd_bytes * act));
        let bwd = bmm_bwd + ctx.memory_bound(scores * (bwd_bytes * act));
        (fwd, bwd)
    };

    let dense_mlp = mlp_gemms(ctx, tokens.clone(), k(1.0), ctx.ffn, t.clone());
    let activation = if ctx.mlp_matrices > 2.0 {
        SWIGLU_BYTES
    } else {
        GELU_BYTES
    };
    let row_parallel_fwd = match &ctx.moe {
        None => {
            proj.forward.clone()
                + down_projection(ctx, tokens.clone(), k(1.0), ctx.ffn, t.clone()).forward
        }
        Some(_) => proj.forward.clone(),
    };
    let (mlp_gemm_fwd, mlp_gemm_bwd, mlp_width, permuted, modules, moe_act_fwd) = match &ctx.moe {
        None => (
            dense_mlp.forward,
            dense_mlp.backward,
            k(ctx.ffn),
            k(0.0),
            k(1.0),
            k(0.0),
        ),
        Some(moe) => {
            let router = ctx.weight_matmul(tokens.clone(), k(moe.experts), k(h), k(1.0));
            // The token copies this GPU's experts work on: the tp group's whole sequence with
            // experts split over tp, `etp/tp` of it when folded over fewer ranks.
            let expert_tokens = tokens.clone() * ctx.et.clone() / t.clone();
            let routed = expert_tokens.clone() * (moe.top_k * moe.capacity);
            // Each local expert's GEMMs on the tokens routed to it. Megatron-LM and
            // DeepSpeed run the local experts one after another (Megatron-Core's
            // SequentialMLP, its default) from eager Python, at the pace of the GPU or of the
            // host issuing each expert's work, whichever is slower (`EAGER_EXPERT_HOST`); the
            // PyTorch-native stacks run one grouped GEMM over them (torchtitan), whose tiles
            // fill the SMs together, and Tessel's runtime issues its loop without Python.
            let local = k(moe.experts) / ctx.e.clone();
            let per_expert = routed.clone() / local.clone();
            let et = ctx.et.clone();
            let (grouped, python_loop) = match ctx.framework {
                Framework::Fsdp => (true, None),
                Framework::Tessel => (false, None),
                Framework::Megatron | Framework::MegatronFsdp | Framework::Deepspeed => {
                    (false, Some(EAGER_EXPERT_HOST))
                }
            };
            let (experts, expert_modules) = if grouped {
                (
                    mlp_gemms(ctx, per_expert, local, moe.expert_ffn, et.clone()),
                    k(0.0),
                )
            } else {
                let one = mlp_gemms(ctx, per_expert, k(1.0), moe.expert_ffn, et.clone());
                let paced = |gpu: Expr, host_s: Option<f64>| match host_s {
                    Some(host_s) => Expr::max([gpu * local.clone(), local.clone() * host_s]),
                    None => gpu * local.clone(),
                };
                let looped = Matmul {
                    forward: paced(one.forward, python_loop.map(|host| host.forward_s)),
                    backward: paced(one.backward, python_loop.map(|host| host.backward_s)),
                };
                (looped, local)
            };
            let shared = if moe.shared > 0.0 {
                mlp_gemms(
                    ctx,
                    tokens.clone(),
                    k(1.0),
                    moe.expert_ffn * moe.shared,
                    t.clone(),
                )
            } else {
                Matmul {
                    forward: k(0.0),
                    backward: k(0.0),
                }
            };
            let fraction = ctx.moe_fraction();
            let mix = |dense: Expr, moe_part: Expr| {
                (k(1.0) - fraction.clone()) * dense + fraction.clone() * moe_part
            };
            let forward = mix(
                dense_mlp.forward,
                router.forward + experts.forward + shared.forward,
            );
            let backward = mix(
                dense_mlp.backward,
                router.backward + experts.backward + shared.backward,
            );
            let moe_width = moe.expert_ffn * (moe.top_k * moe.capacity + moe.shared);
            let width = k(ctx.ffn) + fraction.clone() * (moe_width - ctx.ffn);
            // Token permutation: each token's hidden state is copied to its `top_k` routed
            // slots before the experts (read 2h, write 2h per copy) and the copies are
            // gathered and weighted back after them (read 2h per copy, write 2h); backward
            // moves the same bytes. Tokens are those the experts work on: with tp the expert
            // layer works on the gathered sequence.
            let copies = moe.top_k * moe.capacity;
            let permuted = fraction.clone() * expert_tokens * ((4.0 * copies + 4.0) * h * act);
            let moe_act_fwd = ctx.memory_bound(
                fraction.clone() * routed * (activation.forward * act * moe.expert_ffn) / et,
            );
            let modules = k(1.0) + fraction * expert_modules;
            (forward, backward, width, permuted, modules, moe_act_fwd)
        }
    };

    // Elementwise HBM bytes per token (2-byte elements): two fused bias-residual adds (with
    // dropout also a mask, h; its backward 5h each) and the activation. The two norms are
    // costed apart, at their kernels' own fraction (`Ctx::norm_bound`).
    let per_token = |add: f64, mask: f64| (2.0 * add + mask) * h * act;
    let norms =
        |bytes: f64| ctx.norm_bound(k(2.0 * bytes * h * act) * tokens.clone() / rep.clone());
    let replicated_fwd =
        k(per_token(RESIDUAL_ADD_BYTES.forward, 2.0 * ctx.dropout)) * tokens.clone() / rep.clone();
    // Compiled blocks write the norms' outputs (2h each) and the down projection's input
    // again in backward, where the weight gradients need them (see `cost::memory`).
    let (rebuilt_norms, rebuilt_down_input) = if ctx.compiled { (4.0, 2.0) } else { (0.0, 0.0) };
    let replicated_bwd = k(per_token(
        RESIDUAL_ADD_BYTES.backward,
        rebuilt_norms + 10.0 * ctx.dropout,
    )) * tokens.clone()
        / rep.clone();
    let sharded_fwd = k(activation.forward * act) * mlp_width.clone() * tokens.clone() / t.clone();
    let sharded_bwd =
        k((activation.backward + rebuilt_down_input) * act) * mlp_width.clone() * tokens.clone()
            / t.clone();
    let rotary = if ctx.rope {
        k(4.0 * act) * tokens.clone() * (k(ctx.q_dim) / t.clone() + k(ctx.kv_dim) / ctx.kv_split())
    } else {
        k(0.0)
    };
    // FP8 GEMMs cast their inputs in forward and their output gradients in backward, each a
    // pass of its own, except under Transformer Engine (Megatron-LM's stacks): its
    // LayerNormLinear and LayerNormMLP write the norm's output and the activation's in FP8
    // from the same kernel, so in forward only the output projection's input (the attention
    // kernel's bf16 output) is cast in a pass.
    let (casts_fwd, casts_bwd) = if ctx.is_fp8() {
        let per_element = k(fp8_cast_bytes(ctx.fp8_scaling)) * tokens.clone();
        let projection_input = k(ctx.q_dim) / t.clone();
        // torchao casts a GEMM's input where the GEMM reads it: after the sequence-parallel
        // gather, on every tensor-parallel rank, unless its tensor-wise plans cast the norms'
        // outputs on each rank's shard and gather them in fp8 (torchtitan applies those plans
        // only when the recipe is not row-wise: `models/llama3/infra/parallelize.py`).
        let norm_outputs = if ctx.fp8_through_torchao() && !ctx.gathers_fp8() {
            k(2.0 * h)
        } else {
            k(2.0 * h) / rep.clone()
        };
        let every_input = norm_outputs + (mlp_width.clone() + ctx.q_dim) / t.clone();
        let forward = match ctx.framework {
            Framework::Megatron | Framework::MegatronFsdp => projection_input,
            Framework::Deepspeed | Framework::Fsdp | Framework::Tessel => every_input.clone(),
        };
        (per_element.clone() * forward, per_element * every_input)
    } else {
        (k(0.0), k(0.0))
    };
    let norms_fwd = norms(NORM_BYTES.forward);
    let elementwise_fwd = ctx.memory_bound(Expr::sum([
        replicated_fwd,
        sharded_fwd,
        rotary.clone(),
        casts_fwd,
        permuted.clone(),
    ])) + norms_fwd.clone();
    let elementwise_bwd = ctx.memory_bound(Expr::sum([
        replicated_bwd,
        sharded_bwd,
        rotary,
        casts_bwd,
        permuted,
    ])) + norms(NORM_BYTES.backward);
    let overhead = modules * ctx.cal.layer_overhead_s;
    LayerTimes {
        attention_gemm_fwd: ctx.bind(attention_gemm_fwd),
        attention_gemm_bwd: ctx.bind(attention_gemm_bwd),
        attention_core_fwd: ctx.bind(attention_core_fwd),
        attention_core_bwd: ctx.bind(attention_core_bwd),
        mlp_gemm_fwd: ctx.bind(mlp_gemm_fwd),
        mlp_gemm_bwd: ctx.bind(mlp_gemm_bwd),
        elementwise_fwd: ctx.bind(elementwise_fwd),
        norms_fwd: ctx.bind(norms_fwd),
        moe_act_fwd: ctx.bind(moe_act_fwd),
        overhead: ctx.bind(overhead),
        row_parallel_fwd,
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

/// The GEMMs of `batch` MLPs of width `ffn`, sharded over `t` ranks, each over `rows` tokens.
fn mlp_gemms(ctx: &Ctx, rows: Expr, batch: Expr, ffn: f64, t: Expr) -> Matmul {
    let h = ctx.hidden;
    let up_width = (ctx.mlp_matrices - 1.0) * ffn;
    let up = ctx.weight_matmul(rows.clone(), k(up_width) / t.clone(), k(h), batch.clone());
    let down = down_projection(ctx, rows.clone(), batch.clone(), ffn, t.clone());
    let mut forward = up.forward + down.forward;
    let mut backward = up.backward + down.backward;
    if let Some(adapters) = ctx.adapters.filter(|a| a.targets.mlp) {
        // Gate and up are column-parallel (`A` whole, `B` split), down row-parallel.
        for _ in 1..ctx.mlp_matrices as usize {
            let one = adapter_gemms(ctx, &adapters, rows.clone(), k(h), k(ffn) / t.clone());
            forward = forward + one.forward * batch.clone();
            backward = backward + one.backward * batch.clone();
        }
        let one = adapter_gemms(ctx, &adapters, rows, k(ffn) / t, k(h));
        forward = forward + one.forward * batch.clone();
        backward = backward + one.backward * batch;
    }
    Matmul { forward, backward }
}

/// The MLP's row-parallel down projection, `ffn/t → h`, of `batch` GEMMs over `rows` tokens.
fn down_projection(ctx: &Ctx, rows: Expr, batch: Expr, ffn: f64, t: Expr) -> Matmul {
    ctx.weight_matmul(rows, k(ctx.hidden), k(ffn) / t, batch)
}

/// Seconds of one LoRA adapter beside a frozen `input × output` projection (widths on this
/// GPU) over `rows` tokens: forward `x·A` then `(x·A)·B`; backward the gradient of `x·A`
/// (`dY·Bᵀ`) and its share of the input gradient (`·Aᵀ`), `B`'s weight gradient, and under
/// LoRA (not LoRA-FA) `A`'s.
fn adapter_gemms(ctx: &Ctx, adapters: &Adapters, rows: Expr, input: Expr, output: Expr) -> Matmul {
    let r = k(adapters.rank);
    let gemm = |m: Expr, n: Expr, kk: Expr| ctx.matmul(m, n, kk, k(1.0)).forward;
    let forward = gemm(rows.clone(), r.clone(), input.clone())
        + gemm(rows.clone(), output.clone(), r.clone());
    let mut backward = gemm(rows.clone(), r.clone(), output.clone())
        + gemm(rows.clone(), input.clone(), r.clone())
        + gemm(r.clone(), output, rows.clone());
    if !adapters.frozen_a {
        backward = backward + gemm(input, r, rows);
    }
    Matmul { forward, backward }
}

/// The adapters of the attention projections: query, key and value (column-parallel, of
/// `qkv_width` on this GPU together) and the output projection (row-parallel).
fn attention_adapter_gemms(ctx: &Ctx, tokens: Expr, qkv_width: Expr) -> Matmul {
    let mut forward = k(0.0);
    let mut backward = k(0.0);
    let Some(adapters) = ctx.adapters else {
        return Matmul { forward, backward };
    };
    let h = k(ctx.hidden);
    if adapters.targets.qkv {
        // Three adapters of one `A` each; their `B`s together as wide as the projections.
        let one = adapter_gemms(ctx, &adapters, tokens.clone(), h.clone(), qkv_width / 3.0);
        forward = forward + one.forward * 3.0;
        backward = backward + one.backward * 3.0;
    }
    if adapters.targets.o {
        let one = adapter_gemms(ctx, &adapters, tokens, k(ctx.q_dim) / ctx.t.clone(), h);
        forward = forward + one.forward;
        backward = backward + one.backward;
    }
    Matmul { forward, backward }
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
    let logits = ctx.weight_matmul(tokens.clone(), k(ctx.vocab) / t.clone(), k(h), k(1.0));
    // Cross-entropy: fp32 upcast, softmax and its gradient, about 18 bytes per logit.
    let cross_entropy = ctx.memory_bound(k(18.0 * ctx.vocab) * tokens.clone() / t);
    let norm = ctx.norm_bound(k(10.0 * h) * tokens / ctx.replicated_divisor());
    logits.forward + logits.backward + cross_entropy + norm
}
