//! The runtime's error type: every failure is a value naming what went wrong and where.

use std::fmt;

#[derive(Clone, Debug, PartialEq)]
pub enum RuntimeError {
    /// The plan asks for something this runtime does not implement.
    Unsupported { feature: String },
    /// The plan does not fit the model (a degree does not divide a size, ...).
    InvalidPlan { reason: String },
    /// The model spec cannot be built (zero sizes, ...).
    InvalidModel { reason: String },
    /// Reading training data failed.
    Data { reason: String },
    /// A rank failed; `reason` says why.
    RankFailed { rank: usize, reason: String },
    /// Another rank failed first and this one stopped waiting for it.
    Aborted,
    /// Writing the trace failed.
    Trace { reason: String },
    /// Writing or reading a checkpoint failed, or it does not fit the plan's model.
    Checkpoint { reason: String },
}

impl RuntimeError {
    pub fn unsupported(feature: impl Into<String>) -> Self {
        RuntimeError::Unsupported {
            feature: feature.into(),
        }
    }

    pub fn invalid_plan(reason: impl Into<String>) -> Self {
        RuntimeError::InvalidPlan {
            reason: reason.into(),
        }
    }
}

impl fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuntimeError::Unsupported { feature } => {
                write!(f, "not supported by the runtime yet: {feature}")
            }
            RuntimeError::InvalidPlan { reason } => write!(f, "the plan cannot run: {reason}"),
            RuntimeError::InvalidModel { reason } => {
                write!(f, "the model cannot be built: {reason}")
            }
            RuntimeError::Data { reason } => write!(f, "training data: {reason}"),
            RuntimeError::RankFailed { rank, reason } => write!(f, "rank {rank} failed: {reason}"),
            RuntimeError::Aborted => write!(f, "stopped because another rank failed"),
            RuntimeError::Trace { reason } => write!(f, "writing the trace: {reason}"),
            RuntimeError::Checkpoint { reason } => write!(f, "checkpoint: {reason}"),
        }
    }
}

impl std::error::Error for RuntimeError {}
