//! Causal self-attention with grouped-query heads, split over the tensor group by heads
//! (column-parallel Q/K/V, row-parallel output), keys and values all-gathered over the
//! context group, rotary positions when the model uses them.

use super::{param, Env, Grads, Values};
use crate::backend::{AttentionShape, Backend};
use crate::error::RuntimeError;
use tessel_grammar::PositionKind;

pub struct AttnCtx<T> {
    x: T,
    q: T,
    k_full: T,
    v_full: T,
    /// Dropped under selective recompute and rebuilt in the backward.
    probs: Option<T>,
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
        let mut v = vec![&self.x, &self.q, &self.k_full, &self.v_full, &self.attn];
        v.extend(self.probs.as_ref());
        v
    }
}

fn shape<B: Backend>(env: &Env<B>) -> AttentionShape {
    let m = env.model;
    AttentionShape {
        batch: env.batch,
        q_len: env.seq_chunk,
        kv_len: env.seq_chunk * env.cp,
        q_offset: env.position_offset(),
        heads: (m.heads as usize) / env.tp,
        kv_heads: ((m.kv_heads as usize) / env.tp).max(1),
        head_dim: m.head_dim as usize,
    }
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
    let k_full = env.gather_cp(&k)?;
    let v_full = env.gather_cp(&v)?;
    let (attn, probs) = b.attention(shape(env), &q, &k_full, &v_full);
    let out = b.matmul(&attn, param(values, &format!("{prefix}.wo"))?, false, false);
    Ok((
        out,
        AttnCtx {
            x: x.clone(),
            q,
            k_full,
            v_full,
            probs: keep_probs.then_some(probs),
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
    let recomputed;
    let probs = match &ctx.probs {
        Some(p) => p,
        None => {
            recomputed = b.attention(shape(env), &ctx.q, &ctx.k_full, &ctx.v_full).1;
            &recomputed
        }
    };
    let (dq, dk_full, dv_full) =
        b.attention_backward(shape(env), &ctx.q, &ctx.k_full, &ctx.v_full, probs, &dattn);
    let dk = env.scatter_cp(&dk_full)?;
    let dv = env.scatter_cp(&dv_full)?;
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
