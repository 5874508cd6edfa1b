//! What checkpoints cost a job that fails, and how often to take them (`train.failures`).
//!
//! A checkpoint keeps each parameter's fp32 master copy and optimizer moments (12 bytes a
//! parameter under Adam), written in equal shares by every GPU, as PyTorch's distributed
//! checkpoint balances its writes. Two targets:
//! - **host**: an in-memory snapshot, copied over each GPU's host link into the node's memory
//!   and replicated to a peer node's memory behind training (as the in-memory checkpointing of
//!   arXiv:2310.12670 does for 3D-parallel pretraining), so that a failed node's snapshot
//!   survives it.
//!   It needs two snapshots' room in each node's host memory and a second node; recovering
//!   reads the replica back over the network.
//! - **disk**: persistent storage at the spec's bandwidth per GPU, for writing and reading.
//!
//! Training stops for `δ` seconds to write a checkpoint every `τ` seconds of training. With
//! the job's mean time between failures `M` (a GPU's over the GPU count), the interval that
//! loses the least is Young's `√(2δM)` with Daly's first-order correction, `√(2δM) − δ` (Young
//! 1974, "A first order approximation to the optimum checkpoint interval", CACM 17(9); Daly
//! 2006, "A higher order estimate of the optimum checkpoint interval for restart dumps", FGCS
//! 22(3)). Each failure then costs the restart, reading the checkpoint back and on average
//! half a period of work again, `R + (τ + δ)/2`; the goodput, the fraction of wall time that
//! trains, is `τ/(τ + δ) · (1 − (R + (τ + δ)/2)/M)`.

use serde::{Deserialize, Serialize};
use tessel_grammar::{CheckpointTarget, FailureSpec, Spec};

use crate::cost::{Calibration, StateBytes};
use crate::GIB;

const DAY_S: f64 = 86_400.0;

/// Checkpointing to one target: what it costs and what it leaves of the job's time.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointCost {
    pub target: CheckpointTarget,
    /// Bytes each GPU writes per checkpoint.
    pub bytes_per_gpu: f64,
    /// Seconds training stops to write one.
    pub write_s: f64,
    /// Seconds from a failure to training again: the restart and reading the checkpoint.
    pub recover_s: f64,
    /// Seconds of training between checkpoints.
    pub interval_s: f64,
    /// The job's mean time between failures, seconds.
    pub job_mtbf_s: f64,
    /// Fraction of wall time that trains.
    pub goodput: f64,
    /// Seconds a day lost to failures: restarts, reading checkpoints, work done again.
    pub lost_to_failures_per_day_s: f64,
    /// Seconds a day spent writing checkpoints.
    pub checkpointing_per_day_s: f64,
}

/// A target the job cannot checkpoint to, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Unavailable {
    pub target: CheckpointTarget,
    pub reason: String,
}

/// Bytes each GPU writes per checkpoint: the model's checkpointed state in equal shares.
pub fn checkpoint_bytes_per_gpu(spec: &Spec) -> f64 {
    let per_param = StateBytes::of(&spec.train, &Calibration::default()).checkpointed();
    spec.model.parameter_count().total as f64 * per_param / spec.cluster.total_gpus().max(1) as f64
}

