//! [`CostModel`]: the stage-cost expressions of one spec, and the prediction of a whole step
//! built from them.

use std::cell::RefCell;

use tessel_grammar::{Offload, Precision, Recompute, RecomputeModules, Spec, Strategy};

use super::calibration::{Calibration, KernelEfficiency};
use super::encoder::Encoders;
use super::layout::{microbatches, stage_layers, validate_strategy};
use super::slots::{slot_values, Output, Slot};
use super::stage_exprs::StagedExprs;
use super::{
    CompressedBuckets, CostError, Estimate, MemoryBreakdown, PipelineShape, StageCost,
    StageEstimate, TimeBreakdown,
};
use crate::uncertainty::{PredictionInterval, RunTraits};
use crate::{Expr, Program, Symbol, GIB};

/// Every output of one stage, in [`Output::ALL`] order.
pub type StageOutputs = [f64; Output::ALL.len()];

thread_local! {
    /// The register array of the compiled stage-cost program, one per thread, so that
    /// `stage_cost` allocates nothing after a thread's first call and `CostModel` stays
    /// `Send + Sync` without locking. Programs of different models share it (each call
    /// overwrites what it reads).
    static SCRATCH: RefCell<Vec<f64>> = const { RefCell::new(Vec::new()) };
}

/// The cost model of one spec: built once, then evaluated for any strategy. `Send + Sync`.
#[derive(Clone, Debug)]
pub struct CostModel {
    spec: Spec,
    calibration: Calibration,
    efficiency: KernelEfficiency,
    staged: StagedExprs,
    /// The outputs of `staged`, inlined, simplified and compiled over the slots: what
    /// `stage_cost` evaluates. `None` for a model built for a few evaluations only
    /// ([`CostModel::uncompiled`]), which walks `staged` instead.
    program: Option<Program>,
    /// The encoders of a multimodal model.
    encoders: Option<Encoders>,
}

impl CostModel {
    /// Builds the model with the committed calibration, and the collectives of the cluster's
    /// own calibration file when it has one.
    pub fn new(spec: &Spec) -> Result<CostModel, CostError> {
        CostModel::with_calibration(spec, Calibration::for_spec(spec)?)
    }

    /// Builds the model with explicit global calibration parameters (used by calibration and
    /// tests).
    pub fn with_calibration(spec: &Spec, calibration: Calibration) -> Result<CostModel, CostError> {
        validate_spec(spec)?;
        let efficiency = KernelEfficiency::for_gpu(&spec.cluster.gpu).calibrated(&calibration);
        CostModel::with_parameters(spec, calibration, efficiency)
    }

    /// Builds the model with explicit calibration and kernel efficiencies.
    pub fn with_parameters(
        spec: &Spec,
        calibration: Calibration,
        efficiency: KernelEfficiency,
    ) -> Result<CostModel, CostError> {
        let mut model = CostModel::uncompiled(spec, calibration, efficiency)?;
        let slots: Vec<Symbol> = Slot::ALL.iter().map(|slot| slot.symbol()).collect();
        let program = Program::compile(&model.staged.inlined(), &slots).map_err(|error| {
            CostError::spec(format!(
                "the stage-cost expressions do not compile: {error}"
            ))
        })?;
        model.program = Some(program);
        Ok(model)
    }

    /// The same model without the compiled program: stage costs walk the named-intermediate
    /// trees (equal within rounding, slower per call). Compiling takes a few milliseconds,
    /// far more than the handful of stage evaluations one `estimate` needs, so validation and
    /// calibration, which build a model per published run and per trial, use this.
    pub fn uncompiled(
        spec: &Spec,
        calibration: Calibration,
        efficiency: KernelEfficiency,
    ) -> Result<CostModel, CostError> {
        validate_spec(spec)?;
        Ok(CostModel {
            spec: spec.clone(),
            calibration,
            efficiency,
            staged: StagedExprs::new(spec, efficiency, calibration),
            program: None,
            encoders: Encoders::new(spec, efficiency, calibration),
        })
    }

    /// [`CostModel::uncompiled`] with the calibration [`CostModel::new`] would use: for a
    /// model built to estimate a configuration or a few.
    pub fn for_few_estimates(spec: &Spec) -> Result<CostModel, CostError> {
        let calibration = Calibration::for_spec(spec)?;
        let efficiency = KernelEfficiency::for_gpu(&spec.cluster.gpu).calibrated(&calibration);
        CostModel::uncompiled(spec, calibration, efficiency)
    }

    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    pub fn calibration(&self) -> &Calibration {
        &self.calibration
    }

