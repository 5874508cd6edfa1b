//! Causal self-attention with grouped-query heads, split over the tensor group by heads
//! (column-parallel Q/K/V, row-parallel output), rotary positions when the model uses them.
//! With context parallelism it is ring attention: each rank keeps its own contiguous chunk of
//! queries, keys and values; the key/value blocks travel around the context ring and the
//! partial results are merged with an online (log-sum-exp) softmax. Causality by block: a
//! rank's queries see the blocks of the ranks before it whole, its own block causally and the
//! later ones not at all (those are passed on without work). Contiguous chunks leave the
//! last ranks more work than the first; Megatron's load-balanced split (two chunks per rank)
//! is not done here.

use super::{param, Env, Grads, Values};
use crate::backend::{AttentionShape, Backend};
use crate::error::RuntimeError;
use tessel_grammar::PositionKind;

pub struct AttnCtx<T> {
    x: T,
    q: T,
    /// This rank's keys and values (the whole sequence without context parallelism).
    k: T,
    v: T,
    /// Per visible key/value block (by source context rank): its share of the softmax. Dropped
    /// under selective recompute and rebuilt in the backward.
    probs: Option<Vec<T>>,
    /// Ring attention: log-sum-exp of each query row and head over every visible key.
    lse: Option<T>,
    attn: T,
}

impl<T> AttnCtx<T> {
    /// The input the backward multiplies with. Under sequence parallelism the block swaps in
    /// this rank's sequence shard after the forward and the all-gathered input again before
    /// the backward, so the full input is not kept in between (as Megatron does).
    pub fn input(&self) -> &T {
        &self.x
    }

    pub fn set_input(&mut self, x: T) {
        self.x = x;
    }

    pub fn tensors(&self) -> Vec<&T> {
        let mut v = vec![&self.x, &self.q, &self.k, &self.v, &self.attn];
        v.extend(self.probs.iter().flatten());
        v.extend(self.lse.as_ref());
        v
    }
}

/// Queries of this rank against the key/value block of context rank `source`: an ordinary
/// causal call whose keys start `(cp_index − source)·seq_chunk` positions before the queries.
fn shape<B: Backend>(env: &Env<B>, source: usize) -> AttentionShape {
    let m = env.model;
    AttentionShape {
        batch: env.batch,
        q_len: env.seq_chunk,
        kv_len: env.seq_chunk,
        q_offset: (env.cp_index - source) * env.seq_chunk,
        heads: (m.heads as usize) / env.tp,
        kv_heads: ((m.kv_heads as usize) / env.tp).max(1),
        head_dim: m.head_dim as usize,
    }
}

/// Context rank whose key/value block this rank holds after `step` passes around the ring.
fn source(env: &Env<impl Backend>, step: usize) -> usize {
    (env.cp_index + env.cp - step) % env.cp
}

/// Attention output of this rank's queries; with context parallelism also the per-block
/// probabilities (when kept) and the merged log-sum-exp.
type AttnOut<T> = (T, Vec<T>, Option<T>);

fn ring_forward<B: Backend>(
    env: &Env<B>,
    q: &B::Tensor,
    k: &B::Tensor,
    v: &B::Tensor,
    keep_probs: bool,
) -> Result<AttnOut<B::Tensor>, RuntimeError> {
    let b = env.b;
    if env.cp == 1 {
        let (attn, probs) = b.attention(shape(env, 0), q, k, v);
        return Ok((
            attn,
            keep_probs.then_some(probs).into_iter().collect(),
            None,
        ));
    }
    let (mut k_block, mut v_block) = (k.clone(), v.clone());
    let mut merged: Option<(B::Tensor, B::Tensor)> = None;
    let mut blocks = Vec::new();
    for step in 0..env.cp {
        let src = source(env, step);
        // Pass the block on before working on it; the last step has nothing left to pass.
        let next = if step + 1 < env.cp {
            Some((
                env.pass_around_cp_ring(&k_block)?,
                env.pass_around_cp_ring(&v_block)?,
            ))
        } else {
            None
        };
        if src <= env.cp_index {
            let s = shape(env, src);
            let (out, probs, lse) = b.attention_block(s, q, &k_block, &v_block);
            merged = Some(match merged {
                None => (out, lse.clone()),
                Some((acc, acc_lse)) => b.attention_merge(s, (&acc, &acc_lse), (&out, &lse)),
            });
            if keep_probs {
                blocks.push((src, probs, lse));
            }
        }
        if let Some((k_next, v_next)) = next {
            k_block = k_next;
            v_block = v_next;
        }
    }
    let (attn, lse) = merged.expect("a rank always sees its own block");
    blocks.sort_by_key(|(src, _, _)| *src);
    let probs = blocks
        .into_iter()
        .map(|(src, p, block_lse)| b.attention_rescale(shape(env, src), &p, &block_lse, &lse))
        .collect();
    Ok((attn, probs, Some(lse)))
}

/// Gradients of this rank's queries, keys and values.
type QkvGrads<T> = (T, T, T);

