//! Entry point of the CPU backend: one thread per rank in this process.

use crate::backend::cpu::CpuBackend;
use crate::backend::shared_memory::World;
use crate::backend::AdamParams;
use crate::checkpoint::{create_folder, Checkpoint, InjectedFailure, ReshardSource, StateKind};
use crate::data::{DataSource, TokenStream};
use crate::error::RuntimeError;
use crate::executor::{run_rank, RankOutput, RunSetup};
use crate::memory::{MemoryBreakdown, MemoryPeaks};
use crate::mesh::Mesh;
use crate::model::layout::whole_model_params;
use crate::plan::ExecutionPlan;
use crate::trace::write_trace;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use tessel_grammar::{ModelSpec, PositionKind};
use tessel_planner::schedule::PipelineSchedule;

#[derive(Clone, Debug, PartialEq)]
pub struct LaunchOptions {
    pub steps: u64,
    /// Seeds the synthetic data (the plan's seed fixes the parameter initialisation).
    pub seed: u64,
    pub data: DataSource,
    /// Where to write a Chrome trace of the run.
    pub trace: Option<PathBuf>,
    /// What the trace says about the run beside its events, for `tessel calibrate` (`tessel
    /// launch` puts the scaled spec and each stage's strategy here): written as the trace's
    /// `tessel` object, with each rank's pipeline stage and the step times added.
    pub trace_context: serde_json::Map<String, serde_json::Value>,
    pub adam: AdamParams,
    /// Return the final global parameters in the report (for checking against a reference).
    pub collect_parameters: bool,
    /// Resume from the checkpoint in this folder (`crate::checkpoint`), written under any plan
    /// of the same model.
    pub resume_from: Option<PathBuf>,
    /// Write checkpoints to this folder: after the last step, and every `snapshot_every`
    /// steps when set (each in `step{N}/`, `latest` naming the newest).
    pub checkpoint_to: Option<PathBuf>,
    pub snapshot_every: Option<u64>,
    /// Make a rank fail as a step starts (tests of recovery).
    pub fail_at: Option<InjectedFailure>,
}

impl LaunchOptions {
    pub fn new(steps: u64) -> Self {
        LaunchOptions {
            steps,
            seed: 0,
            data: DataSource::Synthetic,
            trace: None,
            trace_context: serde_json::Map::new(),
            adam: AdamParams::default(),
            collect_parameters: false,
            resume_from: None,
            checkpoint_to: None,
            snapshot_every: None,
            fail_at: None,
        }
    }
}

/// Peak memory of one rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankMemory {
    pub rank: usize,
    /// Device bytes per category, each category's own peak.
    pub device: MemoryBreakdown,
    /// Peak of weights + gradients + optimizer states + activations on the device.
    pub device_total: u64,
    /// Peak of everything on the device, the transient ZeRO-2/3 buffers included.
    pub device_total_with_buffers: u64,
    /// Host bytes (offloaded state) per category.
    pub host: MemoryBreakdown,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LaunchReport {
    /// Global mean cross-entropy of each step.
    pub losses: Vec<f64>,
    /// Wall time of each step (the slowest rank).
    pub step_time_s: Vec<f64>,
    pub tokens_per_s: f64,
    pub peak_memory: Vec<RankMemory>,
    /// Final global parameters by name (when asked for).
    pub parameters: Option<BTreeMap<String, Vec<f32>>>,
    /// Optimizer steps taken before this run's first (those of the checkpoint it resumed).
    pub first_step: u64,
    /// What each rank read from each rank of the checkpoint it resumed.
    pub resharded: Vec<ReshardSource>,
}

