//! The deployment search: for every instance shape and batch limit, the highest request rate
//! one instance sustains within the SLO (found by simulating it), then the deployments that
//! serve the workload's rate from those instances, colocated or disaggregated (DistServe's
//! method: each phase's goodput per instance, then as many instances of each as the rate
//! needs). Deployments are ranked by goodput per GPU; the best few are simulated whole at the
//! workload's rate.

use rayon::prelude::*;
use tessel_grammar::{DeploymentChoice, Request, ServingSpec};
use tessel_symbolic::serving::InstanceShape;

use super::deployment::{cost_model, simulate_alone, Deployment, LatencySummary, Phase};
use super::engine::{BatchLimits, Role};
use super::workload::{rescaled_trace, synthetic_requests};

/// Fewest requests a rate probe simulates: enough for its attainment to move in steps of
/// 0.5 %.
pub const PROBE_REQUESTS: u64 = 200;

/// A probe spans this many lifetimes of a request held to the SLO, so that the instance
/// reaches its steady load before the requests run out.
const PROBE_LIFETIMES: f64 = 4.0;

/// Batch limits tried: vLLM's sequence cap, and its token budgets for latency (2,048, the
/// chunked-prefill default for online serving) and for throughput (8,192).
pub const BATCH_LIMITS: [BatchLimits; 2] = [
    BatchLimits {
        max_sequences: 256,
        max_batched_tokens: 2048,
    },
    BatchLimits {
        max_sequences: 256,
        max_batched_tokens: 8192,
    },
];

/// Bisection steps on a rate once it is bracketed: about 1 % of relative precision.
const BISECTION_STEPS: u32 = 7;

/// The slowest rate probed, requests per second: below it the SLO is out of reach.
const MIN_RATE: f64 = 1.0 / 64.0;

/// What a request stream is made of: the spec's distributions or its trace.
#[derive(Clone, Copy)]
pub struct RequestSource<'a> {
    pub spec: &'a ServingSpec,
    /// The trace's requests, when the workload names one.
    pub trace: Option<&'a [Request]>,
}

impl RequestSource<'_> {
    /// `count` requests arriving at `rate` per second.
    pub fn requests(&self, rate: f64, count: u64) -> Vec<Request> {
        match self.trace {
            Some(trace) => rescaled_trace(trace, &self.spec.model, rate, count),
            None => synthetic_requests(&self.spec.serve.workload, &self.spec.model, rate, count),
        }
    }
}

/// One instance configuration in one role, and the highest rate it sustains within the SLO.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InstanceGoodput {
    pub role: Role,
    pub shape: InstanceShape,
    pub limits: BatchLimits,
    /// Requests per second one instance serves within the SLO; 0 when it cannot at any rate.
    pub rate: f64,
    /// Which target fails first above that rate: `ttft` or `tpot`.
    pub binding: &'static str,
}

/// A deployment sized for the workload's rate and what it achieves there.
#[derive(Clone, Debug, PartialEq)]
pub struct RankedDeployment {
    pub deployment: Deployment,
    /// The rate the deployment sustains within the SLO (its instances' rates, the smaller
    /// phase's for a disaggregated one), requests per second.
    pub sustained_rate: f64,
    /// `sustained_rate` per GPU: DistServe's per-GPU goodput of the deployment.
    pub capacity_per_gpu: f64,
    /// Which target binds: the limiting phase's.
    pub binding: &'static str,
    /// Simulated at the workload's rate: `None` when not simulated.
    pub at_rate: Option<LatencySummary>,
}

/// The instance shapes of the search: tensor parallel inside a node dividing the heads,
/// pipeline stages up to the cluster's nodes, weights leaving room for a KV cache of one
/// longest request.
pub fn instance_shapes(spec: &ServingSpec, longest_request: u64) -> Vec<InstanceShape> {
    let cluster = &spec.cluster;
    let model = &spec.model;
    let total = cluster.total_gpus();
    let mut shapes = Vec::new();
    for tp in [1u64, 2, 4, 8, 16] {
        if tp > cluster.gpus_per_node || !model.heads.is_multiple_of(tp) {
            continue;
        }
        for pp in [1u64, 2, 4, 8] {
            if tp * pp > total || pp > model.layers {
                continue;
            }
            let shape = InstanceShape { tp, pp };
            let fits = BATCH_LIMITS.iter().any(|limits| {
                cost_model(spec, shape)
                    .kv_capacity_tokens(limits.max_batched_tokens, limits.max_sequences)
                    .is_some_and(|tokens| tokens >= longest_request)
            });
            if fits {
                shapes.push(shape);
                // More stages only cost hops once the weights fit.
                break;
            }
        }
    }
    shapes
}

