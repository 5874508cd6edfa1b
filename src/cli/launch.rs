//! `tessel launch PLAN --backend cpu|cuda [--scale F] [--steps N] [--seed S] [--data PATH
//! --token-bytes 2|4] [--trace trace.json] [--format table|json] [--max-ranks N]
//! [--nproc-per-node N] [--from-env]`: train a plan file's model, scaled down, for a few steps
//! under the plan's parallel configuration. In one process (CPU threads) it also sets the
//! measured peak memory of every rank against the cost model's prediction for the same scaled
//! model; with several processes (`--nproc-per-node`, the CUDA backend, or ranks started by
//! srun/torchrun with `--from-env`) rank 0 prints the losses and step times, and the launcher
//! reports which rank failed and why.

use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::{json, Value};
use tessel_planner::{Objective, Plan};
use tessel_runtime::checkpoint::InjectedFailure;
use tessel_runtime::launcher::{launch_local, run_cpu_worker, LocalLaunch, WorkerConfig};
use tessel_runtime::{
    auto_scale, launch_cpu, scale_plan, DataSource, LaunchOptions, LaunchReport, PredictedMemory,
    RankMemory, RuntimeError, ScaledPlan, TokenWidth,
};
use tessel_symbolic::cost::CostModel;

use super::TableOrJson as Format;
use super::{bytes, count, grouped, EXIT_BAD_INPUT};

/// A rank failed while training (the message names the rank and why).
pub const EXIT_RUNTIME_FAILURE: u8 = 4;

/// Where the ranks run.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Backend {
    /// f32 on the CPU: one thread per rank with collectives in shared memory, or with
    /// --nproc-per-node, one process per rank with collectives over TCP.
    Cpu,
    /// One process per GPU, cuBLAS and NVRTC kernels, NCCL collectives (build with
    /// `--features cuda`).
    Cuda,
}

/// Set by `tessel launch` on the processes it starts: run as one rank of the job.
const WORKER_VAR: &str = "TESSEL_WORKER";

/// `RANK:STEP`: that rank fails as that step starts, to test recovery from snapshots.
const FAILURE_VAR: &str = "TESSEL_INJECT_FAILURE";

#[derive(clap::Args)]
pub struct Args {
    /// The plan file (`tessel plan ... -o plan.json`).
    pub plan: PathBuf,
    #[arg(long, value_enum)]
    pub backend: Backend,
    /// Shrink widths, vocabulary, depth and sequence length by this factor in (0, 1], keeping
    /// head counts, MoE structure and the plan's degrees (default: the largest power of two
    /// that brings the model under 2 M parameters).
    #[arg(long)]
    pub scale: Option<f64>,
    /// Optimizer steps to train.
    #[arg(long, default_value_t = 5)]
    pub steps: u64,
    /// Seeds the synthetic tokens.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// A binary token file (nanoGPT / Megatron `.bin`) instead of synthetic tokens.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Bytes per token in --data.
    #[arg(long, value_parser = parse_token_bytes, default_value = "2", requires = "data")]
    pub token_bytes: TokenWidth,
    /// Write a Chrome trace (chrome://tracing, Perfetto) of every rank here.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Refuse plans with more ranks than this: the CPU backend runs one thread per rank.
    #[arg(long, default_value_t = 64)]
    pub max_ranks: u64,
    /// Start this many processes on this machine, one per rank (the CUDA backend always runs
    /// one process per GPU; default there: the plan's world size).
    #[arg(long)]
    pub nproc_per_node: Option<usize>,
    /// Write checkpoints to this folder: every rank's parameters and Adam moments with a
    /// manifest (`tessel-checkpoint/1`), which `--resume` reads under any plan of the same
    /// model; after the last step, and every `--save-every` steps.
    #[arg(long, value_name = "DIR")]
    pub save: Option<PathBuf>,
    /// Steps between snapshots (default: the plan's checkpoint interval when its spec has
    /// `train.failures`, else only after the last step).
    #[arg(long, value_name = "N", requires = "save", value_parser = clap::value_parser!(u64).range(1..))]
    pub save_every: Option<u64>,
    /// Resume from a checkpoint `--save` wrote, under this plan's degrees (tensor, pipeline,
    /// data, expert parallelism, ZeRO stage and rank count may all differ); steps are
    /// numbered on from the checkpoint's.
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
    /// Run as one rank of a job started by srun or torchrun: the rank, world size and rank 0's
    /// address come from `SLURM_*` or `RANK`/`WORLD_SIZE`/`MASTER_ADDR`/`MASTER_PORT`.
    #[arg(long)]
    pub from_env: bool,
}

