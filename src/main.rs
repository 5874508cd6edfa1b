mod cli;

use std::process::ExitCode;

use clap::Parser;

/// Tessel plans and runs distributed training of large transformer models.
#[derive(Parser)]
#[command(name = "tessel", version)]
enum Cli {
    /// Parse and validate a spec; print the model's size, FLOPs per token and the cluster.
    Check(cli::check::Args),
    /// Predict step time, throughput, MFU and per-stage memory of one fixed configuration.
    Estimate(cli::estimate::Args),
    /// Search for the best plan and write the plan file.
    Plan(Box<cli::plan::Args>),
    /// Write a model block from another tool's model description.
    #[command(subcommand)]
    Import(cli::import::Source),
    /// Write a strategy as launch arguments or a config file for Megatron-LM, torchtitan or DeepSpeed.
    Export(cli::export::Args),
    /// Show what changed between two plan files; exit 3 on a regression.
    Diff(cli::diff::Args),
    /// Train a plan file's model (scaled down) under the plan and compare memory with the prediction.
    Launch(cli::launch::Args),
    /// Write a self-contained HTML page with a plan's timeline, memory and runners-up.
    Report(cli::report::Args),
    /// Fit the cost model's primitives to measurements from your cluster (nccl-tests output).
    Calibrate(cli::calibrate::Args),
    /// The best plan for the job's new resources, the cost of moving its shards there counted.
    Replan(cli::replan::Args),
}

fn main() -> ExitCode {
    let command = match Cli::try_parse() {
        Ok(command) => command,
        Err(error) => return cli::usage_error(error),
    };
    match command {
        Cli::Check(args) => cli::check::run(&args),
        Cli::Estimate(args) => cli::estimate::run(&args),
        Cli::Plan(args) => cli::plan::run(&args),
        Cli::Import(source) => cli::import::run(&source),
        Cli::Export(args) => cli::export::run(&args),
        Cli::Diff(args) => cli::diff::run(&args),
        Cli::Launch(args) => cli::launch::run(&args),
        Cli::Report(args) => cli::report::run(&args),
        Cli::Calibrate(args) => cli::calibrate::run(&args),
        Cli::Replan(args) => cli::replan::run(&args),
    }
}
