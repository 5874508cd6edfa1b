//! `tessel plan` on a serving spec (a `serve` block): search the deployments, print the plan,
//! write it, or check a committed one.

use std::path::Path;
use std::process::ExitCode;

use tessel_grammar::{Request, ServingSpec};
use tessel_planner::serving::plan::{plan_serving, ServingPlan};
use tessel_planner::serving::render::{
    render_serving_explain, render_serving_markdown, render_serving_table,
};

use super::plan::{Args, Format};
use super::{EXIT_BAD_INPUT, EXIT_NO_FIT, EXIT_REGRESSION};

/// Reads the workload's trace file, when it names one.
pub fn read_trace(spec_path: &Path, spec: &ServingSpec) -> Result<Option<Vec<Request>>, ExitCode> {
    let Some(trace) = &spec.serve.workload.trace else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&trace.resolved).map_err(|error| {
        eprintln!(
            "error: {}: cannot read trace `{}`: {error}",
            spec_path.display(),
            trace.path
        );
        ExitCode::from(EXIT_BAD_INPUT)
    })?;
    tessel_interop::traces::parse_request_trace(&text)
        .map(Some)
        .map_err(|error| {
            eprintln!(
                "error: {}:{}: {}\n  help: the trace is read as Azure's LLM inference trace \
                 (TIMESTAMP,ContextTokens,GeneratedTokens)",
                trace.resolved.display(),
                error.line,
                error.message
            );
            ExitCode::from(EXIT_BAD_INPUT)
        })
}

pub fn run(args: &Args, mut spec: ServingSpec) -> ExitCode {
    if args.is_fixed() {
        eprintln!(
            "error: {}: a serving spec is planned by its search; --strategy and the degrees \
             apply to training specs",
            args.spec.display()
        );
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    if let Err(message) = args.cluster.resize(&mut spec.cluster) {
        eprintln!("error: {message}");
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    let spec = &spec;
    let trace = match read_trace(&args.spec, spec) {
        Ok(trace) => trace,
        Err(code) => return code,
    };
    let plan = match plan_serving(spec, trace.as_deref(), args.top) {
        Ok(plan) => plan,
        Err(error) => {
            eprintln!("error: {}: {error}", args.spec.display());
            // Every reason is the job not fitting what the cluster and the SLO allow.
            return ExitCode::from(EXIT_NO_FIT);
        }
    };
    if let Some(committed) = &args.check {
        return check(committed, &plan, args.threshold);
    }
    let shown = match args.format {
        Format::Table => render_serving_table(&plan),
        Format::Json => plan.to_json(),
        Format::Markdown => render_serving_markdown(&plan),
    };
    print!("{shown}");
    if args.explain {
        print!("\n{}", render_serving_explain(&plan));
    }
    match &args.output {
        Some(path) => super::write_output(Some(path), &plan.to_json()),
        None => ExitCode::SUCCESS,
    }
}

/// Stale when the spec changed or a deployment with more goodput per GPU by more than
/// `threshold_pct` exists.
fn check(committed_path: &Path, fresh: &ServingPlan, threshold_pct: f64) -> ExitCode {
    let committed = match std::fs::read_to_string(committed_path)
        .map_err(|e| e.to_string())
        .and_then(|text| ServingPlan::from_json(&text))
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
            "stale: {name} was made for another version of the spec; re-run `tessel plan` and commit the result"
        );
        return ExitCode::from(EXIT_REGRESSION);
    }
    let old = committed.chosen.goodput_per_gpu;
    let new = fresh.chosen.goodput_per_gpu;
    let gain_pct = (new - old) / old.max(f64::MIN_POSITIVE) * 100.0;
    if gain_pct > threshold_pct {
        println!(
            "stale: a better deployment exists: {new:.4} requests/s per GPU instead of {old:.4} ({gain_pct:.1}% more, threshold {threshold_pct}%)"
        );
        return ExitCode::from(EXIT_REGRESSION);
    }
    println!(
        "current: {name} matches its spec and no deployment has more than {threshold_pct}% more goodput per GPU"
    );
    ExitCode::SUCCESS
}
