//! Peak memory of one GPU of a pipeline device, as expressions.
//!
//! States (mixed precision, bytes per parameter before sharding): the bf16/fp16 compute copy
//! 2, the gradient 4 for bf16 (accumulated and reduced in fp32, Megatron's main grads) or 2
//! for fp16 (loss-scaled fp16 grads), the fp32 master 4 and Adam's two fp32 moments 8: 18
//! bytes for bf16 + Adam, 16 for fp16 + Adam. ZeRO-1 shards master and moments over dp·cp
//! (Megatron's distributed optimizer shards over both), ZeRO-2 also the gradients, ZeRO-3
//! keeps only the fp32 shard as the weights (FSDP style: 4 + 4 + 8 = 16 bytes / dp·cp) plus
//! two gathered layers and one layer's unsharded gradients as buffers. Routed experts' states
//! shard over the expert-data-parallel group, `dp·cp/ep` ranks, instead.
//!
//! Activations per layer and micro-batch follow Korthikanti et al. (arXiv 2205.05198 §4),
//! generalised mechanistically: with `s' = s/c` positions per GPU, `sbh` = s'·b·h elements,
//! - outside tensor-parallel regions (divided by t only with sequence parallelism): two norm
//!   inputs 4sbh, QKV input 2sbh, MLP input 2sbh, and with dropout two masks 2sbh = 10sbh;
//! - attention inside tp: Q and K 2s'b(q + kv), V 2s'b·kv, output-projection input 2s'b·q
//!   (= 8sbh for multi-head attention; key/value parts divided by `min(t, kv_heads)`, as
//!   heads are replicated past that), and without flash attention the scores path
//!   5·a·s'·s·b with dropout (softmax 2, dropout mask 1, dropout output 2), 2·a·s'·s·b
//!   without, which selective recompute drops; flash attention keeps only an fp32
//!   log-sum-exp per row and head (dropout, if any, is regenerated from its seed);
//! - MLP inside tp: gelu 4·s'b·ffn (its input and the down projection's input), swiglu
//!   6·s'b·ffn (gate, up, product); experts the same on the routed tokens plus their
//!   dispatched inputs and combined outputs.
//!
//! Blocks under `torch.compile` (`train.compile`) keep neither the norms' outputs nor the
//! down projection's input: the compiler's partitioner recomputes pointwise results in
//! backward rather than saving them, so only the inputs those are computed from stay.
//!
//! Tempo's activation-saving kernels (`train.memory_saving_kernels`, Andoorveedu et al. 2022):
//! each norm keeps its output instead of its input (its backward works from the output), which
//! is the next GEMM's kept input, so the two norm inputs 4sbh go; GELU keeps its output and a
//! one-bit mask instead of its input (gelu MLP: 2·s'b·ffn + ffn/8 bytes instead of 4·s'b·ffn);
//! the attention keeps the softmax output and the dropout mask and rebuilds the dropout output
//! in backward (2·a·s'·s·b less with dropout). Where a GEMM does not keep the norm's output
//! or GELU's (LoRA-FA, `compile`, FP8 copies), the norm or GELU keeps what it kept before.
//!
//! FP8 training through Transformer Engine keeps fp8 copies of the GEMM inputs (1 byte per
//! element instead of 2); through torchao it keeps the bf16 inputs and casts them again in
//! backward.
//!
//! For a GPT layer with dropout this is sbh(34 + 5as/h) without parallelism and 34sbh/t with tp + sp +
//! selective recompute. A fully recomputed layer keeps its input, 2sbh (÷t with sp), and the
//! layer being recomputed needs its full activations once, after the last device's logits
//! are freed: the peak holds the larger of the two.
//!
//! Buffers: the logits beyond that working set, ZeRO-3's gathered layers, NCCL buffers and the
//! CUDA context, and allocator fragmentation as a fraction of the memory allocated and freed
//! every micro-batch (activations, logits, gathered layers); the states live in flat buffers
//! allocated once.

use tessel_grammar::{Framework, Precision};

use super::context::{above, k, Ctx};
use super::parameters::{
    adapter_stage_params, layer_params, sharded_params, stage_params, trainable_sharded_params,
};
use crate::primitives::{c, exceeds, Scalar};
use crate::Expr;

