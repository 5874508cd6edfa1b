//! Choices a spec leaves to the planner beside the strategy, each resolved by planning every
//! alternative and keeping the fastest plan by its ranked step time (the first alternative on a
//! tie). `finetune = { method = auto }` has its own rule (`finetune.rs`: LoRA unless memory
//! binds); these two are pure speed:
//! - `memory_saving_kernels = auto`: Tempo's kernels keep fewer activation bytes (larger
//!   micro-batches, less recompute) but rebuild the attention's dropout output in backward, so
//!   they pay off only where memory binds;
//! - `grad_compression = { method = auto }`: none, PowerSGD, top-k or fp8. The cost model
//!   already compresses a class of buckets only where that is faster, so a method wins where
//!   the network is slow against the compute (Espresso's question, Wang et al., EuroSys 2023);
//! - `multimodal = { placement = auto }` (or `separate` without `encoder_gpus`): the encoders on
//!   the first stage, or on whole nodes of their own, as many as their share of the FLOPs
//!   suggests, one fewer and twice as many (MMScale's and DistTrain's disaggregation sizes each
//!   module's GPUs to its work).

use serde::{Deserialize, Serialize};
use tessel_grammar::{
    CompressionMethod, EncoderPlacement, MemorySavingKernels, MultimodalTraining, Spec, Strategy,
};

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

/// How `grad_compression = { method = auto }` chose: the method (`None`: sent whole) and the
/// ranked step time of each alternative, seconds (`None` where no plan fits).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompressionChoice {
    pub chosen: Option<CompressionMethod>,
    pub none_s: Option<f64>,
    pub powersgd_s: Option<f64>,
    pub topk_s: Option<f64>,
    pub fp8_s: Option<f64>,
}

/// How `multimodal = { placement = auto }` chose: the placement, the encoders' own GPUs when
/// separate, and the ranked step time of each alternative (`None` where no plan fits).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EncoderPlacementChoice {
    pub chosen: EncoderPlacement,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoder_gpus: Option<u64>,
    /// Whether the first stage was tried (not when the spec asked for `separate`), and its
    /// ranked step time.
    pub first_stage_tried: bool,
    pub first_stage_s: Option<f64>,
    /// Each size tried for the encoders' own GPUs, with its ranked step time.
    pub separate_s: Vec<(u64, Option<f64>)>,
}

/// How a resolution plans one spec and reads and marks its result.
struct Resolver<'a, T> {
    plan_of: &'a dyn Fn(&Spec) -> Result<T, PlanError>,
    ranked: &'a dyn Fn(&T) -> f64,
    plan: &'a dyn Fn(&mut T) -> &mut Plan,
}

/// Whether a plan's prediction fits: a separate encoders' stage is costed outside the
/// search's memory constraints, so an alternative whose encoder GPUs overflow loses.
fn fits(plan: &mut Plan) -> bool {
    plan.prediction.fits
}

