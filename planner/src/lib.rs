//! Search, the MILP, pipeline schedules and plan files.
pub mod schedule;
