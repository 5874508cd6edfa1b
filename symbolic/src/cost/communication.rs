//! Communication per GPU, as expressions, with placement deciding the link.
//!
//! Rank placement (Megatron's order): tensor parallel innermost (consecutive GPUs), then
//! context parallel, then data parallel (expert parallel inside the data × context ranks),
//! pipeline outermost. A group with `n` members and stride `k` spans `n·k` consecutive GPUs:
//! inside one node when that is at most `gpus_per_node`, which then uses the intra-node link;
//! otherwise the inter-node link per GPU is the bottleneck of the ring.

use tessel_grammar::Framework;

use super::context::{above, k, Ctx};
use super::parameters::{layer_params, stage_params};
use crate::Expr;

/// Seconds of the tensor-parallel collectives of `forward` and `backward` layer passes. Each
/// pass is two all-reduces of the `b·s/c·h` activations, or with sequence parallelism a
/// reduce-scatter and an all-gather for each, the same bytes on the wire. With sequence
/// parallelism and [`Ctx::gathers_fp8`], a forward pass's all-gathers of the GEMM inputs,
/// half of its traffic, move fp8.
pub(crate) fn tp_layer_passes(ctx: &Ctx, forward: Expr, backward: Expr) -> Expr {
    let bytes = ctx.tokens() * (ctx.hidden * ctx.bytes.activation);
    let ring = ctx.ring("tp", ctx.t.clone(), k(1.0));
    let pass = k(2.0) * ctx.all_reduce(bytes, &ring) * (1.0 - ctx.cal.tp_overlap);
    if ctx.gathers_fp8() {
        let pass = ctx.bind(pass);
        let fp8_share = 0.5 * (1.0 - 1.0 / ctx.bytes.activation);
        forward * pass.clone() * (k(1.0) - ctx.sp.clone() * fp8_share) + backward * pass
    } else {
        (forward + backward) * pass
    }
}

/// Seconds of the context-parallel ring of one layer's forward: each GPU passes its keys and
/// values on `c − 1` times. Backward passes keys, values and their gradients: twice that.
pub(crate) fn cp_layer_forward(ctx: &Ctx) -> Expr {
    let kv_bytes = ctx.tokens() * (2.0 * ctx.kv_dim * ctx.bytes.activation) / ctx.kv_split();
    let span = ctx.t.clone() * ctx.c.clone();
    (ctx.c.clone() - 1.0) * ctx.p2p(kv_bytes, span)
}

/// Seconds of the expert-parallel all-to-alls of one average layer in one direction: dispatch
/// and combine of the routed tokens. Each tp rank dispatches only the tokens it holds, its
/// sequence-parallel shard when sequence parallelism is on (Megatron-Core's all-to-all
/// dispatcher); the tp-sharded experts then all-gather what arrives over tp, and the combine
/// reduce-scatters it back. The dense MLP's sequence-parallel gather, one copy of each token,
/// is counted with the tp collectives; the expert layer gathers `top_k · capacity` copies.
pub(crate) fn ep_layer_one_way(ctx: &Ctx) -> Expr {
    match &ctx.moe {
        None => k(0.0),
        Some(moe) => {
            let copies = moe.top_k * moe.capacity;
            let element = ctx.hidden * ctx.bytes.activation;
            let dispatched = ctx.tokens() / ctx.replicated_divisor() * (copies * element);
            let stride = ctx.t.clone() * ctx.c.clone();
            let all_to_all = ctx.all_to_all(dispatched, ctx.e.clone(), stride);
            let ring = ctx.ring("tp", ctx.t.clone(), k(1.0));
            let extra_copies = (copies - 1.0).max(0.0);
            let regather = ctx.sp.clone()
                * above(ctx.e.clone(), 1.0)
                * ctx.gather(ctx.tokens() * (extra_copies * element), &ring);
            k(2.0) * ctx.moe_fraction() * (all_to_all + regather) * (1.0 - ctx.cal.ep_overlap)
        }
    }
}

