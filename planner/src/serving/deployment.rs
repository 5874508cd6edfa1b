//! A deployment (instances, each phase's shape and batch limits) and its simulation over a
//! stream of requests: round-robin dispatch, then each instance's engine; for a disaggregated
//! deployment each prompt's KV cache travels from its prefill instance to its decode one.

use serde::{Deserialize, Serialize};
use tessel_grammar::{Request, ServingSpec, Slo};
use tessel_symbolic::serving::{InstanceShape, ServingCostModel};

use super::engine::{simulate_instance, Arrival, BatchLimits, Role, Timing};

/// Instances of one shape and batch limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Phase {
    pub shape: InstanceShape,
    pub limits: BatchLimits,
    pub instances: u64,
}

impl Phase {
    pub fn gpus(&self) -> u64 {
        self.shape.gpus() * self.instances
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Deployment {
    Colocated(Phase),
    /// Prefill and decode on instances of their own; `same_node` when each prefill instance
    /// shares a node with the decode instances it sends to (the KV cache goes over NVLink).
    Disaggregated {
        prefill: Phase,
        decode: Phase,
        same_node: bool,
    },
}

impl Deployment {
    /// The deployment with its instance counts left out: what its instances are.
    pub fn kind_of_instances(&self) -> Deployment {
        let bare = |p: &Phase| Phase { instances: 0, ..*p };
        match self {
            Deployment::Colocated(phase) => Deployment::Colocated(bare(phase)),
            Deployment::Disaggregated {
                prefill,
                decode,
                same_node,
            } => Deployment::Disaggregated {
                prefill: bare(prefill),
                decode: bare(decode),
                same_node: *same_node,
            },
        }
    }

    pub fn gpus(&self) -> u64 {
        match self {
            Deployment::Colocated(phase) => phase.gpus(),
            Deployment::Disaggregated {
                prefill, decode, ..
            } => prefill.gpus() + decode.gpus(),
        }
    }
}

/// Builds the cost model of an instance shape of the spec's model.
pub fn cost_model(spec: &ServingSpec, shape: InstanceShape) -> ServingCostModel {
    ServingCostModel::new(
        &spec.model,
        &spec.cluster,
        spec.serve.precision,
        spec.serve.kv_precision,
        shape,
    )
}

/// Each request's time to first token and time per output token after it, seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Latencies {
    pub ttft: Vec<f64>,
    /// `None` for a request of one output token.
    pub tpot: Vec<Option<f64>>,
}

/// Percentiles of a deployment's latencies and how many requests met the SLO.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub ttft_p50_s: f64,
    pub ttft_p90_s: f64,
    pub ttft_p99_s: f64,
    pub tpot_p50_s: f64,
    pub tpot_p90_s: f64,
    pub tpot_p99_s: f64,
    /// Fraction of requests that met both targets.
    pub attainment: f64,
    /// Fraction that met the time to first token.
    pub ttft_attainment: f64,
    /// Fraction that met the time per output token.
    pub tpot_attainment: f64,
}

/// The `q` quantile (nearest rank) of `values`.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

impl Latencies {
    fn from_timings(requests: &[Request], timings: &[Timing]) -> Latencies {
        let ttft = requests
            .iter()
            .zip(timings)
            .map(|(r, t)| t.first_token - r.arrival)
            .collect();
        let tpot = requests
            .iter()
            .zip(timings)
            .map(|(r, t)| {
                (r.output > 1).then(|| (t.finished - t.first_token) / (r.output - 1) as f64)
            })
            .collect();
        Latencies { ttft, tpot }
    }

    /// Fractions of requests meeting each target, and both.
    pub fn attainment(&self, slo: &Slo) -> (f64, f64, f64) {
        self.attainment_after(slo, 0)
    }

    /// [`Latencies::attainment`] of the requests after the first `skip` (a warm-up).
    pub fn attainment_after(&self, slo: &Slo, skip: usize) -> (f64, f64, f64) {
        let n = self.ttft.len().saturating_sub(skip).max(1) as f64;
        let (mut both, mut first, mut per_token) = (0usize, 0usize, 0usize);
        for (ttft, tpot) in self.ttft.iter().zip(&self.tpot).skip(skip) {
            let a = *ttft <= slo.ttft;
            let b = tpot.is_none_or(|t| t <= slo.tpot);
            first += usize::from(a);
            per_token += usize::from(b);
            both += usize::from(a && b);
        }
        (both as f64 / n, first as f64 / n, per_token as f64 / n)
    }

