//! Parameters one GPU of a pipeline device holds, as expressions: its layers' weights sharded
//! over tensor (and, for experts, expert) parallelism, plus the embedding on the first device
//! and the output layer on the last.

use super::context::{k, Adapters, Ctx};
use crate::Expr;

/// Parameters of one (average) layer on one GPU.
pub(crate) fn layer_params(ctx: &Ctx) -> Expr {
    ctx.shared("layer_params", || layer_params_expr(ctx))
}

fn layer_params_expr(ctx: &Ctx) -> Expr {
    let t = ctx.t.clone();
    let h = ctx.hidden;
    // Query and output projections split over tp; key/value projections over `kv_split`.
    let query_output = 2.0 * h * ctx.q_dim + if ctx.bias { ctx.q_dim + h } else { 0.0 };
    let key_value = 2.0 * h * ctx.kv_dim + if ctx.bias { 2.0 * ctx.kv_dim } else { 0.0 };
    // Two norms, replicated over tp.
    let norms = 2.0 * ctx.norm_params;
    let dense_mlp = ctx.mlp_matrices * h * ctx.ffn
        + if ctx.bias {
            (ctx.mlp_matrices - 1.0) * ctx.ffn + h
        } else {
            0.0
        };
    let sharded = k(query_output) / t.clone() + k(key_value) / ctx.kv_split();
    let mlp = match &ctx.moe {
        None => k(dense_mlp) / t,
        Some(moe) => {
            let experts = k(moe.experts * moe.expert_params) / (ctx.e.clone() * ctx.et.clone());
            let shared = k(moe.shared * moe.expert_params) / t.clone();
            let router = k(h * moe.experts);
            let fraction = ctx.moe_fraction();
            (k(1.0) - fraction.clone()) * (k(dense_mlp) / t)
                + fraction * (experts + shared + router)
        }
    };
    sharded + mlp + k(norms)
}

/// The weights (no biases), on one GPU, of a transformer block's linear layers in execution
/// order: fused QKV, attention output, MLP in, MLP out. They are the weight terms of
/// [`layer_params`] split by layer, for what depends on each layer's size (DeepSpeed's ZeRO-3
/// reuse distance); an MoE block is counted as a dense one.
pub(crate) fn block_linear_weights(ctx: &Ctx) -> [Expr; 4] {
    let h = ctx.hidden;
    let t = ctx.t.clone();
    [
        k(h * ctx.q_dim) / t.clone() + k(2.0 * h * ctx.kv_dim) / ctx.kv_split(),
        k(h * ctx.q_dim) / t.clone(),
        k(h * (ctx.mlp_matrices - 1.0) * ctx.ffn) / t.clone(),
        k(h * ctx.ffn) / t,
    ]
}

/// Parameters of the embedding on the first device: the vocabulary split over tp, learned
/// positions replicated.
pub(crate) fn embedding_params(ctx: &Ctx) -> Expr {
    k(ctx.vocab * ctx.hidden) / ctx.t.clone() + k(ctx.position_params)
}

/// Parameters of the final norm and output layer on the last device. With tied embeddings
/// and a single device the output reuses the embedding; with a pipeline the last device keeps
/// its own copy (synchronised by an all-reduce of the gradients), as Megatron does.
pub(crate) fn head_params(ctx: &Ctx) -> Expr {
    let output = k(ctx.vocab * ctx.hidden) / ctx.t.clone();
    let copies = if ctx.tied {
        Expr::min([ctx.p.clone() - 1.0, k(1.0)])
    } else {
        k(1.0)
    };
    output * copies + k(ctx.norm_params)
}

/// Of [`stage_params`], the routed experts' parameters: ZeRO shards them over the
/// expert-data-parallel group (`tp·dp·cp/(etp·ep)` ranks holding the same experts, `dp·cp/ep`
/// unfolded), not over `dp·cp`.
pub(crate) fn stage_expert_params(ctx: &Ctx) -> Expr {
    match &ctx.moe {
        None => k(0.0),
        Some(moe) => {
            ctx.layers.clone() * ctx.moe_fraction() * (moe.experts * moe.expert_params)
                / (ctx.e.clone() * ctx.et.clone())
        }
    }
}

