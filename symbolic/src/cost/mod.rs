//! The cost model: time and memory of a training step as expressions over the strategy.

mod types;

pub use types::*;
