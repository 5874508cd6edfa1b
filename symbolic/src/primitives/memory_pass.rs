//! A memory-bound pass (norms, activations, casts, the optimizer step): bytes over the HBM
//! bandwidth a streaming kernel reaches.

use super::scalar::{c, Scalar};

/// Fraction of the datasheet HBM bandwidth STREAM-style kernels reach (copy, scale, add,
/// triad, dot), fitted on the Azure A100, H100 and H200 measurements (`fit::fit_and_score`):
/// one number for every GPU.
pub const HBM_STREAM_FRACTION: f64 = 0.8646;

/// Seconds to move `bytes` through HBM of `datasheet_bandwidth` at the streaming fraction.
pub fn memory_pass_time<S: Scalar>(bytes: S, datasheet_bandwidth: f64) -> S {
    bytes / c(datasheet_bandwidth * HBM_STREAM_FRACTION)
}