fn parse_token_bytes(text: &str) -> Result<TokenWidth, String> {
    match text {
        "2" => Ok(TokenWidth::U16),
        "4" => Ok(TokenWidth::U32),
        _ => Err(format!("tokens are 2 or 4 bytes, not `{text}`")),
    }
}

/// The fewest GPUs, whole nodes of the plan's cluster (or one node's GPUs) doubling up to
/// `max_ranks`, on which the planner finds a plan of the same job: what to suggest when a
/// plan has too many ranks to run here.
fn fewest_gpus_that_plan(plan: &Plan, max_ranks: u64) -> Option<u64> {
    let per_node = plan.spec.cluster.gpus_per_node.max(1);
    let counts = std::iter::successors(Some(per_node.min(max_ranks)), |n| Some(n * 2));
    counts.take_while(|&gpus| gpus <= max_ranks).find(|&gpus| {
        let mut spec = plan.spec.clone();
        let resize = super::ClusterArgs {
            gpus: Some(gpus),
            nodes: None,
        };
        resize.apply(&mut spec).is_ok()
            && CostModel::new(&spec).is_ok_and(|model| {
                super::plan::search(&spec, &model, None, Objective::Pessimistic, false).is_ok()
            })
    })
}

fn bad_input(message: String) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(EXIT_BAD_INPUT)
}

