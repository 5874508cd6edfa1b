//! Communication per GPU, as expressions: which collectives a step calls, on which group,
//! how many times (each framework's granularity) and with how many bytes; each call's time is
//! the calibrated NCCL primitive (`crate::primitives::collective`).
//!
//! Rank placement (Megatron's order): tensor parallel innermost (consecutive GPUs), then
//! context parallel, then data parallel (expert parallel inside the data × context ranks),
//! pipeline outermost.

use tessel_grammar::{CompressionMethod, Framework, GradCompression};

use super::context::{above, k, Ctx, Ring};
use super::parameters::{
    block_linear_weights, embedding_params, head_params, layer_params, powersgd_layer_factors,
    stage_params, trainable_stage_params,
};
use crate::Expr;

/// Seconds of the tensor-parallel collectives of `forward` and `backward` layer passes. Each
/// pass is two all-reduces of the `b·s/c·h` activations, or with sequence parallelism a
/// reduce-scatter and an all-gather for each: the same bytes on a ring, but only the
/// all-reduce gains from NVLink SHARP, and the pair pays two calls. With sequence
/// parallelism and [`Ctx::gathers_fp8`], a forward pass's all-gathers of the GEMM inputs,
/// half of its traffic, move fp8.
pub(crate) fn tp_layer_passes(ctx: &Ctx, forward: Expr, backward: Expr) -> Expr {
    let bytes = ctx.tokens() * (ctx.hidden * ctx.bytes.activation);
    let ring = ctx.ring("tp", ctx.t.clone(), k(1.0));
    // A group of one calls nothing (the primitive would still charge a call's latency).
    let several = above(ctx.t.clone(), 1.0);
    // The attention's gather and scatter, and the MLP's, which folded experts do not make.
    let regions = k(2.0) - ctx.folded() * ctx.moe_fraction();
    let sp = ctx.sp.clone();
    let pair = sp.clone() * k(2.0) * ctx.gather(bytes.clone(), &ring)
        + (k(1.0) - sp) * ctx.all_reduce(bytes, &ring);
    let pass = regions * several * pair;
    if ctx.gathers_fp8() {
        let pass = ctx.bind(pass);
        let fp8_share = 0.5 * (1.0 - 1.0 / ctx.bytes.activation);
        forward * pass.clone() * (k(1.0) - ctx.sp.clone() * fp8_share) + backward * pass
    } else {
        (forward + backward) * pass
    }
}

/// Transformer Engine's overlap of the reduce-scatters after the row-parallel GEMMs (the
/// output and down projections, forward), as NeMo's performance configurations set it
/// (NeMo-Framework-Launcher `conf/training/gpt3/ub-confs/ub_cfg_h100_175b_tp4_mbs1_seqlen2k_bf16grad.yaml`:
/// `method: pipeline`, `num_splits: 4`, `num_sm: 24` and 20, `set_sm_margin: 1`): the GEMM
/// runs in four chunks, each chunk's reduce-scatter behind the next chunk, so the last chunk's
/// waits for the GEMM's end; and the reduce-scatter's kernels hold their SMs for the whole
/// GEMM, which runs on the rest. The all-gathers before the column-parallel GEMMs exchange
/// chunks around the ring on the copy engines (`ring_exchange`), and the backward's bulk
/// overlaps take 2–8 SMs: both are costed as hidden.
pub(crate) const OVERLAPPED_REDUCE_SCATTER_SPLITS: f64 = 4.0;
pub(crate) const OVERLAPPED_REDUCE_SCATTER_SMS: f64 = 24.0;

