//! The interface the search runs against: what one pipeline stage costs under a configuration.
//! The real cost model (`tessel_symbolic::cost::CostModel`) implements it through a small adapter;
//! tests use an analytic model.

use tessel_grammar::{Offload, Recompute, Strategy};
use tessel_symbolic::cost::{Estimate, PipelineShape, StageCost};

/// Costs the planner needs from a cost model.
///
/// The search's bounds rely on physical properties of stage costs: a stage's `microbatch_s`,
/// `tail_s` and memory never decrease when it holds more layers, and `microbatch_s` is convex in
/// the layer count (each added layer costs at least as much as the one before; a cost that is
/// affine in layers, as for identical layers, qualifies); more recompute (none < selective <
/// partial < full) or more offload never makes a stage faster, nor makes it use more memory.
/// A model that breaks them still gets valid plans, but the pruning may then skip a
/// configuration that would have been better.
pub trait StageCostModel: Sync {
    /// Cost of pipeline stage `stage` (0-based device index in the pipeline) holding `layers`
    /// layers with this recompute/offload, under the outer configuration `strategy` (its degrees,
    /// microbatch, zero, sequence parallel and interleave are used; its `stages`, `recompute` and
    /// `offload` fields are ignored).
    fn stage_cost(
        &self,
        strategy: &Strategy,
        stage: u64,
        layers: u64,
        recompute: Recompute,
        offload: Offload,
    ) -> StageCost;

    /// How stage times combine into a step:
    /// `step = sum_weight·Σ microbatch_s + max_weight·max microbatch_s + max tail_s`.
    fn pipeline_shape(&self, strategy: &Strategy) -> PipelineShape;

    /// Usable bytes per GPU (capacity times the search's memory limit); on GPUs of several
    /// kinds, the largest.
    fn memory_capacity(&self) -> f64;

    /// Usable bytes per GPU of the GPUs that run pipeline stage `stage` under `strategy`.
    fn stage_memory_capacity(&self, _strategy: &Strategy, _stage: u64) -> f64 {
        self.memory_capacity()
    }

    /// Whether the configuration can be laid out on the cluster at all (on pools of GPUs, every
    /// pool must hold whole stages).
    fn places(&self, _strategy: &Strategy) -> bool {
        true
    }

    /// Full prediction of a fixed strategy (with `stages`, `recompute` and `offload` set).
    fn estimate(&self, strategy: &Strategy) -> Result<Estimate, String>;
}

/// The real cost model, as the search sees it.
impl StageCostModel for tessel_symbolic::cost::CostModel {
    fn stage_cost(
        &self,
        strategy: &Strategy,
        stage: u64,
        layers: u64,
        recompute: Recompute,
        offload: Offload,
    ) -> StageCost {
        tessel_symbolic::cost::CostModel::stage_cost(
            self, strategy, stage, layers, recompute, offload,
        )
    }

    fn pipeline_shape(&self, strategy: &Strategy) -> PipelineShape {
        tessel_symbolic::cost::CostModel::pipeline_shape(self, strategy)
    }

    fn memory_capacity(&self) -> f64 {
        tessel_symbolic::cost::CostModel::memory_capacity(self)
    }

    fn estimate(&self, strategy: &Strategy) -> Result<Estimate, String> {
        tessel_symbolic::cost::CostModel::estimate(self, strategy).map_err(|e| e.to_string())
    }
}

/// A pipeline through pools of different GPUs, as the search sees it.
impl StageCostModel for tessel_symbolic::cost::PooledCostModel {
    fn stage_cost(
        &self,
        strategy: &Strategy,
        stage: u64,
        layers: u64,
        recompute: Recompute,
        offload: Offload,
    ) -> StageCost {
        tessel_symbolic::cost::PooledCostModel::stage_cost(
            self, strategy, stage, layers, recompute, offload,
        )
    }

    fn pipeline_shape(&self, strategy: &Strategy) -> PipelineShape {
        tessel_symbolic::cost::PooledCostModel::pipeline_shape(self, strategy)
    }

    fn memory_capacity(&self) -> f64 {
        tessel_symbolic::cost::PooledCostModel::memory_capacity(self)
    }

    fn stage_memory_capacity(&self, strategy: &Strategy, stage: u64) -> f64 {
        tessel_symbolic::cost::PooledCostModel::stage_memory_capacity(self, strategy, stage)
    }

    fn places(&self, strategy: &Strategy) -> bool {
        self.stages_per_pool(strategy).is_some()
    }

    fn estimate(&self, strategy: &Strategy) -> Result<Estimate, String> {
        tessel_symbolic::cost::PooledCostModel::estimate(self, strategy).map_err(|e| e.to_string())
    }
}
