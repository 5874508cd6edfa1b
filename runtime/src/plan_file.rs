//! From a planner's plan file to what this runtime executes: the consistency checks a plan
//! must pass (world size against its rank map, stages against the model's layers, the
//! embedded spec against its digest), the scaled-down model and configuration a CPU run
//! trains, and the cost model's memory prediction for exactly that scaled configuration.

use crate::error::RuntimeError;
use crate::model::lora::Adapters;
use crate::plan::{Compression, ExecutionPlan};
use crate::scale::scale_model;
use tessel_grammar::{ModelSpec, Precision, Recompute, Spec, Strategy};
use tessel_planner::{coordinates, spec_digest, MeshShape, Plan};
use tessel_symbolic::cost::{CompressedBuckets, CostModel};

/// Parameter count the automatic scale shrinks a model below, so that a plan of a 70B model
/// trains a few steps on a CPU in seconds.
pub const AUTO_SCALE_MAX_PARAMETERS: u64 = 2_000_000;

/// Shortest sequence a scaled run trains on (rounded up to what the degrees need).
const MIN_SCALED_SEQ_LEN: u64 = 16;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// Checks that a plan file is self-consistent: the embedded spec matches its digest and
/// model name, the rank map holds `dp·tp·pp·cp` ranks at the coordinates the runtime's mesh
/// uses, the stages hold every layer once, and the batch split adds up.
pub fn check_plan(plan: &Plan) -> Result<(), RuntimeError> {
    let bad = |reason: String| Err(RuntimeError::invalid_plan(reason));
    if spec_digest(&plan.spec) != plan.spec_digest {
        return bad(
            "the embedded spec does not match the plan's spec_digest (edited by hand?)".into(),
        );
    }
    if plan.spec.model.name != plan.model {
        return bad(format!(
            "the plan names model `{}` but embeds `{}`",
            plan.model, plan.spec.model.name
        ));
    }
    if plan.placement.as_ref().is_some_and(|p| p.uneven_replicas()) {
        return bad(
            "its replicas run different micro-batch counts (replicas across pools), which the \
             runtime does not run"
                .into(),
        );
    }
    let c = &plan.config;
    for (what, v) in [
        ("dp", c.dp),
        ("tp", c.tp),
        ("pp", c.pp),
        ("cp", c.cp),
        ("ep", c.ep),
        ("interleave", c.interleave),
        ("microbatch", c.microbatch),
        ("microbatches", c.microbatches),
    ] {
        if v == 0 {
            return bad(format!("config.{what} must be at least 1"));
        }
    }
    crate::plan::experts_split_over_tp(c.tp, c.etp)?;
    crate::plan::shards_over_every_dp_rank(c.dp, c.dp_shard)?;
    let world = [c.dp, c.tp, c.pp, c.cp]
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| RuntimeError::invalid_plan("dp·tp·pp·cp overflows"))?;
    if plan.rank_map.ranks.len() as u64 != world {
        return bad(format!(
            "the rank map lists {} ranks but dp·tp·pp·cp = {}·{}·{}·{} = {world}",
            plan.rank_map.ranks.len(),
            c.dp,
            c.tp,
            c.pp,
            c.cp
        ));
    }
    if plan.gpus != world {
        return bad(format!(
            "the plan is for {} GPUs but dp·tp·pp·cp = {world}",
            plan.gpus
        ));
    }
    let shape = MeshShape {
        tp: c.tp,
        cp: c.cp,
        dp: c.dp,
        pp: c.pp,
        ep: c.ep,
        etp: c.etp.unwrap_or(c.tp),
        gpus_per_node: plan.gpus_per_node,
    };
    for (index, row) in plan.rank_map.ranks.iter().enumerate() {
        let k = coordinates(&shape, index as u64);
        let expected = [k.rank, k.node, k.local_gpu, k.pp, k.dp, k.cp, k.tp, k.ep];
        if *row != expected {
            return bad(format!(
                "rank map row {index} is {row:?}, but the runtime places that rank at {expected:?} \
                 (columns rank, node, local_gpu, pp, dp, cp, tp, ep)"
            ));
        }
    }
    if plan.stages.len() as u64 != c.pp {
        return bad(format!(
            "{} stages listed for pp = {}",
            plan.stages.len(),
            c.pp
        ));
    }
    let mut ranges: Vec<[u64; 2]> = Vec::new();
    for (i, stage) in plan.stages.iter().enumerate() {
        if stage.stage != i as u64 {
            return bad(format!("stage {i} is numbered {}", stage.stage));
        }
        if stage.layer_ranges.len() as u64 != c.interleave {
            return bad(format!(
                "stage {i} has {} layer ranges for interleave = {}",
                stage.layer_ranges.len(),
                c.interleave
            ));
        }
        let held: u64 = stage
            .layer_ranges
            .iter()
            .map(|[a, b]| b.saturating_sub(*a))
            .sum();
        if held != stage.layers {
            return bad(format!(
                "stage {i} says {} layers but its ranges hold {held}",
                stage.layers
            ));
        }
        ranges.extend(stage.layer_ranges.iter().copied());
    }
    ranges.sort();
    let mut next = 0;
    for [first, last] in &ranges {
        if *first != next || last <= first {
            return bad(format!(
                "the stages' layer ranges do not cover layers 0..{} once each, in order \
                 (found {first}..{last} where layer {next} was expected)",
                plan.spec.model.layers
            ));
        }
        next = *last;
    }
    if next != plan.spec.model.layers {
        return bad(format!(
            "the stages hold {next} layers but the model has {}",
            plan.spec.model.layers
        ));
    }
    let batch =
        c.dp.checked_mul(c.microbatch)
            .and_then(|x| x.checked_mul(c.microbatches));
    if batch != Some(plan.global_batch) || plan.global_batch != plan.spec.train.global_batch {
        return bad(format!(
            "dp·microbatch·microbatches = {}·{}·{} does not give the global batch {}",
            c.dp, c.microbatch, c.microbatches, plan.global_batch
        ));
    }
    if plan.seq_len != plan.spec.train.seq_len {
        return bad(format!(
            "the plan's sequence length {} differs from its spec's {}",
            plan.seq_len, plan.spec.train.seq_len
        ));
    }
    Ok(())
}

