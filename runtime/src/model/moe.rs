//! Mixture-of-experts feed-forward: a replicated top-k router, experts split over the
//! expert-parallel group with token all-to-all (dispatch and combine), each expert a
//! tensor-parallel MLP, optional always-active shared experts. Every routed token is
//! processed (no capacity dropping), so the result does not depend on how tokens are spread
//! over ranks.

use super::{mlp, param, Env, Grads, Values};
use crate::backend::Backend;
use crate::error::RuntimeError;
use crate::mesh::GroupKind;

pub struct MoeCtx<T> {
    x: T,
    /// Router choices `(token, expert, gate)` in dispatch order: by expert, then token.
    routes: Vec<(usize, usize, f32)>,
    /// Per expert: the router's selected logits of each token are softmaxed into gates.
    selected: Vec<Vec<usize>>,
    gates: Vec<Vec<f32>>,
    /// Rows each source rank sent to each local expert: `counts[src][local]`.
    recv_counts: Vec<Vec<usize>>,
    expert_ctx: Vec<mlp::MlpCtx<T>>,
    /// Expert outputs in dispatch order (partial over the tensor group).
    outputs: T,
    shared: Option<mlp::MlpCtx<T>>,
}

impl<T: Clone> MoeCtx<T> {
    /// The router's (and the shared experts') input; see [`mlp::MlpCtx::input`] for why the
    /// block swaps it.
    pub fn input(&self) -> &T {
        &self.x
    }

    pub fn set_input(&mut self, x: T) {
        if let Some(shared) = self.shared.as_mut() {
            shared.set_input(x.clone());
        }
        self.x = x;
    }
}

impl<T> MoeCtx<T> {
    pub fn tensors(&self) -> Vec<&T> {
        let mut v = vec![&self.x, &self.outputs];
        for c in &self.expert_ctx {
            v.extend(c.tensors());
        }
        // The shared experts read the same input as the router, held once.
        if let Some(shared) = &self.shared {
            v.extend(shared.tensors_besides_input());
        }
        v
    }
}

struct Layout {
    experts: usize,
    top_k: usize,
    per_rank: usize,
    ep: usize,
    ep_index: usize,
}

fn layout<B: Backend>(env: &Env<B>) -> Result<Layout, RuntimeError> {
    let moe = env
        .model
        .moe
        .as_ref()
        .ok_or_else(|| RuntimeError::InvalidModel {
            reason: "expert layer in a model without experts".into(),
        })?;
    let ep = env.b.group_size(GroupKind::Expert);
    Ok(Layout {
        experts: moe.experts as usize,
        top_k: moe.top_k as usize,
        per_rank: moe.experts as usize / ep,
        ep,
        ep_index: env.b.group_index(GroupKind::Expert),
    })
}

/// Top-k experts of each token (ties to the lower index) and their gates (softmax over the
/// selected logits, as Mixtral).
fn route(logits: &[f32], experts: usize, top_k: usize) -> (Vec<Vec<usize>>, Vec<Vec<f32>>) {
    logits
        .chunks(experts)
        .map(|row| {
            let mut order: Vec<usize> = (0..experts).collect();
            order.sort_by(|&a, &b| {
                row[b]
                    .partial_cmp(&row[a])
                    .unwrap_or(std::cmp::Ordering::Equal)
                    .then(a.cmp(&b))
            });
            order.truncate(top_k);
            let max = order
                .iter()
                .map(|&e| row[e])
                .fold(f32::NEG_INFINITY, f32::max);
            let exps: Vec<f32> = order.iter().map(|&e| (row[e] - max).exp()).collect();
            let total: f32 = exps.iter().sum();
            (order, exps.into_iter().map(|x| x / total).collect())
        })
        .unzip()
}

fn expert_prefix(prefix: &str, e: usize) -> String {
    format!("{prefix}.experts.{e}")
}

