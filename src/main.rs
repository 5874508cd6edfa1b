mod cli;

use std::process::ExitCode;

use clap::Parser;

/// Tessel plans and runs distributed training of large transformer models.
#[derive(Parser)]
#[command(name = "tessel", version)]
enum Cli {
    /// Parse and validate a spec; print the model's size, FLOPs per token and the cluster.
    Check(cli::check::Args),
}

fn main() -> ExitCode {
    let command = match Cli::try_parse() {
        Ok(command) => command,
        Err(error) => return cli::usage_error(error),
    };
    match command {
        Cli::Check(args) => cli::check::run(&args),
    }
}
