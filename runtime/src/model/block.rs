//! A pre-norm decoder block: `h = x + Attn(Norm(x))`, `out = h + FFN(Norm(h))`, with the
//! tensor-parallel regions entered by `gather_tp` and left by `reduce_tp`, and activation
//! recompute choosing what the forward keeps.

use super::{attention, mlp, moe, param, Env, Grads, Values};
use crate::backend::Backend;
use crate::error::RuntimeError;
use tessel_grammar::NormKind;

/// What a block's forward keeps for its backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    Everything,
    /// Selective recompute: drop the attention probabilities.
    AllButAttentionCore,
    /// Full recompute: keep the input only and re-run the forward in the backward.
    InputOnly,
}

enum FfnCtx<T> {
    Dense(mlp::MlpCtx<T>),
    Moe(Box<moe::MoeCtx<T>>),
}

impl<T: Clone> FfnCtx<T> {
    fn input(&self) -> Option<&T> {
        match self {
            FfnCtx::Dense(c) => c.input(),
            FfnCtx::Moe(c) => Some(c.input()),
        }
    }

    fn set_input(&mut self, x: T) {
        match self {
            FfnCtx::Dense(c) => c.set_input(x),
            FfnCtx::Moe(c) => c.set_input(x),
        }
    }
}

/// What a norm keeps for its backward.
enum NormKept<T> {
    Input(T),
    /// Tempo's in-place norm: its output (this rank's tokens), the backward working from it.
    Output(T),
    /// Tempo's in-place norm whose output the GEMM after it keeps as its input anyway.
    OutputKeptByGemm,
}

/// Where a norm's backward starts: its input, or (in place) its output.
enum NormFrom<'a, T> {
    Input(&'a T),
    Output(&'a T),
}

impl<T> NormKept<T> {
    fn tensor(&self) -> Option<&T> {
        match self {
            NormKept::Input(t) | NormKept::Output(t) => Some(t),
            NormKept::OutputKeptByGemm => None,
        }
    }

    /// Where the backward starts, once [`NormKept::resolve`] has taken a shared output.
    fn start(&self) -> Result<NormFrom<'_, T>, RuntimeError> {
        match self {
            NormKept::Input(x) => Ok(NormFrom::Input(x)),
            NormKept::Output(y) => Ok(NormFrom::Output(y)),
            NormKept::OutputKeptByGemm => Err(RuntimeError::InvalidModel {
                reason: "an in-place norm's output was not resolved".into(),
            }),
        }
    }
}

impl<T: Clone> NormKept<T> {
    /// An in-place norm keeps `output`, or nothing of its own where the GEMM after it keeps
    /// it too.
    fn in_place(output: &T, gemm_keeps: bool) -> Self {
        if gemm_keeps {
            NormKept::OutputKeptByGemm
        } else {
            NormKept::Output(output.clone())
        }
    }

    /// What the norm's backward starts from: its input, or its output (from the GEMM's
    /// kept input, taken before the backward gathers that again under sequence parallelism).
    fn resolve(self, gemm_input: Option<&T>) -> Result<NormKept<T>, RuntimeError> {
        match self {
            NormKept::OutputKeptByGemm => {
                gemm_input.cloned().map(NormKept::Output).ok_or_else(|| {
                    RuntimeError::InvalidModel {
                        reason: "an in-place norm's output was not kept".into(),
                    }
                })
            }
            kept => Ok(kept),
        }
    }
}

pub struct Saved<T> {
    norm1: NormKept<T>,
    stats1: T,
    norm2: NormKept<T>,
    stats2: T,
    attn: attention::AttnCtx<T>,
    ffn: FfnCtx<T>,
}

pub enum BlockCtx<T> {
    Saved(Box<Saved<T>>),
    Input(T),
}

impl<T> BlockCtx<T> {
    pub fn tensors(&self) -> Vec<&T> {
        match self {
            BlockCtx::Input(x) => vec![x],
            BlockCtx::Saved(s) => {
                let mut v = vec![&s.stats1, &s.stats2];
                v.extend(s.norm1.tensor());
                v.extend(s.norm2.tensor());
                v.extend(s.attn.tensors());
                match &s.ffn {
                    FfnCtx::Dense(c) => v.extend(c.tensors()),
                    FfnCtx::Moe(c) => v.extend(c.tensors()),
                }
                v
            }
        }
    }
}

