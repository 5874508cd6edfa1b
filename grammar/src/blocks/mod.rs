//! One module per block kind: its fields, defaults and checks.

pub mod cluster;
pub mod gpu;
pub mod model;
pub mod search;
pub mod serve;
pub mod strategy;
pub mod train;
