//! Causal self-attention with grouped-query heads, split over the tensor group by heads
//! (column-parallel Q/K/V, row-parallel output), rotary positions when the model uses them.
//! With context parallelism it is ring attention: the sequence is cut into `2·cp` chunks and
//! context rank `r` keeps chunks `r` and `2cp − 1 − r` of the queries, keys and values (so
//! every rank has the same causal work, as in Megatron); the key/value blocks travel around
//! the context ring and the partial results are merged with an online (log-sum-exp) softmax.
//! Causality by chunk: a query chunk sees earlier key chunks whole, its own causally and later
//! ones not at all.

use super::lora::{self, AdapterCtx, Parallel};
use super::{param, Env, Grads, Values};
use crate::backend::{AttentionShape, Backend};
use crate::error::RuntimeError;
use tessel_grammar::PositionKind;

pub struct AttnCtx<T> {
    /// The input of the query, key and value projections, where their backward needs it
    /// (not under LoRA-FA: frozen weights need no input for a gradient).
    x: Option<T>,
    q: T,
    /// This rank's keys and values (the whole sequence without context parallelism).
    k: T,
    v: T,
    /// Per visible (query chunk, key chunk) pair, in the order the ring visits them: its share
    /// of the softmax. Dropped under selective recompute and rebuilt in the backward.
    probs: Option<Vec<T>>,
    /// Ring attention: log-sum-exp of each query row and head over every visible key.
    lse: Option<T>,
    attn: T,
    /// The adapters' products with `A`, by projection (`q`, `k`, `v`, `o`).
    adapters: Vec<(&'static str, AdapterCtx<T>)>,
}

impl<T> AttnCtx<T> {
    /// The input the backward multiplies with, where kept. Under sequence parallelism the
    /// block swaps in this rank's sequence shard after the forward and the all-gathered input
    /// again before the backward, so the full input is not kept in between (as Megatron does).
    pub fn input(&self) -> Option<&T> {
        self.x.as_ref()
    }

    pub fn set_input(&mut self, x: T) {
        if self.x.is_some() {
            self.x = Some(x);
        }
    }

    pub fn tensors(&self) -> Vec<&T> {
        let mut v = vec![&self.q, &self.k, &self.v, &self.attn];
        v.extend(self.x.as_ref());
        v.extend(self.probs.iter().flatten());
        v.extend(self.lse.as_ref());
        v.extend(self.adapters.iter().map(|(_, a)| a.tensor()));
        v
    }

