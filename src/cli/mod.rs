//! One module per subcommand, plus what they share: exit codes and number formatting.

pub mod calibrate;
pub mod check;
pub mod diff;
pub mod estimate;
pub mod export;
pub mod import;
pub mod launch;
pub mod plan;
pub mod replan;
pub mod report;
pub mod serve_launch;
pub mod serve_plan;

use std::path::Path;
use std::process::ExitCode;

use tessel_grammar::{Diagnostics, Spec};

/// The user's input is wrong (a diagnostic was printed).
pub const EXIT_BAD_INPUT: u8 = 1;

/// A human table or JSON, for the commands that print either.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum TableOrJson {
    Table,
    Json,
}

/// No plan fits the job (the explanation says what is short).
pub const EXIT_NO_FIT: u8 = 2;

/// `diff` or `plan --check` found a regression or a stale plan.
pub const EXIT_REGRESSION: u8 = 3;

/// Prints a command-line parsing error (or `--help`/`--version`) and picks the exit code: a
/// malformed command line is bad input like a malformed spec.
pub fn usage_error(error: clap::Error) -> ExitCode {
    // Printing to a closed pipe is not worth a second error.
    let _ = error.print();
    if error.use_stderr() {
        ExitCode::from(EXIT_BAD_INPUT)
    } else {
        ExitCode::SUCCESS
    }
}

/// Prints a file's diagnostics and the closing count line.
pub fn print_diagnostics(file: &Path, diagnostics: &Diagnostics) -> ExitCode {
    let n = diagnostics.len();
    eprint!("{diagnostics}");
    eprintln!(
        "\nerror: `{}` has {n} error{}",
        file.display(),
        if n == 1 { "" } else { "s" }
    );
    ExitCode::from(EXIT_BAD_INPUT)
}

/// A smaller (or larger) share of the spec's cluster for one command, leaving the file as it
/// is: to plan a run of the same job on a few GPUs (`tessel launch` on the CPU backend), or
/// to see how a plan changes with the GPU count.
#[derive(clap::Args, Default)]
pub struct ClusterArgs {
    /// Use this many GPUs of the spec's cluster: whole nodes, or part of one.
    #[arg(long, conflicts_with = "nodes")]
    pub gpus: Option<u64>,
    /// Use this many nodes of the spec's cluster.
    #[arg(long)]
    pub nodes: Option<u64>,
}

impl ClusterArgs {
    /// The spec's cluster resized, or why it cannot be.
    pub fn apply(&self, spec: &mut Spec) -> Result<(), String> {
        self.resize(&mut spec.cluster)
    }

    /// The cluster resized, or why it cannot be.
    pub fn resize(&self, cluster: &mut tessel_grammar::ClusterSpec) -> Result<(), String> {
        if !cluster.pools.is_empty() && (self.gpus.is_some() || self.nodes.is_some()) {
            return Err(format!(
                "cluster `{}` is made of pools; set each pool's `nodes` in the spec instead of \
                 --gpus or --nodes",
                cluster.name
            ));
        }
        let per_node = cluster.gpus_per_node;
        match (self.gpus, self.nodes) {
            (Some(0), _) | (_, Some(0)) => Err("--gpus and --nodes must be at least 1".into()),
            (Some(gpus), _) if gpus < per_node => {
                cluster.nodes = 1;
                cluster.gpus_per_node = gpus;
                Ok(())
            }
            (Some(gpus), _) if gpus % per_node == 0 => {
                cluster.nodes = gpus / per_node;
                Ok(())
            }
            (Some(gpus), _) => Err(format!(
                "--gpus {gpus} is neither whole nodes of {per_node} GPUs nor part of one; try --gpus {}",
                gpus.div_ceil(per_node) * per_node
            )),
            (None, Some(nodes)) => {
                cluster.nodes = nodes;
                Ok(())
            }
            (None, None) => Ok(()),
        }
    }
}

/// Refuses (exit 1) what `command` cannot do on a cluster made of pools: it costs or exports
/// one GPU type. A plan on one pool names a cluster of one type and passes.
pub fn refuse_pools(command: &str, spec: &Spec) -> Result<(), ExitCode> {
    if spec.cluster.pools.is_empty() {
        return Ok(());
    }
    eprintln!(
        "error: cluster `{}` is made of pools ({}); `tessel {command}` works on one GPU type — \
         `tessel plan` places work across pools, and a plan it makes on one pool works here as \
         any plan does",
        spec.cluster.name,
        spec.cluster
            .pools
            .iter()
            .map(|p| format!("{} × {}", p.total_gpus(), p.gpu.name))
            .collect::<Vec<_>>()
            .join(" + ")
    );
    Err(ExitCode::from(EXIT_BAD_INPUT))
}

