//! Calibration from a cluster's own measurements (`tessel calibrate`): the primitives' cost
//! functions refitted to what the user measured on their machines, from the committed values
//! and inside the same physical ranges as the published fit (`primitives::fit`).
//!
//! Today: NCCL's collectives from nccl-tests output. The file written (`cluster.cal.json`,
//! [`ClusterCalibration`]) records each input, the fitted parameters, how far each moved and
//! whether it stopped on its range's bound, and the error on the measurements before and after.

use serde::{Deserialize, Serialize};

use crate::primitives::fit::{
    collective_values, fit_collectives, predict_collective, relative_error, COLLECTIVE_RANGES,
};
use crate::primitives::{CollectiveMeasurement, CollectiveParams};

pub use tessel_grammar::CALIBRATION_FORMAT;

/// A calibration of one cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterCalibration {
    pub format: String,
    /// The spec's cluster it was measured on.
    pub cluster: String,
    pub inputs: Vec<CalibrationInput>,
    /// NCCL's parameters on this cluster.
    pub collectives: CollectiveParams,
    pub fit: CollectiveFit,
}

/// One measured file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CalibrationInput {
    pub file: String,
    /// `nccl-tests`.
    pub kind: String,
    /// `all_reduce`, `all_gather`, `reduce_scatter`, `alltoall`, `sendrecv`.
    pub collective: String,
    pub ranks: u64,
    pub ranks_per_node: u64,
    pub rows: usize,
}

/// How the collectives' fit went.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CollectiveFit {
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
}

/// Fits NCCL's parameters to `measurements`, starting from `start` (the committed values).
pub fn calibrate_collectives(
    cluster: &str,
    inputs: Vec<CalibrationInput>,
    measurements: &[CollectiveMeasurement],
    start: &CollectiveParams,
) -> ClusterCalibration {
    let rows: Vec<&CollectiveMeasurement> = measurements.iter().collect();
    let fitted = fit_collectives(&rows, start);
    let median_error = |params: &CollectiveParams| {
        let mut errors: Vec<f64> = rows
            .iter()
            .map(|r| relative_error(predict_collective(r, params), r.seconds).abs())
            .collect();
        crate::primitives::fit::median(&mut errors)
    };
    let parameters = COLLECTIVE_RANGES
        .iter()
        .zip(
            collective_values(start)
                .into_iter()
                .zip(collective_values(&fitted)),
        )
        .map(|(range, (before, after))| {
            let slack = 1e-3 * (range.high - range.low);
            ParameterMove {
                name: range.name.to_string(),
                before,
                after,
                low: range.low,
                high: range.high,
                on_bound: after - range.low <= slack || range.high - after <= slack,
            }
        })
        .collect();
    ClusterCalibration {
        format: CALIBRATION_FORMAT.to_string(),
        cluster: cluster.to_string(),
        inputs,
        collectives: fitted,
        fit: CollectiveFit {
            rows: rows.len(),
            median_error_before: median_error(start),
            median_error_after: median_error(&fitted),
            parameters,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::primitives::{Collective, Links};

    #[test]
    fn measurements_made_by_known_parameters_are_reproduced() {
        // A cluster whose NCCL is slower to start and less efficient across nodes than the
        // committed fit: an all-reduce sweep over 16 ranks, 8 per node, and an 8-rank one.
        let truth = CollectiveParams {
            call_latency_s: 30e-6,
            inter_efficiency: 0.6,
            ..CollectiveParams::default()
        };
        let links = Links {
            intra_bandwidth: 450e9,
            inter_bandwidth: 50e9,
        };
        let mut rows = Vec::new();
        for (ranks, per_node) in [(16.0, 8.0), (8.0, 8.0)] {
            for power in (3..34).step_by(2) {
                let mut row = CollectiveMeasurement {
                    source: format!("{ranks} ranks"),
                    system: "test".into(),
                    kind: Collective::AllReduce,
                    ranks,
                    per_node,
                    bytes: f64::from(2u32).powi(power),
                    links,
                    seconds: 1.0,
                    reported_degraded: false,
                };
                row.seconds = predict_collective(&row, &truth);
                rows.push(row);
            }
        }
        let cal = calibrate_collectives("test", vec![], &rows, &CollectiveParams::default());
        assert!(cal.fit.median_error_before > 0.05, "{:?}", cal.fit);
        assert!(cal.fit.median_error_after < 0.01, "{:?}", cal.fit);
        let moved = |name: &str| cal.fit.parameters.iter().find(|p| p.name == name).unwrap();
        assert!((moved("inter_efficiency").after - 0.6).abs() < 0.03);
        assert!(!moved("inter_efficiency").on_bound);
    }
}