    pub fn summary(&self, slo: &Slo) -> LatencySummary {
        let mut ttft = self.ttft.clone();
        ttft.sort_by(f64::total_cmp);
        let mut tpot: Vec<f64> = self.tpot.iter().flatten().copied().collect();
        tpot.sort_by(f64::total_cmp);
        let (attainment, ttft_attainment, tpot_attainment) = self.attainment(slo);
        LatencySummary {
            ttft_p50_s: quantile(&ttft, 0.5),
            ttft_p90_s: quantile(&ttft, 0.9),
            ttft_p99_s: quantile(&ttft, 0.99),
            tpot_p50_s: quantile(&tpot, 0.5),
            tpot_p90_s: quantile(&tpot, 0.9),
            tpot_p99_s: quantile(&tpot, 0.99),
            attainment,
            ttft_attainment,
            tpot_attainment,
        }
    }
}

/// The requests `keep` keeps, as instances see them arrive.
fn arrivals(requests: &[Request], keep: impl Fn(&Request) -> bool) -> Vec<Arrival> {
    requests
        .iter()
        .enumerate()
        .filter(|(_, r)| keep(r))
        .map(|(id, r)| Arrival {
            id,
            at: r.arrival,
            prompt: r.prompt,
            output: r.output,
        })
        .collect()
}

/// Requests of one instance among `instances`, round robin.
fn dispatched(arrivals: &[Arrival], instance: u64, instances: u64) -> Vec<Arrival> {
    arrivals
        .iter()
        .skip(instance as usize)
        .step_by(instances as usize)
        .copied()
        .collect()
}

/// Runs `phase`'s instances over `arrivals` in `role`; `None` when a request never fits.
fn run_phase(
    spec: &ServingSpec,
    phase: &Phase,
    role: Role,
    arrivals: &[Arrival],
    timings: &mut [Timing],
) -> Option<()> {
    let cost = cost_model(spec, phase.shape);
    let capacity =
        cost.kv_capacity_tokens(phase.limits.max_batched_tokens, phase.limits.max_sequences)?;
    for instance in 0..phase.instances {
        let mine = dispatched(arrivals, instance, phase.instances);
        simulate_instance(&cost, role, phase.limits, capacity, &mine, timings)?;
    }
    Some(())
}

/// Simulates the deployment over `requests` (sorted by arrival); `None` when an instance's KV
/// cache cannot hold a request.
pub fn simulate(
    spec: &ServingSpec,
    deployment: &Deployment,
    requests: &[Request],
) -> Option<Latencies> {
    let arrivals = arrivals(requests, |_| true);
    let mut timings = vec![Timing::default(); requests.len()];
    match deployment {
        Deployment::Colocated(phase) => {
            run_phase(spec, phase, Role::Both, &arrivals, &mut timings)?;
        }
        Deployment::Disaggregated {
            prefill,
            decode,
            same_node,
        } => {
            run_phase(spec, prefill, Role::Prefill, &arrivals, &mut timings)?;
            // Each prompt's cache leaves its prefill instance when its first token is out
            // and reaches the decode side after the transfer, prefill and decode GPUs
            // sending and receiving their shards in parallel.
            let sender = cost_model(spec, prefill.shape);
            let mut handed: Vec<Arrival> = arrivals
                .iter()
                .filter(|a| a.output > 1)
                .map(|a| Arrival {
                    at: timings[a.id].first_token + sender.kv_transfer_time(a.prompt, *same_node),
                    ..*a
                })
                .collect();
            handed.sort_by(|a, b| a.at.total_cmp(&b.at).then(a.id.cmp(&b.id)));
            run_phase(spec, decode, Role::Decode, &handed, &mut timings)?;
        }
    }
    Some(Latencies::from_timings(requests, &timings))
}

/// One instance alone in `role`: how the search judges a shape. A decode instance's requests
/// arrive with their prompt's cache at their arrival times.
pub fn simulate_alone(
    spec: &ServingSpec,
    phase: &Phase,
    role: Role,
    requests: &[Request],
) -> Option<Latencies> {
    if role == Role::Both {
        return simulate(spec, &Deployment::Colocated(*phase), requests);
    }
    let arrivals = arrivals(requests, |r| role == Role::Prefill || r.output > 1);
    let mut timings: Vec<Timing> = requests
        .iter()
        .map(|r| Timing {
            admitted: r.arrival,
            first_token: r.arrival,
            finished: r.arrival,
        })
        .collect();
    run_phase(spec, phase, role, &arrivals, &mut timings)?;
    Some(Latencies::from_timings(requests, &timings))
}
