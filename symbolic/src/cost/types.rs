//! The cost model's results: what one pipeline stage costs, and the prediction of a whole step.
//! These types are the contract between the cost model and the planner.

use serde::{Deserialize, Serialize};

use crate::uncertainty::PredictionInterval;

/// Bytes one GPU of a pipeline stage holds at its peak, by component.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryBreakdown {
    pub weights: f64,
    pub gradients: f64,
    pub optimizer: f64,
    pub activations: f64,
    /// Communication buffers, gathered-weight buffers (ZeRO-3), logits buffers, allocator
    /// fragmentation and the framework's fixed overhead.
    pub buffers: f64,
}

impl MemoryBreakdown {
    pub fn total(&self) -> f64 {
        self.weights + self.gradients + self.optimizer + self.activations + self.buffers
    }
}

/// Seconds of one step, by where they go. Communication fields are the *exposed* part, after
/// overlap with compute.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TimeBreakdown {
    pub compute: f64,
    pub recompute: f64,
    pub tp_comm: f64,
    pub cp_comm: f64,
    pub ep_comm: f64,
    pub pp_comm: f64,
    pub dp_comm: f64,
    pub offload: f64,
    pub bubble: f64,
    pub optimizer: f64,
}

impl TimeBreakdown {
    pub fn total(&self) -> f64 {
        self.compute
            + self.recompute
            + self.tp_comm
            + self.cp_comm
            + self.ep_comm
            + self.pp_comm
            + self.dp_comm
            + self.offload
            + self.bubble
            + self.optimizer
    }
}

/// What one pipeline stage (one device of the pipeline, holding all its interleaved chunks)
/// costs, for one choice of layers, recompute and offload.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StageCost {
    /// Forward plus backward of one micro-batch through every layer the stage holds, including
    /// recompute and the exposed tensor/context/expert/pipeline communication it waits for.
    pub microbatch_s: f64,
    /// Work done once per step after the stage's last backward: exposed data-parallel gradient
    /// reduction, ZeRO gathers that do not overlap, the optimizer step, offload traffic.
    pub tail_s: f64,
    /// Peak bytes per GPU of this stage.
    pub memory: MemoryBreakdown,
}

/// How stage times combine into a step under the pipeline schedule:
/// `step = sum_weight · Σ microbatch_s + max_weight · max microbatch_s + max tail_s`.
/// Plain 1F1B has `sum_weight = 1`, `max_weight = m − 1`; interleaving with `v` chunks has
/// `sum_weight = 1/v`, `max_weight = m − 1/v`. The form is linear in the stage times and their
/// maximum so that the planner's MILP models it exactly.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PipelineShape {
    pub sum_weight: f64,
    pub max_weight: f64,
}

impl PipelineShape {
    pub fn step_time(&self, stages: &[StageCost]) -> f64 {
        let sum: f64 = stages.iter().map(|s| s.microbatch_s).sum();
        let max = stages.iter().map(|s| s.microbatch_s).fold(0.0, f64::max);
        let tail = stages.iter().map(|s| s.tail_s).fold(0.0, f64::max);
        self.sum_weight * sum + self.max_weight * max + tail
    }
}

/// One stage in a prediction.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageEstimate {
    pub stage: u64,
    /// Layers the stage holds (all its chunks together).
    pub layers: u64,
    /// GiB per GPU (the JSON's unit; `StageCost` holds bytes).
    pub memory: MemoryBreakdown,
    /// Seconds, for one step.
    pub time: TimeBreakdown,
    /// With `train.grad_compression`, which of the stage's bucket classes go compressed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compressed: Option<CompressedBuckets>,
}

/// Which classes of data-parallel gradient buckets a stage sends compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompressedBuckets {
    /// The transformer layers' gradients.
    pub layers: bool,
    /// The embedding's and output layer's.
    pub edges: bool,
}

/// The prediction for one fixed configuration: what `tessel estimate --format json` prints and
/// what a plan file's `prediction` holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    pub step_time_s: f64,
    pub tokens_per_s: f64,
    pub tokens_per_s_per_gpu: f64,
    pub model_tflops_per_gpu: f64,
    pub hardware_tflops_per_gpu: f64,
    pub mfu: f64,
    pub hfu: f64,
    pub peak_memory_gib: f64,
    /// GiB each GPU may use (capacity × the search's memory limit).
    pub memory_capacity_gib: f64,
    pub fits: bool,
    /// The step's critical path, by component.
    pub time: TimeBreakdown,
    pub stages: Vec<StageEstimate>,
    /// Where the measured step time and throughput are expected to fall (absent from plan
    /// files written before intervals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<PredictionInterval>,
    /// A multimodal model's encoders: where they run and what uneven items cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multimodal: Option<super::MultimodalEstimate>,
}
