//! The cost model: time and memory of a training step as expressions over the strategy.

mod calibration;
mod communication;
mod compute;
mod context;
mod encoder;
mod error;
mod layout;
mod memory;
mod model;
mod overrides;
mod parameters;
mod pools;
mod report;
mod slots;
mod stage_exprs;
mod stragglers;
mod types;

pub use calibration::{AttentionRate, Calibration, ComputeParams, GpuGeneration, KernelEfficiency};
pub(crate) use context::StateBytes;
pub use encoder::MultimodalEstimate;
pub use error::CostError;
pub use layout::{microbatches, spread_layers, stage_layers, validate_strategy};
pub use model::{CostModel, StageOutputs};
pub use overrides::StrategyOverrides;
pub use pools::{
    pipeline_order, pool_spec, pooled_search_spec, replicas_across_pools, PooledCostModel,
    ReplicaShares,
};
pub use report::{
    encoder_placement_label, estimate_json, render_estimate_json, render_estimate_table, round6,
    step_interval_label, uneven_items_label,
};
pub use slots::{slot_values, Output, Slot};
pub use stage_exprs::{stage_cost_exprs, StagedExprs};
pub use types::*;