/// Sends `rows` (in dispatch order, `send_counts[dest][local]` per destination and local
/// expert) to the experts' ranks; returns per local expert the rows received, grouped by
/// source rank.
fn dispatch<B: Backend>(
    env: &Env<B>,
    l: &Layout,
    rows: &B::Tensor,
    send_counts: &[Vec<usize>],
    recv_counts: &[Vec<usize>],
) -> Result<Vec<B::Tensor>, RuntimeError> {
    let b = env.b;
    let mut parts = Vec::with_capacity(l.ep);
    let mut start = 0;
    for counts in send_counts {
        let n: usize = counts.iter().sum();
        parts.push(b.slice_rows(rows, start, start + n));
        start += n;
    }
    let received = b.all_to_all(GroupKind::Expert, parts)?;
    let mut per_expert = Vec::with_capacity(l.per_rank);
    for local in 0..l.per_rank {
        let pieces: Vec<B::Tensor> = received
            .iter()
            .zip(recv_counts)
            .map(|(r, counts)| {
                let s: usize = counts[..local].iter().sum();
                b.slice_rows(r, s, s + counts[local])
            })
            .collect();
        per_expert.push(b.concat_rows(&pieces.iter().collect::<Vec<_>>()));
    }
    Ok(per_expert)
}

/// Inverse of [`dispatch`]: returns rows in the sender's dispatch order.
fn combine<B: Backend>(
    env: &Env<B>,
    l: &Layout,
    per_expert: &[B::Tensor],
    recv_counts: &[Vec<usize>],
) -> Result<B::Tensor, RuntimeError> {
    let b = env.b;
    let mut offsets = vec![0usize; l.per_rank];
    let mut parts = Vec::with_capacity(l.ep);
    for counts in recv_counts {
        let pieces: Vec<B::Tensor> = (0..l.per_rank)
            .map(|local| {
                let s = offsets[local];
                offsets[local] += counts[local];
                b.slice_rows(&per_expert[local], s, s + counts[local])
            })
            .collect();
        parts.push(b.concat_rows(&pieces.iter().collect::<Vec<_>>()));
    }
    let back = b.all_to_all(GroupKind::Expert, parts)?;
    Ok(b.concat_rows(&back.iter().collect::<Vec<_>>()))
}

/// Returns this rank's partial output (summed over the tensor group by the caller).
pub fn forward<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    prefix: &str,
    x: &B::Tensor,
) -> Result<(B::Tensor, MoeCtx<B::Tensor>), RuntimeError> {
    let b = env.b;
    let l = layout(env)?;
    let (tokens, hidden) = b.shape(x);
    let logits = b.to_vec(&b.matmul(x, param(values, &format!("{prefix}.router"))?, false, false));
    let (selected, gates) = route(&logits, l.experts, l.top_k);
    let mut routes = Vec::new();
    for e in 0..l.experts {
        for t in 0..tokens {
            if let Some(k) = selected[t].iter().position(|&s| s == e) {
                routes.push((t, e, gates[t][k]));
            }
        }
    }
    let mut send_counts = vec![vec![0usize; l.per_rank]; l.ep];
    for &(_, e, _) in &routes {
        send_counts[e / l.per_rank][e % l.per_rank] += 1;
    }
    let count_parts: Vec<B::Tensor> = send_counts
        .iter()
        .map(|c| b.tensor(c.iter().map(|&n| n as f32).collect(), 1, l.per_rank))
        .collect();
    let recv_counts: Vec<Vec<usize>> = b
        .all_to_all(GroupKind::Expert, count_parts)?
        .iter()
        .map(|t| b.to_vec(t).into_iter().map(|n| n as usize).collect())
        .collect();
    let token_order: Vec<usize> = routes.iter().map(|r| r.0).collect();
    let rows = b.gather_rows(x, &token_order);
    let inputs = dispatch(env, &l, &rows, &send_counts, &recv_counts)?;
    let mut expert_ctx = Vec::with_capacity(l.per_rank);
    let mut expert_out = Vec::with_capacity(l.per_rank);
    for (local, input) in inputs.iter().enumerate() {
        let e = l.ep_index * l.per_rank + local;
        let (y, ctx) = mlp::forward(env, values, &expert_prefix(prefix, e), input)?;
        expert_out.push(y);
        expert_ctx.push(ctx);
    }
    let outputs = combine(env, &l, &expert_out, &recv_counts)?;
    let gate_order: Vec<f32> = routes.iter().map(|r| r.2).collect();
    let mut y = b.zeros(tokens, hidden);
    b.scatter_add_rows(&mut y, &token_order, &b.scale_rows(&outputs, &gate_order));
    let shared = if values.contains_key(&shared_probe(prefix, env)) {
        let (ys, ctx) = mlp::forward(env, values, &format!("{prefix}.shared"), x)?;
        b.add_assign(&mut y, &ys);
        Some(ctx)
    } else {
        None
    };
    Ok((
        y,
        MoeCtx {
            x: x.clone(),
            routes,
            selected,
            gates,
            recv_counts,
            expert_ctx,
            outputs,
            shared,
        },
    ))
}