/// Requests a probe at `rate` simulates: [`PROBE_LIFETIMES`] lifetimes of a request held to
/// the SLO (its first token, then its mean output at the per-token target), at least
/// [`PROBE_REQUESTS`], at most the workload's count.
fn probe_requests(spec: &ServingSpec, rate: f64) -> u64 {
    let workload = &spec.serve.workload;
    let slo = &spec.serve.slo;
    let lifetime = slo.ttft + workload.output.mean * slo.tpot;
    let count = (rate * PROBE_LIFETIMES * lifetime).ceil() as u64;
    count.clamp(PROBE_REQUESTS.min(workload.requests), workload.requests)
}

/// Attainment of one instance in `role` at `rate`: (both targets, TTFT, TPOT) as the role
/// is judged — a prefill instance on TTFT, a decode instance on TPOT.
fn probe(
    source: &RequestSource,
    role: Role,
    shape: InstanceShape,
    limits: BatchLimits,
    rate: f64,
) -> Option<(f64, f64, f64)> {
    let spec = source.spec;
    let requests = source.requests(rate, probe_requests(spec, rate));
    let phase = Phase {
        shape,
        limits,
        instances: 1,
    };
    let latencies = simulate_alone(spec, &phase, role, &requests)?;
    // The first quarter fills an empty instance; the rest is judged at the load it settles
    // into (or, overloaded, keeps growing into).
    Some(latencies.attainment_after(&spec.serve.slo, requests.len() / 4))
}

/// Whether the role meets the SLO's attainment at `rate`, and which target fails when not.
fn meets(
    source: &RequestSource,
    role: Role,
    shape: InstanceShape,
    limits: BatchLimits,
    rate: f64,
) -> (bool, &'static str) {
    let target = source.spec.serve.slo.attainment;
    match probe(source, role, shape, limits, rate) {
        None => (false, "kv_cache"),
        Some((both, ttft, tpot)) => {
            let judged = match role {
                Role::Both => both,
                Role::Prefill => ttft,
                Role::Decode => tpot,
            };
            let binding = if ttft <= tpot { "ttft" } else { "tpot" };
            (judged >= target, binding)
        }
    }
}

/// The highest rate at which one instance meets the SLO: doubling until it fails, then
/// bisecting.
pub fn instance_goodput(
    source: &RequestSource,
    role: Role,
    shape: InstanceShape,
    limits: BatchLimits,
) -> InstanceGoodput {
    let result = |rate: f64, binding: &'static str| InstanceGoodput {
        role,
        shape,
        limits,
        rate,
        binding,
    };
    let (ok, binding) = meets(source, role, shape, limits, MIN_RATE);
    if !ok {
        return result(0.0, binding);
    }
    let (mut low, mut high) = (MIN_RATE, 2.0 * MIN_RATE);
    let mut binding = binding;
    loop {
        let (ok, b) = meets(source, role, shape, limits, high);
        if !ok {
            binding = b;
            break;
        }
        low = high;
        high *= 2.0;
        if high > 1e6 {
            return result(low, binding);
        }
    }
    for _ in 0..BISECTION_STEPS {
        let middle = 0.5 * (low + high);
        let (ok, b) = meets(source, role, shape, limits, middle);
        if ok {
            low = middle;
        } else {
            high = middle;
            binding = b;
        }
    }
    result(low, binding)
}