    fn adapter(&self, which: &str) -> Option<&AdapterCtx<T>> {
        self.adapters
            .iter()
            .find(|(w, _)| *w == which)
            .map(|(_, a)| a)
    }
}

/// Queries of the sequence chunk `q_chunk` against the keys of chunk `kv_chunk ≤ q_chunk`:
/// an ordinary causal call whose keys start `q_chunk − kv_chunk` chunks before the queries
/// (so every key of an earlier chunk is visible).
fn shape<B: Backend>(env: &Env<B>, q_chunk: usize, kv_chunk: usize) -> AttentionShape {
    let m = env.model;
    AttentionShape {
        batch: env.batch,
        q_len: env.chunk_len,
        kv_len: env.chunk_len,
        q_offset: (q_chunk - kv_chunk) * env.chunk_len,
        heads: (m.heads as usize) / env.tp,
        kv_heads: ((m.kv_heads as usize) / env.tp).max(1),
        head_dim: m.head_dim as usize,
    }
}

/// The whole-sequence shape without context parallelism.
fn single_shape<B: Backend>(env: &Env<B>) -> AttentionShape {
    shape(env, 0, 0)
}

/// Context rank whose key/value block this rank holds after `step` passes around the ring.
fn source(env: &Env<impl Backend>, step: usize) -> usize {
    (env.cp_index + env.cp - step) % env.cp
}

/// Chunk `j` (in the rank's token order) of chunk-major rows.
fn chunk<B: Backend>(env: &Env<B>, t: &B::Tensor, j: usize) -> B::Tensor {
    let n = env.chunk_tokens();
    env.b.slice_rows(t, j * n, (j + 1) * n)
}

fn concat<B: Backend>(env: &Env<B>, parts: &[B::Tensor]) -> B::Tensor {
    env.b.concat_rows(&parts.iter().collect::<Vec<_>>())
}

/// The pairs (query chunk, key/value chunk), as indices into the two ranks' chunk lists,
/// where some key is visible to some query, in the order the forward and backward visit them
/// for the block of context rank `src`.
fn visible_pairs<B: Backend>(env: &Env<B>, src: usize) -> Vec<(usize, usize, AttentionShape)> {
    let q_chunks = env.chunks();
    let kv_chunks = [src, 2 * env.cp - 1 - src];
    let mut pairs = Vec::new();
    for (qi, &qc) in q_chunks.iter().enumerate() {
        for (ki, &kc) in kv_chunks.iter().enumerate() {
            if kc <= qc {
                pairs.push((qi, ki, shape(env, qc, kc)));
            }
        }
    }
    pairs
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
        let (attn, probs) = b.attention(single_shape(env), q, k, v);
        return Ok((
            attn,
            keep_probs.then_some(probs).into_iter().collect(),
            None,
        ));
    }
    let q_chunks = [chunk(env, q, 0), chunk(env, q, 1)];
    let (mut k_block, mut v_block) = (k.clone(), v.clone());
    let mut merged: [Option<(B::Tensor, B::Tensor)>; 2] = [None, None];
    let mut blocks = Vec::new();
    for step in 0..env.cp {
        // Pass the block on before working on it; the last step has nothing left to pass.
        let next = if step + 1 < env.cp {
            Some((
                env.pass_around_cp_ring(&k_block)?,
                env.pass_around_cp_ring(&v_block)?,
            ))
        } else {
            None
        };
        for (qi, ki, s) in visible_pairs(env, source(env, step)) {
            let (out, probs, lse) = b.attention_block(
                s,
                &q_chunks[qi],
                &chunk(env, &k_block, ki),
                &chunk(env, &v_block, ki),
            );
            merged[qi] = Some(match merged[qi].take() {
                None => (out, lse.clone()),
                Some((acc, acc_lse)) => b.attention_merge(s, (&acc, &acc_lse), (&out, &lse)),
            });
            if keep_probs {
                blocks.push((qi, s, probs, lse));
            }
        }
        if let Some((k_next, v_next)) = next {
            k_block = k_next;
            v_block = v_next;
        }
    }
    // Every query chunk sees at least its own diagonal block.
    let [first, second] = merged.map(|m| m.expect("a chunk sees itself"));
    let lse_chunks = [first.1, second.1];
    let probs = blocks
        .into_iter()
        .map(|(qi, s, p, block_lse)| b.attention_rescale(s, &p, &block_lse, &lse_chunks[qi]))
        .collect();
    Ok((
        concat(env, &[first.0, second.0]),
        probs,
        Some(concat(env, &lse_chunks)),
    ))
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
        let s = single_shape(env);
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
    let per_chunk = |t: &B::Tensor| [chunk(env, t, 0), chunk(env, t, 1)];
    let (q, out, dout) = (per_chunk(&ctx.q), per_chunk(&ctx.attn), per_chunk(dattn));
    let lse = per_chunk(lse);
    let (rows, q_cols) = b.shape(&q[0]);
    let kv_cols = b.shape(&ctx.k).1;
    let mut dq = [b.zeros(rows, q_cols), b.zeros(rows, q_cols)];
    let (mut k_block, mut v_block) = (ctx.k.clone(), ctx.v.clone());
    let mut dk_block = [b.zeros(rows, kv_cols), b.zeros(rows, kv_cols)];
    let mut dv_block = [b.zeros(rows, kv_cols), b.zeros(rows, kv_cols)];
    let mut kept = ctx.probs.iter().flatten();
    for step in 0..env.cp {
        for (qi, ki, s) in visible_pairs(env, source(env, step)) {
            let (k, v) = (chunk(env, &k_block, ki), chunk(env, &v_block, ki));
            let recomputed;
            let probs = match kept.next() {
                Some(p) => p,
                None => {
                    recomputed = b.attention_block_probs(s, &q[qi], &k, &lse[qi]);
                    &recomputed
                }
            };
            let (dq_part, dk_part, dv_part) =
                b.attention_block_backward(s, &q[qi], &k, &v, probs, &out[qi], &dout[qi]);
            b.add_assign(&mut dq[qi], &dq_part);
            b.add_assign(&mut dk_block[ki], &dk_part);
            b.add_assign(&mut dv_block[ki], &dv_part);
        }
        if step + 1 < env.cp {
            k_block = env.pass_around_cp_ring(&k_block)?;
            v_block = env.pass_around_cp_ring(&v_block)?;
        }
        dk_block = per_chunk(&env.pass_around_cp_ring(&concat(env, &dk_block))?);
        dv_block = per_chunk(&env.pass_around_cp_ring(&concat(env, &dv_block))?);
    }
    Ok((
        concat(env, &dq),
        concat(env, &dk_block),
        concat(env, &dv_block),
    ))
}