pub fn run(args: &Args) -> ExitCode {
    let path = args.plan.display();
    let text = match std::fs::read_to_string(&args.plan) {
        Ok(text) => text,
        Err(error) => return bad_input(format!("cannot read `{path}`: {error}")),
    };
    if tessel_planner::serving::plan::is_serving_plan(&text) {
        return super::serve_launch::run(args, &text);
    }
    let plan = match Plan::from_json(&text) {
        Ok(plan) => plan,
        Err(error) => return bad_input(format!("`{path}` is not a plan file: {error}")),
    };
    if args.steps == 0 {
        return bad_input("--steps must be at least 1".into());
    }
    let world = plan.rank_map.ranks.len() as u64;
    if world > args.max_ranks {
        let advice = match fewest_gpus_that_plan(&plan, args.max_ranks) {
            Some(gpus) => format!(
                "Plan the same job on {gpus} GPUs, `tessel plan SPEC --gpus {gpus} -o \
                 small.json` (add --tp, --pp or --dp to fix degrees), or raise --max-ranks"
            ),
            None => format!(
                "No plan of this job fits on {} GPUs or fewer; raise --max-ranks",
                args.max_ranks
            ),
        };
        return bad_input(format!(
            "`{path}` has {world} ranks; the CPU backend runs one thread per rank and stops at \
             --max-ranks {}. {advice}",
            args.max_ranks
        ));
    }
    let factor = match args.scale {
        Some(f) => f,
        None => auto_scale(
            &plan.spec.model,
            tessel_runtime::plan_file::min_layers(&plan),
        ),
    };
    let scaled = match scale_plan(&plan, factor) {
        Ok(scaled) => scaled,
        Err(error) => return bad_input(format!("`{path}`: {error}")),
    };
    let predicted = match scaled.predicted_memory() {
        Ok(predicted) => predicted,
        Err(error) => return bad_input(format!("`{path}`: {error}")),
    };
    if let Some(data) = &args.data {
        if let Err(error) = std::fs::metadata(data) {
            return bad_input(format!("cannot read `{}`: {error}", data.display()));
        }
    }
    let fail_at = match std::env::var(FAILURE_VAR) {
        Ok(text) => match InjectedFailure::parse(&text) {
            Ok(failure) => Some(failure),
            Err(why) => return bad_input(format!("{FAILURE_VAR}: {why}")),
        },
        Err(_) => None,
    };
    let options = LaunchOptions {
        seed: args.seed,
        data: match &args.data {
            None => DataSource::Synthetic,
            Some(path) => DataSource::TokenFile {
                path: path.clone(),
                width: args.token_bytes,
            },
        },
        trace: args.trace.clone(),
        trace_context: trace_context(&scaled),
        resume_from: args.resume.clone(),
        checkpoint_to: args.save.clone(),
        snapshot_every: args
            .save_every
            .or_else(|| plan.checkpoints.as_ref().and_then(|c| c.interval_steps)),
        fail_at,
        ..LaunchOptions::new(args.steps)
    };
    let one_process = matches!(args.backend, Backend::Cpu)
        && args.nproc_per_node.is_none_or(|n| n <= 1)
        && !args.from_env;
    if (args.save.is_some() || args.resume.is_some()) && !one_process {
        return bad_input(
            "--save and --resume run with the one-process CPU launch (`--backend cpu` without \
             --nproc-per-node or --from-env); multi-process and CUDA checkpoints are not built yet"
                .to_string(),
        );
    }
    if args.from_env || std::env::var_os(WORKER_VAR).is_some() {
        return run_worker(args, &scaled, &options);
    }
    let processes = match (args.backend, args.nproc_per_node) {
        (Backend::Cuda, n) => Some(n.unwrap_or(world as usize)),
        (Backend::Cpu, Some(n)) if n > 1 => Some(n),
        (Backend::Cpu, _) => None,
    };
    if let Some(nproc) = processes {
        if let (Backend::Cuda, Err(missing)) =
            (args.backend, tessel_runtime::backend::cuda::probe())
        {
            eprintln!("error: the CUDA backend cannot run here: {missing}");
            return ExitCode::from(EXIT_RUNTIME_FAILURE);
        }
        return run_processes(nproc);
    }
    if matches!(args.format, Format::Table) {
        print_header(&plan, &scaled);
    }
    let report = match launch_cpu(scaled.model(), &scaled.execution, &options) {
        Ok(report) => report,
        Err(
            error @ (RuntimeError::Data { .. }
            | RuntimeError::InvalidPlan { .. }
            | RuntimeError::Checkpoint { .. }),
        ) => return bad_input(format!("`{path}`: {error}")),
        Err(error) => {
            eprintln!("error: training failed: {error}");
            return ExitCode::from(EXIT_RUNTIME_FAILURE);
        }
    };
    match args.format {
        Format::Table => print_table(&scaled, &report, &predicted),
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&report_json(&scaled, &report, &predicted))
                .unwrap_or_default()
        ),
    }
    if let Some(trace) = &args.trace {
        if matches!(args.format, Format::Table) {
            println!("\ntrace written to {}", trace.display());
        }
    }
    ExitCode::SUCCESS
}

/// What `tessel calibrate` needs to predict the traced run: the scaled spec and the strategy
/// of each pipeline stage.
fn trace_context(scaled: &ScaledPlan) -> serde_json::Map<String, Value> {
    let mut run = serde_json::Map::new();
    run.insert("spec".into(), json!(scaled.spec));
    run.insert("stage_strategies".into(), json!(scaled.stage_strategies));
    run
}