/// Bytes of activations one layer keeps for one micro-batch without recompute, and the parts
/// that recomputing a module drops.
pub(crate) struct LayerActivations {
    pub total: Expr,
    /// The attention core's scores (none with flash attention).
    pub core_attn: Expr,
    /// The two norms' outputs.
    pub norms: Expr,
    /// The experts' activation output, the down projection's input.
    pub moe_act: Expr,
}

impl LayerActivations {
    /// What a layer keeps under the recompute of modules the context's flags select.
    pub fn kept(&self, ctx: &Ctx) -> Expr {
        self.total.clone()
            - ctx.selective.clone() * self.core_attn.clone()
            - ctx.recompute_norms.clone() * self.norms.clone()
            - ctx.recompute_moe_act.clone() * self.moe_act.clone()
    }
}

pub(crate) fn layer_activations(ctx: &Ctx) -> LayerActivations {
    // Built at most once per context; each part is bound once and shared after that.
    let built = std::cell::OnceCell::new();
    let part = |key: &'static str, pick: fn(&LayerActivations) -> &Expr| {
        ctx.shared(key, || {
            pick(built.get_or_init(|| layer_activations_expr(ctx))).clone()
        })
    };
    LayerActivations {
        total: part("layer_activations", |a| &a.total),
        core_attn: part("core_attn_activations", |a| &a.core_attn),
        norms: part("norm_activations", |a| &a.norms),
        moe_act: part("moe_act_activations", |a| &a.moe_act),
    }
}

fn layer_activations_expr(ctx: &Ctx) -> LayerActivations {
    let t = ctx.t.clone();
    let b = ctx.b.clone();
    let s_local = ctx.local_seq();
    let sb = s_local.clone() * b.clone();
    let act = ctx.bytes.activation / 2.0;
    let h = ctx.hidden;
    // Transformer Engine keeps the fp8 copies of GEMM inputs for backward (1 byte, not 2).
    let g = if ctx.is_fp8() && !ctx.fp8_through_torchao() {
        0.5
    } else {
        1.0
    };
    let masks = 2.0 * ctx.dropout;
    // Which projections' inputs the backward needs for a weight gradient: every one in full
    // training; under LoRA the targeted ones (for `A`'s gradient); under LoRA-FA none, its
    // adapters keeping their `r`-wide products with `A` instead.
    let (qkv_input, mlp_input) = match &ctx.adapters {
        None => (true, true),
        Some(a) => (!a.frozen_a && a.targets.qkv, !a.frozen_a && a.targets.mlp),
    };
    // The two norms' outputs, inputs of the QKV and MLP GEMMs; compiled blocks rebuild them.
    let norm_outputs = if ctx.compiled {
        0.0
    } else {
        2.0 * g * (f64::from(u8::from(qkv_input)) + f64::from(u8::from(mlp_input)))
    };
    // Each norm keeps its input for its backward; Tempo's in-place norm keeps its output
    // instead, the very tensor the next GEMM keeps where that one keeps it in the same
    // precision, so the norm then adds nothing of its own.
    let in_place_norm =
        |gemm_keeps: bool| ctx.memory_saving_kernels && !ctx.compiled && gemm_keeps && g == 1.0;
    let norm_own: f64 = [qkv_input, mlp_input]
        .into_iter()
        .map(|kept| if in_place_norm(kept) { 0.0 } else { 2.0 })
        .sum();
    let replicated_divisor = ctx.replicated_divisor();
    let replicated =
        k((norm_own + masks + norm_outputs) * h * act) * sb.clone() / replicated_divisor.clone();
    // Recomputing the norms drops what they keep beyond one tensor each.
    let norms = k((norm_outputs + norm_own - 4.0) * h * act) * sb.clone() / replicated_divisor;
    let attention = k((2.0 + 2.0 * g) * ctx.q_dim * act) * sb.clone() / t.clone()
        + k(4.0 * ctx.kv_dim * act) * sb.clone() / ctx.kv_split();
    let scores = if ctx.flash {
        k(4.0 * ctx.heads) * sb.clone() / t.clone()
    } else {
        // Softmax output 2 bytes; with dropout also its 1-byte mask and 2-byte output, which
        // Tempo's attention rebuilds in backward instead.
        let dropout_output = if ctx.memory_saving_kernels { 0.0 } else { 2.0 };
        k((2.0 + (1.0 + dropout_output) * ctx.dropout) * ctx.heads * ctx.seq * act) * sb.clone()
            / t.clone()
    };
    // gelu: its input and the down projection's input; swiglu: gate and up outputs and the
    // down projection's input, which compiled blocks rebuild from the others.
    let down_input = if ctx.compiled || !mlp_input {
        0.0
    } else {
        2.0 * g
    };
    // Tempo's in-place GELU keeps its output (the down projection's kept input) and a one-bit
    // branch mask instead of its input.
    let in_place_gelu = ctx.memory_saving_kernels && down_input > 0.0 && g == 1.0;
    let mlp_factor = if ctx.mlp_matrices > 2.0 {
        4.0 + down_input
    } else if in_place_gelu {
        GELU_MASK_BYTES / act + down_input
    } else {
        2.0 + down_input
    };
    let dense_mlp = k(mlp_factor * ctx.ffn * act) * sb.clone() / t.clone();
    let (mlp, moe_act) = match &ctx.moe {
        None => (dense_mlp, k(0.0)),
        Some(moe) => {
            // The token copies this GPU's experts work on: with experts split over tp, the
            // tp group's whole sequence; folded over fewer ranks, `etp/tp` of it.
            let routed = sb.clone() * (moe.top_k * moe.capacity) * ctx.et.clone() / t.clone();
            let per_expert_width = routed.clone() * (moe.expert_ffn * act) / ctx.et.clone();
            let experts =
                per_expert_width.clone() * mlp_factor + routed * ((2.0 + 2.0 * g) * h * act);
            let shared = k(mlp_factor * moe.shared * moe.expert_ffn * act) * sb.clone() / t;
            let fraction = ctx.moe_fraction();
            let moe_act = fraction.clone() * per_expert_width * down_input;
            let mlp = (k(1.0) - fraction.clone()) * dense_mlp + fraction * (experts + shared);
            (mlp, moe_act)
        }
    };
    let core_attn = if ctx.flash { k(0.0) } else { scores.clone() };
    let mut parts = vec![replicated, attention, scores, mlp];
    if let Some(a) = &ctx.adapters {
        // Each adapter keeps its input's product with `A`, `r` wide (2 bytes in bf16).
        let count = 3.0 * f64::from(u8::from(a.targets.qkv))
            + f64::from(u8::from(a.targets.o))
            + ctx.mlp_matrices * f64::from(u8::from(a.targets.mlp));
        parts.push(k(2.0 * count * a.rank * act) * sb);
    }
    LayerActivations {
        total: Expr::sum(parts),
        core_attn,
        norms,
        moe_act,
    }
}

