//! The serving plan: the chosen deployment, its runners-up, each simulated at the workload's
//! rate, and the file that records them (`tessel-plan/serve-1`, canonical JSON like training
//! plans, so that `diff` and `plan --check` read both).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tessel_grammar::{Request, ServingSpec, Slo};
use tessel_symbolic::serving::{InstanceShape, GPU_MEMORY_UTILIZATION};

use super::deployment::{cost_model, simulate, Deployment, LatencySummary, Phase};
use super::search::{rank_deployments, RankedDeployment, RequestSource, BATCH_LIMITS};
use super::workload::trace_rate;
use crate::canonical_json::to_canonical_string;

/// The `format` of serving plan files.
pub const SERVING_PLAN_FORMAT: &str = "tessel-plan/serve-1";

/// Runners-up simulated and listed when the caller does not say.
pub const DEFAULT_TOP: usize = 3;

/// Instances of one role in a deployment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlannedPhase {
    /// `both` (colocated), `prefill` or `decode`.
    pub role: String,
    pub instances: u64,
    pub tp: u64,
    pub pp: u64,
    pub max_sequences: u64,
    pub max_batched_tokens: u64,
    /// Tokens each instance's KV cache holds.
    pub kv_cache_tokens: u64,
    /// Weights on each GPU, bytes.
    pub weight_bytes_per_gpu: f64,
}

/// One deployment, sized for the workload's rate, and its simulated latencies there.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlannedDeployment {
    /// `colocated` or `disaggregated`.
    pub kind: String,
    pub gpus: u64,
    pub phases: Vec<PlannedPhase>,
    /// How a disaggregated deployment's KV caches travel: `nvlink` (prefill and decode
    /// instances share nodes) or `network`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_transfer: Option<String>,
    /// Requests per second the deployment serves within the SLO (its instances' probed
    /// rates; a disaggregated deployment's scarcer phase).
    pub sustained_rate: f64,
    /// `sustained_rate` per GPU.
    pub capacity_per_gpu: f64,
    /// Requests per second per GPU that meet the SLO at the workload's rate (the rate times
    /// the simulated attainment, over the GPUs): what the search maximises.
    pub goodput_per_gpu: f64,
    /// Which target limits the rate: `ttft` or `tpot`.
    pub binding: String,
    /// Simulated at the workload's rate.
    pub at_rate: LatencySummary,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlannedWorkload {
    /// Requests per second the plan serves.
    pub rate: f64,
    /// Requests simulated at that rate.
    pub requests: u64,
    pub seed: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServingSearchStats {
    /// Instance configurations (role, shape, batch limits) whose goodput was simulated.
    pub configurations: usize,
    /// Deployments that serve the rate on the cluster by their instances' probes.
    pub deployments: usize,
    /// Of those, the ones passed over because the whole simulation at the rate missed the SLO.
    pub rejected: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServingPlan {
    pub format: String,
    pub spec_digest: String,
    pub model: String,
    pub cluster: String,
    pub gpus_available: u64,
    pub engine: String,
    pub workload: PlannedWorkload,
    pub slo: Slo,
    pub chosen: PlannedDeployment,
    pub runners_up: Vec<PlannedDeployment>,
    pub search: ServingSearchStats,
    /// The spec it was planned from (a trace file by its path and digest): what `export` and
    /// `launch` read.
    pub spec: ServingSpec,
}

/// Why a serving spec has no plan.
#[derive(Clone, Debug, PartialEq)]
pub enum ServingPlanError {
    /// No instance of any shape meets the SLO, even unloaded.
    SloOutOfReach { detail: String },
    /// Instances meet the SLO but the cluster has too few GPUs for the rate.
    TooFewGpus {
        needed: u64,
        available: u64,
        best: String,
    },
    /// The weights leave no room for a request's KV cache on any shape.
    NothingFits { detail: String },
}

impl std::fmt::Display for ServingPlanError {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            ServingPlanError::SloOutOfReach { detail } => {
                write!(f, "the SLO is out of reach: {detail}")
            }
            ServingPlanError::TooFewGpus {
                needed,
                available,
                best,
            } => write!(
                f,
                "the rate needs {needed} GPUs and the cluster has {available} ({} short): the \
                 deployment with the most goodput per GPU is {best}",
                needed - available
            ),
            ServingPlanError::NothingFits { detail } => write!(f, "nothing fits: {detail}"),
        }
    }
}

