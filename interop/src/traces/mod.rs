//! Parsers of measurements other tools write, for `tessel calibrate`: each reads one format
//! into typed rows and rejects anything else with the line that gave it away.
//!
//! - [`nccl_tests`]: the output of NVIDIA's nccl-tests (`all_reduce_perf`, ...);
//! - [`gemm_csv`]: a CSV of GEMM timings (`m,n,k` and a time or a rate);
//! - [`kineto`]: PyTorch profiler traces (NCCL kernels and what they moved, GEMMs with shapes);
//! - [`requests`]: request traces of serving workloads (Azure's LLM inference traces);
//! - [`tessel`]: Tessel's own `tessel launch --trace` files (their collectives, and the run
//!   with each rank's time per step).

pub mod gemm_csv;
pub mod kineto;
pub mod nccl_tests;
pub mod requests;
pub mod tessel;

use std::fmt;

pub use gemm_csv::{parse_gemm_csv, GemmTiming};
pub use kineto::{kineto_trace, parse_kineto_trace, KinetoCollective, KinetoGemm, KinetoTrace};
pub use nccl_tests::{parse_nccl_tests, NcclTestsDevice, NcclTestsRow, NcclTestsRun};
pub use requests::parse_request_trace;
pub use tessel::{
    parse_tessel_trace, tessel_trace, RankWork, StepWork, TesselCollective, TesselTrace,
    TracedMatmul, TracedRun,
};

/// Why a file is not what its parser reads, with the line (1-based) where that became clear.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for TraceError {}

/// A Chrome-trace JSON document (PyTorch profiler's, Tessel's), read once for the readers of
/// its events ([`kineto_trace`], [`tessel_trace`]).
pub fn read_trace_json(text: &str) -> Result<serde_json::Value, TraceError> {
    serde_json::from_str(text).map_err(|error| TraceError {
        line: error.line(),
        message: format!("not a trace: not JSON ({error})"),
    })
}