/// Bytes per element of the in-place GELU's branch mask: one bit.
const GELU_MASK_BYTES: f64 = 0.125;

/// Micro-batches whose activations a pipeline device holds at its peak: `min(p − i, m)` for
/// 1F1B; with `v` interleaved chunks Megatron's warm-up holds `2(p − i − 1) + (v − 1)p + 1`
/// chunk-micro-batches, `/v` in whole-device units (for the first device `p + (p − 1)/v`,
/// Korthikanti's `p·(1 + (p − 1)/(p·v))`).
pub(crate) fn in_flight(ctx: &Ctx) -> Expr {
    in_flight_of(
        ctx.p.clone(),
        ctx.stage.clone(),
        ctx.v.clone(),
        ctx.m.clone(),
    )
}

/// [`in_flight`] over any [`Scalar`]: pipeline degree `p`, device `i`, chunks `v`,
/// micro-batches `m`.
pub(crate) fn in_flight_of<S: Scalar>(p: S, i: S, v: S, m: S) -> S {
    let interleaved = exceeds(v.clone(), 1.0);
    let plain = p.clone() - i.clone();
    let warmup = (c::<S>(2.0) * (p.clone() - i - c(1.0)) + (v.clone() - c(1.0)) * p + c(1.0)) / v;
    let fill = (c::<S>(1.0) - interleaved.clone()) * plain + interleaved * warmup;
    fill.min_of(m)
}

/// Memory components of one GPU: weights, gradients, optimizer states, activations, buffers.
pub(crate) struct StageMemory {
    pub weights: Expr,
    pub gradients: Expr,
    pub optimizer: Expr,
    pub activations: Expr,
    pub buffers: Expr,
}