/// The plan's gradient compression, where it compresses any bucket.
fn compression_of(plan: &Plan) -> Option<Compression> {
    let method = plan.spec.train.grad_compression?;
    let stages: Vec<CompressedBuckets> = plan
        .prediction
        .stages
        .iter()
        .map(|s| {
            s.compressed.unwrap_or(CompressedBuckets {
                layers: false,
                edges: false,
            })
        })
        .collect();
    stages
        .iter()
        .any(|s| s.layers || s.edges)
        .then_some(Compression { method, stages })
}

impl ExecutionPlan {
    /// The execution plan of a plan file, at full size: its degrees, batch split, the exact
    /// layer ranges of every stage and each stage's recompute and offload.
    pub fn from_plan(plan: &Plan) -> Result<Self, RuntimeError> {
        check_plan(plan)?;
        let c = &plan.config;
        let mut chunk_layers = Vec::new();
        for chunk in 0..c.interleave as usize {
            for stage in &plan.stages {
                let [first, last] = stage.layer_ranges[chunk];
                chunk_layers.push((first, last));
            }
        }
        // The stages list their chunks in model order; virtual stage `c·pp + r` must be chunk
        // `c` of rank `r`, which `validate` checks through the ranges' order.
        let execution = ExecutionPlan {
            dp: c.dp,
            tp: c.tp,
            pp: c.pp,
            cp: c.cp,
            ep: c.ep,
            interleave: c.interleave,
            microbatch: c.microbatch,
            microbatches: c.microbatches,
            seq_len: plan.seq_len,
            zero: c.zero,
            sequence_parallel: c.sequence_parallel,
            chunk_layers,
            recompute: plan.stages.iter().map(|s| s.recompute).collect(),
            offload: plan.stages.iter().map(|s| s.offload).collect(),
            seed: 0,
            adapters: Adapters::of(plan.spec.train.finetune)?,
            memory_saving_kernels: plan.spec.train.memory_saving_kernels.is_on(),
            compression: compression_of(plan),
        };
        execution.validate(&plan.spec.model)?;
        Ok(execution)
    }
}

/// A plan shrunk to run on the CPU backend: the scaled spec (its model, sequence length and
/// the CPU run's facts — fp32, attention probabilities materialised, no dropout), what the runtime
/// executes, and the per-stage strategies the cost model predicts it with.
#[derive(Clone, Debug)]
pub struct ScaledPlan {
    pub factor: f64,
    pub spec: Spec,
    pub execution: ExecutionPlan,
    /// The fixed strategy of the scaled configuration, with each pipeline stage's recompute
    /// and offload in turn (the cost model takes one recompute choice per estimate).
    pub stage_strategies: Vec<Strategy>,
}

impl ScaledPlan {
    pub fn model(&self) -> &ModelSpec {
        &self.spec.model
    }

    /// Bytes per rank of each pipeline stage the cost model predicts for the scaled
    /// configuration: weights, gradients, optimizer states, activations (the categories the
    /// CPU backend measures).
    pub fn predicted_memory(&self) -> Result<Vec<PredictedMemory>, RuntimeError> {
        let cost = CostModel::new(&self.spec)
            .map_err(|e| RuntimeError::invalid_plan(format!("cost model: {e}")))?;
        self.stage_strategies
            .iter()
            .enumerate()
            .map(|(stage, strategy)| {
                let estimate = cost
                    .estimate(strategy)
                    .map_err(|e| RuntimeError::invalid_plan(format!("cost model: {e}")))?;
                let m = estimate
                    .stages
                    .get(stage)
                    .map(|s| s.memory)
                    .ok_or_else(|| {
                        RuntimeError::invalid_plan(format!("the cost model has no stage {stage}"))
                    })?;
                Ok(PredictedMemory {
                    weights: m.weights * GIB,
                    grads: m.gradients * GIB,
                    optimizer: m.optimizer * GIB,
                    activations: m.activations * GIB,
                    not_measured: m.buffers * GIB,
                })
            })
            .collect()
    }
}

