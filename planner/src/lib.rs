//! Search, the MILP, pipeline schedules and plan files.
//!
//! [`plan`] searches a spec's space against a [`StageCostModel`] and returns a [`Plan`];
//! [`plan_fixed`] turns a fixed strategy into a plan file; [`render_table`],
//! [`render_markdown`] and [`render_explain`] format plans; [`Plan::to_json`] and
//! [`Plan::from_json`] read and write plan files.

mod bounds;
pub mod canonical_json;
mod checkpoints;
mod choices;
mod cost_model;
mod diff;
mod error;
mod explain;
mod finetune;
mod frontier;
mod layers;
mod local_search;
mod losses;
mod milp;
mod nothing_fits;
mod objective;
mod placement;
mod plan;
mod planning;
mod published;
mod rank_map;
mod render;
pub mod report;
pub mod schedule;
mod search;
pub mod serving;
mod space;

pub use checkpoints::{checkpoint_explanation, checkpoint_line, checkpoint_plan, CheckpointPlan};
pub use choices::{
    explain_compression_choice, explain_kernels_choice, explain_placement_choice,
    plan_fixed_resolving_choices, plan_resolving_choices, CompressionChoice,
    EncoderPlacementChoice, KernelsChoice,
};
pub use cost_model::StageCostModel;
pub use diff::{
    diff_plans, render_diff_markdown, render_diff_text, FieldChange, MetricChange, PlanDiff,
    RankMapChange, StageMemory,
};
pub use error::PlanError;
pub use explain::{render_explain, render_validated_alternative};
pub use finetune::{explain_finetune_choice, plan_finetune, plan_fixed_finetune, FinetuneChoice};
pub use layers::{chunk_ranges, even_chunks, even_split, layer_ranges, stage_chunks, stage_totals};
pub use milp::MilpSettings;
pub use nothing_fits::{FixedDoesNotFit, ModelFactory, NothingFits, Suggestion};
pub use objective::Objective;
pub use placement::{
    estimate_placed, plan_on_pools, PlacedPool, PlacementOutcome, PoolPlacement, ACROSS_POOLS,
    REPLICAS_ACROSS_POOLS,
};
pub use plan::{
    spec_digest, Plan, PlanConfig, PlanStage, RunnerUp, SearchStats, SolverReport, SolverStatus,
    PLAN_FORMAT,
};
pub use planning::{plan, plan_fixed, PlanOptions, PlanOutcome, SearchTimings, DEFAULT_TOP};
pub use published::{compare_with_published, describe_strategy, PublishedVsPlanned};
pub use rank_map::{coordinates, MeshShape, RankCoordinates, RankMap, RANK_COLUMNS};
pub use render::{render_markdown, render_table};
pub use search::SearchProgress;
pub use space::{outer_configs, stage_options, OuterConfig, StageOption};