/// A parameter every shared-expert MLP has.
fn shared_probe<B: Backend>(prefix: &str, env: &Env<B>) -> String {
    match env.model.mlp {
        tessel_grammar::MlpKind::Gelu => format!("{prefix}.shared.w2"),
        tessel_grammar::MlpKind::Swiglu => format!("{prefix}.shared.wd"),
    }
}

/// `dy` is the gradient of the full (summed) output; returns this rank's partial input
/// gradient.
pub fn backward<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    grads: &mut Grads<B::Tensor>,
    prefix: &str,
    ctx: &MoeCtx<B::Tensor>,
    dy: &B::Tensor,
) -> Result<B::Tensor, RuntimeError> {
    let b = env.b;
    let l = layout(env)?;
    let (tokens, hidden) = b.shape(&ctx.x);
    let token_order: Vec<usize> = ctx.routes.iter().map(|r| r.0).collect();
    let gate_order: Vec<f32> = ctx.routes.iter().map(|r| r.2).collect();
    let dy_rows = b.gather_rows(dy, &token_order);
    // Gate gradients need the full expert outputs: sum the partial dots over the tensor group.
    let dgate_partial = b.row_dots(&dy_rows, &ctx.outputs);
    let n = dgate_partial.len();
    let dgate = if env.tp > 1 {
        b.to_vec(&b.all_reduce(GroupKind::Tensor, &b.tensor(dgate_partial, 1, n))?)
    } else {
        dgate_partial
    };
    let d_outputs = b.scale_rows(&dy_rows, &gate_order);
    let mut send_counts = vec![vec![0usize; l.per_rank]; l.ep];
    for &(_, e, _) in &ctx.routes {
        send_counts[e / l.per_rank][e % l.per_rank] += 1;
    }
    let d_expert_out = dispatch(env, &l, &d_outputs, &send_counts, &ctx.recv_counts)?;
    let mut d_expert_in = Vec::with_capacity(l.per_rank);
    for (local, d) in d_expert_out.iter().enumerate() {
        let e = l.ep_index * l.per_rank + local;
        d_expert_in.push(mlp::backward(
            env,
            values,
            grads,
            &expert_prefix(prefix, e),
            &ctx.expert_ctx[local],
            d,
        )?);
    }
    let d_rows = combine(env, &l, &d_expert_in, &ctx.recv_counts)?;
    let mut dx = b.zeros(tokens, hidden);
    b.scatter_add_rows(&mut dx, &token_order, &d_rows);
    // Router: softmax over each token's selected logits.
    let mut dgate_by_token = vec![vec![0.0f32; l.top_k]; tokens];
    for (i, &(t, e, _)) in ctx.routes.iter().enumerate() {
        let k = ctx.selected[t]
            .iter()
            .position(|&s| s == e)
            .expect("routed expert was selected");
        dgate_by_token[t][k] = dgate[i];
    }
    let mut dlogits = vec![0.0f32; tokens * l.experts];
    for t in 0..tokens {
        let g = &ctx.gates[t];
        let dot: f32 = g.iter().zip(&dgate_by_token[t]).map(|(a, b)| a * b).sum();
        for (k, &e) in ctx.selected[t].iter().enumerate() {
            dlogits[t * l.experts + e] = g[k] * (dgate_by_token[t][k] - dot);
        }
    }
    let dlogits = b.tensor(dlogits, tokens, l.experts);
    let router = format!("{prefix}.router");
    grads.add(b, &router, || b.matmul(&ctx.x, &dlogits, true, false));
    if env.tp_index == 0 {
        // The router input gradient is whole on every tensor rank; count it once in the sum.
        b.add_assign(
            &mut dx,
            &b.matmul(&dlogits, param(values, &router)?, false, true),
        );
    }
    if let Some(shared) = &ctx.shared {
        let ds = mlp::backward(env, values, grads, &format!("{prefix}.shared"), shared, dy)?;
        b.add_assign(&mut dx, &ds);
    }
    Ok(dx)
}
