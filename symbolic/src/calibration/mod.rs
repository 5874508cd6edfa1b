//! Calibration from a cluster's own measurements (`tessel calibrate`): the primitives' cost
//! functions refitted to what the user measured on their machines, from the committed values
//! and inside the same physical ranges as the published fit (`primitives::fit`), but for the
//! GEMMs' level ([`CLUSTER_GEMM_RANGES`]) and the links' efficiencies and a call's fixed time
//! ([`CLUSTER_COLLECTIVE_RANGES`]).
//!
//! NCCL's collectives from nccl-tests output and traced collectives, the GEMM primitive from
//! GEMM timings (a CSV, a profiler trace's GEMMs, the matmuls a Tessel trace timed), and the
//! step's compute from traced training steps ([`compute`]). The file written
//! (`cluster.cal.json`, [`ClusterCalibration`]) records each input, the fitted parameters of
//! each primitive measured, how far each moved and whether it stopped on its range's bound, and
//! the error on the measurements before and after.

mod compute;

use serde::{Deserialize, Serialize};

pub use compute::{
    fit_cluster_compute, rank_jitter, StageWork, StepPrediction, TracedStep, COMPUTE_RANGES,
};

use crate::primitives::fit::{
    collective_loss, collective_values, fit_collectives, fit_gemms, gemm_loss, gemm_values,
    predict_collective, predict_gemm, relative_error, PrimitiveScore, Range, COLLECTIVE_RANGES,
    GEMM_RANGES,
};
use crate::primitives::{
    CollectiveMeasurement, CollectiveParams, GemmMeasurement, GemmParams, POWER_CAPPED_GEMM_RATE,
};

pub use tessel_grammar::CALIBRATION_FORMAT;

/// A calibration of one cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterCalibration {
    pub format: String,
    /// The spec's cluster it was measured on.
    pub cluster: String,
    pub inputs: Vec<CalibrationInput>,
    /// NCCL's parameters on this cluster, when collectives were measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collectives: Option<CollectiveParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collectives_fit: Option<PrimitiveFit>,
    /// The GEMM primitive's parameters on this cluster's GPU, when GEMMs were measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm: Option<GemmParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm_fit: Option<PrimitiveFit>,
    /// The step's compute on this cluster, when training steps were traced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute: Option<crate::cost::ComputeParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_fit: Option<PrimitiveFit>,
}

/// One measured file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CalibrationInput {
    pub file: String,
    /// `nccl-tests` or `gemm-csv`.
    pub kind: String,
    /// What it measured: a collective (`all_reduce`, ...), or `gemm`.
    pub measures: String,
    /// Ranks and ranks per node of a collective's run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranks: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranks_per_node: Option<u64>,
    pub rows: usize,
}

/// How one primitive's fit went.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrimitiveFit {
    pub rows: usize,
    /// Median |predicted / measured − 1| with the committed parameters.
    pub median_error_before: f64,
    /// The same with the fitted ones.
    pub median_error_after: f64,
    /// Every parameter, before and after.
    pub parameters: Vec<ParameterMove>,
}

/// One parameter's move.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParameterMove {
    pub name: String,
    pub before: f64,
    pub after: f64,
    pub low: f64,
    pub high: f64,
    /// Stopped within 0.1 % of the range's width from an end: the measurements would take it
    /// further, so some mechanism is missing or the cluster's links are not what the spec says.
    pub on_bound: bool,
    /// The values, the others held at their fit, over which the fit's mean |log error| stays
    /// within [`SUPPORT_SLACK`] of its minimum: how tightly the measurements pin it down (a
    /// range as wide as the parameter's own says they do not).
    pub supported: [f64; 2],
}

/// How much worse than the fit a parameter's value may make the loss and still count as
/// supported by the measurements: 10 % of the loss, and at least half a point of mean
/// |log error|.
pub const SUPPORT_SLACK: f64 = 0.1;
const SUPPORT_FLOOR: f64 = 0.005;
/// Points of each parameter's range tried around the fit.
const SUPPORT_POINTS: usize = 200;

