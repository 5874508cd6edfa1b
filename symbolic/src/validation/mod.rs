//! Validation of the cost model against published training runs
//! (`shared/data/published_training_runs.csv`): reading the table, turning rows into specs
//! and strategies, predicting, and reporting the errors per source.

mod cases;
mod csv;
mod evaluate;
mod hardware;
mod hetero;
mod ranking;
mod regimes;
mod report;

pub use cases::{cases_from_records, Case, MemoryMeasure, Skipped, Source, Throughput};
pub use csv::{parse_csv, Table};
pub use evaluate::{evaluate, evaluate_case, per_source, EfficiencyFor, ErrorStats, Outcome};
pub use hardware::{cluster_for, gpu_for};
pub use hetero::{
    default_hetero_path, evaluate_hetero, load_hetero_cases, HeteroCase, HeteroOutcome,
};
pub use ranking::{ranking_per_source, spearman, RankingStats};
pub use regimes::{
    default_regimes_path, evaluate_regimes, load_regime_cases, RegimeCase, RegimeMeasure,
    RegimeOutcome,
};
pub use report::render_validation_markdown;

use std::path::{Path, PathBuf};

/// Where the published runs live: `TESSEL_DATA_DIR` if set, else `shared/data/` beside the
/// repository (`<repo>/../shared`, as CI clones it) or one level further up (a worktree
/// checkout under `<workspace>/wt/<name>`).
pub fn default_data_path() -> PathBuf {
    let file = "published_training_runs.csv";
    if let Some(dir) = std::env::var_os("TESSEL_DATA_DIR") {
        return PathBuf::from(dir).join(file);
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let candidates = [
        repo.join("..").join("shared").join("data").join(file),
        repo.join("..")
            .join("..")
            .join("shared")
            .join("data")
            .join(file),
    ];
    candidates
        .iter()
        .find(|path| path.exists())
        .unwrap_or(&candidates[0])
        .clone()
}

/// Reads and converts the table at `path`.
pub fn load_cases(path: &Path) -> Result<(Vec<Case>, Vec<Skipped>), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|err| format!("cannot read {}: {err}", path.display()))?;
    Ok(cases_from_records(&parse_csv(&text)))
}
