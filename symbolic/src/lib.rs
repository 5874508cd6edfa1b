//! Symbolic expressions and the Tessel cost model.

pub mod calibration;
pub mod checkpoint;
pub mod cost;
mod expr;
pub mod primitives;
mod rng;
pub mod serving;
pub mod uncertainty;
pub mod validation;

pub use expr::{BatchScratch, CompileError, Expr, Program, Symbol};
pub use rng::SplitMix64;

/// Bytes in a GiB, the unit memory is reported in.
pub(crate) const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
