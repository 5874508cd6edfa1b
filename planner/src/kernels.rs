//! `train.memory_saving_kernels = auto`: Tempo's activation-saving kernels keep fewer
//! activation bytes (which buys larger micro-batches or less recompute) but rebuild the
//! attention's dropout output in backward, so they pay off only where memory binds. The planner
//! plans the job with them and without them and keeps the faster plan by its ranked step time.

use serde::{Deserialize, Serialize};
use tessel_grammar::{MemorySavingKernels, Spec, Strategy};

use crate::error::PlanError;
use crate::finetune::{plan_finetune, plan_fixed_finetune};
use crate::planning::{PlanOptions, PlanOutcome};
use crate::{ModelFactory, Plan};

/// How `memory_saving_kernels = auto` chose: the ranked step times with and without the
/// kernels, seconds (`None` where no plan fits).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelsChoice {
    pub chosen: MemorySavingKernels,
    pub on_s: Option<f64>,
    pub off_s: Option<f64>,
}

fn with_kernels(spec: &Spec, kernels: MemorySavingKernels) -> Spec {
    let mut spec = spec.clone();
    spec.train.memory_saving_kernels = kernels;
    spec
}

/// Chooses between the plans of `spec` with the kernels on and off, by `ranked`.
fn choose<T>(
    spec: &Spec,
    plan_of: impl Fn(&Spec) -> Result<T, PlanError>,
    ranked: impl Fn(&T) -> f64,
    record: impl FnOnce(&mut T, KernelsChoice),
) -> Result<T, PlanError> {
    let on = plan_of(&with_kernels(spec, MemorySavingKernels::On));
    let off = plan_of(&with_kernels(spec, MemorySavingKernels::Off));
    let (on_s, off_s) = (
        on.as_ref().ok().map(&ranked),
        off.as_ref().ok().map(&ranked),
    );
    let (mut chosen, kernels) = match (on, off) {
        (Ok(on), Ok(off)) if ranked(&on) < ranked(&off) => (on, MemorySavingKernels::On),
        (_, Ok(off)) => (off, MemorySavingKernels::Off),
        (Ok(on), Err(_)) => (on, MemorySavingKernels::On),
        (Err(error), Err(_)) => return Err(error),
    };
    let choice = KernelsChoice {
        chosen: kernels,
        on_s,
        off_s,
    };
    record(&mut chosen, choice);
    Ok(chosen)
}

fn is_auto(spec: &Spec) -> bool {
    spec.train.memory_saving_kernels == MemorySavingKernels::Auto
}

/// Plans `spec`, resolving `memory_saving_kernels = auto` and `finetune = { method = auto }`;
/// any other spec is planned as it is. Needs `options.model_for_spec`.
pub fn plan_resolving_choices(
    spec: &Spec,
    options: &PlanOptions<'_>,
) -> Result<PlanOutcome, PlanError> {
    if !is_auto(spec) {
        return plan_finetune(spec, options);
    }
    choose(
        spec,
        |s| plan_finetune(s, options),
        |o| options.objective.ranked_step_time(&o.plan.prediction),
        |o, choice| o.plan.kernels_choice = Some(choice),
    )
}

/// Plans the fixed `strategy`, resolving both choices as [`plan_resolving_choices`] does.
pub fn plan_fixed_resolving_choices(
    spec: &Spec,
    strategy: &Strategy,
    model_for_spec: ModelFactory<'_>,
) -> Result<Plan, PlanError> {
    if !is_auto(spec) {
        return plan_fixed_finetune(spec, strategy, model_for_spec);
    }
    choose(
        spec,
        |s| plan_fixed_finetune(s, strategy, model_for_spec),
        |p| p.prediction.step_time_s,
        |p, choice| p.kernels_choice = Some(choice),
    )
}

/// Why `memory_saving_kernels = auto` chose what it did, for `--explain`.
pub fn explain_kernels_choice(choice: &KernelsChoice) -> String {
    let s = |t: Option<f64>| t.map_or("no plan fits".to_string(), |t| format!("{t:.3} s"));
    let chosen = if choice.chosen.is_on() { "on" } else { "off" };
    format!(
        "memory_saving_kernels: {chosen}: {} with them, {} without.\n",
        s(choice.on_s),
        s(choice.off_s)
    )
}
