//! The first virtual stage's embedding and the last one's final norm, output projection and
//! cross-entropy, all vocab-parallel (Megatron): each tensor rank holds a block of vocabulary
//! rows, looks up or scores only those, and the partial results are summed over the tensor
//! group.

use super::block::norm_backward;
use super::layout::head_weight_name;
use super::{param, Env, Grads, Values};
use crate::backend::Backend;
use crate::error::RuntimeError;
use crate::mesh::GroupKind;

/// Which of the micro-batch's tokens fall in this rank's vocabulary rows.
pub struct EmbedCtx {
    /// `(token index, local row)` of every token whose id this rank holds.
    hits: Vec<(usize, usize)>,
    positions: Option<Vec<usize>>,
}

/// This rank's vocabulary rows `[start, end)`.
fn vocab_range<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    name: &str,
) -> Result<(usize, usize), RuntimeError> {
    let rows = env.b.shape(param(values, name)?).0;
    Ok((env.tp_index * rows, (env.tp_index + 1) * rows))
}

/// `tokens` are the micro-batch's inputs on this context rank, batch-major. Returns this
/// rank's share of the embedded tokens.
pub fn forward<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    tokens: &[u32],
) -> Result<(B::Tensor, EmbedCtx), RuntimeError> {
    let b = env.b;
    let table = param(values, "embedding.weight")?;
    let (lo, hi) = vocab_range(env, values, "embedding.weight")?;
    let hits: Vec<(usize, usize)> = tokens
        .iter()
        .enumerate()
        .filter(|(_, &t)| (lo..hi).contains(&(t as usize)))
        .map(|(i, &t)| (i, t as usize - lo))
        .collect();
    let rows: Vec<usize> = hits.iter().map(|h| h.1).collect();
    let at: Vec<usize> = hits.iter().map(|h| h.0).collect();
    let mut partial = b.zeros(tokens.len(), b.shape(table).1);
    b.scatter_add_rows(&mut partial, &at, &b.gather_rows(table, &rows));
    let mut x = env.reduce_tp(&partial)?;
    let positions = match values.get("embedding.position") {
        Some(table) => {
            let local = env.local_tokens();
            let start = if local < env.tokens() {
                env.tp_index * local
            } else {
                0
            };
            let pos: Vec<usize> = (start..start + local).map(|i| env.position(i)).collect();
            b.add_assign(&mut x, &b.gather_rows(table, &pos));
            Some(pos)
        }
        None => None,
    };
    Ok((x, EmbedCtx { hits, positions }))
}

pub fn backward<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    grads: &mut Grads<B::Tensor>,
    ctx: &EmbedCtx,
    dx: &B::Tensor,
) -> Result<(), RuntimeError> {
    let b = env.b;
    // A frozen table (adapter fine-tuning) takes no gradient; every tensor rank skips alike.
    if !grads.trains("embedding.weight") {
        return Ok(());
    }
    let mut scatter = |name: &str, rows: &[usize], d: &B::Tensor| -> Result<(), RuntimeError> {
        let (r, c) = b.shape(param(values, name)?);
        let g = grads
            .map
            .entry(name.to_string())
            .or_insert_with(|| b.zeros(r, c));
        b.scatter_add_rows(g, rows, d);
        Ok(())
    };
    if let Some(pos) = &ctx.positions {
        scatter("embedding.position", pos, dx)?;
    }
    let full = env.gather_tp(dx)?;
    let at: Vec<usize> = ctx.hits.iter().map(|h| h.0).collect();
    let rows: Vec<usize> = ctx.hits.iter().map(|h| h.1).collect();
    scatter("embedding.weight", &rows, &b.gather_rows(&full, &at))
}

pub struct HeadCtx<T> {
    x: T,
    stats: T,
    /// Normed input of all the micro-batch's tokens.
    normed: T,
    /// Loss gradient of this rank's vocabulary columns.
    dlogits: T,
}

