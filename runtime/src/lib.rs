//! The plan executor: device mesh and process groups, the model built from `ModelSpec`,
//! sharded parameters, the per-rank instruction stream from the planner's schedule
//! generator, backends (`cpu` always), memory accounting and Chrome traces.

pub mod backend;
pub mod checkpoint;
pub mod compression;
pub mod data;
pub mod error;
pub mod executor;
pub mod init;
pub mod kernels;
pub mod launch;
pub mod launcher;
pub mod memory;
pub mod mesh;
pub mod model;
pub mod plan;
pub mod plan_file;
pub mod scale;
pub mod serve;
pub mod trace;

pub use data::{DataSource, TokenWidth};
pub use error::RuntimeError;
pub use launch::{launch_cpu, LaunchOptions, LaunchReport, RankMemory};
pub use memory::MemoryBreakdown;
pub use plan::ExecutionPlan;
pub use plan_file::{auto_scale, check_plan, scale_plan, PredictedMemory, ScaledPlan};
pub use scale::scale_model;
