//! The `cuda` backend when Tessel is built without the `cuda` feature: the same entry points,
//! each answering with how to get the real one.

use crate::executor::RankOutput;
use crate::launch::LaunchOptions;
use crate::launcher::{WorkerConfig, WorkerError};
use crate::plan::ExecutionPlan;
use tessel_grammar::ModelSpec;

pub const NOT_BUILT: &str = "built without the cuda feature; rebuild with --features cuda";

/// What the probe found (never constructed in this build).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaProbe {
    pub devices: usize,
}

pub fn probe() -> Result<CudaProbe, String> {
    Err(NOT_BUILT.into())
}

pub fn run_cuda_worker(
    _model: &ModelSpec,
    _plan: &ExecutionPlan,
    _options: &LaunchOptions,
    _config: &WorkerConfig,
) -> Result<RankOutput, WorkerError> {
    Err(WorkerError::Failed(NOT_BUILT.into()))
}