/// Gradient bytes per GPU. Megatron and FSDP accumulate and reduce one gradient copy (fp32
/// for bf16, see `StateBytes::gradient`), sharded from ZeRO-2 on. DeepSpeed keeps the
/// model's half-precision gradients (sharded from ZeRO-2 on) and an fp32 copy beside them:
/// its bf16 optimizer (`BF16_Optimizer`, which DeepSpeed runs up to ZeRO-1) accumulates into a
/// full-size fp32 buffer, while its ZeRO-2/3 optimizers keep only the rank's partition; its
/// fp16 ZeRO optimizer converts each rank's partition (sharded from ZeRO-1 on).
fn gradient_bytes(ctx: &Ctx, z1: Expr, z2: Expr) -> Expr {
    if ctx.framework != Framework::Deepspeed || ctx.precision == Precision::Fp32 {
        return k(ctx.bytes.gradient) * trainable_sharded_params(ctx, z2);
    }
    let fp32_sharding = match ctx.precision {
        Precision::Bf16 => z2.clone(),
        _ => z1,
    };
    k(ctx.bytes.weight) * trainable_sharded_params(ctx, z2)
        + k(4.0) * trainable_sharded_params(ctx, fp32_sharding)
}

/// Elements in each of DeepSpeed's ZeRO communication buckets: the defaults of
/// `reduce_bucket_size` and `allgather_bucket_size` (DeepSpeed's configuration reference).
const DEEPSPEED_BUCKET_ELEMENTS: f64 = 5e8;

/// DeepSpeed's fp16 ZeRO optimizer reduces gradients and gathers updated weights through one
/// bucket each, allocated for the whole run; its bf16 optimizer and the other stacks reduce
/// in place.
fn zero_buckets(ctx: &Ctx, z1: Expr) -> Expr {
    if ctx.framework != Framework::Deepspeed || ctx.precision != Precision::Fp16 {
        return k(0.0);
    }
    z1 * (2.0 * DEEPSPEED_BUCKET_ELEMENTS * ctx.bytes.weight)
}

/// Bytes per logits element alive at the loss, counted from each implementation.
/// Megatron-LM's vocabulary-parallel cross-entropy (DeepSpeed runs Megatron's) works on an fp32
/// copy of the logits, turns it into the softmax in place and saves it, and its backward writes
/// the gradient into it before casting back: 4 bytes, then 2 more for the half-precision
/// gradient. flash-attn's fused cross-entropy (llm-foundry's default loss) reads the
/// half-precision logits, saves them and the row's log-sum-exp, and its backward writes a
/// half-precision gradient: 2 + 2. PyTorch's cross-entropy on logits upcast to fp32, as
/// torchtitan computes its loss, peaks in the log-softmax backward with its saved fp32 output,
/// the fp32 gradient arriving and the fp32 gradient leaving: 12.
fn logits_bytes_per_element(ctx: &Ctx) -> f64 {
    match (ctx.fused_cross_entropy, ctx.framework) {
        (true, Framework::Fsdp) => FUSED_HALF_CROSS_ENTROPY_BYTES,
        (true, _) => VOCAB_PARALLEL_CROSS_ENTROPY_BYTES,
        (false, _) => UNFUSED_CROSS_ENTROPY_BYTES,
    }
}

/// Bytes of logits alive at the loss on this device.
fn logits_bytes(ctx: &Ctx) -> Expr {
    let logits =
        ctx.is_last() * ctx.tokens() * (ctx.vocab * logits_bytes_per_element(ctx)) / ctx.t.clone();
    if ctx.fused_cross_entropy || ctx.framework != Framework::Fsdp {
        return logits;
    }
    // With the vocabulary split over tp, the PyTorch-native stacks run PyTorch's loss-parallel
    // cross-entropy (torchtitan's default), whose backward builds the gradient from separate
    // ops: beside the saved log-probabilities, the scattered target gradient, the exponentials
    // and their sum with it, then the product: 16 bytes per element.
    let elements = ctx.is_last() * ctx.tokens() * ctx.vocab / ctx.t.clone();
    logits
        + above(ctx.t.clone(), 1.0) * elements * (LOSS_PARALLEL_BYTES - UNFUSED_CROSS_ENTROPY_BYTES)
}

const FUSED_HALF_CROSS_ENTROPY_BYTES: f64 = 4.0;
const VOCAB_PARALLEL_CROSS_ENTROPY_BYTES: f64 = 6.0;
const UNFUSED_CROSS_ENTROPY_BYTES: f64 = 12.0;
const LOSS_PARALLEL_BYTES: f64 = 16.0;