/// Gradients of the queries, keys and values. With context parallelism the key/value blocks
/// travel around the ring again, each with the gradient accumulated for it so far; after the
/// last step one more pass brings every block's gradient home.
fn ring_backward<B: Backend>(
    env: &Env<B>,
    ctx: &AttnCtx<B::Tensor>,
    dattn: &B::Tensor,
) -> Result<QkvGrads<B::Tensor>, RuntimeError> {
    let b = env.b;
    let Some(lse) = &ctx.lse else {
        let s = shape(env, 0);
        let recomputed;
        let probs = match &ctx.probs {
            Some(p) => &p[0],
            None => {
                recomputed = b.attention(s, &ctx.q, &ctx.k, &ctx.v).1;
                &recomputed
            }
        };
        return Ok(b.attention_backward(s, &ctx.q, &ctx.k, &ctx.v, probs, dattn));
    };
    let (q_rows, q_cols) = b.shape(&ctx.q);
    let (kv_rows, kv_cols) = b.shape(&ctx.k);
    let mut dq = b.zeros(q_rows, q_cols);
    let (mut k_block, mut v_block) = (ctx.k.clone(), ctx.v.clone());
    let mut dk_block = b.zeros(kv_rows, kv_cols);
    let mut dv_block = b.zeros(kv_rows, kv_cols);
    for step in 0..env.cp {
        let src = source(env, step);
        if src <= env.cp_index {
            let s = shape(env, src);
            let recomputed;
            let probs = match &ctx.probs {
                Some(p) => &p[src],
                None => {
                    recomputed = b.attention_block_probs(s, &ctx.q, &k_block, lse);
                    &recomputed
                }
            };
            let (dq_part, dk_part, dv_part) =
                b.attention_block_backward(s, &ctx.q, &k_block, &v_block, probs, &ctx.attn, dattn);
            b.add_assign(&mut dq, &dq_part);
            b.add_assign(&mut dk_block, &dk_part);
            b.add_assign(&mut dv_block, &dv_part);
        }
        if step + 1 < env.cp {
            k_block = env.pass_around_cp_ring(&k_block)?;
            v_block = env.pass_around_cp_ring(&v_block)?;
        }
        dk_block = env.pass_around_cp_ring(&dk_block)?;
        dv_block = env.pass_around_cp_ring(&dv_block)?;
    }
    Ok((dq, dk_block, dv_block))
}

fn project<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    prefix: &str,
    x: &B::Tensor,
    which: &str,
) -> Result<B::Tensor, RuntimeError> {
    let y = env.b.matmul(
        x,
        param(values, &format!("{prefix}.w{which}"))?,
        false,
        false,
    );
    let y = match values.get(&format!("{prefix}.b{which}")) {
        Some(bias) => env.b.add_row(&y, bias),
        None => y,
    };
    Ok(
        if env.model.position == PositionKind::Rope && which != "v" {
            env.b.rope(
                &y,
                env.model.head_dim as usize,
                env.seq_chunk,
                env.position_offset(),
                false,
            )
        } else {
            y
        },
    )
}

/// Returns this rank's partial output (to be summed over the tensor group).
pub fn forward<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    prefix: &str,
    x: &B::Tensor,
    keep_probs: bool,
) -> Result<(B::Tensor, AttnCtx<B::Tensor>), RuntimeError> {
    let b = env.b;
    let q = project(env, values, prefix, x, "q")?;
    let k = project(env, values, prefix, x, "k")?;
    let v = project(env, values, prefix, x, "v")?;
    let (attn, probs, lse) = ring_forward(env, &q, &k, &v, keep_probs)?;
    let out = b.matmul(&attn, param(values, &format!("{prefix}.wo"))?, false, false);
    Ok((
        out,
        AttnCtx {
            x: x.clone(),
            q,
            k,
            v,
            probs: keep_probs.then_some(probs),
            lse,
            attn,
        },
    ))
}

/// Returns this rank's partial gradient of the input.
pub fn backward<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    grads: &mut Grads<B::Tensor>,
    prefix: &str,
    ctx: &AttnCtx<B::Tensor>,
    dy: &B::Tensor,
) -> Result<B::Tensor, RuntimeError> {
    let b = env.b;
    let wo = format!("{prefix}.wo");
    grads.add(b, &wo, b.matmul(&ctx.attn, dy, true, false));
    let dattn = b.matmul(dy, param(values, &wo)?, false, true);
    let (dq, dk, dv) = ring_backward(env, ctx, &dattn)?;
    let rope = env.model.position == PositionKind::Rope;
    let unrotate = |d: B::Tensor| {
        if rope {
            b.rope(
                &d,
                env.model.head_dim as usize,
                env.seq_chunk,
                env.position_offset(),
                true,
            )
        } else {
            d
        }
    };
    let mut dx: Option<B::Tensor> = None;
    for (which, d) in [("q", unrotate(dq)), ("k", unrotate(dk)), ("v", dv)] {
        let w = format!("{prefix}.w{which}");
        grads.add(b, &w, b.matmul(&ctx.x, &d, true, false));
        let bias = format!("{prefix}.b{which}");
        if values.contains_key(&bias) {
            grads.add(b, &bias, b.sum_rows(&d));
        }
        let part = b.matmul(&d, param(values, &w)?, false, true);
        dx = Some(match dx {
            Some(acc) => b.add(&acc, &part),
            None => part,
        });
    }
    Ok(dx.expect("three projections"))
}
