use clap::Parser;

/// Tessel plans and runs distributed training of large transformer models.
#[derive(Parser)]
#[command(name = "tessel", version)]
enum Cli {}

fn main() {
    match Cli::parse() {}
}
