//! `tessel estimate SPEC [--strategy NAME] [--tp N ...] [--format table|json]`: the predicted
//! step time, throughput and per-stage memory of one fixed configuration.

use std::path::PathBuf;
use std::process::ExitCode;

use tessel_grammar::{Recompute, Spec, Strategy};
use tessel_symbolic::cost::{
    render_estimate_json, render_estimate_table, CostModel, StrategyOverrides,
};

use super::TableOrJson as Format;
use super::EXIT_BAD_INPUT;
use tessel_planner::{checkpoint_line, checkpoint_plan};

/// The strategy keys a command line may override.
#[derive(clap::Args)]
pub struct StrategyArgs {
    /// The `strategy` block to start from (default: the spec's only one; all degrees 1 when it
    /// has none).
    #[arg(long)]
    pub strategy: Option<String>,
    /// Data-parallel degree (default: GPUs / (tp·pp·cp)).
    #[arg(long)]
    pub dp: Option<u64>,
    /// Tensor-parallel degree.
    #[arg(long)]
    pub tp: Option<u64>,
    /// Pipeline-parallel degree.
    #[arg(long)]
    pub pp: Option<u64>,
    /// Context-parallel degree.
    #[arg(long)]
    pub cp: Option<u64>,
    /// Expert-parallel degree.
    #[arg(long)]
    pub ep: Option<u64>,
    /// Sequences per micro-batch.
    #[arg(long)]
    pub microbatch: Option<u64>,
    /// Virtual pipeline chunks per device.
    #[arg(long)]
    pub interleave: Option<u64>,
    /// none, selective, full, or a number of fully recomputed layers per stage.
    #[arg(long, value_parser = parse_recompute)]
    pub recompute: Option<Recompute>,
    /// ZeRO stage, 0 to 3.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=3))]
    pub zero: Option<u8>,
    /// Sequence parallelism on or off.
    #[arg(long)]
    pub sequence_parallel: Option<bool>,
}

#[derive(clap::Args)]
pub struct Args {
    /// The spec file (`*.tsl`).
    pub spec: PathBuf,
    #[command(flatten)]
    pub strategy: StrategyArgs,
    #[command(flatten)]
    pub cluster: super::ClusterArgs,
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
}

fn parse_recompute(text: &str) -> Result<Recompute, String> {
    match text {
        "none" => Ok(Recompute::None),
        "selective" => Ok(Recompute::Selective),
        "full" => Ok(Recompute::Full),
        _ => text
            .parse()
            .map(|full_layers| Recompute::Partial { full_layers })
            .map_err(|_| {
                format!("`{text}` is not a recompute choice; use none, selective, full or a layer count")
            }),
    }
}

impl StrategyArgs {
    /// The strategy the command line describes: the named (or only) block with the flags
    /// applied. Prints the error and returns the exit code when the name is unknown.
    pub fn resolve(&self, spec: &Spec, spec_path: &std::path::Path) -> Result<Strategy, ExitCode> {
        let base = match (&self.strategy, spec.strategies.as_slice()) {
            (Some(name), _) => match spec.strategy(name) {
                Some(strategy) => strategy.clone(),
                None => {
                    eprintln!(
                        "error: `{}` has no strategy `{name}`{}",
                        spec_path.display(),
                        super::known_strategies(spec)
                    );
                    return Err(ExitCode::from(EXIT_BAD_INPUT));
                }
            },
            (None, [only]) => only.clone(),
            (None, []) => command_line_strategy(),
            (None, _) => {
                eprintln!(
                    "error: `{}` has several strategies; choose one with --strategy NAME{}",
                    spec_path.display(),
                    super::known_strategies(spec)
                );
                return Err(ExitCode::from(EXIT_BAD_INPUT));
            }
        };
        let overrides = StrategyOverrides {
            dp: self.dp,
            tp: self.tp,
            pp: self.pp,
            cp: self.cp,
            ep: self.ep,
            microbatch: self.microbatch,
            interleave: self.interleave,
            recompute: self.recompute,
            zero: self.zero,
            sequence_parallel: self.sequence_parallel,
        };
        Ok(overrides.apply(&base, spec.cluster.total_gpus()))
    }
}

/// The starting point when the spec names no strategy: every degree 1, nothing recomputed.
fn command_line_strategy() -> Strategy {
    Strategy {
        name: "command_line".to_string(),
        ..Strategy::default()
    }
}

pub fn run(args: &Args) -> ExitCode {
    let spec = match super::load_resized_spec(&args.spec, &args.cluster) {
        Ok(spec) => spec,
        Err(code) => return code,
    };
    if let Err(code) = super::refuse_pools("estimate", &spec) {
        return code;
    }
    let strategy = match args.strategy.resolve(&spec, &args.spec) {
        Ok(strategy) => strategy,
        Err(code) => return code,
    };
    let estimate = CostModel::new(&spec).and_then(|model| model.estimate(&strategy));
    match estimate {
        Ok(estimate) => {
            match args.format {
                Format::Table => {
                    print!("{}", render_estimate_table(&spec, &strategy, &estimate));
                    if let Some(checkpoints) = checkpoint_plan(&spec, estimate.step_time_s) {
                        println!("{:<26}{}", "checkpoints", checkpoint_line(&checkpoints));
                    }
                }
                Format::Json => println!("{}", render_estimate_json(&estimate)),
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {}: {error}", args.spec.display());
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}
