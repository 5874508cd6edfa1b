//! LoRA and LoRA-FA adapters (Hu et al. 2021, arXiv 2106.09685; Zhang et al. 2023, arXiv
//! 2308.03303). Beside a frozen projection `W` (`in × out`) trains a rank-`r` update: the
//! output gains `x·A·B`, with `A` (`in × r`) and `B` (`r × out`). `B` starts at zero, so
//! training starts from the model as it is; the scale `α/r` is 1 (PEFT's `lora_alpha = r`).
//! LoRA-FA freezes `A` as well (at its random start), so only `B` trains and the backward
//! needs no input of `W`, only the `r`-wide product `u = x·A` every adapter keeps.
//!
//! Adapters split as their projection does over the tensor group:
//! - column-parallel `W` (output columns split): `A` whole on every tensor rank, `B` split as
//!   `W`. Every rank computes the same `u`; each one's gradient of `u`, hence of `A`, is
//!   partial and summed over the tensor group (`tp_replicas = tp`).
//! - row-parallel `W` (input rows split): `A` split by rows as `W`, `u = Σ x_i·A_i`
//!   all-reduced over the tensor group, `B` whole. The first tensor rank adds `u·B` to its
//!   partial output, which the block's reduction sums; the output's gradient is whole on
//!   every rank, so each computes the same gradient of `B` and of `u`.

use super::layout::{ParamSpec, Split};
use super::{param, Env, Grads, Values};
use crate::backend::Backend;
use crate::error::RuntimeError;
use crate::init::Init;
use crate::mesh::GroupKind;
use tessel_grammar::{FinetuneMethod, FinetuneSpec, LoraTargets, MlpKind, ModelSpec};

/// `A`'s start: normal with this standard deviation (the model's weights use 0.02 too).
const A_STD: f32 = 0.02;

/// Which adapters a fine-tuning run trains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Adapters {
    pub rank: u64,
    pub targets: LoraTargets,
    /// LoRA-FA: `A` is frozen too.
    pub frozen_a: bool,
}

impl Adapters {
    /// The adapters of `train.finetune`: none for full training.
    pub fn of(finetune: Option<FinetuneSpec>) -> Result<Option<Adapters>, RuntimeError> {
        let Some(f) = finetune else { return Ok(None) };
        let frozen_a = match f.method {
            FinetuneMethod::Full => return Ok(None),
            FinetuneMethod::Lora => false,
            FinetuneMethod::LoraFa => true,
            FinetuneMethod::Auto => {
                return Err(RuntimeError::invalid_plan(
                    "`finetune.method = auto` must be resolved by `tessel plan` first",
                ))
            }
        };
        Ok(Some(Adapters {
            rank: f.rank,
            targets: f.targets,
            frozen_a,
        }))
    }

    /// Whether the projection named `weight` (`layers.L.attn.wq`, `layers.L.mlp.wd`, …)
    /// carries an adapter.
    pub fn targets(&self, weight: &str) -> bool {
        let Some((module, name)) = weight.rsplit_once('.') else {
            return false;
        };
        if module.ends_with(".attn") {
            match name {
                "wq" | "wk" | "wv" => self.targets.qkv,
                "wo" => self.targets.o,
                _ => false,
            }
        } else {
            module.ends_with(".mlp")
                && matches!(name, "w1" | "w2" | "wg" | "wu" | "wd")
                && self.targets.mlp
        }
    }
}

/// Whether a backward needs the input of the projections named: when their weights train
/// (no adapters) or when one of them carries an adapter whose `A` trains.
pub fn keeps_input(adapters: Option<&Adapters>, weights: &[&str]) -> bool {
    match adapters {
        None => true,
        Some(a) => !a.frozen_a && weights.iter().any(|w| a.targets(w)),
    }
}

/// Whether parameter `name` is an adapter matrix.
pub fn is_adapter(name: &str) -> bool {
    name.ends_with(".lora_a") || name.ends_with(".lora_b")
}

