//! The plan file: what the planner chose, what it predicts, and how it searched.
//! Written as canonical JSON (see [`crate::canonical_json`]) with `"format": "tessel-plan/1"`.

use serde::{Deserialize, Serialize};

use crate::objective::Objective;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tessel_grammar::{Offload, Recompute, Spec, Strategy};
use tessel_symbolic::cost::Estimate;

use crate::canonical_json::to_canonical_string;
use crate::error::PlanError;
use crate::rank_map::RankMap;

/// The format tag of plan files this version reads and writes.
pub const PLAN_FORMAT: &str = "tessel-plan/1";

/// How the chosen inner configuration was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SolverStatus {
    /// The MILP was solved to optimality.
    Optimal,
    /// The MILP stopped at its relative gap tolerance.
    GapLimit,
    /// The MILP stopped at its time limit with a feasible, possibly suboptimal, solution.
    TimeLimit,
    /// One pipeline stage: every option was evaluated directly, no MILP needed.
    Enumerated,
    /// The solver failed; the even split is used.
    EvenSplit,
    /// A fixed strategy was given; nothing was searched.
    Fixed,
}

impl SolverStatus {
    pub fn as_str(&self) -> &'static str {
        match self {
            SolverStatus::Optimal => "optimal",
            SolverStatus::GapLimit => "gap limit",
            SolverStatus::TimeLimit => "time limit",
            SolverStatus::Enumerated => "enumerated",
            SolverStatus::EvenSplit => "even split (solver failed)",
            SolverStatus::Fixed => "fixed strategy",
        }
    }
}

/// The parallel degrees and micro-batching of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanConfig {
    pub dp: u64,
    pub tp: u64,
    pub pp: u64,
    pub cp: u64,
    pub ep: u64,
    /// The experts' tensor-parallel degree when folded below `tp` (absent: `tp`, and from
    /// plans written before folding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etp: Option<u64>,
    /// The data-parallel ranks ZeRO shards over when fewer than `dp` (hybrid sharding; absent:
    /// all of them, and from plans written before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dp_shard: Option<u64>,
    pub interleave: u64,
    /// Sequences per micro-batch.
    pub microbatch: u64,
    /// Micro-batches per step per data-parallel rank.
    pub microbatches: u64,
    pub zero: u8,
    pub sequence_parallel: bool,
}

/// One pipeline stage of a plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanStage {
    pub stage: u64,
    pub layers: u64,
    /// Model layers `[first, last)` the stage holds, one range per interleaved chunk.
    pub layer_ranges: Vec<[u64; 2]>,
    pub recompute: Recompute,
    pub offload: Offload,
}

/// The solver's result for the chosen configuration.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SolverReport {
    pub status: SolverStatus,
    /// The step time the search optimised (seconds), from the stage costs it chose.
    pub objective_s: f64,
}

/// What the search did. Wall-clock times are kept out of the file to keep it deterministic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SearchStats {
    /// Combinations of candidate values looked at.
    pub candidates_enumerated: u64,
    /// Combinations rejected because a degree does not divide what it must.
    pub rejected_divisibility: u64,
    /// Combinations the spec's framework cannot run (absent from plans written before it).
    #[serde(default)]
    pub rejected_framework: u64,
    /// Valid outer configurations screened with the bounds.
    pub screened: u64,
    /// Screened configurations that cannot fit in memory with any option.
    pub pruned_memory: u64,
    /// Configurations whose lower bound could not beat the best found.
    pub pruned_bound: u64,
    /// Configurations whose every option was evaluated at the even split.
    pub evaluated: u64,
    pub milps_solved: u64,
    /// Calls to the cost model's `stage_cost`.
    pub stage_evaluations: u64,
}

/// A configuration that came close, and why it loses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunnerUp {
    pub config: PlanConfig,
    /// The first stage's recompute and offload; the lists below hold every stage's when they
    /// differ (as in [`Strategy`]).
    pub recompute: Recompute,
    pub offload: Offload,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_recompute: Option<Vec<Recompute>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_offload: Option<Vec<Offload>>,
    /// Layers per stage.
    pub stages: Vec<u64>,
    pub step_time_s: f64,
    pub tokens_per_s: f64,
    pub mfu: f64,
    /// The time component it loses most on, against the chosen plan.
    pub loses_on: String,
    /// A sentence with the numbers.
    pub reason: String,
}

impl RunnerUp {
    /// Every stage's recompute, in stage order.
    pub fn stage_recomputes(&self) -> Vec<Recompute> {
        self.stage_recompute
            .clone()
            .unwrap_or_else(|| vec![self.recompute; self.stages.len()])
    }

    /// Every stage's offload fractions, in stage order.
    pub fn stage_offloads(&self) -> Vec<Offload> {
        self.stage_offload
            .clone()
            .unwrap_or_else(|| vec![self.offload; self.stages.len()])
    }
}

