//! The model's forward for generation: each block reads and extends a KV cache, so that a
//! prompt is processed once (prefill) and every later token attends to the cached keys and
//! values of the tokens before it (decode). Tensor parallelism splits heads and MLP columns as
//! in training (the same parameters, the same names), the embedding and the output layer are
//! vocab-parallel, and greedy sampling takes the arg-max over the whole vocabulary.

use crate::backend::{AttentionShape, Backend};
use crate::error::RuntimeError;
use crate::mesh::GroupKind;
use crate::model::block::{add_bias, norm};
use crate::model::layout::head_weight_name;
use crate::model::{mlp, moe, param, Env, Values};
use tessel_grammar::PositionKind;

/// One layer's cached keys and values on this rank: rows `[tokens, local kv heads·head_dim]`.
#[derive(Clone)]
pub struct LayerCache<T> {
    pub k: T,
    pub v: T,
}

/// An environment for `n` new tokens of one sequence: what the shared MLP code reads.
pub fn env<'a, B: Backend>(
    b: &'a B,
    model: &'a tessel_grammar::ModelSpec,
    tp: usize,
    tp_index: usize,
    rank: usize,
    n: usize,
) -> Env<'a, B> {
    Env {
        b,
        model,
        tp,
        tp_index,
        sequence_parallel: false,
        cp: 1,
        cp_index: 0,
        batch: 1,
        seq_chunk: n,
        chunk_len: n,
        cp_next_rank: rank,
        cp_prev_rank: rank,
        adapters: None,
        memory_saving_kernels: false,
    }
}

/// The embedding of `tokens` at positions `start..`: vocab-parallel lookup summed over the
/// tensor group, plus the learned position rows when the model has them.
pub fn embed<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    tokens: &[u32],
    start: usize,
) -> Result<B::Tensor, RuntimeError> {
    let b = env.b;
    let table = param(values, "embedding.weight")?;
    let (rows, hidden) = b.shape(table);
    let lo = env.tp_index * rows;
    let (at, local): (Vec<usize>, Vec<usize>) = tokens
        .iter()
        .enumerate()
        .filter(|(_, &t)| (lo..lo + rows).contains(&(t as usize)))
        .map(|(i, &t)| (i, t as usize - lo))
        .unzip();
    let mut partial = b.zeros(tokens.len(), hidden);
    b.scatter_add_rows(&mut partial, &at, &b.gather_rows(table, &local));
    let mut x = env.reduce_tp(&partial)?;
    if let Some(positions) = values.get("embedding.position") {
        let pos: Vec<usize> = (start..start + tokens.len()).collect();
        b.add_assign(&mut x, &b.gather_rows(positions, &pos));
    }
    Ok(x)
}

fn project<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    prefix: &str,
    x: &B::Tensor,
    which: &str,
    start: usize,
) -> Result<B::Tensor, RuntimeError> {
    let b = env.b;
    let y = b.matmul(
        x,
        param(values, &format!("{prefix}.w{which}"))?,
        false,
        false,
    );
    let y = add_bias(env, values, &format!("{prefix}.b{which}"), y);
    Ok(
        if env.model.position == PositionKind::Rope && which != "v" {
            let n = b.shape(&y).0;
            b.rope(&y, env.model.head_dim as usize, n, start, false)
        } else {
            y
        },
    )
}

/// Block `layer` over `x`, the new tokens at positions `start..`, appending their keys and
/// values to `cache` (empty before a prefill).
pub fn block<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    layer: u64,
    x: &B::Tensor,
    cache: &mut Option<LayerCache<B::Tensor>>,
    start: usize,
) -> Result<B::Tensor, RuntimeError> {
    let b = env.b;
    let m = env.model;
    let p = format!("layers.{layer}");
    let a = format!("{p}.attn");
    let n1 = norm(env, values, &format!("{p}.norm1"), x)?.0;
    let q = project(env, values, &a, &n1, "q", start)?;
    let k_new = project(env, values, &a, &n1, "k", start)?;
    let v_new = project(env, values, &a, &n1, "v", start)?;
    let (k, v) = match cache.take() {
        Some(c) => (
            b.concat_rows(&[&c.k, &k_new]),
            b.concat_rows(&[&c.v, &v_new]),
        ),
        None => (k_new, v_new),
    };
    let n = b.shape(x).0;
    let shape = AttentionShape {
        batch: 1,
        q_len: n,
        kv_len: start + n,
        q_offset: start,
        heads: m.heads as usize / env.tp,
        kv_heads: (m.kv_heads as usize / env.tp).max(1),
        head_dim: m.head_dim as usize,
    };
    let attn = b.attention(shape, &q, &k, &v).0;
    *cache = Some(LayerCache { k, v });
    let partial = b.matmul(&attn, param(values, &format!("{a}.wo"))?, false, false);
    let attn_out = add_bias(env, values, &format!("{a}.bo"), env.reduce_tp(&partial)?);
    let h = b.add(x, &attn_out);
    let n2 = norm(env, values, &format!("{p}.norm2"), &h)?.0;
    let ffn_partial = if m.is_moe_layer(layer) {
        moe::forward(env, values, &format!("{p}.moe"), &n2)?.0
    } else {
        mlp::forward(env, values, &format!("{p}.mlp"), &n2)?.0
    };
    let ffn_out = add_bias(
        env,
        values,
        &format!("{p}.mlp.bo"),
        env.reduce_tp(&ffn_partial)?,
    );
    Ok(b.add(&h, &ffn_out))
}

/// The greedy next token after the last row of `x`: final norm, this rank's vocabulary
/// columns of the logits, and the arg-max over the tensor group (the lowest id on a tie, as a
/// single rank's scan finds it).
pub fn greedy_token<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    x: &B::Tensor,
) -> Result<u32, RuntimeError> {
    let b = env.b;
    let rows = b.shape(x).0;
    let last = b.slice_rows(x, rows - 1, rows);
    let normed = norm(env, values, "final_norm", &last)?.0;
    let w = param(values, head_weight_name(env.model))?;
    let logits = b.to_vec(&b.matmul(&normed, w, false, true));
    let lo = env.tp_index * b.shape(w).0;
    let (best, value) =
        logits
            .iter()
            .enumerate()
            .fold((0usize, f32::NEG_INFINITY), |acc, (i, &v)| {
                if v > acc.1 {
                    (i, v)
                } else {
                    acc
                }
            });
    if env.tp == 1 {
        return Ok(best as u32);
    }
    let candidates = b.to_vec(&b.all_gather(
        GroupKind::Tensor,
        &b.tensor(vec![value, (lo + best) as f32], 1, 2),
    )?);
    // Ranks hold ascending vocabulary blocks: the first strict maximum is the lowest id.
    let mut winner = (f32::NEG_INFINITY, 0.0f32);
    for pair in candidates.chunks(2) {
        if pair[0] > winner.0 {
            winner = (pair[0], pair[1]);
        }
    }
    Ok(winner.1 as u32)
}
