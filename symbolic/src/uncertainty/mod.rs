//! How wrong the cost model is likely to be for a configuration, learned from its errors on
//! runs it was not fitted to: the prediction intervals of `tessel estimate` and `tessel plan`,
//! and the pessimistic bound the planner ranks by.

mod held_out;
mod interval;
mod run_traits;

pub use held_out::{held_out_runs, parse_held_out, render_held_out, HeldOutRun};
pub use interval::{
    distance, step_factors, PredictionInterval, StepFactors, COVERAGE, NEIGHBOURS,
    SAME_KIND_DISTANCE, WIDENING_PER_DISTANCE, WIDENING_PER_UNVALIDATED,
};
pub use run_traits::{RecomputeKind, RunTraits};
