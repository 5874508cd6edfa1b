//! Errors of planning and of reading plan files.

use std::fmt;

use crate::nothing_fits::{FixedDoesNotFit, NothingFits};

#[derive(Clone, Debug, PartialEq)]
pub enum PlanError {
    /// No configuration of the search space fits in memory. The CLI exits 2 on it.
    NothingFits { explanation: Box<NothingFits> },
    /// The fixed configuration asked for does not fit in memory. The CLI exits 2 on it.
    FixedDoesNotFit { explanation: Box<FixedDoesNotFit> },
    /// The search space holds no valid configuration (before looking at memory).
    EmptySearchSpace { reason: String },
    /// A fixed strategy is inconsistent with the spec.
    InvalidStrategy { reason: String },
    /// The cost model could not predict a configuration.
    CostModel { message: String },
    /// A plan file is not valid JSON (or is cut short).
    Json { message: String },
    /// A plan file of another format version.
    WrongFormat { found: String },
    /// A plan file lacks a field.
    MissingField { field: String },
}

impl PlanError {
    /// The CLI's exit status for this error: 2 when nothing (or the fixed configuration asked
    /// for) fits, 1 for wrong input.
    pub fn exit_code(&self) -> u8 {
        match self {
            PlanError::NothingFits { .. } | PlanError::FixedDoesNotFit { .. } => 2,
            _ => 1,
        }
    }
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::NothingFits { explanation } => write!(f, "{explanation}"),
            PlanError::FixedDoesNotFit { explanation } => write!(f, "{explanation}"),
            PlanError::EmptySearchSpace { reason } => {
                write!(f, "the search space holds no valid configuration: {reason}")
            }
            PlanError::InvalidStrategy { reason } => write!(f, "invalid strategy: {reason}"),
            PlanError::CostModel { message } => write!(f, "cost model: {message}"),
            PlanError::Json { message } => write!(f, "plan file is not valid JSON: {message}"),
            PlanError::WrongFormat { found } => write!(
                f,
                "plan file has format `{found}`, this version reads `{}`",
                crate::plan::PLAN_FORMAT
            ),
            PlanError::MissingField { field } => {
                write!(f, "plan file lacks the field `{field}`")
            }
        }
    }
}

impl std::error::Error for PlanError {}
