//! `tessel launch PLAN --backend cpu [--scale F] [--steps N] [--seed S] [--data PATH
//! --token-bytes 2|4] [--trace trace.json] [--format table|json] [--max-ranks N]`: train a plan
//! file's model, scaled down, for a few steps under the plan's parallel configuration, and set
//! the measured peak memory of every rank against the cost model's prediction for the same
//! scaled model.

use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::{json, Value};
use tessel_planner::Plan;
use tessel_runtime::{
    auto_scale, launch_cpu, scale_plan, DataSource, LaunchOptions, LaunchReport, PredictedMemory,
    RankMemory, RuntimeError, ScaledPlan, TokenWidth,
};

use super::{bytes, count, grouped, EXIT_BAD_INPUT};

/// A rank failed while training (the message names the rank and why).
pub const EXIT_RUNTIME_FAILURE: u8 = 4;

/// Where the ranks run.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Backend {
    /// One thread per rank in this process, f32, collectives in shared memory.
    Cpu,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

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
}

fn parse_token_bytes(text: &str) -> Result<TokenWidth, String> {
    match text {
        "2" => Ok(TokenWidth::U16),
        "4" => Ok(TokenWidth::U32),
        _ => Err(format!("tokens are 2 or 4 bytes, not `{text}`")),
    }
}

fn bad_input(message: String) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(EXIT_BAD_INPUT)
}

pub fn run(args: &Args) -> ExitCode {
    let Backend::Cpu = args.backend;
    let path = args.plan.display();
    let text = match std::fs::read_to_string(&args.plan) {
        Ok(text) => text,
        Err(error) => return bad_input(format!("cannot read `{path}`: {error}")),
    };
    let plan = match Plan::from_json(&text) {
        Ok(plan) => plan,
        Err(error) => return bad_input(format!("`{path}` is not a plan file: {error}")),
    };
    if args.steps == 0 {
        return bad_input("--steps must be at least 1".into());
    }
    let world = plan.rank_map.ranks.len() as u64;
    if world > args.max_ranks {
        return bad_input(format!(
            "`{path}` has {world} ranks; the CPU backend runs one thread per rank and stops at \
             --max-ranks {}. Make a smaller plan of the same model with fixed degrees, e.g. \
             `tessel plan SPEC --strategy NAME --dp 2 --tp 2 --pp 2 -o small.json`, or raise \
             --max-ranks",
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
        ..LaunchOptions::new(args.steps)
    };
    if matches!(args.format, Format::Table) {
        print_header(&plan, &scaled);
    }
    let report = match launch_cpu(scaled.model(), &scaled.execution, &options) {
        Ok(report) => report,
        Err(error @ (RuntimeError::Data { .. } | RuntimeError::InvalidPlan { .. })) => {
            return bad_input(format!("`{path}`: {error}"))
        }
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
            step + 1,
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
        "\nnot measured on the CPU: the prediction's communication, logits and gathered-weight \
         buffers, fragmentation and CUDA context ({} on stage 0)",
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
                },
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
        "losses": report.losses,
        "step_time_s": report.step_time_s,
        "tokens_per_s": report.tokens_per_s,
        "ranks": ranks,
    })
}
