//! Why a spec or a strategy cannot be costed.

use std::fmt;

/// An input the cost model cannot evaluate. Every variant says what is wrong and with which
/// numbers.
#[derive(Clone, Debug, PartialEq)]
pub enum CostError {
    /// The spec itself is inconsistent (a zero dimension, a precision the GPU lacks, ...).
    InvalidSpec { reason: String },
    /// The strategy does not fit the model or the cluster.
    InvalidStrategy { strategy: String, reason: String },
}

impl CostError {
    pub(crate) fn spec(reason: impl Into<String>) -> CostError {
        CostError::InvalidSpec {
            reason: reason.into(),
        }
    }

    pub(crate) fn strategy(strategy: &str, reason: impl Into<String>) -> CostError {
        CostError::InvalidStrategy {
            strategy: strategy.to_string(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for CostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CostError::InvalidSpec { reason } => write!(f, "cannot cost this spec: {reason}"),
            CostError::InvalidStrategy { strategy, reason } => {
                write!(f, "strategy `{strategy}` is not valid: {reason}")
            }
        }
    }
}

impl std::error::Error for CostError {}
