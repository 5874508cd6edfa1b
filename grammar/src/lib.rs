//! The Tessel spec language: parsing, units, `use`/`extends` resolution, semantic checks,
//! diagnostics, the embedded GPU catalog, and the typed [`Spec`] the other crates consume.
//!
//! ```
//! let spec = tessel_grammar::load_str("job.tsl", r#"
//!     model tiny { layers = 2, hidden = 64, heads = 4, ffn_hidden = 256, vocab = 1000, mlp = gelu }
//!     cluster box { gpu = A100_80GB, nodes = 1, gpus_per_node = 8
//!                   intra_node = { bandwidth = 300 GB/s } }
//!     train { model = tiny, cluster = box, seq_len = 128, global_batch = 64 }
//! "#).unwrap();
//! assert_eq!(spec.cluster.total_gpus(), 8);
//! ```

mod assemble;
mod ast;
mod blocks;
mod calibration_file;
mod chunks;
mod diagnostic;
mod eval;
mod fields;
mod frameworks;
mod loader;
mod model_stats;
mod parser;
mod resolve;
mod source;
mod spec;
mod suggest;
mod units;

use std::path::Path;

pub use assemble::Definitions;
pub use blocks::cluster::{
    DEFAULT_HOST_LINK, DEFAULT_HOST_MEMORY_PER_GPU_MEMORY, DEFAULT_INTER_NODE_LATENCY,
    DEFAULT_INTRA_NODE_LATENCY,
};
pub use calibration_file::{read_calibration_file, CALIBRATION_FORMAT};
pub use chunks::{empty_chunk_error, stage_chunks, stage_totals};
pub use diagnostic::{Diagnostic, Diagnostics};
pub use frameworks::{
    ActivationOffload, Capabilities, GradientOffload, Limit, OptimizerOffload, PartialRecompute,
    WeightOffload,
};
pub use model_stats::ParameterCount;
pub use spec::*;

use loader::Loaded;

/// Loads the spec at `path` with everything it `use`s; it must have a `train` block. Paths in
/// diagnostics are printed as given (used files joined onto the directory of `path`).
pub fn load_file(path: &Path) -> Result<Spec, Diagnostics> {
    let name = path.display().to_string();
    into_spec(&name, assemble::assemble(Loaded::from_path(path), true)?)
}

/// Loads a spec from memory; `file_name` names it in diagnostics, and its `use` paths are
/// relative to the current directory.
pub fn load_str(file_name: &str, source: &str) -> Result<Spec, Diagnostics> {
    let definitions = assemble::assemble(Loaded::from_str(file_name, source), true)?;
    into_spec(file_name, definitions)
}

/// Loads the spec at `path`, a training job (`train` block) or a serving one (`serve`).
pub fn load_job(path: &Path) -> Result<Job, Diagnostics> {
    let name = path.display().to_string();
    into_job(&name, assemble::assemble(Loaded::from_path(path), true)?)
}

/// [`load_job`] for a spec held in memory.
pub fn load_job_str(file_name: &str, source: &str) -> Result<Job, Diagnostics> {
    into_job(
        file_name,
        assemble::assemble(Loaded::from_str(file_name, source), true)?,
    )
}

/// Loads and checks every block of the file at `path`; unlike [`load_file`] the file needs no
/// `train` block (a file of cluster or model definitions).
pub fn load_definitions(path: &Path) -> Result<Definitions, Diagnostics> {
    assemble::assemble(Loaded::from_path(path), false)
}

/// [`load_definitions`] for a spec held in memory.
pub fn load_definitions_str(file_name: &str, source: &str) -> Result<Definitions, Diagnostics> {
    assemble::assemble(Loaded::from_str(file_name, source), false)
}

fn into_spec(file_name: &str, definitions: Definitions) -> Result<Spec, Diagnostics> {
    match into_job(file_name, definitions)? {
        Job::Train(spec) => Ok(*spec),
        Job::Serve(_) => Err(Diagnostics(vec![Diagnostic::whole_file(
            file_name,
            format!(
                "`{file_name}` is a serving spec (a `serve` block); this command takes a \
                 training job (a `train` block). `tessel plan` plans serving specs"
            ),
        )])),
    }
}

fn into_job(file_name: &str, definitions: Definitions) -> Result<Job, Diagnostics> {
    // `assemble` with `require_job` reports why a job is incomplete; this is a safety net.
    match (definitions.spec, definitions.serving) {
        (Some(spec), _) => Ok(Job::Train(Box::new(spec))),
        (None, Some(serving)) => Ok(Job::Serve(Box::new(serving))),
        (None, None) => Err(Diagnostics(vec![Diagnostic::whole_file(
            file_name,
            format!("`{file_name}` does not describe a complete training or serving job"),
        )])),
    }
}

/// The built-in GPU catalog (`grammar/catalog/gpus.tsl`), in catalog order.
pub fn gpu_catalog() -> Vec<GpuSpec> {
    // An empty spec reads the catalog and nothing else; this crate's tests check it is clean.
    load_definitions_str("<empty>", "")
        .map(|d| d.catalog)
        .unwrap_or_default()
}
