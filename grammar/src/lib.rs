//! The Tessel spec language: parsing, units, `use`/`extends` resolution, semantic checks,
//! diagnostics, the embedded GPU catalog, and the typed [`Spec`] the other crates consume.

mod spec;

pub use spec::*;
