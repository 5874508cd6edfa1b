//! `tessel export PLAN --to megatron|torchtitan|deepspeed` or
//! `tessel export SPEC --strategy NAME --to ...`: launch arguments or a config file for another
//! training framework, from a plan file (its embedded spec and chosen configuration) or from one
//! of a spec's `strategy` blocks.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tessel_grammar::{Spec, Strategy};
use tessel_interop::export::serving::{
    export_serving, LaunchPhase, LaunchRole, ServingLaunch, ServingTarget,
};
use tessel_interop::{ExportOptions, ExportTarget};
use tessel_planner::serving::plan::{is_serving_plan, ServingPlan};
use tessel_planner::{checkpoint_plan, Plan, PLAN_FORMAT};
use tessel_symbolic::cost::CostModel;

use super::EXIT_BAD_INPUT;

#[derive(clap::Args)]
pub struct Args {
    /// A plan file (`plan.json`, written by `tessel plan -o`) or a spec file (`*.tsl`, with
    /// --strategy).
    pub input: PathBuf,
    /// The spec's `strategy` block to export (only with a spec file).
    #[arg(long)]
    pub strategy: Option<String>,
    /// The framework: megatron, torchtitan or deepspeed for a training plan; vllm or sglang for
    /// a serving plan.
    #[arg(long, value_parser = parse_target)]
    pub to: Target,
    /// Write the configuration to this file instead of standard output.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

/// What `--to` names: a training framework or a serving engine.
#[derive(Clone, Copy, Debug)]
pub enum Target {
    Training(ExportTarget),
    Serving(ServingTarget),
}

fn parse_target(text: &str) -> Result<Target, String> {
    text.parse()
        .map(Target::Training)
        .or_else(|_| text.parse().map(Target::Serving))
        .map_err(|_| {
            format!(
                "`{text}` is not a target; use megatron, torchtitan or deepspeed for training, \
                 vllm or sglang for serving"
            )
        })
}

/// Whether `text` (read from `path`) is meant as a plan file: named `*.json`, or a JSON object
/// (spec files never start with `{`). Such a file is read as a plan, so that a plan of another
/// format version or a truncated one gets the plan reader's error rather than a spec parse error.
fn looks_like_plan(path: &Path, text: &str) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
        || text.trim_start().starts_with('{')
}