/// Loads a spec with a `train` block and resizes its cluster, or prints why it cannot.
pub fn load_resized_spec(path: &Path, cluster: &ClusterArgs) -> Result<Spec, ExitCode> {
    let mut spec = load_spec(path)?;
    cluster.apply(&mut spec).map_err(|message| {
        eprintln!("error: {message}");
        ExitCode::from(EXIT_BAD_INPUT)
    })?;
    Ok(spec)
}

/// Loads a spec with a `train` block, or prints why it cannot.
pub fn load_spec(path: &Path) -> Result<Spec, ExitCode> {
    tessel_grammar::load_file(path).map_err(|diagnostics| print_diagnostics(path, &diagnostics))
}

/// `; it has a, b` (or `; it has no strategy blocks`), to follow an unknown strategy's name.
pub fn known_strategies(spec: &Spec) -> String {
    if spec.strategies.is_empty() {
        return "; it has no strategy blocks".to_string();
    }
    let names: Vec<&str> = spec.strategies.iter().map(|s| s.name.as_str()).collect();
    format!("; it has {}", names.join(", "))
}

/// Writes `text` to `path`, or to standard output without one.
pub fn write_output(path: Option<&Path>, text: &str) -> ExitCode {
    match path {
        None => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Some(path) => match std::fs::write(path, text) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("error: cannot write `{}`: {error}", path.display());
                ExitCode::from(EXIT_BAD_INPUT)
            }
        },
    }
}

/// At most two decimals, without trailing zeros: `70.55`, `1.2`, `989`.
pub fn short_decimal(value: f64) -> String {
    let text = format!("{value:.2}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" {
        "0".to_string()
    } else {
        text.to_string()
    }
}

/// Scales `value` by powers of 1000 onto `prefixes` (the first is for 1).
fn scaled(value: f64, prefixes: &[&str], unit: &str) -> String {
    let mut scaled = value;
    let mut index = 0;
    while scaled.abs() >= 999.995 && index + 1 < prefixes.len() {
        scaled /= 1000.0;
        index += 1;
    }
    format!("{} {}{unit}", short_decimal(scaled), prefixes[index])
}

/// A count with K/M/B/T, as model sizes are quoted: `70.55 B`.
pub fn count(value: f64) -> String {
    scaled(value, &["", "K", "M", "B", "T"], "")
        .trim_end()
        .to_string()
}

/// An SI quantity: `si(1.2e15, "FLOP/s")` is `1.2 PFLOP/s`.
pub fn si(value: f64, unit: &str) -> String {
    scaled(value, &["", "K", "M", "G", "T", "P", "E", "Z"], unit)
}

/// Bytes in powers of 1024: `80 GiB`.
pub fn bytes(value: f64) -> String {
    let prefixes = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut scaled = value;
    let mut index = 0;
    while scaled >= 1023.995 && index + 1 < prefixes.len() {
        scaled /= 1024.0;
        index += 1;
    }
    format!("{} {}", short_decimal(scaled), prefixes[index])
}

/// Seconds in the largest of s, ms, us, ns that keeps the number at least 1.
pub fn duration(seconds: f64) -> String {
    for (scale, unit) in [(1.0, "s"), (1e-3, "ms"), (1e-6, "us")] {
        if seconds >= scale {
            return format!("{} {unit}", short_decimal(seconds / scale));
        }
    }
    format!("{} ns", short_decimal(seconds / 1e-9))
}

/// `70553706496` as `70,553,706,496`.
pub fn grouped(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_like_a_datasheet() {
        assert_eq!(count(70_553_706_496.0), "70.55 B");
        assert_eq!(count(46_702_792_704.0), "46.7 B");
        assert_eq!(count(512.0), "512");
        assert_eq!(si(1.2e15, "FLOP/s"), "1.2 PFLOP/s");
        assert_eq!(si(989e12, "FLOP/s"), "989 TFLOP/s");
        assert_eq!(si(999.999e12, "FLOP/s"), "1 PFLOP/s");
        assert_eq!(bytes(80.0 * 1024f64.powi(3)), "80 GiB");
        assert_eq!(bytes(2e12), "1.82 TiB");
        assert_eq!(duration(3e-6), "3 us");
        assert_eq!(duration(0.25), "250 ms");
        assert_eq!(grouped(70_553_706_496), "70,553,706,496");
        assert_eq!(grouped(999), "999");
    }
}
