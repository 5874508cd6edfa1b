//! The predicted timeline of one step: the planner's pipeline schedule (the generator the
//! runtime executes) run as a discrete-event simulation with per-stage durations from the
//! plan's prediction.
//!
//! Durations: the cost model gives each stage's time per micro-batch (`microbatch_s`, forward
//! plus backward through all its chunks, with recompute and exposed communication) and its
//! once-per-step tail. The compute part is split forward : backward = 1 : 2 (the backward pass
//! computes gradients of both inputs and weights, twice the forward's FLOPs); recompute is a
//! second forward done during the backward, so it joins the backward; exposed communication is
//! split 1 : 2 like the compute it waits on. A stage's chunks share its time in proportion to
//! their layers. Transfers between stages take no time of their own (their exposed part is
//! already inside the stage times), so with equal stages the simulated end of the step equals
//! the prediction's `m·t + (p−1)·t/v + tail` exactly.

use tessel_symbolic::cost::CostModel;

use super::error::ReportError;
use crate::plan::Plan;
use crate::schedule::{Instruction, MessageKey, PipelineSchedule};
use std::collections::HashMap;

/// Forward or backward of one micro-batch through one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    Forward,
    Backward,
}

/// One compute box of the timeline.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WorkBox {
    pub pass: Pass,
    pub microbatch: u64,
    pub chunk: u64,
    pub start_s: f64,
    pub end_s: f64,
    /// The exposed communication inside the box, drawn at its end.
    pub comm_s: f64,
}

/// Per-chunk durations of one stage.
#[derive(Clone, Debug, PartialEq)]
pub struct StageDurations {
    pub forward_s: Vec<f64>,
    pub backward_s: Vec<f64>,
    pub forward_comm_s: Vec<f64>,
    pub backward_comm_s: Vec<f64>,
    /// Exposed gradient reduction and offload traffic after the last backward.
    pub tail_comm_s: f64,
    /// The optimizer step after the tail communication.
    pub optimizer_s: f64,
}

/// What one pipeline stage does during the step.
#[derive(Clone, Debug, PartialEq)]
pub struct StageLane {
    pub stage: u64,
    pub boxes: Vec<WorkBox>,
    /// When the last backward ends and the gradient reduction starts.
    pub tail_start_s: f64,
    pub tail_comm_s: f64,
    pub optimizer_s: f64,
}

impl StageLane {
    pub fn end_s(&self) -> f64 {
        self.tail_start_s + self.tail_comm_s + self.optimizer_s
    }

    /// Time the stage spends in neither compute nor its tail before the step ends.
    pub fn idle_s(&self, step_s: f64) -> f64 {
        let busy: f64 = self.boxes.iter().map(|b| b.end_s - b.start_s).sum();
        (step_s - busy - self.tail_comm_s - self.optimizer_s).max(0.0)
    }
}

/// The predicted timeline of one step.
#[derive(Clone, Debug, PartialEq)]
pub struct PredictedTimeline {
    pub stages: u64,
    pub microbatches: u64,
    pub chunks: u64,
    pub lanes: Vec<StageLane>,
    /// The prediction's step time, for comparison with the simulated end.
    pub predicted_step_s: f64,
}

impl PredictedTimeline {
    /// When the last stage finishes its optimizer step.
    pub fn end_s(&self) -> f64 {
        self.lanes.iter().map(StageLane::end_s).fold(0.0, f64::max)
    }
}

/// Builds the predicted timeline of `plan`.
pub fn predicted_timeline(plan: &Plan) -> Result<PredictedTimeline, ReportError> {
    let config = &plan.config;
    let chunks = config.interleave.max(1);
    let schedule = PipelineSchedule::interleaved(config.pp, config.microbatches, chunks)
        .map_err(|error| ReportError::Schedule { error })?;
    let durations = stage_durations(plan, chunks)?;
    let lanes = simulate(&schedule, &durations)?;
    Ok(PredictedTimeline {
        stages: config.pp,
        microbatches: config.microbatches,
        chunks,
        lanes,
        predicted_step_s: plan.prediction.step_time_s,
    })
}

