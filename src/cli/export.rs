//! `tessel export SPEC --strategy NAME --to megatron|torchtitan|deepspeed`: launch arguments or a
//! config file for another training framework.

use std::path::PathBuf;
use std::process::ExitCode;

use tessel_interop::ExportTarget;

use super::EXIT_BAD_INPUT;

#[derive(clap::Args)]
pub struct Args {
    /// The spec file (`*.tsl`).
    pub spec: PathBuf,
    /// The `strategy` block to export.
    #[arg(long)]
    pub strategy: String,
    /// The framework: megatron, torchtitan or deepspeed.
    #[arg(long, value_parser = parse_target)]
    pub to: ExportTarget,
    /// Write the configuration to this file instead of standard output.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

fn parse_target(text: &str) -> Result<ExportTarget, String> {
    text.parse()
        .map_err(|_| format!("`{text}` is not a target; use megatron, torchtitan or deepspeed"))
}

pub fn run(args: &Args) -> ExitCode {
    let spec = match super::load_spec(&args.spec) {
        Ok(spec) => spec,
        Err(code) => return code,
    };
    let Some(strategy) = spec.strategy(&args.strategy) else {
        eprintln!(
            "error: `{}` has no strategy `{}`{}",
            args.spec.display(),
            args.strategy,
            super::known_strategies(&spec)
        );
        return ExitCode::from(EXIT_BAD_INPUT);
    };
    let exported = tessel_interop::export(&spec, strategy, args.to);
    eprint!("{}", exported.summary());
    super::write_output(args.output.as_deref(), &exported.text)
}
