//! The feed-forward block, column-parallel in and row-parallel out (Megatron): each tensor
//! rank returns a partial output that the caller sums over the tensor group.

use super::lora::{self, AdapterCtx, Parallel};
use super::{param, Env, Grads, Values};
use crate::backend::Backend;
use crate::error::RuntimeError;
use tessel_grammar::MlpKind;

pub struct MlpCtx<T> {
    /// The input, where the backward needs it (not under LoRA-FA: frozen weights need no
    /// input for a gradient).
    x: Option<T>,
    /// Pre-activation (gelu) or gate pre-activation (swiglu); not under Tempo's in-place GELU.
    pre: Option<T>,
    /// Tempo's in-place GELU: the branch bits that recover the pre-activation from `act`.
    gelu_bits: Option<T>,
    /// Up projection (swiglu only).
    up: Option<T>,
    /// Input of the output projection, where its backward needs it (as `x`).
    act: Option<T>,
    /// The adapters' products with `A`, by weight name.
    adapters: Vec<(String, AdapterCtx<T>)>,
}

impl<T> MlpCtx<T> {
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
        let mut v: Vec<&T> = self.x.iter().collect();
        v.extend(self.tensors_besides_input());
        v
    }

    /// What the MLP keeps apart from its input, for callers that keep the input themselves.
    pub fn tensors_besides_input(&self) -> Vec<&T> {
        let mut v: Vec<&T> = self.pre.iter().collect();
        v.extend(self.gelu_bits.as_ref());
        v.extend(self.act.as_ref());
        v.extend(self.up.as_ref());
        v.extend(self.adapters.iter().map(|(_, a)| a.tensor()));
        v
    }

    fn adapter(&self, weight: &str) -> Option<&AdapterCtx<T>> {
        self.adapters
            .iter()
            .find(|(w, _)| w == weight)
            .map(|(_, a)| a)
    }
}

/// A kept input, or an error naming the weight whose gradient needs it.
fn kept<'a, T>(x: Option<&'a T>, weight: &str) -> Result<&'a T, RuntimeError> {
    x.ok_or_else(|| RuntimeError::InvalidModel {
        reason: format!("{weight} trains but its input was not kept"),
    })
}

/// `x·W (+ bias)` with `W`'s adapter, whose context joins `adapters`.
fn linear<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    x: &B::Tensor,
    (w, bias): (&str, &str),
    parallel: Parallel,
    adapters: &mut Vec<(String, AdapterCtx<B::Tensor>)>,
) -> Result<B::Tensor, RuntimeError> {
    let mut y = env.b.matmul(x, param(values, w)?, false, false);
    if let Some(b) = values.get(bias) {
        y = env.b.add_row(&y, b);
    }
    if let Some(adapter) = lora::forward(env, values, (w, parallel), x, &mut y)? {
        adapters.push((w.to_string(), adapter));
    }
    Ok(y)
}

pub fn forward<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    prefix: &str,
    x: &B::Tensor,
) -> Result<(B::Tensor, MlpCtx<B::Tensor>), RuntimeError> {
    let b = env.b;
    let keep = env.adapters.is_none() || {
        let weights: Vec<String> = lora::mlp_weights(env.model)
            .iter()
            .map(|w| format!("{prefix}.{w}"))
            .collect();
        let names: Vec<&str> = weights.iter().map(String::as_str).collect();
        lora::keeps_input(env.adapters.as_ref(), &names)
    };
    let mut adapters = Vec::new();
    let names = |w: &str| (format!("{prefix}.w{w}"), format!("{prefix}.b{w}"));
    let column = |w: &str, adapters: &mut Vec<_>| {
        let (w, bias) = names(w);
        linear(env, values, x, (&w, &bias), Parallel::Column, adapters)
    };
    let (pre, gelu_bits, up, act, out) = match env.model.mlp {
        // Tempo's in-place GELU where the output is kept anyway, as the down projection's input.
        MlpKind::Gelu if env.memory_saving_kernels && keep => {
            let (act, bits) = b.gelu_keeping_output(&column("1", &mut adapters)?);
            (None, Some(bits), None, act, "2")
        }
        MlpKind::Gelu => {
            let pre = column("1", &mut adapters)?;
            let act = b.gelu(&pre);
            (Some(pre), None, None, act, "2")
        }
        MlpKind::Swiglu => {
            let pre = column("g", &mut adapters)?;
            let up = column("u", &mut adapters)?;
            let act = b.mul(&b.silu(&pre), &up);
            (Some(pre), None, Some(up), act, "d")
        }
    };
    let (w_out, bias_out) = names(out);
    // The output projection's bias is added after the tensor-parallel reduction.
    let y = linear(
        env,
        values,
        &act,
        (&w_out, &bias_out),
        Parallel::Row,
        &mut adapters,
    )?;
    Ok((
        y,
        MlpCtx {
            x: keep.then(|| x.clone()),
            pre,
            gelu_bits,
            up,
            act: keep.then_some(act),
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
    ctx: &MlpCtx<B::Tensor>,
    dy: &B::Tensor,
) -> Result<B::Tensor, RuntimeError> {
    let b = env.b;
    // Gradients of a projection `x·W (+ bias)` (and of its adapter) from its output's
    // gradient `d`; returns the input's gradient.
    let back_linear = |grads: &mut Grads<B::Tensor>,
                       x: Option<&B::Tensor>,
                       d: &B::Tensor,
                       which: &str|
     -> Result<B::Tensor, RuntimeError> {
        let w = format!("{prefix}.w{which}");
        if grads.trains(&w) {
            let x = kept(x, &w)?;
            grads.add(b, &w, || b.matmul(x, d, true, false));
        }
        let bias = format!("{prefix}.b{which}");
        if values.contains_key(&bias) {
            grads.add(b, &bias, || b.sum_rows(d));
        }
        let mut dx = b.matmul(d, param(values, &w)?, false, true);
        if let Some(adapter) = ctx.adapter(&w) {
            b.add_assign(
                &mut dx,
                &lora::backward(env, values, grads, &w, adapter, x, d)?,
            );
        }
        Ok(dx)
    };
    let pre = || ctx.pre.as_ref().expect("kept unless GELU is in place");
    match env.model.mlp {
        MlpKind::Gelu => {
            let dact = back_linear(grads, ctx.act.as_ref(), dy, "2")?;
            let dpre = match (&ctx.gelu_bits, &ctx.act) {
                (Some(bits), Some(act)) => b.gelu_backward_from_output(act, bits, &dact),
                _ => b.gelu_backward(pre(), &dact),
            };
            back_linear(grads, ctx.x.as_ref(), &dpre, "1")
        }
        MlpKind::Swiglu => {
            let dact = back_linear(grads, ctx.act.as_ref(), dy, "d")?;
            let up = ctx.up.as_ref().expect("swiglu keeps its up projection");
            let dup = b.mul(&dact, &b.silu(pre()));
            let dgate = b.silu_backward(pre(), &b.mul(&dact, up));
            let dx_gate = back_linear(grads, ctx.x.as_ref(), &dgate, "g")?;
            let dx_up = back_linear(grads, ctx.x.as_ref(), &dup, "u")?;
            Ok(b.add(&dx_gate, &dx_up))
        }
    }
}