/// Fits NCCL's parameters to `measurements` from `start` (the committed values).
pub fn fit_cluster_collectives(
    measurements: &[CollectiveMeasurement],
    start: &CollectiveParams,
) -> (CollectiveParams, PrimitiveFit) {
    let rows: Vec<&CollectiveMeasurement> = measurements.iter().collect();
    let fitted = fit_collectives(&rows, start, &CLUSTER_COLLECTIVE_RANGES);
    let errors = |params: &CollectiveParams| {
        rows.iter()
            .map(|r| relative_error(predict_collective(r, params), r.seconds))
            .collect()
    };
    let fit = summary(
        errors(start),
        errors(&fitted),
        &CLUSTER_COLLECTIVE_RANGES,
        collective_values(start),
        collective_values(&fitted),
        |x| collective_loss(&rows, x),
    );
    (fitted, fit)
}

/// [`COLLECTIVE_RANGES`] with the links' efficiencies down to 2 % of the spec's bandwidths and
/// a call's fixed time up to a millisecond: a datasheet fabric under NCCL delivers at least
/// 40 % of its nominal bandwidth, but a cluster's links may be far from what its spec names
/// (the CPU ranks' "links" are copies between threads into fresh allocations, 2–3.5 GB/s
/// against the spec's 10), and an efficiency held above what was measured moves the latencies
/// to their bounds instead.
pub const CLUSTER_COLLECTIVE_RANGES: [Range; 9] = [
    Range {
        name: "call_latency_s",
        low: COLLECTIVE_RANGES[0].low,
        high: 1e-3,
    },
    COLLECTIVE_RANGES[1],
    COLLECTIVE_RANGES[2],
    COLLECTIVE_RANGES[3],
    COLLECTIVE_RANGES[4],
    Range {
        name: "intra_efficiency",
        low: 0.02,
        high: COLLECTIVE_RANGES[5].high,
    },
    Range {
        name: "inter_efficiency",
        low: 0.02,
        high: COLLECTIVE_RANGES[6].high,
    },
    Range {
        name: "nvls_efficiency",
        low: 0.02,
        high: COLLECTIVE_RANGES[7].high,
    },
    COLLECTIVE_RANGES[8],
];

/// [`GEMM_RANGES`] with the level down to 2 % of the spec's peak, as the step's fractions
/// ([`COMPUTE_RANGES`]): a datasheet GPU's cuBLAS reaches at least half of it, but a cluster's
/// spec may give a nominal peak (the CPU ranks' is AVX-512's; an AVX2 core multiplies at
/// 0.36 of it), and a level held above what was measured would move the shape parameters
/// instead (short `k` fitted 10 times too slow).
pub const CLUSTER_GEMM_RANGES: [Range; 4] = [
    Range {
        name: "efficiency",
        low: 0.02,
        high: 1.0,
    },
    GEMM_RANGES[1],
    GEMM_RANGES[2],
    GEMM_RANGES[3],
];

/// Fits the GEMM primitive to `measurements` from `start` (the committed values for the GPU's
/// generation).
pub fn fit_cluster_gemms(
    measurements: &[GemmMeasurement],
    start: &GemmParams,
) -> (GemmParams, PrimitiveFit) {
    let rows: Vec<&GemmMeasurement> = measurements.iter().collect();
    let fitted = fit_gemms(&rows, start, &CLUSTER_GEMM_RANGES);
    let errors = |params: &GemmParams| {
        rows.iter()
            .map(|r| relative_error(predict_gemm(r, params, POWER_CAPPED_GEMM_RATE), r.seconds))
            .collect()
    };
    let fit = summary(
        errors(start),
        errors(&fitted),
        &CLUSTER_GEMM_RANGES,
        gemm_values(start),
        gemm_values(&fitted),
        |x| gemm_loss(&rows, x),
    );
    (fitted, fit)
}

