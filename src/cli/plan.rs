//! `tessel plan SPEC [-o plan.json] [--top K] [--format table|json|markdown] [--explain]`:
//! search the spec's space and write the best plan; `--strategy NAME` writes the plan of a fixed
//! configuration instead; `--check plan.json` says whether a committed plan is still current.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Instant;

use tessel_grammar::{Job, Spec};
use tessel_planner::{
    estimate_placed, plan, plan_fixed_resolving_choices, plan_on_pools, plan_resolving_choices,
    render_explain, render_markdown, render_table, render_validated_alternative, Objective, Plan,
    PlanError, PlanOptions, SearchProgress, StageCostModel,
};
use tessel_symbolic::cost::CostModel;

use super::estimate::StrategyArgs;
use super::{EXIT_BAD_INPUT, EXIT_REGRESSION};

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
    Markdown,
}

#[derive(clap::Args)]
pub struct Args {
    /// The spec file (`*.tsl`).
    pub spec: PathBuf,
    /// Write the plan file here.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Runners-up to list (default: the search block's `top`, else 3).
    #[arg(long)]
    pub top: Option<usize>,
    /// How to print the plan on standard output.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Say which constraint binds and what each runner-up loses on.
    #[arg(long)]
    pub explain: bool,
    /// Exit 3 when this committed plan no longer matches the spec, or a plan better by more
    /// than --threshold exists.
    #[arg(long, value_name = "PLAN", conflicts_with_all = ["output"])]
    pub check: Option<PathBuf>,
    /// Improvement in predicted step time, in percent, that makes a committed plan stale.
    #[arg(long, default_value_t = 1.0)]
    pub threshold: f64,
    /// Rank plans by the predicted step time (`expected`) or by the high end of its 80 %
    /// interval (`pessimistic`), which keeps the search out of regimes the published runs
    /// validate thinly.
    #[arg(long, default_value = "pessimistic", value_parser = parse_objective)]
    pub objective: Objective,
    /// Plan this fixed configuration (a `strategy` block, with any overrides) instead of searching.
    #[command(flatten)]
    pub fixed: StrategyArgs,
    #[command(flatten)]
    pub cluster: super::ClusterArgs,
}

impl Args {
    pub fn is_fixed(&self) -> bool {
        let s = &self.fixed;
        s.strategy.is_some()
            || [s.dp, s.tp, s.pp, s.cp, s.ep, s.microbatch, s.interleave]
                .iter()
                .any(Option::is_some)
            || s.recompute.is_some()
            || s.zero.is_some()
            || s.sequence_parallel.is_some()
    }
}

pub fn parse_objective(text: &str) -> Result<Objective, String> {
    Objective::ALL
        .into_iter()
        .find(|o| o.name() == text)
        .ok_or_else(|| format!("`{text}` is not an objective; use expected or pessimistic"))
}