/// SHA-256 (hex) of the serving spec's canonical JSON (a trace counts by its digest).
pub fn serving_spec_digest(spec: &ServingSpec) -> String {
    let canonical = serde_json::to_value(spec)
        .map(|value| to_canonical_string(&value))
        .unwrap_or_default();
    Sha256::digest(canonical.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

fn planned_phase(spec: &ServingSpec, role: &str, phase: &Phase) -> PlannedPhase {
    let cost = cost_model(spec, phase.shape);
    PlannedPhase {
        role: role.to_string(),
        instances: phase.instances,
        tp: phase.shape.tp,
        pp: phase.shape.pp,
        max_sequences: phase.limits.max_sequences,
        max_batched_tokens: phase.limits.max_batched_tokens,
        kv_cache_tokens: cost
            .kv_capacity_tokens(phase.limits.max_batched_tokens, phase.limits.max_sequences)
            .unwrap_or(0),
        weight_bytes_per_gpu: cost.weight_bytes(),
    }
}

fn planned(
    spec: &ServingSpec,
    ranked: &RankedDeployment,
    rate: f64,
    at_rate: LatencySummary,
) -> PlannedDeployment {
    let (kind, phases, kv_transfer) = match &ranked.deployment {
        Deployment::Colocated(phase) => {
            ("colocated", vec![planned_phase(spec, "both", phase)], None)
        }
        Deployment::Disaggregated {
            prefill,
            decode,
            same_node,
        } => (
            "disaggregated",
            vec![
                planned_phase(spec, "prefill", prefill),
                planned_phase(spec, "decode", decode),
            ],
            Some(if *same_node { "nvlink" } else { "network" }.to_string()),
        ),
    };
    PlannedDeployment {
        kind: kind.to_string(),
        gpus: ranked.deployment.gpus(),
        phases,
        kv_transfer,
        sustained_rate: ranked.sustained_rate,
        capacity_per_gpu: ranked.capacity_per_gpu,
        goodput_per_gpu: rate * at_rate.attainment / ranked.deployment.gpus() as f64,
        binding: ranked.binding.to_string(),
        at_rate,
    }
}

/// The workload's rate: the spec's, else the trace's own.
pub fn workload_rate(spec: &ServingSpec, trace: Option<&[Request]>) -> Option<f64> {
    spec.serve
        .workload
        .rate
        .or_else(|| trace.and_then(trace_rate))
}

/// Searches the deployments of a serving spec; `trace` holds the requests of the workload's
/// trace file when it names one.
pub fn plan_serving(
    spec: &ServingSpec,
    trace: Option<&[Request]>,
    top: Option<usize>,
) -> Result<ServingPlan, ServingPlanError> {
    let source = RequestSource { spec, trace };
    let rate = workload_rate(spec, trace).ok_or_else(|| ServingPlanError::NothingFits {
        detail: "the trace's requests all arrive at once; give the workload a `rate`".into(),
    })?;
    let (ranked, configurations) = rank_deployments(&source, rate);
    if configurations == 0 {
        let weights = cost_model(spec, InstanceShape { tp: 1, pp: 1 }).weight_bytes();
        let usable = spec.cluster.gpu.memory * GPU_MEMORY_UTILIZATION;
        return Err(ServingPlanError::NothingFits {
            detail: format!(
                "the weights of `{}` ({:.1} GB) and a request's KV cache do not fit any instance \
                 of up to {} GPUs of `{}` ({:.1} GB usable per GPU): at least {} GPUs are needed",
                spec.model.name,
                weights / 1e9,
                spec.cluster.total_gpus(),
                spec.cluster.name,
                usable / 1e9,
                (weights / usable).ceil() as u64
            ),
        });
    }
    if ranked.is_empty() {
        return Err(short_of_gpus(&source, rate));
    }
    let top = top.unwrap_or(DEFAULT_TOP);
    let requests = source.requests(rate, spec.serve.workload.requests);
    // Best first, each simulated whole at the workload's rate: one that misses the SLO there
    // (its instances' rates were probed alone, on fewer requests) is passed over.
    let mut verified = Vec::new();
    let mut listed = Vec::new();
    let mut rejected = 0;
    for r in &ranked {
        if verified.len() > top {
            break;
        }
        // Runners-up differ in their instances, not only in how many.
        let kind = r.deployment.kind_of_instances();
        if listed.contains(&kind) {
            continue;
        }
        let Some(latencies) = simulate(spec, &r.deployment, &requests) else {
            rejected += 1;
            continue;
        };
        let summary = latencies.summary(&spec.serve.slo);
        if summary.attainment < spec.serve.slo.attainment {
            rejected += 1;
            continue;
        }
        listed.push(kind);
        verified.push(planned(spec, r, rate, summary));
    }
    let mut deployments = verified.into_iter();
    let chosen = deployments
        .next()
        .ok_or_else(|| ServingPlanError::SloOutOfReach {
            detail: format!(
                "each of the {} deployments that serve {rate} requests/s on the cluster by their \
             instances' probes misses the SLO when simulated whole",
                ranked.len()
            ),
        })?;
    Ok(ServingPlan {
        format: SERVING_PLAN_FORMAT.to_string(),
        spec_digest: serving_spec_digest(spec),
        model: spec.model.name.clone(),
        cluster: spec.cluster.name.clone(),
        gpus_available: spec.cluster.total_gpus(),
        engine: spec.serve.engine.name().to_string(),
        workload: PlannedWorkload {
            rate,
            requests: requests.len() as u64,
            seed: spec.serve.workload.seed,
            trace: spec.serve.workload.trace.as_ref().map(|t| t.path.clone()),
        },
        slo: spec.serve.slo.clone(),
        chosen,
        runners_up: deployments.collect(),
        search: ServingSearchStats {
            configurations,
            deployments: ranked.len(),
            rejected,
        },
        spec: spec.clone(),
    })
}

/// Why no deployment serves the rate: the SLO out of reach, or too few GPUs for the best.
fn short_of_gpus(source: &RequestSource, rate: f64) -> ServingPlanError {
    let spec = source.spec;
    let mut best: Option<(f64, super::search::InstanceGoodput)> = None;
    for shape in super::search::instance_shapes(spec, 1) {
        for limits in BATCH_LIMITS {
            let g =
                super::search::instance_goodput(source, super::engine::Role::Both, shape, limits);
            let per_gpu = g.rate / shape.gpus() as f64;
            if g.rate > 0.0 && best.is_none_or(|(b, _)| per_gpu > b) {
                best = Some((per_gpu, g));
            }
        }
    }
    match best {
        None => ServingPlanError::SloOutOfReach {
            detail: format!(
                "no instance of `{}` on `{}` meets ttft {} s and tpot {} s for {:.0} % of \
                 requests even when unloaded",
                spec.model.name,
                spec.cluster.name,
                spec.serve.slo.ttft,
                spec.serve.slo.tpot,
                spec.serve.slo.attainment * 100.0
            ),
        },
        Some((_, g)) => {
            let instances = (rate / g.rate).ceil() as u64;
            ServingPlanError::TooFewGpus {
                needed: instances * g.shape.gpus(),
                available: spec.cluster.total_gpus(),
                best: format!(
                    "{instances} colocated instances of tp {} pp {}, {:.3} requests/s each",
                    g.shape.tp, g.shape.pp, g.rate
                ),
            }
        }
    }
}

impl ServingPlan {
    /// The canonical, byte-stable JSON of the plan.
    pub fn to_json(&self) -> String {
        match serde_json::to_value(self) {
            Ok(value) => to_canonical_string(&value),
            Err(error) => format!("{{\"error\": {:?}}}\n", error.to_string()),
        }
    }

    /// Reads a serving plan file.
    pub fn from_json(text: &str) -> Result<ServingPlan, String> {
        let value: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        match value.get("format").and_then(Value::as_str) {
            Some(SERVING_PLAN_FORMAT) => serde_json::from_value(value).map_err(|e| e.to_string()),
            other => Err(format!(
                "format `{}` is not a serving plan's (`{SERVING_PLAN_FORMAT}`)",
                other.unwrap_or("")
            )),
        }
    }
}

/// Whether a plan file's text is a serving plan's (by its `format`).
pub fn is_serving_plan(text: &str) -> bool {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| v.get("format").and_then(Value::as_str).map(str::to_string))
        .is_some_and(|f| f == SERVING_PLAN_FORMAT)
}