fn summary(
    before: Vec<f64>,
    after: Vec<f64>,
    ranges: &[Range],
    start: Vec<f64>,
    fitted: Vec<f64>,
    loss: impl Fn(&[f64]) -> f64,
) -> PrimitiveFit {
    let best = loss(&fitted);
    let limit = best + (SUPPORT_SLACK * best).max(SUPPORT_FLOOR);
    let parameters = ranges
        .iter()
        .zip(start.into_iter().zip(fitted.iter().copied()))
        .enumerate()
        .map(|(i, (range, (before, after)))| {
            let slack = 1e-3 * (range.high - range.low);
            ParameterMove {
                name: range.name.to_string(),
                before,
                after,
                low: range.low,
                high: range.high,
                on_bound: after - range.low <= slack || range.high - after <= slack,
                supported: supported(&fitted, i, range, |x| loss(x) <= limit),
            }
        })
        .collect();
    PrimitiveFit {
        rows: before.len(),
        median_error_before: PrimitiveScore::median_abs(&before),
        median_error_after: PrimitiveScore::median_abs(&after),
        parameters,
    }
}

/// The contiguous span of parameter `i`'s range around its fitted value where `accepted`
/// holds, the other parameters at their fit.
fn supported(
    fitted: &[f64],
    i: usize,
    range: &Range,
    accepted: impl Fn(&[f64]) -> bool,
) -> [f64; 2] {
    let at = |value: f64| {
        let mut x = fitted.to_vec();
        x[i] = value;
        accepted(&x)
    };
    let step = (range.high - range.low) / SUPPORT_POINTS as f64;
    let walk = |direction: f64| {
        let mut edge = fitted[i];
        loop {
            let next = edge + direction * step;
            if next < range.low - 1e-12 * step.abs()
                || next > range.high + 1e-12 * step.abs()
                || !at(next)
            {
                return edge;
            }
            edge = next;
        }
    };
    [walk(-1.0), walk(1.0)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::primitives::{Collective, Links};

    #[test]
    fn measurements_made_by_known_parameters_are_reproduced() {
        // A cluster whose NCCL is slower to start and less efficient across nodes than the
        // committed fit: an all-gather sweep over 16 ranks, 8 per node (a ring through the
        // NICs), and an 8-rank all-reduce.
        let truth = CollectiveParams {
            call_latency_s: 50e-6,
            inter_efficiency: 0.6,
            ..CollectiveParams::default()
        };
        let links = Links {
            intra_bandwidth: 450e9,
            inter_bandwidth: 50e9,
            multicast: false,
        };
        let mut rows = Vec::new();
        for (ranks, per_node, kind) in [
            (16.0, 8.0, Collective::AllGather),
            (8.0, 8.0, Collective::AllReduce),
        ] {
            for power in (3..34).step_by(2) {
                let mut row = CollectiveMeasurement {
                    source: format!("{ranks} ranks"),
                    system: "test".into(),
                    kind,
                    ranks,
                    per_node,
                    bytes: f64::from(2u32).powi(power),
                    links,
                    seconds: 1.0,
                    gpus_per_thread: 1.0,
                    never_fitted: false,
                };
                row.seconds = predict_collective(&row, &truth);
                rows.push(row);
            }
        }
        let (_, fit) = fit_cluster_collectives(&rows, &CollectiveParams::default());
        assert!(fit.median_error_before > 0.05, "{fit:?}");
        assert!(fit.median_error_after < 0.01, "{fit:?}");
        let moved = |name: &str| fit.parameters.iter().find(|p| p.name == name).unwrap();
        assert!((moved("inter_efficiency").after - 0.6).abs() < 0.03);
        assert!(!moved("inter_efficiency").on_bound);
        // Large messages over the network pin the NIC efficiency.
        let [low, high] = moved("inter_efficiency").supported;
        assert!(
            low <= 0.6 && 0.6 <= high && high - low < 0.2,
            "{low}–{high}"
        );
    }
}