/// A projection's output and its adapter's context.
type Projected<T> = (T, Option<AdapterCtx<T>>);

/// The query, key or value projection (with its adapter, before the rotation).
fn project<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    prefix: &str,
    x: &B::Tensor,
    which: &str,
) -> Result<Projected<B::Tensor>, RuntimeError> {
    let weight = format!("{prefix}.w{which}");
    let mut y = env.b.matmul(x, param(values, &weight)?, false, false);
    if let Some(bias) = values.get(&format!("{prefix}.b{which}")) {
        y = env.b.add_row(&y, bias);
    }
    let adapter = lora::forward(env, values, (&weight, Parallel::Column), x, &mut y)?;
    let y = if env.model.position == PositionKind::Rope && which != "v" {
        env.rope(&y, false)
    } else {
        y
    };
    Ok((y, adapter))
}

/// The input projections' weights under `prefix`.
fn input_weights(prefix: &str) -> [String; 3] {
    ["q", "k", "v"].map(|w| format!("{prefix}.w{w}"))
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
    let mut adapters = Vec::new();
    let mut projected = Vec::with_capacity(3);
    for which in ["q", "k", "v"] {
        let (y, adapter) = project(env, values, prefix, x, which)?;
        adapters.extend(adapter.map(|a| (which, a)));
        projected.push(y);
    }
    let [q, k, v]: [B::Tensor; 3] = projected.try_into().ok().expect("three projections");
    let (attn, probs, lse) = ring_forward(env, &q, &k, &v, keep_probs)?;
    let wo = format!("{prefix}.wo");
    let mut out = b.matmul(&attn, param(values, &wo)?, false, false);
    if let Some(adapter) = lora::forward(env, values, (&wo, Parallel::Row), &attn, &mut out)? {
        adapters.push(("o", adapter));
    }
    let keep_x = env.adapters.is_none() || {
        let inputs = input_weights(prefix);
        lora::keeps_input(
            env.adapters.as_ref(),
            &inputs.each_ref().map(|w| w.as_str()),
        )
    };
    Ok((
        out,
        AttnCtx {
            x: keep_x.then(|| x.clone()),
            q,
            k,
            v,
            probs: keep_probs.then_some(probs),
            lse,
            attn,
            adapters,
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
    grads.add(b, &wo, || b.matmul(&ctx.attn, dy, true, false));
    let mut dattn = b.matmul(dy, param(values, &wo)?, false, true);
    if let Some(adapter) = ctx.adapter("o") {
        let d = lora::backward(env, values, grads, &wo, adapter, Some(&ctx.attn), dy)?;
        b.add_assign(&mut dattn, &d);
    }
    let (dq, dk, dv) = ring_backward(env, ctx, &dattn)?;
    let rope = env.model.position == PositionKind::Rope;
    let unrotate = |d: B::Tensor| {
        if rope {
            env.rope(&d, true)
        } else {
            d
        }
    };
    let mut dx: Option<B::Tensor> = None;
    for (which, d) in [("q", unrotate(dq)), ("k", unrotate(dk)), ("v", dv)] {
        let w = format!("{prefix}.w{which}");
        if grads.trains(&w) {
            let x = ctx.x.as_ref().ok_or_else(|| RuntimeError::InvalidModel {
                reason: format!("{w} trains but its input was not kept"),
            })?;
            grads.add(b, &w, || b.matmul(x, &d, true, false));
        }
        let bias = format!("{prefix}.b{which}");
        if values.contains_key(&bias) {
            grads.add(b, &bias, || b.sum_rows(&d));
        }
        let mut part = b.matmul(&d, param(values, &w)?, false, true);
        if let Some(adapter) = ctx.adapter(which) {
            let da = lora::backward(env, values, grads, &w, adapter, ctx.x.as_ref(), &d)?;
            b.add_assign(&mut part, &da);
        }
        dx = Some(match dx {
            Some(acc) => b.add(&acc, &part),
            None => part,
        });
    }
    Ok(dx.expect("three projections"))
}