pub fn run(args: &Args) -> ExitCode {
    let mut spec = match tessel_grammar::load_job(&args.spec) {
        Ok(Job::Serve(serving)) => return super::serve_plan::run(args, *serving),
        Ok(Job::Train(spec)) => *spec,
        Err(diagnostics) => return super::print_diagnostics(&args.spec, &diagnostics),
    };
    if let Err(message) = args.cluster.apply(&mut spec) {
        eprintln!("error: {message}");
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    let model = match CostModel::new(&spec) {
        Ok(model) => model,
        Err(error) => {
            eprintln!("error: {}: {error}", args.spec.display());
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let planned = if args.is_fixed() {
        if !spec.cluster.pools.is_empty() {
            eprintln!(
                "error: {}: cluster `{}` is made of pools; a fixed strategy runs on one GPU type — \
                 let `tessel plan` place the work, or write a spec for one pool",
                args.spec.display(),
                spec.cluster.name
            );
            return ExitCode::from(EXIT_BAD_INPUT);
        }
        match args.fixed.resolve(&spec, &args.spec) {
            Ok(strategy) => plan_fixed_resolving_choices(&spec, &strategy, &cost_model_for),
            Err(code) => return code,
        }
    } else {
        search(&spec, &model, args.top, args.objective, false)
    };
    let plan = match planned {
        Ok(plan) => plan,
        Err(error) => return plan_error(&args.spec, &error),
    };
    if let Some(committed) = &args.check {
        return check(committed, &plan, &spec, &model, args.threshold);
    }
    let shown = match args.format {
        Format::Table => render_table(&plan),
        Format::Json => plan.to_json(),
        Format::Markdown => render_markdown(&plan),
    };
    print!("{shown}");
    if args.explain {
        print!("\n{}", render_explain(&plan));
        let thin = plan
            .prediction
            .interval
            .as_ref()
            .is_some_and(|i| !i.unvalidated.is_empty());
        if thin && !args.is_fixed() {
            let validated = search(&spec, &model, args.top, args.objective, true).ok();
            print!(
                "{}",
                render_validated_alternative(&plan, validated.as_ref())
            );
        }
    }
    match &args.output {
        Some(path) => super::write_output(Some(path), &plan.to_json()),
        None => ExitCode::SUCCESS,
    }
}

/// The cost model of a spec the planner derives (another fine-tuning method, more nodes).
fn cost_model_for(spec: &Spec) -> Result<Box<dyn StageCostModel>, String> {
    CostModel::new(spec)
        .map(|m| Box::new(m) as Box<dyn StageCostModel>)
        .map_err(|e| e.to_string())
}

/// The full search, with a progress line on a terminal once it has run for a second.
pub fn search(
    spec: &Spec,
    model: &CostModel,
    top: Option<usize>,
    objective: Objective,
    validated_only: bool,
) -> Result<Plan, PlanError> {
    let started = Instant::now();
    let terminal = std::io::stderr().is_terminal();
    let shown = Mutex::new(false);
    let progress = |p: &SearchProgress| {
        if !terminal || started.elapsed().as_secs_f64() < 1.0 {
            return;
        }
        let best = p
            .best_step_time_s
            .map_or("none yet".to_string(), |s| format!("{s:.3} s"));
        eprint!(
            "\rsearching: {} screened, {} evaluated, {} MILPs, best step {best}   ",
            p.screened, p.evaluated, p.milps_solved
        );
        if let Ok(mut shown) = shown.lock() {
            *shown = true;
        }
    };
    let options = PlanOptions {
        top,
        milp: None,
        progress: Some(&progress),
        model_for_spec: Some(&cost_model_for),
        objective,
        validated_only,
    };
    let outcome = if !spec.cluster.pools.is_empty() {
        plan_on_pools(spec, &options)
    } else if spec.has_planner_choices() {
        plan_resolving_choices(spec, &options)
    } else {
        plan(spec, model, &options)
    };
    if shown.into_inner().unwrap_or(false) {
        eprintln!();
    }
    outcome.map(|o| o.plan)
}

fn plan_error(spec_path: &std::path::Path, error: &PlanError) -> ExitCode {
    match error {
        PlanError::NothingFits { .. } => eprintln!("error: nothing fits\n{error}"),
        PlanError::FixedDoesNotFit { .. } => eprint!("error: {error}"),
        _ => eprintln!("error: {}: {error}", spec_path.display()),
    }
    ExitCode::from(error.exit_code())
}

/// Compares a committed plan with a fresh one: stale when the spec changed, or when the fresh
/// plan is predicted faster by more than `threshold_pct`.
/// The committed plan's step time is predicted again with this version's cost model, so that a
/// plan written by an older Tessel is judged on the same footing as the fresh one.
fn check(
    committed_path: &std::path::Path,
    fresh: &Plan,
    spec: &Spec,
    model: &CostModel,
    threshold_pct: f64,
) -> ExitCode {
    let committed = match std::fs::read_to_string(committed_path)
        .map_err(|e| e.to_string())
        .and_then(|text| Plan::from_json(&text).map_err(|e| e.to_string()))
    {
        Ok(plan) => plan,
        Err(error) => {
            eprintln!("error: {}: {error}", committed_path.display());
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let name = committed_path.display();
    if committed.spec_digest != fresh.spec_digest {
        println!(
            "stale: {name} was made for another version of the spec (digest {} ≠ {}); re-run `tessel plan` and commit the result",
            short(&committed.spec_digest),
            short(&fresh.spec_digest)
        );
        return ExitCode::from(EXIT_REGRESSION);
    }
    // On pools the digest is of the spec the placement's search saw; the cluster of pools it
    // was chosen from is compared on its own.
    let pools_of = |plan: &Plan| plan.placement.as_ref().map(|p| p.cluster.clone());
    if pools_of(&committed) != pools_of(fresh) {
        println!(
            "stale: {name} was made for other pools than the spec's; re-run `tessel plan` and commit the result"
        );
        return ExitCode::from(EXIT_REGRESSION);
    }
    let objective = fresh.objective;
    // `auto` resolved to the committed plan's choices: cost it under them.
    let resolved = (committed.finetune_choice.is_some()
        || committed.kernels_choice.is_some()
        || committed.compression_choice.is_some()
        || committed.placement_choice.is_some())
    .then(|| CostModel::new(&committed.spec));
    let estimate = if spec.cluster.pools.is_empty() {
        match &resolved {
            Some(model) => model
                .as_ref()
                .map_err(|e| e.to_string())
                .and_then(|m| m.estimate(&committed.strategy()).map_err(|e| e.to_string())),
            None => model
                .estimate(&committed.strategy())
                .map_err(|e| e.to_string()),
        }
    } else {
        estimate_placed(spec, &committed)
    };
    let old = match estimate {
        Ok(estimate) => objective.ranked_step_time(&estimate),
        Err(error) => {
            println!("stale: {name} no longer describes a valid configuration: {error}");
            return ExitCode::from(EXIT_REGRESSION);
        }
    };
    let new = objective.ranked_step_time(&fresh.prediction);
    let gain_pct = (old - new) / old * 100.0;
    if gain_pct > threshold_pct {
        println!(
            "stale: a better plan exists: {} step {new:.4} s instead of {old:.4} s ({gain_pct:.1}% faster, threshold {threshold_pct}%)",
            objective.name()
        );
        return ExitCode::from(EXIT_REGRESSION);
    }
    println!("current: {name} matches its spec and no plan is more than {threshold_pct}% faster");
    ExitCode::SUCCESS
}

/// The first 12 characters of a digest (by character: a hand-edited plan may hold any text).
fn short(digest: &str) -> String {
    digest.chars().take(12).collect()
}