/// One rank of a multi-process job: rank 0 prints the losses and step times.
fn run_worker(args: &Args, scaled: &ScaledPlan, options: &LaunchOptions) -> ExitCode {
    let config = match WorkerConfig::from_process_env() {
        Ok(config) => config,
        Err(error) => return bad_input(error),
    };
    let run = match args.backend {
        Backend::Cpu => run_cpu_worker(scaled.model(), &scaled.execution, options, &config),
        Backend::Cuda => tessel_runtime::backend::cuda::run_cuda_worker(
            scaled.model(),
            &scaled.execution,
            options,
            &config,
        ),
    };
    match run {
        Ok(output) => {
            if config.env.rank == 0 {
                for (step, (loss, time)) in output.losses.iter().zip(&output.step_times).enumerate()
                {
                    println!("step {:>3}  loss {loss:.6}  time {time:.4} s", step + 1);
                }
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(EXIT_RUNTIME_FAILURE))
        }
    }
}

/// Starts `nproc` copies of this command as ranks of one job on this machine and reports which
/// rank failed, if one did.
fn run_processes(nproc: usize) -> ExitCode {
    let program = match std::env::current_exe() {
        Ok(program) => program,
        Err(error) => {
            eprintln!("error: cannot find the tessel executable: {error}");
            return ExitCode::from(EXIT_RUNTIME_FAILURE);
        }
    };
    let mut launch = LocalLaunch::new(program, nproc);
    launch.args = std::env::args_os().skip(1).collect();
    launch.envs.push((WORKER_VAR.to_string(), "1".to_string()));
    let report = match launch_local(&launch) {
        Ok(report) => report,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(EXIT_RUNTIME_FAILURE);
        }
    };
    for line in &report.ranks[0].stdout {
        println!("{line}");
    }
    match report.failure_message() {
        Some(message) => {
            eprintln!("error: {message}");
            ExitCode::from(EXIT_RUNTIME_FAILURE)
        }
        None => ExitCode::SUCCESS,
    }
}

fn shape_line(scaled: &ScaledPlan) -> String {
    let m = scaled.model();
    let mut line = format!(
        "{} layers, hidden {}, {} heads ({} key/value) of {}, ffn {}, vocab {}",
        m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim, m.ffn_hidden, m.vocab
    );
    if let Some(moe) = &m.moe {
        line.push_str(&format!(
            ", {} experts (top {}) of ffn {}",
            moe.experts, moe.top_k, moe.expert_ffn_hidden
        ));
    }
    line
}

fn print_header(plan: &Plan, scaled: &ScaledPlan) {
    let m = scaled.model();
    let e = &scaled.execution;
    println!(
        "model   {} scaled by {}: {}",
        plan.model,
        scaled.factor,
        shape_line(scaled)
    );
    println!(
        "        {} parameters (full size {})",
        count(m.parameter_count().total as f64),
        count(plan.spec.model.parameter_count().total as f64)
    );
    println!(
        "plan    dp {} · tp {} · pp {} · cp {} · ep {}, interleave {}, ZeRO-{}{}, micro-batch {} × {}",
        e.dp,
        e.tp,
        e.pp,
        e.cp,
        e.ep,
        e.interleave,
        e.zero,
        if e.sequence_parallel { ", SP" } else { "" },
        e.microbatch,
        e.microbatches
    );
    println!(
        "run     {} CPU threads, sequence length {}, global batch {} ({} tokens per step)\n",
        e.world_size(),
        e.seq_len,
        e.global_batch(),
        grouped(e.global_batch() * e.seq_len)
    );
    println!(
        "{:>4}  {:>10}  {:>10}  {:>12}",
        "step", "loss", "time", "tokens/s"
    );
}

