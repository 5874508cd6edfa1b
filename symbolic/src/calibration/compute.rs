//! The step's compute fitted on traced training steps (`tessel launch --trace`): the cost
//! model predicts each traced run whole, stage by stage, and three parameters move until it
//! agrees with what each rank measured: the GEMMs' rate (`matmul`), the rate of the
//! elementwise passes and the optimizer (`memory`), and the fixed time of each layer's pass.
//! How much each rank's compute varies ([`rank_jitter`]) is measured first and held: the
//! predictions wait for the slowest rank at every synchronisation (`cost::stragglers`).
//!
//! Each stage's ranks give two measurements per run: their busy time (forward, backward and
//! the gradient reduction, each step) against the stage's predicted compute, recompute,
//! tensor-, context- and expert-parallel communication and data-parallel communication (the
//! runtime overlaps none of them), and their optimizer step. The run's step time is the third,
//! against the predicted step, which adds the pipeline's bubble and sends. Each measurement is
//! the median over the run's steps after the first (which allocates), and each run weighs
//! the same.

use tessel_grammar::{Spec, Strategy};

use super::{summary, PrimitiveFit};
use crate::cost::{Calibration, ComputeParams, CostError, CostModel, KernelEfficiency};
use crate::primitives::fit::{minimize, relative_error, Range};

/// The ranges the compute parameters are searched in: fractions of the spec's peak rates,
/// and up to a millisecond per layer pass.
pub const COMPUTE_RANGES: [Range; 3] = [
    Range {
        name: "matmul",
        low: 0.02,
        high: 1.0,
    },
    Range {
        name: "memory",
        low: 0.02,
        high: 1.0,
    },
    Range {
        name: "layer_overhead_s",
        low: 0.0,
        high: 1e-3,
    },
];

/// One traced run, as the cost model sees it and as it was measured.
#[derive(Clone, Debug, PartialEq)]
pub struct TracedStep {
    /// The file it came from.
    pub source: String,
    /// The trained spec on the calibrated cluster.
    pub spec: Spec,
    /// Each pipeline stage's strategy.
    pub stage_strategies: Vec<Strategy>,
    /// Median step time, seconds.
    pub step_s: f64,
    pub stages: Vec<StageWork>,
    /// How much each rank's compute varied independently of the other ranks' ([`rank_jitter`]),
    /// when its ranks synchronise only at the step's gradient reduction (inside forward and
    /// backward a synchronisation would even them out).
    pub jitter: Option<f64>,
}

/// What one pipeline stage's ranks measured per step (medians).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StageWork {
    pub stage: u64,
    /// Forward, backward and gradient reduction.
    pub busy_s: f64,
    pub optimizer_s: f64,
}

/// Predicted against measured, per measurement of one run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepPrediction {
    pub predicted_s: f64,
    pub measured_s: f64,
}

impl TracedStep {
    /// The cost model's predictions of this run's measurements (each stage's busy time and
    /// optimizer step, then the step time) under `calibration` and `efficiency`.
    pub fn predict(
        &self,
        calibration: Calibration,
        efficiency: KernelEfficiency,
    ) -> Result<Vec<StepPrediction>, CostError> {
        let model = CostModel::uncompiled(&self.spec, calibration, efficiency)?;
        // One estimate of the run: each stage's time under its own recompute and offload.
        let estimate = model.estimate(&self.step_strategy())?;
        let mut out = Vec::new();
        for work in &self.stages {
            let stage = estimate.stages.get(work.stage as usize).ok_or_else(|| {
                CostError::spec(format!(
                    "{}: the model has no stage {}",
                    self.source, work.stage
                ))
            })?;
            let t = &stage.time;
            let busy = t.total() - t.bubble - t.pp_comm - t.optimizer;
            out.push(StepPrediction {
                predicted_s: busy,
                measured_s: work.busy_s,
            });
            out.push(StepPrediction {
                predicted_s: t.optimizer,
                measured_s: work.optimizer_s,
            });
        }
        out.push(StepPrediction {
            predicted_s: estimate.step_time_s,
            measured_s: self.step_s,
        });
        Ok(out)
    }

    /// One strategy with every stage's own recompute and offload.
    pub fn step_strategy(&self) -> Strategy {
        let mut strategy = self.stage_strategies.first().cloned().unwrap_or_default();
        strategy.set_stage_options(
            self.stage_strategies.iter().map(|s| s.recompute).collect(),
            self.stage_strategies.iter().map(|s| s.offload).collect(),
        );
        strategy
    }
}