/// A plan file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub format: String,
    /// SHA-256 of the canonical JSON of the spec the plan was made for.
    pub spec_digest: String,
    /// The resolved spec the plan was made for, so that `launch`, `export`, `report` and
    /// `diff` need nothing but the plan file. On a cluster of pools, the spec as the chosen
    /// placement's search saw it (one pool, or every pool's GPUs in one cluster); the whole
    /// cluster of pools is in `placement`.
    pub spec: Spec,
    pub model: String,
    pub cluster: String,
    pub gpus: u64,
    pub gpus_per_node: u64,
    pub seq_len: u64,
    pub global_batch: u64,
    pub config: PlanConfig,
    pub stages: Vec<PlanStage>,
    pub rank_map: RankMap,
    /// Exactly what `tessel estimate` predicts for this configuration.
    pub prediction: Estimate,
    /// What the search ranked configurations by (plans written before objectives were ranked
    /// by the expected step time).
    #[serde(default)]
    pub objective: Objective,
    pub solver: SolverReport,
    pub search: SearchStats,
    pub runners_up: Vec<RunnerUp>,
    /// The checkpoint interval and target, when the spec says how often its GPUs fail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoints: Option<crate::CheckpointPlan>,
    /// On a cluster of pools, which pools the plan uses and which ranks run on each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<crate::PoolPlacement>,
    /// With `finetune = { method = auto }`, how the method was chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finetune_choice: Option<crate::FinetuneChoice>,
    /// With `memory_saving_kernels = auto`, whether the kernels were chosen and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernels_choice: Option<crate::KernelsChoice>,
    /// With `grad_compression = { method = auto }`, which method was chosen and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression_choice: Option<crate::CompressionChoice>,
    /// With a multimodal model's `placement = auto`, where the encoders run and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement_choice: Option<crate::EncoderPlacementChoice>,
}

/// SHA-256 (hex) of the spec's JSON with object keys sorted.
pub fn spec_digest(spec: &Spec) -> String {
    let canonical = serde_json::to_value(spec)
        .map(|value| to_canonical_string(&value))
        .unwrap_or_default();
    let digest = Sha256::digest(canonical.as_bytes());
    digest.iter().map(|byte| format!("{byte:02x}")).collect()
}

impl Plan {
    /// The canonical, byte-stable JSON of the plan.
    pub fn to_json(&self) -> String {
        match serde_json::to_value(self) {
            Ok(value) => to_canonical_string(&value),
            Err(error) => format!("{{\"error\": {:?}}}\n", error.to_string()),
        }
    }

    /// Reads a plan file, checking its format tag first.
    pub fn from_json(text: &str) -> Result<Plan, PlanError> {
        let value: Value = serde_json::from_str(text).map_err(|error| PlanError::Json {
            message: if error.is_eof() {
                format!("the plan file ends early (truncated?): {error}")
            } else {
                error.to_string()
            },
        })?;
        let format = match value.get("format") {
            None => {
                return Err(PlanError::MissingField {
                    field: "format".to_string(),
                })
            }
            Some(Value::String(format)) => format.clone(),
            Some(other) => other.to_string(),
        };
        if format != PLAN_FORMAT {
            return Err(PlanError::WrongFormat { found: format });
        }
        serde_json::from_value(value).map_err(|error| {
            let message = error.to_string();
            match message
                .strip_prefix("missing field `")
                .and_then(|rest| rest.split('`').next())
            {
                Some(field) => PlanError::MissingField {
                    field: field.to_string(),
                },
                None => PlanError::Json { message },
            }
        })
    }

    /// The plan as a fixed strategy (what `tessel estimate` would be given).
    pub fn strategy(&self) -> Strategy {
        let mut strategy = Strategy {
            name: "plan".to_string(),
            dp: self.config.dp,
            tp: self.config.tp,
            pp: self.config.pp,
            cp: self.config.cp,
            ep: self.config.ep,
            etp: self.config.etp,
            dp_shard: self.config.dp_shard,
            microbatch: self.config.microbatch,
            interleave: self.config.interleave,
            sequence_parallel: self.config.sequence_parallel,
            zero: self.config.zero,
            stages: Some(self.chunk_layers()),
            ..Strategy::default()
        };
        strategy.set_stage_options(
            self.stages.iter().map(|s| s.recompute).collect(),
            self.stages.iter().map(|s| s.offload).collect(),
        );
        strategy
    }

    /// Layers of every chunk in model order (what a strategy's `stages` holds), from the
    /// stages' layer ranges.
    pub fn chunk_layers(&self) -> Vec<u64> {
        let mut ranges: Vec<[u64; 2]> = self
            .stages
            .iter()
            .flat_map(|s| s.layer_ranges.iter().copied())
            .collect();
        ranges.sort();
        ranges.iter().map(|[first, last]| last - first).collect()
    }
}