/// Checks that the model can be built at all.
pub fn validate_model(model: &ModelSpec) -> Result<(), RuntimeError> {
    let bad = |reason: String| Err(RuntimeError::InvalidModel { reason });
    for (what, v) in [
        ("layers", model.layers),
        ("hidden", model.hidden),
        ("heads", model.heads),
        ("kv_heads", model.kv_heads),
        ("head_dim", model.head_dim),
        ("ffn_hidden", model.ffn_hidden),
        ("vocab", model.vocab),
    ] {
        if v == 0 {
            return bad(format!("{what} must be at least 1"));
        }
    }
    if !model.heads.is_multiple_of(model.kv_heads) {
        return bad(format!(
            "{} heads cannot share {} key/value heads",
            model.heads, model.kv_heads
        ));
    }
    if model.position == PositionKind::Rope && !model.head_dim.is_multiple_of(2) {
        return bad(format!(
            "rotary embeddings need an even head_dim, not {}",
            model.head_dim
        ));
    }
    if model.vocab > u64::from(u32::MAX) {
        return bad(format!(
            "vocabulary of {} does not fit 32-bit token ids",
            model.vocab
        ));
    }
    if let Some(moe) = &model.moe {
        if moe.experts == 0
            || moe.top_k == 0
            || moe.top_k > moe.experts
            || moe.every == 0
            || moe.expert_ffn_hidden == 0
        {
            return bad(
                "experts, top_k (≤ experts), every and expert_ffn_hidden must be at least 1".into(),
            );
        }
    }
    Ok(())
}

/// Trains `model` under `plan` for `options.steps` steps on CPU threads.
pub fn launch_cpu(
    model: &ModelSpec,
    plan: &ExecutionPlan,
    options: &LaunchOptions,
) -> Result<LaunchReport, RuntimeError> {
    validate_model(model)?;
    plan.validate(model)?;
    let schedule = PipelineSchedule::interleaved(plan.pp, plan.microbatches, plan.interleave)
        .map_err(|e| RuntimeError::invalid_plan(e.to_string()))?;
    let stream = TokenStream::new(
        &options.data,
        options.seed,
        model.vocab,
        plan.seq_len as usize,
        plan.global_batch() as usize,
    )?;
    let world = World::new(Mesh::new(plan));
    let resume = options
        .resume_from
        .as_deref()
        .map(Checkpoint::read)
        .transpose()?;
    if let Some(checkpoint) = &resume {
        // Fine-tuning with adapters reads the model's weights alone (from a pretraining
        // checkpoint or its own); its adapters and their moments when the checkpoint has them.
        let states = if plan.adapters.is_some() {
            &[StateKind::Param][..]
        } else {
            &StateKind::ALL[..]
        };
        checkpoint.check(&whole_model_params(model, plan.seq_len), states)?;
    }
    if let Some(dir) = &options.checkpoint_to {
        create_folder(dir)?;
    }
    let setup = RunSetup {
        model,
        plan,
        schedule: &schedule,
        stream: &stream,
        steps: options.steps as usize,
        resume: resume.as_ref(),
        checkpoint_to: options.checkpoint_to.as_deref(),
        snapshot_every: options.snapshot_every,
        fail_at: options.fail_at,
        adam: options.adam,
        collect_parameters: options.collect_parameters,
        start: Instant::now(),
    };
    let outputs = run_ranks(&world, plan.world_size() as usize, |backend, rank| {
        run_rank(backend, rank, &setup)
    })?;
    let first_step = resume.as_ref().map_or(0, |c| c.manifest.step);
    report(plan, options, outputs, first_step)
}

