//! Why a report cannot be made.

use std::fmt;

use crate::schedule::ScheduleError;

#[derive(Clone, Debug, PartialEq)]
pub enum ReportError {
    /// The plan's pipeline cannot be scheduled (a plan file edited by hand).
    Schedule { error: ScheduleError },
    /// The cost model rejects the plan's spec or configuration.
    CostModel { message: String },
    /// The plan's stages disagree with its configuration.
    Stages { message: String },
    /// The trace file is not a Chrome trace of this plan's run.
    Trace { message: String },
}

impl fmt::Display for ReportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReportError::Schedule { error } => write!(f, "cannot schedule the pipeline: {error}"),
            ReportError::CostModel { message } => {
                write!(f, "cannot evaluate the plan's stage costs: {message}")
            }
            ReportError::Stages { message } => {
                write!(f, "the plan's stages are inconsistent: {message}")
            }
            ReportError::Trace { message } => write!(f, "cannot read the trace: {message}"),
        }
    }
}

impl std::error::Error for ReportError {}
