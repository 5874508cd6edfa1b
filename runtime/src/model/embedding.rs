//! The first virtual stage's embedding and the last one's final norm, output projection and
//! cross-entropy. Both are replicated over the tensor group; under sequence parallelism each
//! tensor rank handles its share of the tokens.

use super::block::norm_backward;
use super::layout::head_weight_name;
use super::{param, Env, Grads, Values};
use crate::backend::Backend;
use crate::error::RuntimeError;

/// Token ids (and positions) the embedding looked up, this rank's share.
pub struct EmbedCtx {
    ids: Vec<usize>,
    positions: Option<Vec<usize>>,
}

/// `tokens` are the micro-batch's inputs on this context rank, batch-major.
pub fn forward<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    tokens: &[u32],
) -> Result<(B::Tensor, EmbedCtx), RuntimeError> {
    let b = env.b;
    let local = env.local_tokens();
    let start = if local < env.tokens() {
        env.tp_index * local
    } else {
        0
    };
    let ids: Vec<usize> = tokens[start..start + local]
        .iter()
        .map(|&t| t as usize)
        .collect();
    let mut x = b.gather_rows(param(values, "embedding.weight")?, &ids);
    let positions = match values.get("embedding.position") {
        Some(table) => {
            let pos: Vec<usize> = (start..start + local)
                .map(|i| env.position_offset() + i % env.seq_chunk)
                .collect();
            b.add_assign(&mut x, &b.gather_rows(table, &pos));
            Some(pos)
        }
        None => None,
    };
    Ok((x, EmbedCtx { ids, positions }))
}

pub fn backward<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    grads: &mut Grads<B::Tensor>,
    ctx: &EmbedCtx,
    dx: &B::Tensor,
) -> Result<(), RuntimeError> {
    let b = env.b;
    let mut scatter = |name: &str, rows: &[usize]| -> Result<(), RuntimeError> {
        let (r, c) = b.shape(param(values, name)?);
        let g = grads
            .map
            .entry(name.to_string())
            .or_insert_with(|| b.zeros(r, c));
        b.scatter_add_rows(g, rows, dx);
        Ok(())
    };
    scatter("embedding.weight", &ctx.ids)?;
    if let Some(pos) = &ctx.positions {
        scatter("embedding.position", pos)?;
    }
    Ok(())
}

pub struct HeadCtx<T> {
    x: T,
    stats: T,
    normed: T,
    dlogits: T,
}

impl<T> HeadCtx<T> {
    pub fn tensors(&self) -> Vec<&T> {
        vec![&self.x, &self.stats, &self.normed, &self.dlogits]
    }
}

/// Returns the loss of this rank's tokens times `scale` and what the backward needs. The
/// loss gradient is formed here (fused cross-entropy), so the logits are not kept.
pub fn forward_loss<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    x: &B::Tensor,
    targets: &[u32],
    scale: f32,
) -> Result<(f64, HeadCtx<B::Tensor>), RuntimeError> {
    let b = env.b;
    let local = env.local_tokens();
    let start = if local < env.tokens() {
        env.tp_index * local
    } else {
        0
    };
    let w = param(values, "final_norm.weight")?;
    let (normed, stats) = b.norm(env.model.norm, x, w, values.get("final_norm.bias"));
    let logits = b.matmul(
        &normed,
        param(values, head_weight_name(env.model))?,
        false,
        true,
    );
    let (loss, dlogits) = b.cross_entropy(&logits, &targets[start..start + local], scale);
    Ok((
        loss,
        HeadCtx {
            x: x.clone(),
            stats,
            normed,
            dlogits,
        },
    ))
}

pub fn backward_loss<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    grads: &mut Grads<B::Tensor>,
    ctx: &HeadCtx<B::Tensor>,
) -> Result<B::Tensor, RuntimeError> {
    let b = env.b;
    let wname = head_weight_name(env.model);
    grads.add(b, wname, b.matmul(&ctx.dlogits, &ctx.normed, true, false));
    let dn = b.matmul(&ctx.dlogits, param(values, wname)?, false, false);
    norm_backward(env, values, grads, "final_norm", &ctx.x, &ctx.stats, &dn)
}
