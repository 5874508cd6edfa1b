//! The `serve` block: which model, on which cluster, under what request load and latency
//! targets.

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::ast::Name;
use crate::diagnostic::Problem;
use crate::eval::{Spanned, Value};
use crate::fields::Fields;
use crate::spec::{
    DeploymentChoice, LengthDistribution, LengthShape, Precision, ServeSpec, ServingEngine, Slo,
    TraceFile, Workload,
};
use crate::units::Dim;

use super::train::{job_references, PRECISIONS};

pub const FIELDS: &[&str] = &[
    "model",
    "cluster",
    "precision",
    "kv_precision",
    "workload",
    "slo",
    "deployment",
    "engine",
];

const WORKLOAD_FIELDS: &[&str] = &["rate", "prompt", "output", "requests", "seed", "trace"];
const LENGTH_FIELDS: &[&str] = &["mean", "max", "shape"];
const SLO_FIELDS: &[&str] = &["ttft", "tpot", "attainment"];

/// Requests a simulation replays when the spec does not say: enough for a 99th percentile
/// of some twenty requests, few enough that the search simulates hundreds of deployments.
pub const DEFAULT_REQUESTS: u64 = 2000;

/// Requests of the SLO that must meet both targets when the spec does not say (DistServe's
/// evaluation asks for 90 %).
pub const DEFAULT_ATTAINMENT: f64 = 0.9;

/// A serve block before its references are looked up.
pub struct ServeDef {
    pub model: Option<Name>,
    pub cluster: Option<Name>,
    pub serve: Option<ServeSpec>,
}

pub fn lower(f: &mut Fields, spec_dir: &Path) -> ServeDef {
    let before = f.problems.len();
    f.reject_unknown(FIELDS);
    let (model, cluster) = job_references(f);
    let precision = f.choice("precision", PRECISIONS).unwrap_or(Precision::Bf16);
    let kv_precision = f.choice("kv_precision", PRECISIONS).unwrap_or(precision);
    if precision == Precision::Fp32 {
        let at = f.get("precision").map_or(f.anchor, |v| v.span);
        f.problems.push(
            Problem::new(at, "serving in FP32 is not planned")
                .with_help("serve in `bf16` or `fp16`, or `fp8` on GPUs that have it"),
        );
    }
    let deployments = DeploymentChoice::ALL.map(|d| (d.name(), d));
    let deployment = f.choice("deployment", &deployments).unwrap_or_default();
    let engines = ServingEngine::ALL.map(|e| (e.name(), e));
    let engine = f.choice("engine", &engines).unwrap_or_default();
    let workload = match f.get("workload").cloned() {
        Some(value) => workload(&value, spec_dir, f.problems),
        None => {
            f.missing(
                "workload",
                "{ rate = 6/s, prompt = { mean = 1500 }, output = { mean = 300 } }",
            );
            None
        }
    };
    let slo = match f.get("slo").cloned() {
        Some(value) => slo(&value, f.problems),
        None => {
            f.missing("slo", "{ ttft = 2 s, tpot = 80 ms }");
            None
        }
    };
    let serve = match (workload, slo) {
        (Some(workload), Some(slo)) if f.problems.len() == before => Some(ServeSpec {
            precision,
            kv_precision,
            workload,
            slo,
            deployment,
            engine,
        }),
        _ => None,
    };
    ServeDef {
        model,
        cluster,
        serve,
    }
}

fn workload(value: &Spanned, spec_dir: &Path, problems: &mut Vec<Problem>) -> Option<Workload> {
    let example = "{ rate = 6/s, prompt = { mean = 1500 }, output = { mean = 300 } }";
    let before = problems.len();
    let mut r = Fields::record("workload", value, example, problems)?;
    r.reject_unknown(WORKLOAD_FIELDS);
    let rate = r.quantity("rate", Dim::RATE, true);
    let requests = r.count("requests", 1).unwrap_or(DEFAULT_REQUESTS);
    let seed = r.count("seed", 0).unwrap_or(0);
    let trace = r
        .get("trace")
        .cloned()
        .and_then(|v| trace(&v, spec_dir, r.problems));
    let has_trace = r.has("trace");
    if !has_trace && !r.has("rate") {
        r.missing("rate", "6/s");
    }
    let mut read_lengths = |key: &str| -> Option<LengthDistribution> {
        match r.get(key).cloned() {
            Some(value) => lengths(key, &value, r.problems),
            // Unused: the trace gives each request's lengths.
            None if has_trace => Some(LengthDistribution {
                mean: 1.0,
                max: None,
                shape: LengthShape::Fixed,
            }),
            None => {
                r.missing(key, "{ mean = 512 }");
                None
            }
        }
    };
    let prompt = read_lengths("prompt");
    let output = read_lengths("output");
    if has_trace {
        for key in ["prompt", "output"] {
            if let Some(v) = r.get(key) {
                r.problems.push(
                    Problem::new(v.span, format!("`{key}` is set beside `trace`"))
                        .with_help("the trace gives each request's lengths; remove one"),
                );
            }
        }
    }
    if problems.len() > before {
        return None;
    }
    Some(Workload {
        rate,
        prompt: prompt?,
        output: output?,
        requests,
        seed,
        trace,
    })
}

