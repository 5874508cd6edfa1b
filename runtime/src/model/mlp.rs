//! The feed-forward block, column-parallel in and row-parallel out (Megatron): each tensor
//! rank returns a partial output that the caller sums over the tensor group.

use super::{param, Env, Grads, Values};
use crate::backend::Backend;
use crate::error::RuntimeError;
use tessel_grammar::MlpKind;

pub struct MlpCtx<T> {
    x: T,
    /// Pre-activation (gelu) or gate pre-activation (swiglu).
    pre: T,
    /// Up projection (swiglu only).
    up: Option<T>,
    /// Input of the output projection.
    act: T,
}

impl<T> MlpCtx<T> {
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
        let mut v = vec![&self.x];
        v.extend(self.tensors_besides_input());
        v
    }

    /// What the MLP keeps apart from its input, for callers that keep the input themselves.
    pub fn tensors_besides_input(&self) -> Vec<&T> {
        let mut v = vec![&self.pre, &self.act];
        v.extend(self.up.as_ref());
        v
    }
}

fn linear<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    x: &B::Tensor,
    w: &str,
    bias: &str,
) -> Result<B::Tensor, RuntimeError> {
    let y = env.b.matmul(x, param(values, w)?, false, false);
    Ok(match values.get(bias) {
        Some(b) => env.b.add_row(&y, b),
        None => y,
    })
}

pub fn forward<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    prefix: &str,
    x: &B::Tensor,
) -> Result<(B::Tensor, MlpCtx<B::Tensor>), RuntimeError> {
    let b = env.b;
    let (pre, up, act, out) = match env.model.mlp {
        MlpKind::Gelu => {
            let pre = linear(
                env,
                values,
                x,
                &format!("{prefix}.w1"),
                &format!("{prefix}.b1"),
            )?;
            let act = b.gelu(&pre);
            (pre, None, act, "w2")
        }
        MlpKind::Swiglu => {
            let pre = linear(
                env,
                values,
                x,
                &format!("{prefix}.wg"),
                &format!("{prefix}.bg"),
            )?;
            let up = linear(
                env,
                values,
                x,
                &format!("{prefix}.wu"),
                &format!("{prefix}.bu"),
            )?;
            let act = b.mul(&b.silu(&pre), &up);
            (pre, Some(up), act, "wd")
        }
    };
    let y = b.matmul(
        &act,
        param(values, &format!("{prefix}.{out}"))?,
        false,
        false,
    );
    Ok((
        y,
        MlpCtx {
            x: x.clone(),
            pre,
            up,
            act,
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
    let back_linear = |grads: &mut Grads<B::Tensor>,
                       d: &B::Tensor,
                       w: &str,
                       bias: &str|
     -> Result<B::Tensor, RuntimeError> {
        grads.add(b, w, b.matmul(&ctx.x, d, true, false));
        if values.contains_key(bias) {
            grads.add(b, bias, b.sum_rows(d));
        }
        Ok(b.matmul(d, param(values, w)?, false, true))
    };
    match env.model.mlp {
        MlpKind::Gelu => {
            let w2 = format!("{prefix}.w2");
            grads.add(b, &w2, b.matmul(&ctx.act, dy, true, false));
            let dact = b.matmul(dy, param(values, &w2)?, false, true);
            let dpre = b.gelu_backward(&ctx.pre, &dact);
            back_linear(
                grads,
                &dpre,
                &format!("{prefix}.w1"),
                &format!("{prefix}.b1"),
            )
        }
        MlpKind::Swiglu => {
            let wd = format!("{prefix}.wd");
            grads.add(b, &wd, b.matmul(&ctx.act, dy, true, false));
            let dact = b.matmul(dy, param(values, &wd)?, false, true);
            let up = ctx.up.as_ref().expect("swiglu keeps its up projection");
            let dup = b.mul(&dact, &b.silu(&ctx.pre));
            let dgate = b.silu_backward(&ctx.pre, &b.mul(&dact, up));
            let dx_gate = back_linear(
                grads,
                &dgate,
                &format!("{prefix}.wg"),
                &format!("{prefix}.bg"),
            )?;
            let dx_up = back_linear(
                grads,
                &dup,
                &format!("{prefix}.wu"),
                &format!("{prefix}.bu"),
            )?;
            Ok(b.add(&dx_gate, &dx_up))
        }
    }
}