/// The coefficient of variation of one rank's compute about the step's mean over the ranks
/// of one stage: `ranks[r][s]` is rank `r`'s forward and backward seconds in step `s`.
/// Deviations from each step's mean take out what moves every rank alike (the machine's speed
/// drifting, a longer step); `n` ranks' deviations have `n − 1` degrees of freedom. `None`
/// for fewer than two ranks or three steps.
pub fn rank_jitter(ranks: &[Vec<f64>]) -> Option<f64> {
    let steps = ranks.iter().map(Vec::len).min()?;
    let n = ranks.len();
    if n < 2 || steps < 3 {
        return None;
    }
    let (mut squares, mut total) = (0.0, 0.0);
    for s in 0..steps {
        let mean = ranks.iter().map(|r| r[s]).sum::<f64>() / n as f64;
        squares += ranks.iter().map(|r| (r[s] - mean).powi(2)).sum::<f64>();
        total += mean;
    }
    let mean = total / steps as f64;
    let spread = (squares / ((n - 1) * steps) as f64).sqrt();
    (mean > 0.0).then_some(spread / mean)
}

/// The cluster's jitter: the median of the runs' that measure it.
fn measured_jitter(runs: &[TracedStep]) -> Option<f64> {
    let mut values: Vec<f64> = runs.iter().filter_map(|r| r.jitter).collect();
    (!values.is_empty()).then(|| crate::primitives::fit::median(&mut values))
}

fn with_compute(base: &Calibration, x: &[f64], jitter: f64) -> Calibration {
    base.with_compute(ComputeParams {
        matmul: x[0],
        memory: x[1],
        layer_overhead_s: x[2],
        jitter,
    })
}

/// Mean |log(predicted / measured)| of each run, averaged over runs.
fn loss(runs: &[TracedStep], efficiency: &[KernelEfficiency], cal: Calibration) -> f64 {
    let per_run: Vec<f64> = runs
        .iter()
        .zip(efficiency)
        .map(|(run, &eff)| match run.predict(cal, eff.calibrated(&cal)) {
            Ok(predictions) => {
                predictions
                    .iter()
                    .map(|p| (p.predicted_s / p.measured_s).ln().abs())
                    .sum::<f64>()
                    / predictions.len() as f64
            }
            Err(_) => f64::INFINITY,
        })
        .collect();
    per_run.iter().sum::<f64>() / per_run.len().max(1) as f64
}

/// Fits the compute parameters to `runs` from `base` (the cluster's calibration so far, its
/// collectives already fitted) and the GPU's own fractions.
pub fn fit_cluster_compute(
    runs: &[TracedStep],
    base: &Calibration,
) -> Result<(ComputeParams, PrimitiveFit), CostError> {
    let efficiency: Vec<KernelEfficiency> = runs
        .iter()
        .map(|r| KernelEfficiency::for_gpu(&r.spec.cluster.gpu))
        .collect();
    let jitter = measured_jitter(runs)
        .or(base.compute.map(|c| c.jitter))
        .unwrap_or(0.0);
    let start = match (base.compute, efficiency.first()) {
        (Some(c), _) => vec![c.matmul, c.memory, c.layer_overhead_s],
        (None, Some(e)) => vec![
            base.gemm.map_or(e.matmul, |g| g.efficiency),
            e.memory,
            base.layer_overhead_s,
        ],
        (None, None) => return Err(CostError::spec("no traced run to fit the compute to")),
    };
    let loss_at = |x: &[f64]| loss(runs, &efficiency, with_compute(base, x, jitter));
    let fitted = minimize(loss_at, &start, &COMPUTE_RANGES);
    let errors = |x: &[f64]| -> Result<Vec<f64>, CostError> {
        let cal = with_compute(base, x, jitter);
        let mut out = Vec::new();
        for (run, eff) in runs.iter().zip(&efficiency) {
            for p in run.predict(cal, eff.calibrated(&cal))? {
                out.push(relative_error(p.predicted_s, p.measured_s));
            }
        }
        Ok(out)
    };
    let fit = summary(
        errors(&start)?,
        errors(&fitted)?,
        &COMPUTE_RANGES,
        start,
        fitted.clone(),
        loss_at,
    );
    let params = ComputeParams {
        matmul: fitted[0],
        memory: fitted[1],
        layer_overhead_s: fitted[2],
        jitter,
    };
    Ok((params, fit))
}

#[cfg(test)]
mod tests {
    use super::rank_jitter;

    #[test]
    fn rank_jitter_is_each_rank_s_spread_about_its_step_s_mean() {
        // Two ranks 0.1 s apart in two of four steps; the second step, twice as long on both,
        // moves them alike and adds nothing. Deviations ±0.05 s (one degree of freedom a
        // step): 0.05 s over a mean step of 1.25 s.
        let ranks = [vec![1.1, 2.0, 0.9, 1.0], vec![1.0, 2.0, 1.0, 1.0]];
        let jitter = rank_jitter(&ranks).unwrap();
        assert!((jitter - 0.04).abs() < 1e-12, "{jitter}");
        assert_eq!(rank_jitter(&ranks[..1]), None);
        assert_eq!(rank_jitter(&[vec![1.0, 1.1], vec![1.1, 1.0]]), None);
    }
}