    pub fn efficiency(&self) -> &KernelEfficiency {
        &self.efficiency
    }

    /// The slot symbols and output expressions over the slots only (see [`Slot`] and
    /// [`Output`]), for compiling.
    pub fn stage_cost_exprs(&self) -> (Vec<Symbol>, Vec<Expr>) {
        let slots = Slot::ALL.iter().map(|slot| slot.symbol()).collect();
        (slots, self.staged.inlined())
    }

    /// The same outputs with shared sub-expressions named (the tree-evaluation reference the
    /// compiled program is tested against).
    pub fn staged_exprs(&self) -> &StagedExprs {
        &self.staged
    }

    /// Bytes per GPU a plan may use: the GPU's memory times the search's memory limit.
    pub fn memory_capacity(&self) -> f64 {
        self.spec.cluster.gpu.memory * self.spec.search.memory_limit
    }

    /// How stage times combine into a step: 1F1B `(1, m − 1)`, interleaved `(1/v, m − 1/v)`.
    pub fn pipeline_shape(&self, strategy: &Strategy) -> PipelineShape {
        let m = microbatches(&self.spec, strategy).max(1) as f64;
        let v = strategy.interleave.max(1) as f64;
        if strategy.interleave > 1 {
            PipelineShape {
                sum_weight: 1.0 / v,
                max_weight: m - 1.0 / v,
            }
        } else {
            PipelineShape {
                sum_weight: 1.0,
                max_weight: m - 1.0,
            }
        }
    }

    /// The compiled stage-cost program, if built (inputs in [`Slot::ALL`] order, outputs in
    /// [`Output::ALL`] order).
    pub fn program(&self) -> Option<&Program> {
        self.program.as_ref()
    }

    /// Evaluates every output for one stage (through the compiled program when there is one).
    pub fn stage_outputs(
        &self,
        strategy: &Strategy,
        stage: u64,
        layers: u64,
        recompute: Recompute,
        offload: Offload,
    ) -> StageOutputs {
        let m = microbatches(&self.spec, strategy).max(1);
        let values = slot_values(strategy, m, stage, layers, recompute, offload);
        let mut out = self.eval_slots(&values);
        if let Some(encoders) = self.encoders.as_ref().filter(|_| stage == 0) {
            if encoders.separate_gpus().is_none() {
                let cost = encoders.first_stage(strategy, m);
                for (output, value) in [
                    (Output::Compute, cost.microbatch_s),
                    (Output::DpCommTail, cost.tail_s),
                    (Output::Weights, cost.memory.weights),
                    (Output::Gradients, cost.memory.gradients),
                    (Output::OptimizerStates, cost.memory.optimizer),
                    (Output::Activations, cost.memory.activations),
                ] {
                    out[output.index()] += value;
                }
            }
        }
        out
    }

    /// Evaluates every output from slot values (in [`Slot::ALL`] order).
    pub fn eval_slots(&self, values: &[f64; Slot::ALL.len()]) -> StageOutputs {
        let mut out = [0.0; Output::ALL.len()];
        match &self.program {
            Some(program) => SCRATCH
                .with(|scratch| program.eval_into(values, &mut scratch.borrow_mut(), &mut out)),
            None => out.copy_from_slice(&self.staged.eval(values)),
        }
        out
    }

    /// What one pipeline device costs for one choice of layers, recompute and offload.
    pub fn stage_cost(
        &self,
        strategy: &Strategy,
        stage: u64,
        layers: u64,
        recompute: Recompute,
        offload: Offload,
    ) -> StageCost {
        let out = self.stage_outputs(strategy, stage, layers, recompute, offload);
        stage_cost_from_outputs(&out)
    }

    /// Predicts one fixed configuration.
    pub fn estimate(&self, strategy: &Strategy) -> Result<Estimate, CostError> {
        let capacity = self.memory_capacity();
        estimate_stages(
            &self.spec,
            strategy,
            &|stage, layers| {
                let outputs = self.stage_outputs(
                    strategy,
                    stage,
                    layers,
                    strategy.recompute_of(stage),
                    strategy.offload_of(stage),
                );
                Ok((outputs, capacity))
            },
            peak_for(&self.spec),
            self.pipeline_shape(strategy),
            self.encoders.as_ref(),
        )
    }
}

/// What one stage of a fixed configuration costs and the usable bytes per GPU it has, from
/// its index and layer count; an error when the stage cannot be costed.
pub(crate) type StageWork<'a> = dyn Fn(u64, u64) -> Result<(StageOutputs, f64), CostError> + 'a;

