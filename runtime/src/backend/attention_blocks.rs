//! Blockwise causal attention on host slices: one key/value block at a time with its
//! log-sum-exp, the online-softmax merge of two partial results, and the backward of one
//! block against the merged result. Ring attention over the context group is built from these
//! (`crate::model::attention`); the layouts are those of [`AttentionShape`]: queries
//! `[batch·q_len, heads·head_dim]`, keys and values `[batch·kv_len, kv_heads·head_dim]`,
//! probabilities `[batch·heads·q_len, kv_len]`, log-sum-exps `[batch·q_len, heads]`.
//!
//! A block whose keys start `q_offset` positions before the queries is an ordinary causal
//! attention call with that `q_offset`: key `j` is visible to query `i` when `j ≤ q_offset + i`.

use super::AttentionShape;

struct Heads {
    d: usize,
    group: usize,
    scale: f32,
    q_cols: usize,
    kv_cols: usize,
}

fn heads(s: &AttentionShape) -> Heads {
    Heads {
        d: s.head_dim,
        group: s.heads / s.kv_heads,
        scale: 1.0 / (s.head_dim as f32).sqrt(),
        q_cols: s.heads * s.head_dim,
        kv_cols: s.kv_heads * s.head_dim,
    }
}

fn visible(s: &AttentionShape, i: usize) -> usize {
    (s.q_offset + i + 1).min(s.kv_len)
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The block's output normalised over its own keys, its probabilities and the log-sum-exp of
/// its scaled scores per query row and head.
pub fn forward(
    s: &AttentionShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let hd = heads(s);
    let d = hd.d;
    let mut out = vec![0.0f32; q.len()];
    let mut probs = vec![0.0f32; s.batch * s.heads * s.q_len * s.kv_len];
    let mut lse = vec![f32::NEG_INFINITY; s.batch * s.q_len * s.heads];
    for b in 0..s.batch {
        for h in 0..s.heads {
            let kh = h / hd.group;
            for i in 0..s.q_len {
                let seen = visible(s, i);
                let qrow = b * s.q_len + i;
                let qr = &q[qrow * hd.q_cols + h * d..][..d];
                let p = &mut probs[((b * s.heads + h) * s.q_len + i) * s.kv_len..][..s.kv_len];
                let mut max = f32::NEG_INFINITY;
                for (j, pj) in p.iter_mut().enumerate().take(seen) {
                    let kr = &k[(b * s.kv_len + j) * hd.kv_cols + kh * d..][..d];
                    *pj = dot(qr, kr) * hd.scale;
                    max = max.max(*pj);
                }
                let mut total = 0.0f32;
                for pj in p.iter_mut().take(seen) {
                    *pj = (*pj - max).exp();
                    total += *pj;
                }
                lse[qrow * s.heads + h] = max + total.ln();
                let o = &mut out[qrow * hd.q_cols + h * d..][..d];
                for (j, pj) in p.iter_mut().enumerate().take(seen) {
                    *pj /= total;
                    let vr = &v[(b * s.kv_len + j) * hd.kv_cols + kh * d..][..d];
                    o.iter_mut().zip(vr).for_each(|(x, y)| *x += *pj * y);
                }
            }
        }
    }
    (out, probs, lse)
}

/// Merges two partial attentions of the same queries over disjoint key sets: the result is
/// the attention over both, weighted by each part's share of the softmax denominator.
pub fn merge(
    head_dim: usize,
    out_a: &[f32],
    lse_a: &[f32],
    out_b: &[f32],
    lse_b: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let mut out = vec![0.0f32; out_a.len()];
    let mut lse = vec![0.0f32; lse_a.len()];
    for (r, (&la, &lb)) in lse_a.iter().zip(lse_b).enumerate() {
        let max = la.max(lb);
        let l = max + ((la - max).exp() + (lb - max).exp()).ln();
        let (wa, wb) = ((la - l).exp(), (lb - l).exp());
        lse[r] = l;
        let at = r * head_dim;
        for c in at..at + head_dim {
            out[c] = wa * out_a[c] + wb * out_b[c];
        }
    }
    (out, lse)
}

/// Turns a block's probabilities, normalised over the block (log-sum-exp `lse_block`), into
/// its share of the softmax over every key (log-sum-exp `lse`).
pub fn rescale(s: &AttentionShape, probs: &mut [f32], lse_block: &[f32], lse: &[f32]) {
    for b in 0..s.batch {
        for h in 0..s.heads {
            for i in 0..s.q_len {
                let at = (b * s.q_len + i) * s.heads + h;
                let w = (lse_block[at] - lse[at]).exp();
                let row = ((b * s.heads + h) * s.q_len + i) * s.kv_len;
                probs[row..row + s.kv_len].iter_mut().for_each(|p| *p *= w);
            }
        }
    }
}

/// A block's probabilities recomputed from the queries, its keys and the log-sum-exp over
/// every key.
pub fn probabilities(s: &AttentionShape, q: &[f32], k: &[f32], lse: &[f32]) -> Vec<f32> {
    let hd = heads(s);
    let d = hd.d;
    let mut probs = vec![0.0f32; s.batch * s.heads * s.q_len * s.kv_len];
    for b in 0..s.batch {
        for h in 0..s.heads {
            let kh = h / hd.group;
            for i in 0..s.q_len {
                let qrow = b * s.q_len + i;
                let qr = &q[qrow * hd.q_cols + h * d..][..d];
                let l = lse[qrow * s.heads + h];
                let p = &mut probs[((b * s.heads + h) * s.q_len + i) * s.kv_len..][..s.kv_len];
                for (j, pj) in p.iter_mut().enumerate().take(visible(s, i)) {
                    let kr = &k[(b * s.kv_len + j) * hd.kv_cols + kh * d..][..d];
                    *pj = (dot(qr, kr) * hd.scale - l).exp();
                }
            }
        }
    }
    probs
}

/// Gradients of one block given its share of the probabilities, the merged output `out` and
/// its gradient: `(dq, dk, dv)`, where `dq` is this block's part of the queries' gradient.
/// The softmax backward needs `Σ_j p_j·dp_j` over every key, which is `dout · out` per row
/// and head.
pub fn backward(
    s: &AttentionShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    probs: &[f32],
    out: &[f32],
    dout: &[f32],
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let hd = heads(s);
    let d = hd.d;
    let mut dq = vec![0.0f32; q.len()];
    let mut dk = vec![0.0f32; k.len()];
    let mut dv = vec![0.0f32; v.len()];
    let mut dp = vec![0.0f32; s.kv_len];
    for b in 0..s.batch {
        for h in 0..s.heads {
            let kh = h / hd.group;
            for i in 0..s.q_len {
                let seen = visible(s, i);
                let qrow = b * s.q_len + i;
                let at = qrow * hd.q_cols + h * d;
                let qr = &q[at..at + d];
                let dor = &dout[at..at + d];
                let delta = dot(dor, &out[at..at + d]);
                let p = &probs[((b * s.heads + h) * s.q_len + i) * s.kv_len..][..s.kv_len];
                for j in 0..seen {
                    let kv_at = (b * s.kv_len + j) * hd.kv_cols + kh * d;
                    dp[j] = dot(dor, &v[kv_at..kv_at + d]);
                    dv[kv_at..kv_at + d]
                        .iter_mut()
                        .zip(dor)
                        .for_each(|(x, y)| *x += p[j] * y);
                }
                for j in 0..seen {
                    let ds = p[j] * (dp[j] - delta) * hd.scale;
                    let kv_at = (b * s.kv_len + j) * hd.kv_cols + kh * d;
                    dq[at..at + d]
                        .iter_mut()
                        .zip(&k[kv_at..kv_at + d])
                        .for_each(|(x, y)| *x += ds * y);
                    dk[kv_at..kv_at + d]
                        .iter_mut()
                        .zip(qr)
                        .for_each(|(x, y)| *x += ds * y);
                }
            }
        }
    }
    (dq, dk, dv)
}
