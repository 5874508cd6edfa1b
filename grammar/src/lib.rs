//! The Tessel spec language: parsing, units, `use`/`extends` resolution, semantic checks,
//! diagnostics, the embedded GPU catalog, and the typed [`Spec`] the other crates consume.

mod model_stats;
mod spec;

pub use model_stats::ParameterCount;

pub use spec::*;