/// The prediction of a step: validates `strategy` against `spec` (whose cluster counts the
/// GPUs), costs each stage with `stage`, and makes the step time the pipeline shape gives, the
/// critical stage's breakdown, throughput and utilisation (`peak_per_gpu`: the dense peak at
/// the training precision, averaged over the GPUs), and the memory of the stage nearest its
/// capacity.
pub(crate) fn estimate_stages(
    spec: &Spec,
    strategy: &Strategy,
    stage: &StageWork<'_>,
    peak_per_gpu: f64,
    shape: PipelineShape,
    encoders: Option<&Encoders>,
) -> Result<Estimate, CostError> {
    validate_strategy(spec, strategy)?;
    let layers = stage_layers(spec, strategy);
    let (outputs, capacities): (Vec<StageOutputs>, Vec<f64>) = (0..)
        .zip(&layers)
        .map(|(index, &count)| stage(index, count))
        .collect::<Result<Vec<_>, CostError>>()?
        .into_iter()
        .unzip();
    let m = microbatches(spec, strategy).max(1) as f64;
    let costs: Vec<StageCost> = outputs.iter().map(|o| stage_cost_from_outputs(o)).collect();
    let encoder_step =
        encoders.map(|e| e.step(spec, strategy, &costs, microbatches(spec, strategy)));
    let step = match &encoder_step {
        None => shape.step_time(&costs),
        Some(e) => {
            let with_encoders: Vec<StageCost> =
                e.extra_stage.iter().chain(&costs).copied().collect();
            shape.step_time(&with_encoders) + e.imbalance_s
        }
    };
    if !step.is_finite() || step <= 0.0 {
        return Err(CostError::strategy(
            &strategy.name,
            "the predicted step time is not a positive number",
        ));
    }
    let critical = argmax(costs.iter().map(|c| c.microbatch_s));
    let tail_stage = argmax(costs.iter().map(|c| c.tail_s));
    let pipeline_part = step - costs[tail_stage].tail_s;
    let mut time = per_microbatch_breakdown(&outputs[critical], m);
    add_tail(&mut time, &outputs[tail_stage]);
    time.bubble = (pipeline_part - m * costs[critical].microbatch_s).max(0.0);
    if let Some(encoders) = &encoder_step {
        // The encoders' own stage's exposed reduction, when it is the longest tail; what
        // uneven items cost and the encoders' own stage add to the bubble.
        if let Some(extra) = encoders.extra_stage {
            time.dp_comm += (extra.tail_s - costs[tail_stage].tail_s).max(0.0);
        }
        time.bubble = (step - (time.total() - time.bubble)).max(0.0);
    }

    let compresses = spec
        .train
        .grad_compression
        .is_some_and(|c| c.method != tessel_grammar::CompressionMethod::Auto);
    let stages: Vec<StageEstimate> = outputs
        .iter()
        .zip(&costs)
        .enumerate()
        .map(|(stage, (out, cost))| {
            let mut stage_time = per_microbatch_breakdown(out, m);
            add_tail(&mut stage_time, out);
            stage_time.bubble = (step - stage_time.total()).max(0.0);
            StageEstimate {
                stage: stage as u64,
                layers: layers[stage],
                memory: scale_memory(&cost.memory, 1.0 / GIB),
                time: stage_time,
                compressed: compresses.then(|| CompressedBuckets {
                    layers: out[Output::CompressedLayerBuckets.index()] > 0.5,
                    edges: out[Output::CompressedEdgeBuckets.index()] > 0.5,
                }),
            }
        })
        .collect();

    let gpus = (spec.cluster.total_gpus() + encoder_step.as_ref().map_or(0, |e| e.gpus)) as f64;
    let tokens_per_step = (spec.train.global_batch * spec.train.seq_len) as f64;
    let tokens_per_s = tokens_per_step / step;
    let model_flops_per_token = spec
        .model
        .job_flops_per_token(spec.train.seq_len, spec.train.finetune.as_ref());
    let recompute_flops_per_token = recompute_flops_per_token(spec, strategy, &layers);
    let model_flops = model_flops_per_token * tokens_per_s / gpus;
    let hardware_flops = (model_flops_per_token + recompute_flops_per_token) * tokens_per_s / gpus;
    // The stage nearest its capacity speaks for the plan's memory (on one GPU type, the
    // largest).
    let binding = argmax(
        costs
            .iter()
            .zip(&capacities)
            .map(|(c, capacity)| c.memory.total() / capacity),
    );
    let mut peak_memory = costs[binding].memory.total();
    let capacity = capacities[binding];
    if let Some(extra) = encoder_step.as_ref().and_then(|e| e.extra_stage) {
        // The encoders' own GPUs carry the first stage's fixed overheads (CUDA context, NCCL
        // buffers, fragmentation) beside their states.
        peak_memory = peak_memory.max(extra.memory.total() + costs[0].memory.buffers);
    }
    Ok(Estimate {
        step_time_s: step,
        tokens_per_s,
        tokens_per_s_per_gpu: tokens_per_s / gpus,
        model_tflops_per_gpu: model_flops / 1e12,
        hardware_tflops_per_gpu: hardware_flops / 1e12,
        mfu: model_flops / peak_per_gpu,
        hfu: hardware_flops / peak_per_gpu,
        peak_memory_gib: peak_memory / GIB,
        memory_capacity_gib: capacity / GIB,
        fits: peak_memory <= capacity,
        time,
        stages,
        interval: Some(PredictionInterval::around(
            step,
            tokens_per_s,
            &RunTraits::of(spec, strategy),
        )),
        multimodal: encoder_step.map(|e| e.estimate),
    })
}