impl<T> Resolver<'_, T> {
    /// Plans `spec`, resolving its `auto` choices one after another.
    fn resolve(&self, spec: &Spec) -> Result<T, PlanError> {
        let train = &spec.train;
        if train.memory_saving_kernels == MemorySavingKernels::Auto {
            let options = [MemorySavingKernels::On, MemorySavingKernels::Off];
            let variants = options.map(|kernels| {
                let mut variant = spec.clone();
                variant.train.memory_saving_kernels = kernels;
                variant
            });
            let (best, mut chosen, times) = self.fastest(&variants)?;
            (self.plan)(&mut chosen).kernels_choice = Some(KernelsChoice {
                chosen: options[best],
                on_s: times[0],
                off_s: times[1],
            });
            return Ok(chosen);
        }
        if let Some(auto) = train
            .grad_compression
            .filter(|c| c.method == CompressionMethod::Auto)
        {
            let methods = [
                None,
                Some(CompressionMethod::Powersgd),
                Some(CompressionMethod::Topk),
                Some(CompressionMethod::Fp8),
            ];
            let variants = methods.map(|method| {
                let mut variant = spec.clone();
                variant.train.grad_compression =
                    method.map(|method| tessel_grammar::GradCompression { method, ..auto });
                variant
            });
            let (best, mut chosen, times) = self.fastest(&variants)?;
            (self.plan)(&mut chosen).compression_choice = Some(CompressionChoice {
                chosen: methods[best],
                none_s: times[0],
                powersgd_s: times[1],
                topk_s: times[2],
                fp8_s: times[3],
            });
            return Ok(chosen);
        }
        if let Some(training) = spec.placement_to_choose() {
            let sizes = encoder_node_counts(spec);
            let mut variants = Vec::new();
            if training.placement == EncoderPlacement::Auto {
                let mut variant = spec.clone();
                variant.train.multimodal = Some(MultimodalTraining {
                    placement: EncoderPlacement::FirstStage,
                    ..training
                });
                variants.push(variant);
            }
            let first_stage = variants.len();
            for &nodes in &sizes {
                let gpus = nodes * spec.cluster.gpus_per_node;
                let mut variant = spec.clone();
                variant.cluster = spec
                    .cluster
                    .without_encoder_gpus(gpus)
                    .map_err(|message| PlanError::CostModel { message })?;
                variant.train.multimodal = Some(MultimodalTraining {
                    placement: EncoderPlacement::Separate,
                    encoder_gpus: Some(gpus),
                    ..training
                });
                variants.push(variant);
            }
            let (best, mut chosen, times) = self.fastest(&variants)?;
            let gpus_of = |index: usize| {
                (index >= first_stage)
                    .then(|| sizes[index - first_stage] * spec.cluster.gpus_per_node)
            };
            (self.plan)(&mut chosen).placement_choice = Some(EncoderPlacementChoice {
                chosen: if best >= first_stage {
                    EncoderPlacement::Separate
                } else {
                    EncoderPlacement::FirstStage
                },
                encoder_gpus: gpus_of(best),
                first_stage_tried: first_stage > 0,
                first_stage_s: (first_stage > 0).then(|| times[0]).flatten(),
                separate_s: (first_stage..variants.len())
                    .map(|i| (gpus_of(i).unwrap_or(0), times[i]))
                    .collect(),
            });
            return Ok(chosen);
        }
        (self.plan_of)(spec)
    }

    /// The fastest of the variants' plans: its index, the plan and every variant's ranked
    /// step time; the first error where none plans.
    fn fastest(&self, variants: &[Spec]) -> Result<(usize, T, Vec<Option<f64>>), PlanError> {
        let mut best: Option<(usize, T)> = None;
        let mut first_error = None;
        let mut times = Vec::with_capacity(variants.len());
        for (index, variant) in variants.iter().enumerate() {
            match self.resolve(variant).and_then(|mut planned| {
                if fits((self.plan)(&mut planned)) {
                    Ok(planned)
                } else {
                    Err(PlanError::CostModel {
                        message: format!(
                            "the plan for alternative {} does not fit in memory",
                            index + 1
                        ),
                    })
                }
            }) {
                Ok(planned) => {
                    let time = (self.ranked)(&planned);
                    times.push(Some(time));
                    if best.as_ref().is_none_or(|(_, b)| time < (self.ranked)(b)) {
                        best = Some((index, planned));
                    }
                }
                Err(error) => {
                    times.push(None);
                    first_error.get_or_insert(error);
                }
            }
        }
        match (best, first_error) {
            (Some((index, planned)), _) => Ok((index, planned, times)),
            (None, Some(error)) => Err(error),
            (None, None) => Err(PlanError::CostModel {
                message: "no alternative to plan".into(),
            }),
        }
    }
}