/// Checkpointing to `target` under the spec's failures, or why the job cannot.
pub fn checkpoint_cost(
    spec: &Spec,
    failures: &FailureSpec,
    target: CheckpointTarget,
) -> Result<CheckpointCost, Unavailable> {
    let cluster = &spec.cluster;
    let bytes = checkpoint_bytes_per_gpu(spec);
    let unavailable = |reason: String| Unavailable { target, reason };
    let (write_s, read_s) = match target {
        CheckpointTarget::Host => {
            if cluster.nodes < 2 {
                return Err(unavailable(
                    "one node has no peer to hold its snapshot's replica".into(),
                ));
            }
            let needed = 2.0 * bytes * cluster.gpus_per_node as f64;
            if needed > cluster.host_memory {
                return Err(unavailable(format!(
                    "a node's snapshot and its peer's replica need {:.1} GiB of the {:.1} GiB of \
                     host memory",
                    needed / GIB,
                    cluster.host_memory / GIB
                )));
            }
            (
                bytes / cluster.host_link,
                bytes / cluster.inter_node.bandwidth,
            )
        }
        CheckpointTarget::Disk => match failures.disk_bandwidth {
            Some(bandwidth) => (bytes / bandwidth, bytes / bandwidth),
            None => {
                return Err(unavailable(
                    "no disk bandwidth: `checkpoint = { bandwidth = … }` per GPU".into(),
                ))
            }
        },
    };
    let mtbf = failures.job_mtbf_s(cluster.total_gpus());
    let recover_s = failures.restart_s + read_s;
    let interval_s = daly_interval(write_s, mtbf);
    let Losses { writing, failing } = losses(interval_s, write_s, recover_s, mtbf);
    let goodput = (1.0 - writing) * (1.0 - failing);
    Ok(CheckpointCost {
        target,
        bytes_per_gpu: bytes,
        write_s,
        recover_s,
        interval_s,
        job_mtbf_s: mtbf,
        goodput,
        lost_to_failures_per_day_s: DAY_S * failing,
        checkpointing_per_day_s: DAY_S * (1.0 - failing) * writing,
    })
}

/// Young's interval with Daly's first-order correction; the MTBF itself when a checkpoint
/// takes half of it or more.
fn daly_interval(write_s: f64, mtbf: f64) -> f64 {
    if write_s < mtbf / 2.0 {
        (2.0 * write_s * mtbf).sqrt() - write_s
    } else {
        mtbf
    }
}

/// Fractions of wall time lost: to writing checkpoints (of the time not lost to failures) and
/// to failures.
struct Losses {
    writing: f64,
    failing: f64,
}

fn losses(interval_s: f64, write_s: f64, recover_s: f64, mtbf: f64) -> Losses {
    let period = interval_s + write_s;
    Losses {
        writing: write_s / period,
        failing: ((recover_s + period / 2.0) / mtbf).min(1.0),
    }
}

/// The checkpoint plan of a spec with failures: each target it may use (the one it names, or
/// host and disk) costed or refused, the best goodput first.
pub fn checkpoint_options(spec: &Spec) -> Option<(Vec<CheckpointCost>, Vec<Unavailable>)> {
    let failures = spec.train.failures?;
    let targets: Vec<CheckpointTarget> = match failures.checkpoint_to {
        Some(target) => vec![target],
        None => CheckpointTarget::ALL.to_vec(),
    };
    let (mut costed, mut refused) = (Vec::new(), Vec::new());
    for target in targets {
        match checkpoint_cost(spec, &failures, target) {
            Ok(cost) => costed.push(cost),
            Err(why) => refused.push(why),
        }
    }
    costed.sort_by(|a, b| {
        b.goodput
            .total_cmp(&a.goodput)
            .then(a.target.cmp(&b.target))
    });
    Some((costed, refused))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daly_interval_minimises_the_loss() {
        // A job that writes for 60 s and fails every 10 hours.
        let (write, mtbf, restart) = (60.0, 36_000.0, 600.0);
        let lost = |interval: f64| {
            let l = losses(interval, write, restart, mtbf);
            1.0 - (1.0 - l.writing) * (1.0 - l.failing)
        };
        let daly = daly_interval(write, mtbf);
        assert!((daly - 2018.4).abs() < 0.1, "{daly}");
        // Within a percent of the best interval on a fine grid.
        let best = (1..20_000)
            .map(|i| i as f64)
            .map(lost)
            .fold(f64::INFINITY, f64::min);
        assert!(lost(daly) <= best * 1.01, "{} vs {best}", lost(daly));
    }
}