pub fn run(args: &Args) -> ExitCode {
    let text = match std::fs::read_to_string(&args.input) {
        Ok(text) => text,
        Err(error) => {
            eprintln!("error: cannot read `{}`: {error}", args.input.display());
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let serving_plan = is_serving_plan(&text);
    let to = match (args.to, serving_plan) {
        (Target::Serving(target), true) => return export_serving_plan(args, &text, target),
        (Target::Training(to), false) => to,
        (Target::Serving(target), false) => {
            eprintln!(
                "error: `{}` is not a serving plan; `--to {target}` exports the plans `tessel \
                 plan` writes for specs with a `serve` block",
                args.input.display()
            );
            return ExitCode::from(EXIT_BAD_INPUT);
        }
        (Target::Training(to), true) => {
            eprintln!(
                "error: `{}` is a serving plan; export it with `--to vllm` or `--to sglang`, not \
                 `--to {to}`",
                args.input.display()
            );
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let (spec, strategy, mut notes) = if looks_like_plan(&args.input, &text) {
        match from_plan(args, &text) {
            Ok(found) => found,
            Err(code) => return code,
        }
    } else {
        match from_spec(args) {
            Ok((spec, strategy)) => (spec, strategy, Vec::new()),
            Err(code) => return code,
        }
    };
    // The checkpoint interval a plan of this configuration states, when the spec has failures.
    let checkpoint_every = spec.train.failures.and_then(|_| {
        let estimate = CostModel::new(&spec).and_then(|model| model.estimate(&strategy));
        checkpoint_plan(&spec, estimate.ok()?.step_time_s)?.interval_steps
    });
    let options = ExportOptions { checkpoint_every };
    let mut exported = tessel_interop::export_with(&spec, &strategy, to, &options);
    exported.notes.append(&mut notes);
    eprint!("{}", exported.summary());
    super::write_output(args.output.as_deref(), &exported.text)
}

fn from_spec(args: &Args) -> Result<(Spec, Strategy), ExitCode> {
    let spec = super::load_spec(&args.input)?;
    let Some(name) = &args.strategy else {
        eprintln!(
            "error: exporting a spec needs --strategy NAME (or pass a plan file){}",
            super::known_strategies(&spec)
        );
        return Err(ExitCode::from(EXIT_BAD_INPUT));
    };
    match spec.strategy(name) {
        Some(strategy) => {
            let strategy = strategy.clone();
            Ok((spec, strategy))
        }
        None => {
            eprintln!(
                "error: `{}` has no strategy `{name}`{}",
                args.input.display(),
                super::known_strategies(&spec)
            );
            Err(ExitCode::from(EXIT_BAD_INPUT))
        }
    }
}

/// A serving plan's deployment as the engine's launch commands.
fn export_serving_plan(args: &Args, text: &str, target: ServingTarget) -> ExitCode {
    let plan = match ServingPlan::from_json(text) {
        Ok(plan) => plan,
        Err(error) => {
            eprintln!("error: `{}`: {error}", args.input.display());
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let role = |name: &str| match name {
        "prefill" => LaunchRole::Prefill,
        "decode" => LaunchRole::Decode,
        _ => LaunchRole::Both,
    };
    let launch = ServingLaunch {
        model: plan.model.clone(),
        precision: plan.spec.serve.precision,
        kv_precision: plan.spec.serve.kv_precision,
        gpus_per_node: plan.spec.cluster.gpus_per_node,
        phases: plan
            .chosen
            .phases
            .iter()
            .map(|p| LaunchPhase {
                role: role(&p.role),
                instances: p.instances,
                tp: p.tp,
                pp: p.pp,
                max_sequences: p.max_sequences,
                max_batched_tokens: p.max_batched_tokens,
            })
            .collect(),
        kv_same_node: plan.chosen.kv_transfer.as_deref() == Some("nvlink"),
    };
    let mut exported = export_serving(&launch, target);
    if plan.engine != target.name() {
        exported.notes.push(format!(
            "the plan was made for {}'s engine; its latencies assume that engine's scheduling",
            plan.engine
        ));
    }
    eprint!("{}", exported.summary());
    super::write_output(args.output.as_deref(), &exported.text)
}

/// The plan's spec and configuration, and what the target will not see of it.
fn from_plan(args: &Args, text: &str) -> Result<(Spec, Strategy, Vec<String>), ExitCode> {
    if let Some(name) = &args.strategy {
        eprintln!(
            "error: `{}` is a plan file ({PLAN_FORMAT}); it carries its own configuration, so \
             --strategy {name} does not apply",
            args.input.display()
        );
        return Err(ExitCode::from(EXIT_BAD_INPUT));
    }
    let plan = Plan::from_json(text).map_err(|error| {
        eprintln!("error: `{}`: {error}", args.input.display());
        ExitCode::from(EXIT_BAD_INPUT)
    })?;
    super::refuse_pools("export", &plan.spec)?;
    let (mut strategy, notes) = plan_strategy(&plan);
    // The plan's file name says more than the planner's generic `plan` in the target's header.
    if let Some(stem) = args.input.file_stem().and_then(|s| s.to_str()) {
        strategy.name = stem.to_string();
    }
    Ok((plan.spec, strategy, notes))
}

/// The plan as a strategy with `stages` as layers per chunk (what exporters and the spec
/// language mean by it), plus notes on what per-stage detail that drops.
fn plan_strategy(plan: &Plan) -> (Strategy, Vec<String>) {
    let strategy = plan.strategy();
    let mut notes = Vec::new();
    let first = plan.stages.first();
    if plan
        .stages
        .iter()
        .any(|s| Some(s.recompute) != first.map(|f| f.recompute))
    {
        notes.push(
            "the plan recomputes differently per stage; exported with stage 0's recompute"
                .to_string(),
        );
    }
    if plan
        .stages
        .iter()
        .any(|s| Some(s.offload) != first.map(|f| f.offload))
    {
        notes.push(
            "the plan offloads differently per stage; exported with stage 0's offload".to_string(),
        );
    }
    (strategy, notes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessel_grammar::Recompute;

    fn fixture() -> Plan {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/workflow/plans/llama3-70b-selective-recompute.json");
        let text = std::fs::read_to_string(path).expect("the fixture reads");
        Plan::from_json(&text).expect("the fixture is a plan")
    }

    #[test]
    fn stages_are_layers_per_chunk() {
        let (strategy, notes) = plan_strategy(&fixture());
        assert_eq!(strategy.stages, Some(vec![4; 20]));
        assert_eq!(strategy.interleave, 5);
        assert!(notes.is_empty(), "{notes:?}");
    }

    #[test]
    fn uneven_chunks_reach_the_target_and_per_stage_recompute_is_noted() {
        let mut plan = fixture();
        // Stage 0's first two chunks hold 3 and 5 layers instead of 4 and 4.
        plan.stages[0].layer_ranges[0] = [0, 3];
        plan.stages[0].layer_ranges[1] = [16, 21];
        plan.stages[1].recompute = Recompute::Full;
        let (strategy, notes) = plan_strategy(&plan);
        let chunks = strategy.stages.expect("chunk layers");
        assert_eq!((chunks[0], chunks[4]), (3, 5));
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("recomputes differently per stage"));
    }
}