/// Plans `spec`, resolving `memory_saving_kernels = auto`, `grad_compression = { method = auto
/// }` and `finetune = { method = auto }`; any other spec is planned as it is. Needs
/// `options.model_for_spec`.
pub fn plan_resolving_choices(
    spec: &Spec,
    options: &PlanOptions<'_>,
) -> Result<PlanOutcome, PlanError> {
    let resolver = Resolver {
        plan_of: &|s: &Spec| plan_finetune(s, options),
        ranked: &|o: &PlanOutcome| options.objective.ranked_step_time(&o.plan.prediction),
        plan: &|o: &mut PlanOutcome| &mut o.plan,
    };
    resolver.resolve(spec)
}

/// Plans the fixed `strategy`, resolving the choices as [`plan_resolving_choices`] does.
pub fn plan_fixed_resolving_choices(
    spec: &Spec,
    strategy: &Strategy,
    model_for_spec: ModelFactory<'_>,
) -> Result<Plan, PlanError> {
    let resolver = Resolver {
        plan_of: &|s: &Spec| plan_fixed_finetune(s, strategy, model_for_spec),
        ranked: &|p: &Plan| p.prediction.step_time_s,
        plan: &|p: &mut Plan| p,
    };
    resolver.resolve(spec)
}

/// Whole nodes to try for the encoders' own GPUs: their share of the step's FLOPs times the
/// cluster's nodes, rounded down and up, and twice that, each leaving the language model a node.
fn encoder_node_counts(spec: &Spec) -> Vec<u64> {
    let nodes = spec.cluster.nodes;
    if nodes < 2 || !spec.cluster.pools.is_empty() {
        return Vec::new();
    }
    let hidden = spec.model.hidden;
    let per_sample: f64 = spec
        .model
        .encoders
        .iter()
        .map(|e| e.items_per_sample.mean * e.training_flops_per_item(hidden))
        .sum();
    let seq_len = spec.train.seq_len;
    let total = spec
        .model
        .job_flops_per_token(seq_len, spec.train.finetune.as_ref())
        * seq_len as f64;
    let share = nodes as f64 * per_sample / total.max(f64::MIN_POSITIVE);
    let mut counts: Vec<u64> = [share.floor(), share.ceil(), 2.0 * share.ceil()]
        .iter()
        .map(|&n| (n as u64).clamp(1, nodes - 1))
        .collect();
    counts.sort_unstable();
    counts.dedup();
    counts
}

fn seconds(t: Option<f64>) -> String {
    t.map_or("no plan fits".to_string(), |t| format!("{t:.3} s"))
}

/// Why `memory_saving_kernels = auto` chose what it did, for `--explain`.
pub fn explain_kernels_choice(choice: &KernelsChoice) -> String {
    let chosen = if choice.chosen.is_on() { "on" } else { "off" };
    format!(
        "memory_saving_kernels: {chosen}: {} with them, {} without.\n",
        seconds(choice.on_s),
        seconds(choice.off_s)
    )
}

/// Why the encoders run where they do, for `--explain`.
pub fn explain_placement_choice(choice: &EncoderPlacementChoice) -> String {
    let mut tried: Vec<String> = Vec::new();
    if choice.first_stage_tried {
        tried.push(format!("first stage {}", seconds(choice.first_stage_s)));
    }
    tried.extend(
        choice
            .separate_s
            .iter()
            .map(|(gpus, t)| format!("{gpus} GPUs of their own {}", seconds(*t))),
    );
    let chosen = match choice.encoder_gpus {
        Some(gpus) => format!("{gpus} GPUs of their own"),
        None => "the first stage".to_string(),
    };
    format!("encoders: on {chosen}: {}.\n", tried.join(", "))
}

/// Why `grad_compression = { method = auto }` chose what it did, for `--explain`.
pub fn explain_compression_choice(choice: &CompressionChoice) -> String {
    format!(
        "grad_compression: {}: none {}, powersgd {}, topk {}, fp8 {}.\n",
        choice.chosen.map_or("none", CompressionMethod::name),
        seconds(choice.none_s),
        seconds(choice.powersgd_s),
        seconds(choice.topk_s),
        seconds(choice.fp8_s)
    )
}
