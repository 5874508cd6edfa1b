//! Serving plans: a request-level simulator of inference instances (continuous batching,
//! chunked prefill, KV-cache admission and preemption) over the serving cost model, and the
//! search for the deployment with the most goodput per GPU within the SLO.

pub mod deployment;
pub mod diff;
pub mod engine;
pub mod plan;
pub mod render;
pub mod search;
pub mod validation;
pub mod workload;
