//! `tessel diff OLD NEW [--format text|markdown|json] [--fail-on-regression PCT]`: what changed
//! between two plan files and whether it is a regression (exit 3).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tessel_planner::serving::diff::diff_serving_plans;
use tessel_planner::serving::plan::{is_serving_plan, ServingPlan};
use tessel_planner::{diff_plans, render_diff_markdown, render_diff_text, Plan};

use super::{EXIT_BAD_INPUT, EXIT_REGRESSION};

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Format {
    Text,
    Markdown,
    Json,
}

#[derive(clap::Args)]
pub struct Args {
    /// The plan before the change (`plan.json`).
    pub old: PathBuf,
    /// The plan after the change.
    pub new: PathBuf,
    /// text for a terminal, markdown for a pull-request comment, json for scripts.
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
    /// Exit 3 when predicted throughput falls by more than this many percent. A stage that
    /// fitted and no longer fits exits 3 with or without it.
    #[arg(long, value_name = "PCT", value_parser = parse_pct)]
    pub fail_on_regression: Option<f64>,
}

fn parse_pct(text: &str) -> Result<f64, String> {
    match text.trim_end_matches('%').parse::<f64>() {
        Ok(pct) if pct.is_finite() && pct >= 0.0 => Ok(pct),
        _ => Err(format!(
            "`{text}` is not a percentage; give a number such as 5"
        )),
    }
}

/// Reads a plan file, or prints why it is not one.
pub fn read_plan(path: &Path) -> Result<Plan, ExitCode> {
    parse_plan(path, &read_text(path)?)
}

fn read_text(path: &Path) -> Result<String, ExitCode> {
    std::fs::read_to_string(path).map_err(|error| {
        eprintln!("error: cannot read `{}`: {error}", path.display());
        ExitCode::from(EXIT_BAD_INPUT)
    })
}

fn parse_plan(path: &Path, text: &str) -> Result<Plan, ExitCode> {
    Plan::from_json(text).map_err(|error| {
        eprintln!("error: `{}`: {error}", path.display());
        ExitCode::from(EXIT_BAD_INPUT)
    })
}

/// Both files serving plans: their diff. `None` when neither is one; exit 1 when one is.
fn serving_diff(args: &Args, old: &str, new: &str) -> Option<ExitCode> {
    match (is_serving_plan(old), is_serving_plan(new)) {
        (false, false) => return None,
        (true, true) => {}
        _ => {
            eprintln!(
                "error: `{}` and `{}` are not both serving plans or both training plans",
                args.old.display(),
                args.new.display()
            );
            return Some(ExitCode::from(EXIT_BAD_INPUT));
        }
    }
    let parse = |path: &Path, text: &str| {
        ServingPlan::from_json(text).map_err(|error| {
            eprintln!("error: `{}`: {error}", path.display());
            ExitCode::from(EXIT_BAD_INPUT)
        })
    };
    let (old, new) = match (parse(&args.old, old), parse(&args.new, new)) {
        (Ok(old), Ok(new)) => (old, new),
        (Err(code), _) | (_, Err(code)) => return Some(code),
    };
    let diff = diff_serving_plans(
        (&args.old.display().to_string(), &old),
        (&args.new.display().to_string(), &new),
        args.fail_on_regression,
    );
    print!(
        "{}",
        match args.format {
            Format::Text => diff.render(false),
            Format::Markdown => diff.render(true),
            Format::Json => diff.to_json(),
        }
    );
    for failure in &diff.failures {
        eprintln!("regression: {failure}");
    }
    Some(if diff.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_REGRESSION)
    })
}

pub fn run(args: &Args) -> ExitCode {
    let texts = read_text(&args.old).and_then(|old| Ok((old, read_text(&args.new)?)));
    let (old_text, new_text) = match texts {
        Ok(texts) => texts,
        Err(code) => return code,
    };
    if let Some(code) = serving_diff(args, &old_text, &new_text) {
        return code;
    }
    let old = match parse_plan(&args.old, &old_text) {
        Ok(plan) => plan,
        Err(code) => return code,
    };
    let new = match parse_plan(&args.new, &new_text) {
        Ok(plan) => plan,
        Err(code) => return code,
    };
    let old_label = args.old.display().to_string();
    let new_label = args.new.display().to_string();
    let diff = diff_plans(
        (&old_label, &old),
        (&new_label, &new),
        args.fail_on_regression,
    );
    let shown = match args.format {
        Format::Text => render_diff_text(&diff),
        Format::Markdown => render_diff_markdown(&diff),
        Format::Json => diff.to_json(),
    };
    print!("{shown}");
    if diff.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        for failure in &diff.failures {
            eprintln!("regression: {failure}");
        }
        ExitCode::from(EXIT_REGRESSION)
    }
}
