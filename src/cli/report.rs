//! `tessel report PLAN [-o report.html] [--open] [--trace trace.json]`: a self-contained HTML
//! page with the plan's predicted timeline, memory, step-time breakdown and runners-up, and the
//! measured timeline of a traced run beside the prediction.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use tessel_planner::report::{parse_trace, render_report};
use tessel_planner::Plan;

use super::EXIT_BAD_INPUT;

#[derive(clap::Args)]
pub struct Args {
    /// The plan file (`tessel plan -o plan.json`).
    pub plan: PathBuf,
    /// Where to write the HTML page.
    #[arg(short, long, default_value = "report.html")]
    pub output: PathBuf,
    /// Open the page in a browser ($BROWSER, else xdg-open) when one exists.
    #[arg(long)]
    pub open: bool,
    /// A Chrome trace from `tessel launch --trace` to draw below the prediction.
    #[arg(long)]
    pub trace: Option<PathBuf>,
}

fn read(path: &Path, what: &str) -> Result<String, ExitCode> {
    std::fs::read_to_string(path).map_err(|error| {
        eprintln!("error: cannot read {what} `{}`: {error}", path.display());
        ExitCode::from(EXIT_BAD_INPUT)
    })
}

fn build(args: &Args) -> Result<String, ExitCode> {
    let plan_text = read(&args.plan, "the plan")?;
    let plan = Plan::from_json(&plan_text).map_err(|error| {
        eprintln!("error: `{}`: {error}", args.plan.display());
        ExitCode::from(EXIT_BAD_INPUT)
    })?;
    let measured = match &args.trace {
        None => None,
        Some(path) => {
            let text = read(path, "the trace")?;
            Some(parse_trace(&text, &plan).map_err(|error| {
                eprintln!("error: `{}`: {error}", path.display());
                ExitCode::from(EXIT_BAD_INPUT)
            })?)
        }
    };
    render_report(&plan, measured.as_ref()).map_err(|error| {
        eprintln!("error: `{}`: {error}", args.plan.display());
        ExitCode::from(EXIT_BAD_INPUT)
    })
}

pub fn run(args: &Args) -> ExitCode {
    let page = match build(args) {
        Ok(page) => page,
        Err(code) => return code,
    };
    if let Err(error) = std::fs::write(&args.output, page) {
        eprintln!("error: cannot write `{}`: {error}", args.output.display());
        return ExitCode::from(EXIT_BAD_INPUT);
    }
    eprintln!("wrote {}", args.output.display());
    if args.open {
        open_in_browser(&args.output);
    }
    ExitCode::SUCCESS
}

/// The browser command: `$BROWSER` when set, else `xdg-open` (or `open` on macOS) when on PATH.
fn browser() -> Option<String> {
    if let Some(browser) = std::env::var("BROWSER")
        .ok()
        .filter(|b| !b.trim().is_empty())
    {
        return Some(browser);
    }
    let candidates: &[&str] = if cfg!(target_os = "macos") {
        &["open"]
    } else {
        &["xdg-open"]
    };
    let path = std::env::var_os("PATH")?;
    candidates
        .iter()
        .find(|name| std::env::split_paths(&path).any(|dir| dir.join(name).is_file()))
        .map(|name| name.to_string())
}

/// Starts the browser without waiting for it; a missing browser is a message, not an error.
fn open_in_browser(page: &Path) {
    let Some(browser) = browser() else {
        eprintln!(
            "no browser found (set $BROWSER or install xdg-open); open {} yourself",
            page.display()
        );
        return;
    };
    let spawned = Command::new(&browser)
        .arg(page)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    match spawned {
        Ok(_) => eprintln!("opened {} with {browser}", page.display()),
        Err(error) => eprintln!(
            "could not start `{browser}` ({error}); open {} yourself",
            page.display()
        ),
    }
}