/// Parameters per GPU after sharding over the data-parallel ranks when `sharded` is 1 (a ZeRO
/// flag): dense parameters over `ds·cp` (`dp·cp` unless hybrid sharding), routed experts over
/// their expert-data-parallel group within those ranks.
pub(crate) fn sharded_params(ctx: &Ctx, sharded: Expr) -> Expr {
    let experts = stage_expert_params(ctx);
    let dense = stage_params(ctx) - experts.clone();
    let ranks = ctx.ds.clone() * ctx.c.clone();
    let expert_ranks = ranks.clone() * ctx.t.clone() / (ctx.e.clone() * ctx.et.clone());
    dense / (k(1.0) + sharded.clone() * (ranks - 1.0))
        + experts / (k(1.0) + sharded * (expert_ranks - 1.0))
}

/// Parameters one GPU of this pipeline device holds.
pub(crate) fn stage_params(ctx: &Ctx) -> Expr {
    ctx.shared("stage_params", || {
        ctx.layers.clone() * layer_params(ctx)
            + ctx.is_first() * embedding_params(ctx)
            + ctx.is_last() * head_params(ctx)
    })
}

/// Adapter parameters of one (average) layer on one GPU under LoRA: per targeted projection
/// of `input × output`, `A` of `input × r` and `B` of `r × output`. Column-parallel
/// projections (query, key, value, gate, up) split `B` over tp and keep `A` whole;
/// row-parallel ones (output, down) split `A` and keep `B` whole. Routed experts carry
/// adapters of their own, split as their weights are. `trained_only` counts what trains: under
/// LoRA-FA `B` alone.
fn adapter_layer_params(ctx: &Ctx, adapters: &Adapters, trained_only: bool) -> Expr {
    let r = adapters.rank;
    let a = if trained_only && adapters.frozen_a {
        0.0
    } else {
        1.0
    };
    let h = ctx.hidden;
    let t = ctx.t.clone();
    let mut params = k(0.0);
    if adapters.targets.qkv {
        params = params
            + k(a * 3.0 * h * r)
            + k(r * ctx.q_dim) / t.clone()
            + k(2.0 * r * ctx.kv_dim) / ctx.kv_split();
    }
    if adapters.targets.o {
        params = params + k(a * ctx.q_dim * r) / t.clone() + k(r * h);
    }
    if adapters.targets.mlp {
        let mlp = |ffn: f64, split: Expr| {
            let up = ctx.mlp_matrices - 1.0;
            k(a * up * h * r + r * h) + k(up * r * ffn + a * ffn * r) / split
        };
        params = params
            + match &ctx.moe {
                None => mlp(ctx.ffn, t),
                Some(moe) => {
                    let experts = mlp(moe.expert_ffn, ctx.et.clone()) * moe.experts / ctx.e.clone();
                    let shared = mlp(moe.expert_ffn * moe.shared, t.clone());
                    let fraction = ctx.moe_fraction();
                    (k(1.0) - fraction.clone()) * mlp(ctx.ffn, t) + fraction * (experts + shared)
                }
            };
    }
    params
}

/// Elements of PowerSGD's rank-`rank` factors `P` and `Q` of one (average) layer's weight
/// matrices on one GPU: `rank·(rows + cols)` per local matrix, the shapes of rank-`rank`
/// adapters on every projection.
pub(crate) fn powersgd_layer_factors(ctx: &Ctx, rank: f64) -> Expr {
    let every = Adapters {
        rank,
        frozen_a: false,
        targets: tessel_grammar::LoraTargets::ALL,
    };
    adapter_layer_params(ctx, &every, false)
}

/// Adapter parameters one GPU of this pipeline device holds, trained or frozen (LoRA-FA's
/// `A`); none without adapters.
pub(crate) fn adapter_stage_params(ctx: &Ctx) -> Expr {
    match &ctx.adapters {
        None => k(0.0),
        Some(adapters) => ctx.layers.clone() * adapter_layer_params(ctx, adapters, false),
    }
}

/// Parameters that train on one GPU of this pipeline device: every one it holds, or under
/// adapter fine-tuning only its layers' adapters (the embedding and output layer stay frozen).
pub(crate) fn trainable_stage_params(ctx: &Ctx) -> Expr {
    match &ctx.adapters {
        None => stage_params(ctx),
        Some(adapters) => ctx.shared("trainable_stage_params", || {
            ctx.layers.clone() * adapter_layer_params(ctx, adapters, true)
        }),
    }
}

/// [`sharded_params`] of the trainable parameters (adapters shard as dense parameters).
pub(crate) fn trainable_sharded_params(ctx: &Ctx, sharded: Expr) -> Expr {
    if ctx.adapters.is_none() {
        return sharded_params(ctx, sharded);
    }
    let ranks = ctx.ds.clone() * ctx.c.clone();
    trainable_stage_params(ctx) / (k(1.0) + sharded * (ranks - 1.0))
}