/// Names of the two adapter matrices of `weight`.
pub fn names(weight: &str) -> (String, String) {
    (format!("{weight}.lora_a"), format!("{weight}.lora_b"))
}

/// `A` and `B` of a targeted projection, split as [`Adapters`] describes.
pub fn adapter_params(weight: &ParamSpec, rank: u64, tp: u64) -> (ParamSpec, ParamSpec) {
    let (a_name, b_name) = names(&weight.name);
    let mut a = ParamSpec::new(
        a_name,
        weight.rows,
        rank,
        Split::Replicated,
        Init::Normal(A_STD),
    );
    let mut b = ParamSpec::new(
        b_name,
        rank,
        weight.cols,
        Split::Replicated,
        Init::Constant(0.0),
    );
    match weight.split {
        Split::Rows { .. } => a.split = weight.split,
        Split::Cols { .. } | Split::Replicated => {
            b.split = weight.split;
            b.tp_replicas = weight.tp_replicas;
            a.tp_replicas = tp;
        }
    }
    (a, b)
}

/// The projections of one layer's MLP that adapters can target, for a model.
pub fn mlp_weights(model: &ModelSpec) -> &'static [&'static str] {
    match model.mlp {
        MlpKind::Gelu => &["w1", "w2"],
        MlpKind::Swiglu => &["wg", "wu", "wd"],
    }
}

/// How a projection is split over the tensor group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parallel {
    Column,
    Row,
}

/// What an adapter keeps for its backward: `u = x·A`, whole on every tensor rank.
pub struct AdapterCtx<T> {
    u: T,
}

impl<T> AdapterCtx<T> {
    pub fn tensor(&self) -> &T {
        &self.u
    }
}

/// Adds the adapter's part to `y`, this rank's output of `weight` for the input `x` (to the
/// rank's columns of a column-parallel projection; for a row-parallel one, the whole part on
/// the first tensor rank and nothing on the others). `None` where `weight` has no adapter.
pub fn forward<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    (weight, parallel): (&str, Parallel),
    x: &B::Tensor,
    y: &mut B::Tensor,
) -> Result<Option<AdapterCtx<B::Tensor>>, RuntimeError> {
    if !env.adapters.is_some_and(|a| a.targets(weight)) {
        return Ok(None);
    }
    let b = env.b;
    let (a_name, b_name) = names(weight);
    let mut u = b.matmul(x, param(values, &a_name)?, false, false);
    if parallel == Parallel::Row && env.tp > 1 {
        u = b.all_reduce(GroupKind::Tensor, &u)?;
    }
    if parallel == Parallel::Column || env.tp_index == 0 {
        b.add_assign(y, &b.matmul(&u, param(values, &b_name)?, false, false));
    }
    Ok(Some(AdapterCtx { u }))
}

/// Adds the adapter's gradients and returns its part of the input gradient (partial over the
/// tensor group for a column-parallel projection, as the projection's own part is). `x` is
/// the projection's input where the backward kept it (LoRA; LoRA-FA needs none).
pub fn backward<B: Backend>(
    env: &Env<B>,
    values: &Values<B::Tensor>,
    grads: &mut Grads<B::Tensor>,
    weight: &str,
    ctx: &AdapterCtx<B::Tensor>,
    x: Option<&B::Tensor>,
    dy: &B::Tensor,
) -> Result<B::Tensor, RuntimeError> {
    let b = env.b;
    let (a_name, b_name) = names(weight);
    let a = param(values, &a_name)?;
    grads.add(b, &b_name, || b.matmul(&ctx.u, dy, true, false));
    let du = b.matmul(dy, param(values, &b_name)?, false, true);
    if grads.trains(&a_name) {
        let x = x.ok_or_else(|| RuntimeError::InvalidModel {
            reason: format!("{a_name} trains but its input was not kept"),
        })?;
        grads.add(b, &a_name, || b.matmul(x, &du, true, false));
    }
    Ok(b.matmul(&du, a, false, true))
}