pub(crate) fn norm<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    prefix: &str,
    x: &B::Tensor,
) -> Result<(B::Tensor, B::Tensor), RuntimeError> {
    let w = param(values, &format!("{prefix}.weight"))?;
    let bias = values.get(&format!("{prefix}.bias"));
    Ok(env.b.norm(env.model.norm, x, w, bias))
}

pub fn norm_backward<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    grads: &mut Grads<B::Tensor>,
    prefix: &str,
    x: &B::Tensor,
    stats: &B::Tensor,
    dy: &B::Tensor,
) -> Result<B::Tensor, RuntimeError> {
    norm_backward_from(env, values, grads, prefix, NormFrom::Input(x), stats, dy)
}

fn norm_backward_from<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    grads: &mut Grads<B::Tensor>,
    prefix: &str,
    from: NormFrom<'_, B::Tensor>,
    stats: &B::Tensor,
    dy: &B::Tensor,
) -> Result<B::Tensor, RuntimeError> {
    let b = env.b;
    let wname = format!("{prefix}.weight");
    let has_bias = env.model.norm == NormKind::Layernorm;
    let w = param(values, &wname)?;
    let (dx, dw, db) = match from {
        NormFrom::Input(x) => b.norm_backward(env.model.norm, x, w, stats, dy, has_bias),
        NormFrom::Output(y) => {
            let bias = values.get(&format!("{prefix}.bias"));
            b.norm_backward_from_output(env.model.norm, y, w, bias, stats, dy, has_bias)
        }
    };
    grads.add(b, &wname, || dw);
    if let Some(db) = db {
        grads.add(b, &format!("{prefix}.bias"), || db);
    }
    Ok(dx)
}

pub(crate) fn add_bias<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    name: &str,
    y: B::Tensor,
) -> B::Tensor {
    match values.get(name) {
        Some(bias) => env.b.add_row(&y, bias),
        None => y,
    }
}

fn forward_saved<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    layer: u64,
    x: &B::Tensor,
    keep_probs: bool,
) -> Result<(B::Tensor, Saved<B::Tensor>), RuntimeError> {
    let b = env.b;
    let p = format!("layers.{layer}");
    let (n1, stats1) = norm(env, values, &format!("{p}.norm1"), x)?;
    let (attn_partial, mut attn) = attention::forward(
        env,
        values,
        &format!("{p}.attn"),
        &env.gather_tp(&n1)?,
        keep_probs,
    )?;
    let saves = env.memory_saving_kernels;
    let norm1 = if saves {
        NormKept::in_place(&n1, attn.input().is_some())
    } else {
        NormKept::Input(x.clone())
    };
    // Sequence parallelism keeps only this rank's shard of the gathered matmul inputs; the
    // backward gathers them again.
    if env.sp_active() {
        attn.set_input(n1);
    }
    let attn_out = add_bias(
        env,
        values,
        &format!("{p}.attn.bo"),
        env.reduce_tp(&attn_partial)?,
    );
    let h = b.add(x, &attn_out);
    let (n2, stats2) = norm(env, values, &format!("{p}.norm2"), &h)?;
    let n2_full = env.gather_tp(&n2)?;
    let (ffn_partial, mut ffn) = if env.model.is_moe_layer(layer) {
        let (y, c) = moe::forward(env, values, &format!("{p}.moe"), &n2_full)?;
        (y, FfnCtx::Moe(Box::new(c)))
    } else {
        let (y, c) = mlp::forward(env, values, &format!("{p}.mlp"), &n2_full)?;
        (y, FfnCtx::Dense(c))
    };
    drop(n2_full);
    let norm2 = saves.then(|| NormKept::in_place(&n2, ffn.input().is_some()));
    if env.sp_active() {
        ffn.set_input(n2);
    }
    let ffn_out = add_bias(
        env,
        values,
        &format!("{p}.mlp.bo"),
        env.reduce_tp(&ffn_partial)?,
    );
    let out = b.add(&h, &ffn_out);
    Ok((
        out,
        Saved {
            norm1,
            stats1,
            norm2: norm2.unwrap_or(NormKept::Input(h)),
            stats2,
            attn,
            ffn,
        },
    ))
}