/// Seconds of one device's pipeline sends and receives for one micro-batch that stay on its
/// critical path. Each of the `v` chunks receives and sends an activation of `b·s/c·h`
/// elements forward and a gradient backward.
/// - Megatron scatters the activation over the tp ranks (each sends its 1/t slice, the
///   receiver all-gathers over NVLink; with sequence parallelism it is the shard anyway) and
///   pairs each send with the opposite receive in one batched call: 2 transfers per chunk,
///   of which the calibrated fraction `pp_exposed` stays exposed.
/// - DeepSpeed's pipeline engine sends the whole activation from every tp rank with blocking
///   sends and receives, one after another: 4 transfers per micro-batch, all exposed.
/// - PyTorch pipelining sends the whole (sequence-parallel: sharded) activation, batched like
///   Megatron's.
pub(crate) fn pp_microbatch(ctx: &Ctx) -> Expr {
    let activation = ctx.tokens() * (ctx.hidden * ctx.bytes.activation);
    let span = ctx.t.clone() * ctx.c.clone() * ctx.d.clone() * ctx.p.clone();
    let pipelined = Expr::min([ctx.p.clone() - 1.0, k(1.0)]);
    let (bytes, transfers, exposed) = match ctx.framework {
        Framework::Megatron => (activation / ctx.t.clone(), 2.0, ctx.cal.pp_exposed),
        Framework::Deepspeed => (activation / ctx.replicated_divisor(), 4.0, 1.0),
        Framework::Fsdp => (
            activation / ctx.replicated_divisor(),
            2.0,
            ctx.cal.pp_exposed,
        ),
    };
    pipelined * k(transfers) * ctx.v.clone() * ctx.p2p(bytes, span) * exposed
}

/// Data-parallel traffic of one step for ZeRO 0–2, before overlap: ZeRO-0 all-reduces the
/// gradients; ZeRO-1/2 reduce-scatter them and all-gather the updated bf16 weights. Groups
/// are dp·cp ranks (gradients are reduced over both). Tied embeddings add an all-reduce of
/// the embedding gradients between the first and last device.
pub(crate) fn dp_step(ctx: &Ctx) -> Expr {
    let params = stage_params(ctx);
    let ring = ctx.ring("dp", ctx.d.clone() * ctx.c.clone(), ctx.t.clone());
    let (z1, _, z3) = ctx.zero_flags();
    let grad_bytes = params.clone() * ctx.bytes.gradient;
    let all_reduce = ctx.all_reduce(grad_bytes.clone(), &ring);
    let sharded = ctx.gather(grad_bytes, &ring) + ctx.gather(params * ctx.bytes.weight, &ring);
    let zero_traffic = (k(1.0) - z1.clone()) * all_reduce + (z1 - z3.clone()) * sharded;
    let tied = if ctx.tied {
        let bytes = k(ctx.vocab * ctx.hidden * ctx.bytes.gradient) / ctx.t.clone();
        let ends = ctx.is_first() + ctx.is_last();
        let pipelined = Expr::min([ctx.p.clone() - 1.0, k(1.0)]);
        let stride = ctx.t.clone() * ctx.c.clone() * ctx.d.clone() * (ctx.p.clone() - 1.0);
        let ring = ctx.ring("tied", k(2.0), stride);
        Expr::min([ends, k(1.0)]) * pipelined * ctx.all_reduce(bytes, &ring)
    } else {
        k(0.0)
    };
    zero_traffic + tied
}

/// ZeRO-3 traffic of one micro-batch, before overlap: all-gather the bf16 weights for
/// forward and again for backward, reduce-scatter the gradients. With
/// [`Ctx::gathers_fp8`] the layers' weight shards are cast to fp8 before they are gathered;
/// the embedding and output layer stay bf16.
pub(crate) fn zero3_microbatch(ctx: &Ctx) -> Expr {
    let params = stage_params(ctx);
    let ring = ctx.ring("dp", ctx.d.clone() * ctx.c.clone(), ctx.t.clone());
    let (_, _, z3) = ctx.zero_flags();
    let fp8_saving = if ctx.gathers_fp8() {
        ctx.layers.clone() * layer_params(ctx) * (ctx.bytes.weight - 1.0)
    } else {
        k(0.0)
    };
    let gathers = k(2.0) * ctx.gather(params.clone() * ctx.bytes.weight - fp8_saving, &ring);
    let reduce = ctx.gather(params * ctx.bytes.gradient, &ring);
    z3 * (gathers + reduce)
}
