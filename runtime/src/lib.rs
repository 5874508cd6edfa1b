//! The plan executor.