/// Exposed seconds of overlapped tensor-parallel collectives: `traffic` (what
/// [`tp_layer_passes`] charges) beside `gemms`, the GEMMs it overlaps, of which
/// `row_parallel_fwd` run beside the forward's reduce-scatters. Half the traffic is
/// reduce-scatters; the last of their chunks is exposed, what the rest exceed the GEMMs by is
/// exposed, and the row-parallel GEMMs run on the SMs the reduce-scatter leaves them.
pub(crate) fn tp_overlapped(ctx: &Ctx, traffic: Expr, gemms: Expr, row_parallel_fwd: Expr) -> Expr {
    let last_chunk = ctx.bind(traffic.clone() * (0.5 / OVERLAPPED_REDUCE_SCATTER_SPLITS));
    let hidden_behind = Expr::max([traffic - last_chunk.clone() - gemms, k(0.0)]);
    let sm_share =
        OVERLAPPED_REDUCE_SCATTER_SMS / (ctx.sms - OVERLAPPED_REDUCE_SCATTER_SMS).max(1.0);
    let slower_gemms = above(ctx.t.clone(), 1.0) * row_parallel_fwd * sm_share;
    hidden_behind + last_chunk + slower_gemms
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
/// Folded experts (`etp < tp`) take their expert-parallel ranks next to their `etp` ranks
/// (Megatron-Core's expert rank order, tensor then expert parallel), make no tp gather of their
/// own, and all-gather every copy over their `etp` ranks.
pub(crate) fn ep_layer_one_way(ctx: &Ctx) -> Expr {
    match &ctx.moe {
        None => k(0.0),
        Some(moe) => {
            let copies = moe.top_k * moe.capacity;
            let element = ctx.hidden * ctx.bytes.activation;
            let dispatched = ctx.tokens() / ctx.replicated_divisor() * (copies * element);
            let folded = ctx.folded();
            let stride = (k(1.0) - folded.clone()) * ctx.t.clone() * ctx.c.clone()
                + folded.clone() * ctx.et.clone();
            let all_to_all =
                above(ctx.e.clone(), 1.0) * ctx.all_to_all(dispatched, ctx.e.clone(), stride);
            let ring = ctx.ring("tp", ctx.t.clone(), k(1.0));
            let extra_copies = (copies - 1.0).max(0.0);
            let regather = ctx.sp.clone()
                * above(ctx.e.clone(), 1.0)
                * above(ctx.t.clone(), 1.0)
                * ctx.gather(ctx.tokens() * (extra_copies * element), &ring);
            let expert_ring = ctx.ring("tp", ctx.et.clone(), k(1.0));
            let folded_gather = above(ctx.et.clone(), 1.0)
                * ctx.gather(
                    ctx.tokens() * ctx.et.clone() / ctx.t.clone() * (copies * element),
                    &expert_ring,
                );
            let gathers = (k(1.0) - folded.clone()) * regather + folded * folded_gather;
            k(2.0) * ctx.moe_fraction() * (all_to_all + gathers) * (1.0 - ctx.cal.ep_overlap)
        }
    }
}

/// Seconds of one device's pipeline sends and receives for one micro-batch, all on its
/// critical path: a stage waits for its input before it computes and its output goes out
/// before the next micro-batch's work (fitted as a fraction while it was a parameter, the
/// exposed share came out at its upper bound, 1). Each of the `v` chunks receives and sends
/// an activation of `b·s/c·h` elements forward and a gradient backward.
/// - Megatron scatters the activation over the tp ranks (each sends its 1/t slice, the
///   receiver all-gathers over NVLink; with sequence parallelism it is the shard anyway) and
///   pairs each send with the opposite receive in one batched call: 2 transfers per chunk.
/// - DeepSpeed's pipeline engine splits the activation and its gradient over the tp ranks
///   too (`is_pipe_partitioned` and `is_grad_partitioned` whenever tp > 1; the receiver
///   all-gathers), but sends and receives with blocking calls, one after another: 4 transfers
///   per micro-batch.
/// - PyTorch pipelining sends the whole (sequence-parallel: sharded) activation, batched like
///   Megatron's.
pub(crate) fn pp_microbatch(ctx: &Ctx) -> Expr {
    let activation = ctx.tokens() * (ctx.hidden * ctx.bytes.activation);
    let span = ctx.t.clone() * ctx.c.clone() * ctx.d.clone() * ctx.p.clone();
    let pipelined = Expr::min([ctx.p.clone() - 1.0, k(1.0)]);
    let (bytes, transfers) = match ctx.framework {
        Framework::Megatron | Framework::MegatronFsdp => (activation / ctx.t.clone(), 2.0),
        Framework::Deepspeed => (activation / ctx.t.clone(), 4.0),
        Framework::Fsdp | Framework::Tessel => (activation / ctx.replicated_divisor(), 2.0),
    };
    pipelined * k(transfers) * ctx.v.clone() * ctx.p2p(bytes, span)
}

/// Megatron-Core's gradient bucket when it overlaps the reduction: `max(40M, 1M · dp)`
/// parameters (`DistributedDataParallelConfig.bucket_size`); without overlap one bucket.
const MEGATRON_BUCKET_PARAMS: f64 = 40e6;
const MEGATRON_BUCKET_PARAMS_PER_DP_RANK: f64 = 1e6;
/// DeepSpeed's `reduce_bucket_size` and `allgather_bucket_size` defaults, in elements.
const DEEPSPEED_BUCKET_ELEMENTS: f64 = 5e8;

/// How many calls the data-parallel reduction of `params` parameters is split into: Megatron's
/// and DeepSpeed's buckets, FSDP's wrapping units (one per transformer block, plus the
/// embedding and output layer).
fn dp_calls(ctx: &Ctx, params: Expr, overlapped: bool) -> Expr {
    match ctx.framework {
        Framework::Megatron if overlapped => {
            let bucket = Expr::max([
                k(MEGATRON_BUCKET_PARAMS),
                ctx.d.clone() * ctx.c.clone() * MEGATRON_BUCKET_PARAMS_PER_DP_RANK,
            ]);
            Expr::max([(params / bucket).ceil(), k(1.0)])
        }
        Framework::Megatron => k(1.0),
        Framework::Deepspeed => Expr::max([(params / DEEPSPEED_BUCKET_ELEMENTS).ceil(), k(1.0)]),
        Framework::MegatronFsdp | Framework::Fsdp | Framework::Tessel => ctx.layers.clone() + 1.0,
    }
}

/// The data-parallel traffic of one step under ZeRO 0–2, split into what the backward pass
/// produces (the gradient reduction) and what follows the optimizer (the all-gather of the
/// updated weights), with the number of calls each is split into; and, under hybrid sharding
/// at any ZeRO stage, the all-reduce of each gradient shard across the replicas.
pub(crate) struct DpTraffic {
    pub reduce: Expr,
    pub reduce_calls: Expr,
    pub gather: Expr,
    pub gather_calls: Expr,
    pub replica_reduce: Expr,
    /// With gradient compression, what each class of buckets costs sent whole and sent
    /// compressed: the caller chooses per class with the overlap in view.
    pub compression: Option<CompressionClasses>,
}

/// One class of buckets (the layers', or the embedding's and output layer's) under ZeRO 0's
/// all-reduce, sent whole or compressed.
pub(crate) struct BucketClass {
    /// Seconds of the collectives sent whole, and compressed.
    pub whole: Expr,
    pub compressed: Expr,
    /// Seconds of the compression's passes (on the GPU, beside the backward), and the bytes
    /// of state it keeps (error feedback, PowerSGD's factors, top-k's gathered entries).
    pub compute: Expr,
    pub state_bytes: Expr,
}

pub(crate) struct CompressionClasses {
    /// The reduction's part no compression touches (ZeRO-1/2's reduce-scatter, the tied
    /// embedding's all-reduce); `applies` is 1 where ZeRO 0 all-reduces over several ranks.
    pub base: Expr,
    pub applies: Expr,
    pub layers: BucketClass,
    pub edges: BucketClass,
}

/// HBM bytes per gradient element of the compression passes. Error feedback adds the
/// previous error to the gradient and keeps the new one (read 4 + 4, write 4; then read 4 + 4,
/// write 4: 24). PowerSGD's three skinny GEMMs (`M·Q`, `Mᵀ·P`, `P·Qᵀ`) each stream the matrix
/// (12). Top-k's selection reads the gradient about three times (radix select: 12). FP8 casts
/// (read 4, write 1) and casts back (read 1, write 4: 10).
const ERROR_FEEDBACK_BYTES: f64 = 24.0;
const POWERSGD_PASS_BYTES: f64 = 12.0;
const TOPK_SELECT_BYTES: f64 = 12.0;
const FP8_CAST_BYTES: f64 = 10.0;
/// Bytes of a top-k index (int32) and of a scatter-add of one received entry (read the value
/// and index, read and write the sum).
const TOPK_INDEX_BYTES: f64 = 4.0;
const TOPK_SCATTER_BYTES: f64 = 16.0;

/// `params` gradient elements in `calls` buckets over `ring` of `ranks`, sent whole and
/// compressed by `c`; `factors` are PowerSGD's `P` and `Q` elements for these parameters.
fn bucket_class(
    ctx: &Ctx,
    c: &GradCompression,
    (params, factors): (Expr, Expr),
    calls: Expr,
    (ring, ranks): (&Ring, Expr),
) -> BucketClass {
    let g = ctx.bytes.gradient;
    let whole = calls.clone() * ctx.all_reduce(params.clone() * g / calls.clone(), ring);
    let error_feedback = params.clone() * ERROR_FEEDBACK_BYTES;
    let (compressed, compute, state_bytes) = match c.method {
        // `P` then `Q`, each all-reduced bucket by bucket.
        CompressionMethod::Powersgd => (
            k(2.0) * calls.clone() * ctx.all_reduce(factors.clone() * g / (k(2.0) * calls), ring),
            ctx.memory_bound(error_feedback + params.clone() * POWERSGD_PASS_BYTES),
            (params + factors) * g,
        ),
        // Every rank's entries and indices gathered to every rank, then summed in.
        CompressionMethod::Topk => {
            let gathered = ranks * params.clone() * c.ratio;
            (
                calls.clone() * ctx.gather(gathered.clone() * (g + TOPK_INDEX_BYTES) / calls, ring),
                ctx.memory_bound(
                    error_feedback
                        + params.clone() * TOPK_SELECT_BYTES
                        + gathered.clone() * TOPK_SCATTER_BYTES,
                ),
                params * g + gathered * (g + TOPK_INDEX_BYTES),
            )
        }
        CompressionMethod::Fp8 | CompressionMethod::Auto => (
            calls.clone() * ctx.all_reduce(params.clone() / calls, ring),
            ctx.memory_bound(error_feedback + params.clone() * FP8_CAST_BYTES),
            params * (g + 1.0),
        ),
    };
    BucketClass {
        whole: ctx.bind(whole),
        compressed: ctx.bind(compressed),
        compute: ctx.bind(compute),
        state_bytes,
    }
}

/// The layers' and the edges' (embedding, output layer) bucket classes under `c`.
fn bucket_classes(ctx: &Ctx, c: &GradCompression, ring: &Ring) -> (BucketClass, BucketClass) {
    let layers = ctx.bind(ctx.layers.clone() * layer_params(ctx));
    let edges = ctx.bind(ctx.is_first() * embedding_params(ctx) + ctx.is_last() * head_params(ctx));
    let rank = c.rank as f64;
    // The edges hold vocabulary-parallel `V/t × h` matrices; their factors are `r·(V/t + h)`.
    let vocab_matrix = k(ctx.vocab * ctx.hidden) / ctx.t.clone();
    let edge_factors =
        edges.clone() / vocab_matrix * rank * (k(ctx.vocab) / ctx.t.clone() + ctx.hidden);
    let ranks = ctx.d.clone() * ctx.c.clone();
    let layer_calls = dp_calls(ctx, layers.clone(), ctx.overlap.grad_reduce);
    let edge_calls = Expr::max([
        dp_calls(ctx, edges.clone(), ctx.overlap.grad_reduce),
        k(1.0),
    ]);
    let layer_factors = ctx.layers.clone() * powersgd_layer_factors(ctx, rank);
    (
        bucket_class(
            ctx,
            c,
            (layers, layer_factors),
            layer_calls,
            (ring, ranks.clone()),
        ),
        bucket_class(ctx, c, (edges, edge_factors), edge_calls, (ring, ranks)),
    )
}

/// ZeRO-0 all-reduces the gradients over dp·cp ranks; ZeRO-1/2 reduce-scatter them and
/// all-gather the updated bf16 weights over the `ds·cp` ranks that shard them, bucket by bucket,
/// and with hybrid sharding all-reduce each rank's gradient shard over the `d/ds` replicas.
/// Tied embeddings add an all-reduce of the embedding gradients between the first and last
/// device.
pub(crate) fn dp_step(ctx: &Ctx) -> DpTraffic {
    // Only what trains is reduced (and, sharded, gathered back): the adapters under LoRA.
    let params = ctx.bind(trainable_stage_params(ctx));
    let ring = ctx.dp_ring();
    let shard = ctx.shard_ring();
    let (z1, _, _) = ctx.zero_flags();
    let calls = ctx.bind(dp_calls(ctx, params.clone(), ctx.overlap.grad_reduce));
    let grad_bytes = params.clone() * ctx.bytes.gradient / calls.clone();
    let several = above(ctx.d.clone() * ctx.c.clone(), 1.0);
    let scatter = calls.clone() * ctx.gather(grad_bytes.clone(), &shard);
    let (reduce, compression) = match &ctx.grad_compression {
        None => {
            let all_reduce = calls.clone() * ctx.all_reduce(grad_bytes.clone(), &ring);
            let reduce = several.clone()
                * ((k(1.0) - z1.clone()) * all_reduce + z1.clone() * scatter)
                + tied_embedding_reduce(ctx);
            (reduce, None)
        }
        Some(c) => {
            let (layers, edges) = bucket_classes(ctx, c, &ring);
            let base =
                ctx.bind(several.clone() * z1.clone() * scatter + tied_embedding_reduce(ctx));
            let applies = ctx.bind(several.clone() * (k(1.0) - z1.clone()));
            let reduce =
                base.clone() + applies.clone() * (layers.whole.clone() + edges.whole.clone());
            let classes = CompressionClasses {
                base,
                applies,
                layers,
                edges,
            };
            (reduce, Some(classes))
        }
    };
    let gather_calls = ctx.bind(dp_calls(ctx, params.clone(), ctx.overlap.param_gather));
    let gather = several
        * z1.clone()
        * gather_calls.clone()
        * ctx.gather(params * ctx.bytes.weight / gather_calls.clone(), &shard);
    let shard_bytes = grad_bytes / (ctx.ds.clone() * ctx.c.clone());
    let replica_reduce = z1
        * above(ctx.d.clone() / ctx.ds.clone(), 1.0)
        * calls.clone()
        * ctx.all_reduce(shard_bytes, &ctx.replica_ring());
    DpTraffic {
        reduce,
        reduce_calls: calls,
        gather,
        gather_calls,
        replica_reduce,
        compression,
    }
}

/// With compression, the reduction's exposed seconds (by `exposed`, which applies the overlap
/// to a reduction's traffic) with each class of buckets sent whole or compressed, whichever of
/// the four choices is fastest, its compute included; with 1 for each class compressed and the
/// state it keeps. Compression's compute runs on the GPU beside the backward, so it hides behind
/// nothing.
pub(crate) fn choose_compression(
    classes: &CompressionClasses,
    exposed: &dyn Fn(Expr) -> Expr,
) -> (Expr, CompressionCost) {
    let c = classes;
    let time = |layers: bool, edges: bool| {
        let pick = |class: &BucketClass, compressed: bool| {
            if compressed {
                (class.compressed.clone(), class.compute.clone())
            } else {
                (class.whole.clone(), k(0.0))
            }
        };
        let (traffic_l, compute_l) = pick(&c.layers, layers);
        let (traffic_e, compute_e) = pick(&c.edges, edges);
        let reduce = c.base.clone() + c.applies.clone() * (traffic_l + traffic_e);
        exposed(reduce) + c.applies.clone() * (compute_l + compute_e)
    };
    let [neither, edges_only, layers_only, both] =
        [(false, false), (false, true), (true, false), (true, true)].map(|(l, e)| time(l, e));
    let layers = cheaper(
        Expr::min([neither.clone(), edges_only.clone()]),
        Expr::min([layers_only.clone(), both.clone()]),
    );
    let edges = cheaper(
        Expr::min([neither.clone(), layers_only.clone()]),
        Expr::min([edges_only.clone(), both.clone()]),
    );
    let state_bytes = c.applies.clone()
        * (layers.clone() * c.layers.state_bytes.clone()
            + edges.clone() * c.edges.state_bytes.clone());
    let tail = Expr::min([neither, edges_only, layers_only, both]);
    (
        tail,
        CompressionCost {
            state_bytes,
            layers,
            edges,
        },
    )
}

/// What the chosen compression keeps, and whether each class of buckets goes compressed.
pub(crate) struct CompressionCost {
    pub state_bytes: Expr,
    pub layers: Expr,
    pub edges: Expr,
}

/// 1 where `alternative` is faster than `plain`, else 0.
fn cheaper(plain: Expr, alternative: Expr) -> Expr {
    let gain = plain - alternative;
    Expr::max([gain.clone(), k(0.0)]) / Expr::max([gain, k(1e-12)])
}

fn tied_embedding_reduce(ctx: &Ctx) -> Expr {
    // A frozen embedding (adapter fine-tuning) has no gradient to keep in step.
    if !ctx.tied || ctx.adapters.is_some() {
        return k(0.0);
    }
    let bytes = k(ctx.vocab * ctx.hidden * ctx.bytes.gradient) / ctx.t.clone();
    let ends = ctx.is_first() + ctx.is_last();
    let pipelined = Expr::min([ctx.p.clone() - 1.0, k(1.0)]);
    let stride = ctx.t.clone() * ctx.c.clone() * ctx.d.clone() * (ctx.p.clone() - 1.0);
    let ring = ctx.ring("tied", k(2.0), stride);
    Expr::min([ends, k(1.0)]) * pipelined * ctx.all_reduce(bytes, &ring)
}

/// DeepSpeed's `stage3_max_reuse_distance` default, in elements: a parameter is released
/// after its module runs unless the parameters used before its next use number fewer.
const DEEPSPEED_MAX_REUSE_DISTANCE: f64 = 1e9;

/// Parameter all-gathers ZeRO-3 makes per transformer block and pass. DeepSpeed fetches
/// each parameter tensor of a module with its own collective: Megatron-DeepSpeed's block has
/// four linear layers (fused QKV, attention output, MLP in, MLP out) with a weight and, in
/// GPT-style models, a bias each, and two norms with a weight and, for layernorm, a bias.
/// FSDP gathers the whole block as one unit (torchtitan, llm-foundry), and so does
/// Megatron-Core's FSDP.
fn zero3_gathers_per_layer(ctx: &Ctx) -> f64 {
    match ctx.framework {
        Framework::Deepspeed => {
            let per_linear = if ctx.bias { 2.0 } else { 1.0 };
            let per_norm = if ctx.norm_params > ctx.hidden {
                2.0
            } else {
                1.0
            };
            4.0 * per_linear + 2.0 * per_norm
        }
        Framework::Megatron | Framework::MegatronFsdp | Framework::Fsdp | Framework::Tessel => 1.0,
    }
}

/// The fraction of a block's weights DeepSpeed's ZeRO-3 gathers a third time under full
/// recompute. The recomputed forward gathers the block again; each linear layer's weight is
/// then kept for its backward only if the weights used in between (the later linear layers,
/// once in the recomputed forward and once in the backward) number fewer than
/// [`DEEPSPEED_MAX_REUSE_DISTANCE`], and released and gathered again otherwise. FSDP
/// recomputes inside the unit's backward, with its weights already gathered.
fn deepspeed_regathered_fraction(ctx: &Ctx) -> Expr {
    let weights = block_linear_weights(ctx);
    let released = (0..weights.len()).map(|i| {
        let between = k(2.0) * Expr::sum(weights[i + 1..].iter().cloned());
        weights[i].clone() * above(between, DEEPSPEED_MAX_REUSE_DISTANCE)
    });
    Expr::sum(released) / Expr::sum(weights.iter().cloned())
}

/// ZeRO-2 in a framework that reduces piece by piece through flat buffers
/// ([`Framework::zero_through_flat_buffers`]): each micro-batch's gradients, copied into a
/// flat buffer (read and written once) and reduce-scattered over the sharding ranks one layer,
/// the embedding and the output layer at a time, exposed (Tessel's runtime overlaps nothing).
/// 0 elsewhere, where ZeRO-2 reduces once a step ([`dp_step`]).
pub(crate) fn zero2_microbatch(ctx: &Ctx) -> Expr {
    if !ctx.framework.zero_through_flat_buffers() {
        return k(0.0);
    }
    let ring = ctx.shard_ring();
    let (_, z2, z3) = ctx.zero_flags();
    let layer = layer_params(ctx);
    let edges = ctx.is_first() * embedding_params(ctx) + ctx.is_last() * head_params(ctx);
    let reduce = ctx.layers.clone() * ctx.gather(layer.clone() * ctx.bytes.gradient, &ring)
        + ctx.gather(edges.clone() * ctx.bytes.gradient, &ring);
    let copies =
        ctx.memory_bound((ctx.layers.clone() * layer + edges) * (2.0 * ctx.bytes.gradient));
    let several = above(ctx.d.clone() * ctx.c.clone(), 1.0);
    (z2 - z3) * several * (reduce + copies)
}

/// Exposed seconds of ZeRO-3's communication in one micro-batch. Every layer's weights are
/// all-gathered over the `ds·cp` sharding ranks before its forward and again before its
/// backward (DeepSpeed, under full recompute, partly a third time:
/// [`deepspeed_regathered_fraction`]), and its gradients reduce-scattered after its backward
/// (DeepSpeed: in `reduce_bucket_size` buckets; FSDP: per unit). With prefetch
/// (`overlap.param_gather`) the gather of the next layer runs behind the current layer's
/// compute, so only the first layer's gather and what exceeds each layer's compute is exposed;
/// without it every gather is. The reduce-scatter hides behind the next layer's backward when
/// `overlap.grad_reduce` (sharing the links with the gathers), else it is exposed.
/// `layer_forward` and `layer_backward` are one layer's compute (backward including its
/// recomputed forward).
pub(crate) fn zero3_microbatch(ctx: &Ctx, layer_forward: Expr, layer_backward: Expr) -> Expr {
    let ring = ctx.shard_ring();
    let (_, _, z3) = ctx.zero_flags();
    let weight_bytes = if ctx.gathers_fp8() {
        1.0
    } else {
        ctx.bytes.weight
    };
    let calls = zero3_gathers_per_layer(ctx);
    let layer = layer_params(ctx);
    let gather = ctx.bind(k(calls) * ctx.gather(layer.clone() * weight_bytes / calls, &ring));
    let reduce = ctx.bind(match ctx.framework {
        Framework::Deepspeed => {
            let params = stage_params(ctx);
            let buckets = Expr::max([(params.clone() / DEEPSPEED_BUCKET_ELEMENTS).ceil(), k(1.0)]);
            buckets.clone() * ctx.gather(params * ctx.bytes.gradient / buckets, &ring)
                / Expr::max([ctx.layers.clone(), k(1.0)])
        }
        Framework::Megatron | Framework::MegatronFsdp | Framework::Fsdp | Framework::Tessel => {
            ctx.gather(layer.clone() * ctx.bytes.gradient, &ring)
        }
    });
    // The embedding and output layer: gathered for forward and backward, reduced once.
    let edges = ctx.is_first() * embedding_params(ctx) + ctx.is_last() * head_params(ctx);
    let edge_gather = ctx.gather(edges.clone() * ctx.bytes.weight, &ring);
    let edge_reduce = ctx.gather(edges.clone() * ctx.bytes.gradient, &ring);
    let edge_exposed = k(2.0) * edge_gather + edge_reduce;
    // Memory-bound passes beside the transfers: each gathered weight read and written twice
    // (forward, backward), each gradient once.
    let copies = if ctx.framework.zero_through_flat_buffers() {
        let copied = ctx.layers.clone() * layer.clone() + edges.clone();
        ctx.memory_bound(copied * (4.0 * ctx.bytes.weight + 2.0 * ctx.bytes.gradient))
    } else {
        k(0.0)
    };

    let layers = ctx.layers.clone();
    // The backward's gathers: DeepSpeed's recomputed forward gathers again (above).
    let backward_gather = match ctx.framework {
        Framework::Deepspeed => {
            let recomputed = ctx.full.clone() / Expr::max([layers.clone(), k(1.0)]);
            ctx.bind(gather.clone() * (k(1.0) + recomputed * deepspeed_regathered_fraction(ctx)))
        }
        Framework::Megatron | Framework::MegatronFsdp | Framework::Fsdp | Framework::Tessel => {
            gather.clone()
        }
    };
    let overlap = ctx.overlap_zero3;
    let reduce_hidden = if overlap.grad_reduce { 1.0 } else { 0.0 };
    let layers_exposed = if overlap.param_gather {
        let forward = gather.clone()
            + (layers.clone() - 1.0) * Expr::max([gather.clone() - layer_forward.clone(), k(0.0)]);
        let backward_hidden = backward_gather.clone() + reduce.clone() * reduce_hidden;
        let backward = backward_gather.clone()
            + layers.clone()
                * Expr::max([backward_hidden.clone() - layer_backward.clone(), k(0.0)])
            + layers.clone() * reduce.clone() * (1.0 - reduce_hidden);
        // The compute beside the hidden transfers runs on the SMs NCCL leaves it.
        let beside = Expr::min([gather.clone(), layer_forward.clone()])
            + Expr::min([backward_hidden, layer_backward]);
        forward + backward + layers.clone() * beside * ctx.nccl_compute_share(&ring)
    } else {
        layers * (gather + backward_gather + reduce)
    };
    let several = above(ctx.d.clone() * ctx.c.clone(), 1.0);
    z3 * several * (layers_exposed + edge_exposed + copies)
}