/// The GPU's dense peak at the training precision (fp32 trains on TF32 tensor cores).
pub(crate) fn peak_for(spec: &Spec) -> f64 {
    let peak = &spec.cluster.gpu.peak;
    match spec.train.precision {
        Precision::Fp32 => peak.tf32.max(peak.fp32),
        other => peak.for_precision(other),
    }
}

/// Extra FLOPs per trained token that recompute adds (Megatron convention, no causal
/// halving): a full forward of each fully recomputed layer (`2·` its active matmul
/// parameters `+ 4·s·q`, Megatron's 96·B·L·s·h²(1 + s/6h + V/16hL)), or for each selectively
/// recomputed layer the attention core counted as Korthikanti et al. and Megatron-LM count it
/// (`12·s·q`, their 72·B·L·s·h²(1 + s/3h + V/12hL)), so that HFU compares like with like.
fn recompute_flops_per_token(spec: &Spec, strategy: &Strategy, layers: &[u64]) -> f64 {
    let model = &spec.model;
    let seq = spec.train.seq_len as f64;
    let core = 4.0 * seq * model.q_dim() as f64;
    let selective_core = 3.0 * core;
    let total_layers = model.layers.max(1) as f64;
    let attention = model.attention_matmul_params() as f64;
    let mlp_per_layer = (model.active_matmul_params() as f64
        - (model.vocab * model.hidden) as f64
        - total_layers * attention)
        / total_layers;
    let layer_forward = 2.0 * (attention + mlp_per_layer) + core;
    let recomputed: f64 = layers
        .iter()
        .enumerate()
        .map(
            |(stage, &count)| match strategy.recompute_of(stage as u64) {
                Recompute::None => 0.0,
                Recompute::Selective => count as f64 * selective_core,
                // Of the modules, only the attention core's GEMMs count.
                Recompute::Modules(modules) if modules.contains(RecomputeModules::CORE_ATTN) => {
                    count as f64 * selective_core
                }
                Recompute::Modules(_) => 0.0,
                Recompute::Full => count as f64 * layer_forward,
                Recompute::Partial { full_layers } => full_layers.min(count) as f64 * layer_forward,
            },
        )
        .sum();
    recomputed
}