/// Runs `work` on `size` ranks, one thread each, over `world`: every rank's output in rank
/// order, or the first rank's failure (a panic included) once the others have stopped.
pub(crate) fn run_ranks<T: Send>(
    world: &Arc<World>,
    size: usize,
    work: impl Fn(&CpuBackend, usize) -> Result<T, RuntimeError> + Sync,
) -> Result<Vec<T>, RuntimeError> {
    let results: Vec<Result<T, RuntimeError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..size)
            .map(|rank| {
                let (world, work) = (world.clone(), &work);
                scope.spawn(move || {
                    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        let backend = CpuBackend::new(world.clone(), rank);
                        work(&backend, rank)
                    }));
                    let result = match outcome {
                        Ok(r) => r,
                        Err(panic) => Err(RuntimeError::RankFailed {
                            rank,
                            reason: panic_message(panic.as_ref()),
                        }),
                    };
                    if result.is_err() {
                        world.abort();
                    }
                    result
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| {
                h.join().unwrap_or_else(|_| {
                    Err(RuntimeError::RankFailed {
                        rank,
                        reason: "the rank thread could not be joined".into(),
                    })
                })
            })
            .collect()
    });
    let mut outputs = Vec::with_capacity(size);
    let mut first_error = None;
    for (rank, r) in results.into_iter().enumerate() {
        match r {
            Ok(o) => outputs.push(o),
            Err(RuntimeError::Aborted) => {}
            Err(e @ RuntimeError::RankFailed { .. }) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error.get_or_insert(RuntimeError::RankFailed {
                    rank,
                    reason: e.to_string(),
                });
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    if outputs.len() != size {
        return Err(RuntimeError::Aborted);
    }
    Ok(outputs)
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        format!("panicked: {s}")
    } else if let Some(s) = panic.downcast_ref::<String>() {
        format!("panicked: {s}")
    } else {
        "panicked".into()
    }
}

fn report(
    plan: &ExecutionPlan,
    options: &LaunchOptions,
    outputs: Vec<RankOutput>,
    first_step: u64,
) -> Result<LaunchReport, RuntimeError> {
    let steps = options.steps as usize;
    let step_time_s: Vec<f64> = (0..steps)
        .map(|s| outputs.iter().map(|o| o.step_times[s]).fold(0.0, f64::max))
        .collect();
    let total: f64 = step_time_s.iter().sum();
    let tokens = (plan.global_batch() * plan.seq_len * options.steps) as f64;
    let peak_memory = outputs
        .iter()
        .map(|o| {
            let MemoryPeaks {
                device,
                device_total,
                device_total_with_buffers,
                host,
            } = o.peaks;
            RankMemory {
                rank: o.rank,
                device,
                device_total,
                device_total_with_buffers,
                host,
            }
        })
        .collect();
    let parameters = options.collect_parameters.then(|| assemble(&outputs));
    if let Some(path) = &options.trace {
        let events: Vec<_> = outputs
            .iter()
            .flat_map(|o| o.events.iter().cloned())
            .collect();
        let mesh = Mesh::new(plan);
        let mut run = options.trace_context.clone();
        let stages: Vec<u64> = (0..plan.world_size()).map(|r| mesh.coords(r).pp).collect();
        run.insert("stages".into(), serde_json::json!(stages));
        run.insert("step_time_s".into(), serde_json::json!(step_time_s));
        let matmuls: Vec<serde_json::Value> = outputs
            .iter()
            .flat_map(|o| o.matmuls.iter().map(|m| m.json(o.rank)))
            .collect();
        run.insert("matmuls".into(), serde_json::Value::Array(matmuls));
        write_trace(path, &events, run)?;
    }
    let resharded = outputs
        .iter()
        .flat_map(|o| {
            o.resumed_from
                .iter()
                .map(|(&from, &elements)| ReshardSource {
                    from,
                    to: o.rank as u64,
                    elements,
                })
        })
        .collect();
    Ok(LaunchReport {
        resharded,
        losses: outputs[0].losses.clone(),
        step_time_s,
        tokens_per_s: if total > 0.0 { tokens / total } else { 0.0 },
        peak_memory,
        parameters,
        first_step,
    })
}

/// Puts every rank's shards back into global tensors.
fn assemble(outputs: &[RankOutput]) -> BTreeMap<String, Vec<f32>> {
    let mut global: BTreeMap<String, Vec<f32>> = BTreeMap::new();
    for o in outputs {
        for (spec, data) in &o.parameters {
            let full = global
                .entry(spec.name.clone())
                .or_insert_with(|| vec![0.0; (spec.rows * spec.cols) as usize]);
            let (r0, r1) = spec.row_range();
            let (c0, c1) = spec.col_range();
            let width = (c1 - c0) as usize;
            for (i, r) in (r0..r1).enumerate() {
                let dst = (r * spec.cols + c0) as usize;
                full[dst..dst + width].copy_from_slice(&data[i * width..(i + 1) * width]);
            }
        }
    }
    global
}