pub fn forward<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    layer: u64,
    x: &B::Tensor,
    keep: Keep,
) -> Result<(B::Tensor, BlockCtx<B::Tensor>), RuntimeError> {
    let (out, saved) = forward_saved(env, values, layer, x, keep == Keep::Everything)?;
    let ctx = match keep {
        Keep::InputOnly => BlockCtx::Input(x.clone()),
        _ => BlockCtx::Saved(Box::new(saved)),
    };
    Ok((out, ctx))
}

/// Full recompute: re-runs the forward of a block that kept only its input, so that its
/// backward has everything (the caller accounts the layer's rebuilt activations while they
/// live). A block that kept its activations is returned as it is.
pub fn recompute<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    layer: u64,
    ctx: BlockCtx<B::Tensor>,
) -> Result<BlockCtx<B::Tensor>, RuntimeError> {
    Ok(match ctx {
        BlockCtx::Input(x) => {
            BlockCtx::Saved(Box::new(forward_saved(env, values, layer, &x, true)?.1))
        }
        saved => saved,
    })
}

pub fn backward<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    grads: &mut Grads<B::Tensor>,
    layer: u64,
    ctx: BlockCtx<B::Tensor>,
    dout: &B::Tensor,
) -> Result<B::Tensor, RuntimeError> {
    let b = env.b;
    let Saved {
        norm1,
        stats1,
        norm2,
        stats2,
        mut attn,
        mut ffn,
    } = match ctx {
        BlockCtx::Saved(s) => *s,
        BlockCtx::Input(x) => forward_saved(env, values, layer, &x, true)?.1,
    };
    // In-place norms start from the GEMMs' kept inputs: this rank's tokens, before they are
    // gathered again below.
    let norm1 = norm1.resolve(attn.input())?;
    let norm2 = norm2.resolve(ffn.input())?;
    if let Some(x) = ffn.input().filter(|_| env.sp_active()) {
        let ffn_input = env.gather_tp(x)?;
        ffn.set_input(ffn_input);
    }
    let p = format!("layers.{layer}");
    let bias_grad = |grads: &mut Grads<B::Tensor>, name: &str, d: &B::Tensor| {
        if values.contains_key(name) {
            grads.add(b, name, || b.sum_rows(d));
        }
    };
    bias_grad(grads, &format!("{p}.mlp.bo"), dout);
    let dffn_full = env.gather_tp(dout)?;
    let dn2_partial = match &ffn {
        FfnCtx::Dense(c) => mlp::backward(env, values, grads, &format!("{p}.mlp"), c, &dffn_full)?,
        FfnCtx::Moe(c) => moe::backward(env, values, grads, &format!("{p}.moe"), c, &dffn_full)?,
    };
    let dn2 = env.reduce_tp(&dn2_partial)?;
    let dh = b.add(
        dout,
        &norm_backward_from(
            env,
            values,
            grads,
            &format!("{p}.norm2"),
            norm2.start()?,
            &stats2,
            &dn2,
        )?,
    );
    bias_grad(grads, &format!("{p}.attn.bo"), &dh);
    if let Some(x) = attn.input().filter(|_| env.sp_active()) {
        let attn_input = env.gather_tp(x)?;
        attn.set_input(attn_input);
    }
    let dattn_full = env.gather_tp(&dh)?;
    let dn1_partial =
        attention::backward(env, values, grads, &format!("{p}.attn"), &attn, &dattn_full)?;
    let dn1 = env.reduce_tp(&dn1_partial)?;
    Ok(b.add(
        &dh,
        &norm_backward_from(
            env,
            values,
            grads,
            &format!("{p}.norm1"),
            norm1.start()?,
            &stats1,
            &dn1,
        )?,
    ))
}