fn validate_spec(spec: &Spec) -> Result<(), CostError> {
    let model = &spec.model;
    let dims = [
        ("layers", model.layers),
        ("hidden", model.hidden),
        ("heads", model.heads),
        ("kv_heads", model.kv_heads),
        ("head_dim", model.head_dim),
        ("ffn_hidden", model.ffn_hidden),
        ("vocab", model.vocab),
        ("seq_len", spec.train.seq_len),
        ("global_batch", spec.train.global_batch),
        ("nodes", spec.cluster.nodes),
        ("gpus_per_node", spec.cluster.gpus_per_node),
    ];
    for (name, value) in dims {
        if value == 0 {
            return Err(CostError::spec(format!("{name} must be at least 1")));
        }
    }
    for encoder in &model.encoders {
        let longest = encoder.items_per_sample.max * encoder.llm_tokens_per_item();
        if longest > spec.train.seq_len {
            return Err(CostError::spec(format!(
                "a sample of encoder `{}`'s most items ({} × {} tokens) is longer than seq_len \
                 ({}): lower `items_per_sample.max` to {}, raise `merge`, or lengthen the sequence",
                encoder.name,
                encoder.items_per_sample.max,
                encoder.llm_tokens_per_item(),
                spec.train.seq_len,
                spec.train.seq_len / encoder.llm_tokens_per_item().max(1)
            )));
        }
    }
    if !model.heads.is_multiple_of(model.kv_heads) {
        return Err(CostError::spec(format!(
            "{} heads are not a multiple of {} key/value heads",
            model.heads, model.kv_heads
        )));
    }
    if let Some(moe) = &model.moe {
        if moe.experts == 0 || moe.top_k == 0 || moe.every == 0 || moe.expert_ffn_hidden == 0 {
            return Err(CostError::spec(
                "experts, top_k, every and expert_ffn_hidden must be at least 1",
            ));
        }
        if moe.top_k > moe.experts {
            return Err(CostError::spec(format!(
                "top_k = {} exceeds the {} experts",
                moe.top_k, moe.experts
            )));
        }
    }
    let gpu = &spec.cluster.gpu;
    let peak = peak_for(spec);
    if !(peak > 0.0 && peak.is_finite()) {
        return Err(CostError::spec(format!(
            "GPU `{}` has no {:?} peak: it cannot train at this precision",
            gpu.name, spec.train.precision
        )));
    }
    let positive = [
        ("GPU memory", gpu.memory),
        ("HBM bandwidth", gpu.hbm_bandwidth),
        ("intra-node bandwidth", spec.cluster.intra_node.bandwidth),
        ("inter-node bandwidth", spec.cluster.inter_node.bandwidth),
        ("host link bandwidth", spec.cluster.host_link),
        ("memory limit", spec.search.memory_limit),
    ];
    for (name, value) in positive {
        if !(value > 0.0 && value.is_finite()) {
            return Err(CostError::spec(format!(
                "{name} must be positive, got {value}"
            )));
        }
    }
    let latencies = [
        spec.cluster.intra_node.latency,
        spec.cluster.inter_node.latency,
    ];
    if latencies.iter().any(|l| !(l.is_finite() && *l >= 0.0)) {
        return Err(CostError::spec("link latencies must be non-negative"));
    }
    let eff = &gpu.efficiency;
    for value in [eff.matmul, eff.attention, eff.memory]
        .into_iter()
        .flatten()
    {
        if !(value > 0.0 && value <= 1.0) {
            return Err(CostError::spec(format!(
                "GPU efficiencies must lie in (0, 1], got {value}"
            )));
        }
    }
    Ok(())
}

fn argmax(values: impl Iterator<Item = f64>) -> usize {
    let mut best = 0;
    let mut best_value = f64::NEG_INFINITY;
    for (index, value) in values.enumerate() {
        if value > best_value {
            best = index;
            best_value = value;
        }
    }
    best
}

pub(crate) fn stage_cost_from_outputs(out: &[f64]) -> StageCost {
    let sum = |list: &[Output]| list.iter().map(|o| out[o.index()]).sum::<f64>();
    StageCost {
        microbatch_s: sum(&Output::MICROBATCH),
        tail_s: sum(&Output::TAIL),
        memory: MemoryBreakdown {
            weights: out[Output::Weights.index()],
            gradients: out[Output::Gradients.index()],
            optimizer: out[Output::OptimizerStates.index()],
            activations: out[Output::Activations.index()],
            buffers: out[Output::Buffers.index()],
        },
    }
}

/// Per-micro-batch components of a stage, times `m`.
fn per_microbatch_breakdown(out: &[f64], m: f64) -> TimeBreakdown {
    let get = |o: Output| out[o.index()] * m;
    TimeBreakdown {
        compute: get(Output::Compute),
        recompute: get(Output::Recompute),
        tp_comm: get(Output::TpComm),
        cp_comm: get(Output::CpComm),
        ep_comm: get(Output::EpComm),
        pp_comm: get(Output::PpComm),
        dp_comm: get(Output::DpCommPerMicrobatch),
        offload: get(Output::OffloadPerMicrobatch),
        bubble: 0.0,
        optimizer: 0.0,
    }
}

fn add_tail(time: &mut TimeBreakdown, out: &[f64]) {
    time.dp_comm += out[Output::DpCommTail.index()];
    time.optimizer += out[Output::OptimizerTail.index()];
    time.offload += out[Output::OffloadTail.index()];
}

fn scale_memory(memory: &MemoryBreakdown, factor: f64) -> MemoryBreakdown {
    MemoryBreakdown {
        weights: memory.weights * factor,
        gradients: memory.gradients * factor,
        optimizer: memory.optimizer * factor,
        activations: memory.activations * factor,
        buffers: memory.buffers * factor,
    }
}