/// The cost model's bytes per rank of one pipeline stage.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PredictedMemory {
    pub weights: f64,
    pub grads: f64,
    pub optimizer: f64,
    pub activations: f64,
    /// Communication buffers, logits buffer, gathered ZeRO-3 buffers, fragmentation and the
    /// CUDA context: GPU-side costs the CPU backend does not have.
    pub not_measured: f64,
}

impl PredictedMemory {
    /// The categories the CPU backend measures.
    pub fn measured_total(&self) -> f64 {
        self.weights + self.grads + self.optimizer + self.activations
    }
}

/// The minimum depth a plan needs: one layer per virtual pipeline stage.
pub fn min_layers(plan: &Plan) -> u64 {
    plan.config.pp.saturating_mul(plan.config.interleave)
}

/// The largest factor `2^-k` that brings the model to at most
/// [`AUTO_SCALE_MAX_PARAMETERS`] parameters, or the smallest the model shrinks to.
pub fn auto_scale(model: &ModelSpec, min_layers: u64) -> f64 {
    let mut factor = 1.0;
    let mut previous = scale_model(model, factor, min_layers);
    for _ in 0..40 {
        if previous.parameter_count().total <= AUTO_SCALE_MAX_PARAMETERS {
            break;
        }
        let next = scale_model(model, factor / 2.0, min_layers);
        if next == previous {
            break;
        }
        factor /= 2.0;
        previous = next;
    }
    factor
}

/// Shrinks a plan by `factor` (in (0, 1]): the model through [`scale_model`], the sequence
/// length by the same factor (at least 16, a multiple of what context and sequence
/// parallelism split), the batch split kept. Layers are spread evenly over the virtual
/// stages when the depth changed, the plan's own ranges otherwise; a partial recompute of
/// `n` layers is scaled with the depth.
pub fn scale_plan(plan: &Plan, factor: f64) -> Result<ScaledPlan, RuntimeError> {
    if !(factor > 0.0 && factor <= 1.0) {
        return Err(RuntimeError::invalid_plan(format!(
            "scale must be in (0, 1], not {factor}"
        )));
    }
    let full = ExecutionPlan::from_plan(plan)?;
    let c = &plan.config;
    let model = scale_model(&plan.spec.model, factor, min_layers(plan));
    let cp_chunks = if c.cp > 1 { 2 * c.cp } else { 1 };
    let split = cp_chunks * if c.sequence_parallel { c.tp } else { 1 };
    let seq_len = if factor == 1.0 {
        plan.seq_len
    } else {
        let scaled = ((plan.seq_len as f64 * factor).round() as u64).max(MIN_SCALED_SEQ_LEN);
        scaled.div_ceil(split) * split
    };
    let mut spec = plan.spec.clone();
    spec.model = model.clone();
    spec.train.seq_len = seq_len;
    spec.train.precision = Precision::Fp32;
    spec.train.flash_attention = false;
    // The CPU runtime trains without dropout, so the prediction keeps no dropout state either.
    spec.train.dropout = 0.0;
    let base = Strategy {
        name: "scaled-plan".into(),
        stages: None,
        ..plan.strategy()
    };
    let mut execution = if model.layers == plan.spec.model.layers {
        ExecutionPlan {
            seq_len,
            ..full.clone()
        }
    } else {
        ExecutionPlan::from_strategy(&model, &base, plan.global_batch, seq_len)?
    };
    execution.recompute = full
        .recompute
        .iter()
        .enumerate()
        .map(|(stage, r)| match r {
            Recompute::Partial { full_layers } => {
                let held = execution.stage_layers(stage as u64).len() as u64;
                let scaled = (*full_layers as f64 * model.layers as f64
                    / plan.spec.model.layers as f64)
                    .round() as u64;
                Recompute::Partial {
                    full_layers: scaled.min(held),
                }
            }
            other => *other,
        })
        .collect();
    execution.offload = full.offload.clone();
    execution.adapters = full.adapters;
    execution.memory_saving_kernels = full.memory_saving_kernels;
    execution.compression = full.compression.clone();
    execution.validate(&model)?;
    let chunk_sizes: Vec<u64> = execution.chunk_layers.iter().map(|(a, b)| b - a).collect();
    let stage_strategies = (0..c.pp as usize)
        .map(|stage| Strategy {
            recompute: execution.recompute[stage],
            offload: execution.offload[stage],
            stages: Some(chunk_sizes.clone()),
            ..base.clone()
        })
        .collect();
    Ok(ScaledPlan {
        factor,
        spec,
        execution,
        stage_strategies,
    })
}
