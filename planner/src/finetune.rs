//! `train.finetune = { method = auto }`: LoRA, or LoRA-FA where memory binds. LoRA-FA trains
//! only `B` and keeps no inputs of the frozen projections, so it needs less memory and a little
//! less time, but it learns less per step than LoRA (Zhang et al. 2023, arXiv 2308.03303); the
//! planner therefore keeps LoRA unless memory binds it: when no LoRA plan fits, or when memory
//! costs LoRA's plan at least [`MEMORY_BINDS_FRACTION`] of its step time (the best LoRA plan
//! with unlimited memory is that much faster: what fits runs smaller micro-batches, recomputes
//! or shards more). Then it takes LoRA-FA's plan when that one is better.

use tessel_grammar::{FinetuneMethod, Spec};

use crate::error::PlanError;
use crate::planning::{plan, PlanOptions, PlanOutcome};

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
    let memory_binds = match &lora_plan {
        Err(_) => true,
        Ok(fitted) => {
            let mut unlimited = lora.clone();
            unlimited.cluster.gpu.memory = f64::MAX / 4.0;
            plan_of(&unlimited)
                .is_ok_and(|free| ranked(&free) < (1.0 - MEMORY_BINDS_FRACTION) * ranked(fitted))
        }
    };
    if !memory_binds {
        return lora_plan;
    }
    match (
        lora_plan,
        plan_of(&with_method(spec, FinetuneMethod::LoraFa)),
    ) {
        (Ok(lora), Ok(fa)) if ranked(&fa) < ranked(&lora) => Ok(fa),
        (Ok(lora), _) => Ok(lora),
        (Err(_), Ok(fa)) => Ok(fa),
        (Err(error), Err(_)) => Err(error),
    }
}
