//! Search, the MILP, pipeline schedules and plan files.