/// Per-stage, per-chunk durations from the cost model and the plan's prediction.
pub fn stage_durations(plan: &Plan, chunks: u64) -> Result<Vec<StageDurations>, ReportError> {
    let stages_error = |message: String| ReportError::Stages { message };
    if plan.stages.len() as u64 != plan.config.pp
        || plan.prediction.stages.len() != plan.stages.len()
    {
        return Err(stages_error(format!(
            "pp is {} but the plan lists {} stages and predicts {}",
            plan.config.pp,
            plan.stages.len(),
            plan.prediction.stages.len()
        )));
    }
    let model = CostModel::new(&plan.spec).map_err(|error| ReportError::CostModel {
        message: error.to_string(),
    })?;
    let strategy = plan.strategy();
    let m = plan.config.microbatches.max(1) as f64;
    plan.stages
        .iter()
        .zip(&plan.prediction.stages)
        .map(|(stage, predicted)| {
            if stage.layer_ranges.len() as u64 != chunks || stage.layers == 0 {
                return Err(stages_error(format!(
                    "stage {} has {} layer ranges and {} layers; interleave is {chunks}",
                    stage.stage,
                    stage.layer_ranges.len(),
                    stage.layers
                )));
            }
            let cost = model.stage_cost(
                &strategy,
                stage.stage,
                stage.layers,
                stage.recompute,
                stage.offload,
            );
            let compute = predicted.time.compute / m;
            let recompute = predicted.time.recompute / m;
            let comm = (cost.microbatch_s - compute - recompute).max(0.0);
            let optimizer = predicted.time.optimizer.min(cost.tail_s).max(0.0);
            let share =
                |range: &[u64; 2]| range[1].saturating_sub(range[0]) as f64 / stage.layers as f64;
            let shares: Vec<f64> = stage.layer_ranges.iter().map(share).collect();
            let per_chunk = |value: f64| shares.iter().map(|s| value * s).collect::<Vec<f64>>();
            Ok(StageDurations {
                forward_s: per_chunk(compute / 3.0 + comm / 3.0),
                backward_s: per_chunk(compute * 2.0 / 3.0 + recompute + comm * 2.0 / 3.0),
                forward_comm_s: per_chunk(comm / 3.0),
                backward_comm_s: per_chunk(comm * 2.0 / 3.0),
                tail_comm_s: (cost.tail_s - optimizer).max(0.0),
                optimizer_s: optimizer,
            })
        })
        .collect()
}

/// Runs the schedule with per-stage durations, recording every compute box.
pub fn simulate(
    schedule: &PipelineSchedule,
    durations: &[StageDurations],
) -> Result<Vec<StageLane>, ReportError> {
    let n = schedule.ranks.len();
    let mut pc = vec![0usize; n];
    let mut clock = vec![0.0f64; n];
    let mut lanes: Vec<StageLane> = (0..n)
        .map(|rank| StageLane {
            stage: rank as u64,
            boxes: Vec::new(),
            tail_start_s: 0.0,
            tail_comm_s: durations[rank].tail_comm_s,
            optimizer_s: durations[rank].optimizer_s,
        })
        .collect();
    let mut sent: HashMap<MessageKey, f64> = HashMap::new();
    loop {
        let mut progressed = false;
        for rank in 0..n {
            let d = &durations[rank];
            while let Some(instruction) = schedule.ranks[rank].get(pc[rank]) {
                match *instruction {
                    Instruction::Forward { microbatch, chunk } => {
                        let c = chunk as usize;
                        let start = clock[rank];
                        clock[rank] += d.forward_s[c];
                        lanes[rank].boxes.push(WorkBox {
                            pass: Pass::Forward,
                            microbatch,
                            chunk,
                            start_s: start,
                            end_s: clock[rank],
                            comm_s: d.forward_comm_s[c],
                        });
                    }
                    Instruction::Backward { microbatch, chunk } => {
                        let c = chunk as usize;
                        let start = clock[rank];
                        clock[rank] += d.backward_s[c];
                        lanes[rank].boxes.push(WorkBox {
                            pass: Pass::Backward,
                            microbatch,
                            chunk,
                            start_s: start,
                            end_s: clock[rank],
                            comm_s: d.backward_comm_s[c],
                        });
                    }
                    Instruction::SendActivation { .. } | Instruction::SendGrad { .. } => {
                        if let Some(key) = schedule.message_key(rank as u64, instruction) {
                            sent.insert(key, clock[rank]);
                        }
                    }
                    Instruction::RecvActivation { .. } | Instruction::RecvGrad { .. } => {
                        let ready = schedule
                            .message_key(rank as u64, instruction)
                            .and_then(|key| sent.get(&key).copied());
                        match ready {
                            Some(t) => clock[rank] = clock[rank].max(t),
                            None => break,
                        }
                    }
                    Instruction::ReduceGradients => lanes[rank].tail_start_s = clock[rank],
                    Instruction::OptimizerStep => {}
                }
                pc[rank] += 1;
                progressed = true;
            }
        }
        let stuck: Vec<usize> = (0..n)
            .filter(|&r| pc[r] < schedule.ranks[r].len())
            .collect();
        if stuck.is_empty() {
            return Ok(lanes);
        }
        if !progressed {
            return Err(ReportError::Stages {
                message: format!("the pipeline schedule deadlocks on ranks {stuck:?}"),
            });
        }
    }
}