impl<T> HeadCtx<T> {
    pub fn tensors(&self) -> Vec<&T> {
        vec![&self.x, &self.stats, &self.normed, &self.dlogits]
    }
}

/// Cross-entropy over logits split by vocabulary columns: the row maximum, the sum of
/// exponentials and the target logit are combined over the tensor group. Returns
/// `scale·Σ loss` of all rows and this rank's `scale·∂/∂logits`.
fn vocab_parallel_cross_entropy<B: Backend>(
    env: &Env<B>,
    logits: &B::Tensor,
    targets: &[u32],
    lo: usize,
    scale: f32,
) -> Result<(f64, B::Tensor), RuntimeError> {
    let b = env.b;
    if env.tp == 1 {
        return Ok(b.cross_entropy(logits, targets, scale));
    }
    let (rows, cols) = b.shape(logits);
    let data = b.to_vec(logits);
    let local_max: Vec<f32> = data
        .chunks(cols)
        .map(|r| r.iter().cloned().fold(f32::NEG_INFINITY, f32::max))
        .collect();
    let all_max = b.to_vec(&b.all_gather(GroupKind::Tensor, &b.tensor(local_max, rows, 1))?);
    let max: Vec<f32> = (0..rows)
        .map(|r| {
            (0..env.tp)
                .map(|t| all_max[t * rows + r])
                .fold(f32::NEG_INFINITY, f32::max)
        })
        .collect();
    let mut stats = vec![0.0f32; 2 * rows];
    for r in 0..rows {
        let row = &data[r * cols..(r + 1) * cols];
        stats[2 * r] = row.iter().map(|v| (v - max[r]).exp()).sum();
        let t = targets[r] as usize;
        if (lo..lo + cols).contains(&t) {
            stats[2 * r + 1] = row[t - lo];
        }
    }
    let stats = b.to_vec(&b.all_reduce(GroupKind::Tensor, &b.tensor(stats, rows, 2))?);
    let mut loss = 0.0f64;
    let mut grad = data;
    for r in 0..rows {
        let (sum, target_logit) = (stats[2 * r], stats[2 * r + 1]);
        loss += f64::from(sum.ln() + max[r] - target_logit);
        for v in &mut grad[r * cols..(r + 1) * cols] {
            *v = (*v - max[r]).exp() / sum * scale;
        }
        let t = targets[r] as usize;
        if (lo..lo + cols).contains(&t) {
            grad[r * cols + t - lo] -= scale;
        }
    }
    Ok((loss * f64::from(scale), b.tensor(grad, rows, cols)))
}

/// Returns the loss of the micro-batch's tokens times `scale` (the same on every tensor
/// rank) and what the backward needs. The loss gradient is formed here (fused
/// cross-entropy), so the logits are not kept.
pub fn forward_loss<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    x: &B::Tensor,
    targets: &[u32],
    scale: f32,
) -> Result<(f64, HeadCtx<B::Tensor>), RuntimeError> {
    let b = env.b;
    let w = param(values, "final_norm.weight")?;
    let (normed_local, stats) = b.norm(env.model.norm, x, w, values.get("final_norm.bias"));
    let normed = env.gather_tp(&normed_local)?;
    let wname = head_weight_name(env.model);
    let logits = b.matmul(&normed, param(values, wname)?, false, true);
    let (lo, _) = vocab_range(env, values, wname)?;
    let (loss, dlogits) = vocab_parallel_cross_entropy(env, &logits, targets, lo, scale)?;
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
    grads.add(b, wname, || {
        b.matmul(&ctx.dlogits, &ctx.normed, true, false)
    });
    let dn_partial = b.matmul(&ctx.dlogits, param(values, wname)?, false, false);
    let dn = env.reduce_tp(&dn_partial)?;
    norm_backward(env, values, grads, "final_norm", &ctx.x, &ctx.stats, &dn)
}