/// `{ mean = 1500, max = 8192, shape = exponential }`.
fn lengths(key: &str, value: &Spanned, problems: &mut Vec<Problem>) -> Option<LengthDistribution> {
    let before = problems.len();
    let mut r = Fields::record(key, value, "{ mean = 1500, max = 8192 }", problems)?;
    r.reject_unknown(LENGTH_FIELDS);
    let mean = r.required_quantity("mean", Dim::NUMBER, true);
    let max = r.count("max", 1);
    let shapes = LengthShape::ALL.map(|s| (s.name(), s));
    let shape = r
        .choice("shape", &shapes)
        .unwrap_or(LengthShape::Exponential);
    if let Some(mean) = mean {
        if mean < 1.0 || max.is_some_and(|max| mean > max as f64) {
            let at = r.get("mean").map_or(value.span, |v| v.span);
            r.problems.push(
                Problem::new(
                    at,
                    format!("`{key}.mean` must be a length of 1 token to `max`, found {mean}"),
                )
                .with_help("lengths count tokens: `mean = 1500`"),
            );
        }
    }
    if problems.len() > before {
        return None;
    }
    Some(LengthDistribution {
        mean: mean?,
        max,
        shape,
    })
}

fn trace(value: &Spanned, spec_dir: &Path, problems: &mut Vec<Problem>) -> Option<TraceFile> {
    let help = "trace = \"requests.csv\": a CSV of the Azure LLM inference trace's columns \
                (TIMESTAMP,ContextTokens,GeneratedTokens), relative to the spec";
    match &value.value {
        Value::Str(written) => {
            let resolved = spec_dir.join(written);
            match std::fs::read(&resolved) {
                Ok(bytes) => Some(TraceFile {
                    path: written.clone(),
                    resolved,
                    digest: Sha256::digest(&bytes)
                        .iter()
                        .map(|byte| format!("{byte:02x}"))
                        .collect(),
                }),
                Err(error) => {
                    let why = match error.kind() {
                        std::io::ErrorKind::NotFound => "no such file".to_string(),
                        _ => error.to_string(),
                    };
                    problems.push(
                        Problem::new(
                            value.span,
                            format!("cannot read trace `{written}` (relative to the spec): {why}"),
                        )
                        .with_help(help),
                    );
                    None
                }
            }
        }
        Value::Invalid => None,
        _ => {
            problems.push(
                Problem::new(value.span, "`trace` takes a file name in quotes").with_help(help),
            );
            None
        }
    }
}

fn slo(value: &Spanned, problems: &mut Vec<Problem>) -> Option<Slo> {
    let before = problems.len();
    let mut r = Fields::record("slo", value, "{ ttft = 2 s, tpot = 80 ms }", problems)?;
    r.reject_unknown(SLO_FIELDS);
    let ttft = r.required_quantity("ttft", Dim::TIME, true);
    let tpot = r.required_quantity("tpot", Dim::TIME, true);
    let attainment = r.fraction("attainment").unwrap_or(DEFAULT_ATTAINMENT);
    if attainment == 0.0 {
        let at = r.get("attainment").map_or(value.span, |v| v.span);
        r.problems.push(
            Problem::new(at, "`attainment` of 0 asks nothing of any request")
                .with_help("DistServe's evaluation asks for `attainment = 90%`"),
        );
    }
    if problems.len() > before {
        return None;
    }
    Some(Slo {
        ttft: ttft?,
        tpot: tpot?,
        attainment,
    })
}