/// Every deployment of the spec's choice that serves `rate` on the cluster by its instances'
/// probes, fewest GPUs first (the most goodput per GPU at that rate), then the most capacity
/// per GPU, then the deployment's order.
pub fn rank_deployments(source: &RequestSource, rate: f64) -> (Vec<RankedDeployment>, usize) {
    let spec = source.spec;
    let longest = source
        .requests(
            rate.max(MIN_RATE),
            spec.serve.workload.requests.min(PROBE_REQUESTS),
        )
        .iter()
        .map(|r| r.prompt + r.output)
        .max()
        .unwrap_or(1);
    let shapes = instance_shapes(spec, longest);
    let roles: &[Role] = match spec.serve.deployment {
        DeploymentChoice::Colocated => &[Role::Both],
        DeploymentChoice::Disaggregated => &[Role::Prefill, Role::Decode],
        DeploymentChoice::Auto => &[Role::Both, Role::Prefill, Role::Decode],
    };
    let configs: Vec<(Role, InstanceShape, BatchLimits)> = roles
        .iter()
        .flat_map(|&role| {
            // A decode instance batches one token per sequence: its token budget never binds.
            let limits: &[BatchLimits] = if role == Role::Decode {
                &BATCH_LIMITS[..1]
            } else {
                &BATCH_LIMITS
            };
            shapes
                .iter()
                .flat_map(move |&shape| limits.iter().map(move |&limits| (role, shape, limits)))
        })
        .collect();
    let tried = configs.len();
    let goodputs: Vec<InstanceGoodput> = configs
        .par_iter()
        .map(|&(role, shape, limits)| instance_goodput(source, role, shape, limits))
        .collect();
    let total = spec.cluster.total_gpus();
    let per_node = spec.cluster.gpus_per_node;
    let mut ranked = Vec::new();
    let of = |role: Role| {
        goodputs
            .iter()
            .filter(move |g| g.role == role && g.rate > 0.0)
    };
    // Each deployment with the fewest instances that serve the rate, and with one more of each
    // phase: the full simulation at the rate may find the fewest too few.
    for g in of(Role::Both) {
        let fewest = (rate / g.rate).ceil().max(1.0) as u64;
        for instances in [fewest, fewest + 1] {
            let phase = Phase {
                shape: g.shape,
                limits: g.limits,
                instances,
            };
            if phase.gpus() <= total {
                ranked.push(RankedDeployment {
                    deployment: Deployment::Colocated(phase),
                    sustained_rate: instances as f64 * g.rate,
                    capacity_per_gpu: g.rate / g.shape.gpus() as f64,
                    binding: g.binding,
                    at_rate: None,
                });
            }
        }
    }
    for p in of(Role::Prefill) {
        for d in of(Role::Decode) {
            let fewest_prefill = (rate / p.rate).ceil().max(1.0) as u64;
            let fewest_decode = (rate / d.rate).ceil().max(1.0) as u64;
            for (prefills, decodes) in [
                (fewest_prefill, fewest_decode),
                (fewest_prefill + 1, fewest_decode),
                (fewest_prefill, fewest_decode + 1),
            ] {
                let prefill = Phase {
                    shape: p.shape,
                    limits: p.limits,
                    instances: prefills,
                };
                let decode = Phase {
                    shape: d.shape,
                    limits: d.limits,
                    instances: decodes,
                };
                let gpus = prefill.gpus() + decode.gpus();
                if gpus > total {
                    continue;
                }
                let prefill_rate = prefills as f64 * p.rate;
                let decode_rate = decodes as f64 * d.rate;
                let sustained = prefill_rate.min(decode_rate);
                ranked.push(RankedDeployment {
                    deployment: Deployment::Disaggregated {
                        prefill,
                        decode,
                        same_node: p.shape.gpus() + d.shape.gpus() <= per_node,
                    },
                    sustained_rate: sustained,
                    capacity_per_gpu: sustained / gpus as f64,
                    binding: if prefill_rate <= decode_rate {
                        "ttft"
                    } else {
                        "tpot"
                    },
                    at_rate: None,
                });
            }
        }
    }
    ranked.sort_by(|a, b| {
        a.deployment
            .gpus()
            .cmp(&b.deployment.gpus())
            .then(b.capacity_per_gpu.total_cmp(&a.capacity_per_gpu))
            .then(a.deployment.cmp(&b.deployment))
    });
    (ranked, tried)
}
