//! `train.finetune = { method = auto }`: LoRA, or LoRA-FA where memory binds. LoRA-FA trains
//! only `B` and keeps no inputs of the frozen projections, so it needs less memory and a little
//! less time, but it learns less per step than LoRA (Zhang et al. 2023, arXiv 2308.03303); the
//! planner therefore keeps LoRA unless memory binds it: when no LoRA plan fits, or when memory
//! costs LoRA's plan at least [`MEMORY_BINDS_FRACTION`] of its step time (the best LoRA plan
//! with unlimited memory is that much faster: what fits runs smaller micro-batches, recomputes
//! or shards more). Then it takes LoRA-FA's plan when that one is better.

use serde::{Deserialize, Serialize};
use tessel_grammar::{FinetuneMethod, Spec};

use crate::error::PlanError;
use crate::planning::{plan, plan_fixed, PlanOptions, PlanOutcome};
use crate::Plan;
use tessel_grammar::Strategy;

/// How `method = auto` chose: the ranked step times it compared, seconds (`None` where no
/// plan fits).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct FinetuneChoice {
    pub chosen: FinetuneMethod,
    /// LoRA's best plan that fits.
    pub lora_s: Option<f64>,
    /// LoRA's best plan with unlimited memory (only where LoRA fits).
    pub lora_unlimited_s: Option<f64>,
    /// LoRA-FA's best plan (only where memory binds LoRA).
    pub lora_fa_s: Option<f64>,
}

/// How much of LoRA's step time memory must cost before LoRA-FA's lesser update is worth it.
pub const MEMORY_BINDS_FRACTION: f64 = 0.05;

/// The spec with its fine-tuning method set to `method`.
fn with_method(spec: &Spec, method: FinetuneMethod) -> Spec {
    let mut spec = spec.clone();
    if let Some(finetune) = spec.train.finetune.as_mut() {
        finetune.method = method;
    }
    spec
}

/// Plans `spec`, resolving `method = auto`; any other spec is planned as it is. Needs
/// `options.model_for_spec` to cost the specs it tries.
pub fn plan_finetune(spec: &Spec, options: &PlanOptions<'_>) -> Result<PlanOutcome, PlanError> {
    let factory = options.model_for_spec.ok_or_else(|| PlanError::CostModel {
        message: "choosing a fine-tuning method needs a cost model per spec".into(),
    })?;
    let plan_of = |spec: &Spec| -> Result<PlanOutcome, PlanError> {
        let model = factory(spec).map_err(|message| PlanError::CostModel { message })?;
        plan(spec, model.as_ref(), options)
    };
    let auto = spec
        .train
        .finetune
        .is_some_and(|f| f.method == FinetuneMethod::Auto);
    if !auto {
        return plan_of(spec);
    }
    let lora = with_method(spec, FinetuneMethod::Lora);
    let ranked = |o: &PlanOutcome| options.objective.ranked_step_time(&o.plan.prediction);
    let lora_plan = plan_of(&lora);
    let lora_s = lora_plan.as_ref().ok().map(ranked);
    let lora_unlimited_s = lora_plan.as_ref().ok().and_then(|_| {
        let mut unlimited = lora.clone();
        unlimited.cluster.gpu.memory = f64::MAX / 4.0;
        plan_of(&unlimited).ok().map(|o| ranked(&o))
    });
    let memory_binds = match (lora_s, lora_unlimited_s) {
        (None, _) => true,
        (Some(fitted), Some(free)) => free < (1.0 - MEMORY_BINDS_FRACTION) * fitted,
        (Some(_), None) => false,
    };
    let mut choice = FinetuneChoice {
        chosen: FinetuneMethod::Lora,
        lora_s,
        lora_unlimited_s,
        lora_fa_s: None,
    };
    let outcome = if memory_binds {
        let fa_plan = plan_of(&with_method(spec, FinetuneMethod::LoraFa));
        choice.lora_fa_s = fa_plan.as_ref().ok().map(ranked);
        match (lora_plan, fa_plan) {
            (Ok(lora), Ok(fa)) if ranked(&fa) < ranked(&lora) => Ok(fa),
            (Ok(lora), _) => Ok(lora),
            (Err(_), Ok(fa)) => Ok(fa),
            (Err(error), Err(_)) => Err(error),
        }
    } else {
        lora_plan
    };
    outcome.map(|mut outcome| {
        if let Some(f) = outcome.plan.spec.train.finetune {
            choice.chosen = f.method;
        }
        outcome.plan.finetune_choice = Some(choice);
        outcome
    })
}

/// Plans the fixed `strategy`, resolving `method = auto`: with the degrees fixed, memory binds
/// LoRA exactly when LoRA's plan does not fit, and then LoRA-FA's is taken. `model_for_spec`
/// costs each method's spec.
pub fn plan_fixed_finetune(
    spec: &Spec,
    strategy: &Strategy,
    model_for_spec: crate::ModelFactory<'_>,
) -> Result<Plan, PlanError> {
    let plan_of = |method: FinetuneMethod| -> Result<Plan, PlanError> {
        let spec = with_method(spec, method);
        let model = model_for_spec(&spec).map_err(|message| PlanError::CostModel { message })?;
        plan_fixed(&spec, model.as_ref(), strategy)
    };
    let auto = spec
        .train
        .finetune
        .is_some_and(|f| f.method == FinetuneMethod::Auto);
    if !auto {
        let model = model_for_spec(spec).map_err(|message| PlanError::CostModel { message })?;
        return plan_fixed(spec, model.as_ref(), strategy);
    }
    let lora = plan_of(FinetuneMethod::Lora);
    let step = |p: &Plan| p.prediction.step_time_s;
    let mut choice = FinetuneChoice {
        chosen: FinetuneMethod::Lora,
        lora_s: lora.as_ref().ok().map(step),
        lora_unlimited_s: None,
        lora_fa_s: None,
    };
    let mut plan = match lora {
        Ok(plan) => plan,
        Err(error) => {
            let fa = plan_of(FinetuneMethod::LoraFa).map_err(|_| error)?;
            choice.chosen = FinetuneMethod::LoraFa;
            choice.lora_fa_s = Some(step(&fa));
            fa
        }
    };
    plan.finetune_choice = Some(choice);
    Ok(plan)
}

/// Why `method = auto` chose what it did, for `--explain`.
pub fn explain_finetune_choice(choice: &FinetuneChoice) -> String {
    let s = |t: Option<f64>| t.map_or("no plan fits".to_string(), |t| format!("{t:.3} s"));
    let binds = match (choice.lora_s, choice.lora_unlimited_s) {
        (None, _) => "no LoRA plan fits".to_string(),
        (Some(fitted), Some(free)) => format!(
            "memory costs LoRA {:.1} % of its step time ({} fitting, {} with unlimited memory; \
             LoRA-FA is considered from {:.0} %)",
            (1.0 - free / fitted) * 100.0,
            s(Some(fitted)),
            s(Some(free)),
            MEMORY_BINDS_FRACTION * 100.0
        ),
        (Some(fitted), None) => format!("LoRA {}", s(Some(fitted))),
    };
    match choice.lora_fa_s {
        None => format!("finetune: lora, as memory does not bind it: {binds}.\n"),
        Some(fa) => format!(
            "finetune: {}: {binds}; LoRA-FA {}.\n",
            choice.chosen.name(),
            s(Some(fa))
        ),
    }
}