fn print_table(scaled: &ScaledPlan, report: &LaunchReport, predicted: &[PredictedMemory]) {
    let tokens = (scaled.execution.global_batch() * scaled.execution.seq_len) as f64;
    for (step, (loss, time)) in report.losses.iter().zip(&report.step_time_s).enumerate() {
        let rate = if *time > 0.0 { tokens / time } else { 0.0 };
        println!(
            "{:>4}  {:>10.6}  {:>10}  {:>12.0}",
            report.first_step + step as u64 + 1,
            loss,
            super::duration(*time),
            rate
        );
    }
    println!("\nmean {:.0} tokens/s", report.tokens_per_s);
    println!(
        "\npeak memory per rank, measured / predicted by the cost model for this scaled model \
         (fp32, attention probabilities kept)"
    );
    println!(
        "{:>4}  {:>5}  {:>21}  {:>21}  {:>21}  {:>21}  {:>21}",
        "rank", "stage", "weights", "grads", "optimizer", "activations", "total"
    );
    for rank in &report.peak_memory {
        let stage = stage_of(scaled, rank);
        let p = predicted[stage];
        let d = rank.device;
        let cell = |m: u64, p: f64| format!("{} / {}", bytes(m as f64), bytes(p));
        println!(
            "{:>4}  {:>5}  {:>21}  {:>21}  {:>21}  {:>21}  {:>21}",
            rank.rank,
            stage,
            cell(d.weights, p.weights),
            cell(d.grads, p.grads),
            cell(d.optimizer, p.optimizer),
            cell(d.activations, p.activations),
            cell(rank.device_total, p.measured_total())
        );
    }
    println!(
        "\nbuffers apart from the total: measured, ZeRO-2/3's gathered layers and one piece's \
         unsharded gradients (peak {} on rank 0); predicted, the communication, logits and \
         gathered-weight buffers, fragmentation and CUDA context ({} on stage 0)",
        bytes(report.peak_memory.first().map_or(0, |r| r.device.buffers) as f64),
        bytes(predicted.first().map_or(0.0, |p| p.not_measured))
    );
}

/// The pipeline stage of a rank (pipeline parallelism is the outermost dimension).
fn stage_of(scaled: &ScaledPlan, rank: &RankMemory) -> usize {
    let e = &scaled.execution;
    rank.rank / (e.dp * e.cp * e.tp) as usize
}

fn report_json(scaled: &ScaledPlan, report: &LaunchReport, predicted: &[PredictedMemory]) -> Value {
    let m = scaled.model();
    let e = &scaled.execution;
    let ranks: Vec<Value> = report
        .peak_memory
        .iter()
        .map(|rank| {
            let stage = stage_of(scaled, rank);
            let p = predicted[stage];
            let d = rank.device;
            json!({
                "rank": rank.rank,
                "stage": stage,
                "peak_memory_bytes": rank.device_total,
                "predicted_peak_memory_bytes": p.measured_total().round() as u64,
                "measured": {
                    "weights": d.weights,
                    "grads": d.grads,
                    "optimizer": d.optimizer,
                    "activations": d.activations,
                    "buffers": d.buffers,
                },
                "peak_memory_with_buffers_bytes": rank.device_total_with_buffers,
                "predicted": {
                    "weights": p.weights.round() as u64,
                    "grads": p.grads.round() as u64,
                    "optimizer": p.optimizer.round() as u64,
                    "activations": p.activations.round() as u64,
                    "not_measured_on_cpu": p.not_measured.round() as u64,
                },
                "host": {
                    "weights": rank.host.weights,
                    "grads": rank.host.grads,
                    "optimizer": rank.host.optimizer,
                    "activations": rank.host.activations,
                },
            })
        })
        .collect();
    json!({
        "backend": "cpu",
        "scale": scaled.factor,
        "model": {
            "layers": m.layers,
            "hidden": m.hidden,
            "heads": m.heads,
            "kv_heads": m.kv_heads,
            "head_dim": m.head_dim,
            "ffn_hidden": m.ffn_hidden,
            "vocab": m.vocab,
            "parameters": m.parameter_count().total,
        },
        "seq_len": e.seq_len,
        "global_batch": e.global_batch(),
        "world_size": e.world_size(),
        "first_step": report.first_step,
        "resharded": report.resharded.iter().map(|r| json!({
            "from": r.from,
            "to": r.to,
            "elements": r.elements,
        })).collect::<Vec<_>>(),
        "losses": report.losses,
        "step_time_s": report.step_time_s,
        "tokens_per_s": report.tokens_per_s,
        "ranks": ranks,
    })
}