pub(crate) fn stage_memory(ctx: &Ctx) -> StageMemory {
    let params = stage_params(ctx);
    let (z1, z2, z3) = ctx.zero_flags();
    let bytes = ctx.bytes;
    let not_z3 = k(1.0) - z3.clone();

    let gradients = gradient_bytes(ctx, z1.clone(), z2);
    let (weights, optimizer) = if ctx.adapters.is_none() {
        let fp32_shard = bytes.weight.max(bytes.master);
        let weights = not_z3.clone() * bytes.weight * params
            + z3.clone() * fp32_shard * sharded_params(ctx, k(1.0));
        let optimizer_bytes = not_z3 * (bytes.master + bytes.moments) + z3.clone() * bytes.moments;
        (weights, optimizer_bytes * sharded_params(ctx, z1.clone()))
    } else {
        // Frozen weights keep their compute copy only (ZeRO-3 shards it); the adapters train
        // as any parameter, with a master copy and moments.
        let weights = not_z3 * bytes.weight * params
            + z3.clone() * bytes.weight * sharded_params(ctx, k(1.0))
            + k(bytes.weight) * adapter_stage_params(ctx);
        let optimizer = k(bytes.master + bytes.moments) * trainable_sharded_params(ctx, z1.clone());
        (weights, optimizer)
    };

    let layer_activations = layer_activations(ctx);
    let kept = layer_activations.kept(ctx);
    let layer = layer_activations.total;
    let rep = ctx.replicated_divisor();
    let sbh = ctx.tokens() * ctx.hidden * bytes.activation / 2.0;
    let checkpoint = k(2.0) * sbh.clone() / rep.clone();
    // DeepSpeed's pipeline engine keeps each in-flight micro-batch's stage output (2sbh) for
    // its backward; Megatron-LM frees the output's storage once it is sent.
    let sent_output = match ctx.framework {
        Framework::Deepspeed => k(1.0) - ctx.is_last(),
        Framework::Megatron | Framework::MegatronFsdp | Framework::Fsdp | Framework::Tessel => {
            k(0.0)
        }
    };
    let per_microbatch = (ctx.layers.clone() - ctx.full.clone()) * kept
        + ctx.full.clone() * checkpoint
        + ctx.is_first() * (k(3.0) * sbh.clone() / rep.clone())
        + (ctx.is_last() + sent_output) * (k(2.0) * sbh / rep);
    let recompute_working_set = ctx.bind(Expr::min([ctx.full.clone(), k(1.0)]) * layer);
    let activations = in_flight(ctx) * per_microbatch + recompute_working_set.clone();

    let logits = logits_bytes(ctx);
    let gathered = z3 * layer_params(ctx) * (2.0 * bytes.weight + bytes.gradient);

    let weights = ctx.bind((k(1.0) - ctx.off_w.clone()) * weights);
    let gradients = ctx.bind((k(1.0) - ctx.off_g.clone()) * gradients);
    let optimizer = ctx.bind((k(1.0) - ctx.off_opt.clone()) * optimizer);
    let kept_working_set = (k(1.0) - ctx.off_act.clone()) * recompute_working_set;
    let activations = ctx.bind((k(1.0) - ctx.off_act.clone()) * activations);
    // The logits live from the loss until the output layer's backward has used their
    // gradient; the layer rebuilt by full recompute lives during that layer's backward, later.
    // The peak holds the larger of the two: the working set is in the activations, the
    // logits count for what they exceed it by.
    let logits = ctx.bind(Expr::max([logits - kept_working_set, k(0.0)]));
    let gathered = ctx.bind(gathered);
    // Weights, gradients and optimizer states sit in flat buffers allocated once; the caching
    // allocator fragments around what is allocated and freed every micro-batch.
    let dynamic = Expr::sum([activations.clone(), logits.clone(), gathered.clone()]);
    let buffers = Expr::sum([
        logits,
        gathered,
        k(ctx.cal.outside_allocator_bytes),
        zero_buckets(ctx, z1),
        dynamic * ctx.cal.fragmentation,
    ]);
    StageMemory {
        weights,
        gradients,
        optimizer,
        activations,
        buffers,
    }
}
