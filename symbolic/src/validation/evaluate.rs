//! Runs the cost model on every case and measures its error against the published numbers.

use std::collections::BTreeMap;

use crate::cost::{Calibration, CostModel, KernelEfficiency};

use super::cases::{Case, MemoryMeasure, Source, Throughput};

/// The prediction for one case and its errors (fractions, signed: predicted/measured − 1).
#[derive(Clone, Debug)]
pub struct Outcome {
    pub line: usize,
    pub source: Source,
    pub model: String,
    pub table: String,
    /// Measured and predicted throughput in the source's unit (step seconds or tokens/s/GPU).
    pub throughput: Option<(Throughput, f64)>,
    pub throughput_error: Option<f64>,
    /// Measured and predicted GiB.
    pub memory: Option<(f64, f64)>,
    pub memory_error: Option<f64>,
    pub oom: bool,
    pub predicted_fits: bool,
    pub mfu: f64,
    pub error: Option<String>,
}

/// Chooses the kernel efficiencies for a case: the per-generation defaults, optionally
/// replaced (used by calibration).
pub type EfficiencyFor<'a> = dyn Fn(&Case) -> KernelEfficiency + 'a;

/// Evaluates every case with the given calibration.
pub fn evaluate(
    cases: &[Case],
    calibration: Calibration,
    efficiency: &EfficiencyFor,
) -> Vec<Outcome> {
    cases
        .iter()
        .map(|case| evaluate_case(case, calibration, efficiency(case)))
        .collect()
}

pub fn evaluate_case(
    case: &Case,
    calibration: Calibration,
    efficiency: KernelEfficiency,
) -> Outcome {
    let mut outcome = Outcome {
        line: case.line,
        source: case.source,
        model: case.model.clone(),
        table: case.table.clone(),
        throughput: None,
        throughput_error: None,
        memory: None,
        memory_error: None,
        oom: case.oom,
        predicted_fits: true,
        mfu: 0.0,
        error: None,
    };
    let model = match CostModel::uncompiled(&case.spec, calibration, efficiency) {
        Ok(model) => model,
        Err(err) => {
            outcome.error = Some(err.to_string());
            return outcome;
        }
    };
    let estimate = match model.estimate(&case.strategy) {
        Ok(estimate) => estimate,
        Err(err) => {
            outcome.error = Some(err.to_string());
            return outcome;
        }
    };
    outcome.predicted_fits = estimate.fits;
    outcome.mfu = estimate.mfu;
    if let Some(measured) = case.throughput {
        let (predicted, value) = match measured {
            Throughput::StepTime(step) => (estimate.step_time_s, step),
            Throughput::TokensPerGpu(tokens) => (estimate.tokens_per_s_per_gpu, tokens),
        };
        outcome.throughput = Some((measured, predicted));
        outcome.throughput_error = Some(predicted / value - 1.0);
    }
    if let Some((measured, measure)) = case.memory {
        let gib = 1024.0 * 1024.0 * 1024.0;
        let device = estimate.peak_memory_gib;
        let outside_allocator = calibration.outside_allocator_bytes / gib;
        // Fragmentation is a fraction of what is not states (see `cost::memory`; DeepSpeed's
        // fp16 buckets are counted in with it here), and so is the allocator's cache of freed
        // blocks that reserved readings add.
        let peak = estimate
            .stages
            .iter()
            .map(|stage| stage.memory)
            .max_by(|a, b| a.total().total_cmp(&b.total()))
            .unwrap_or_default();
        let states = peak.weights + peak.gradients + peak.optimizer;
        let dynamic = (device - outside_allocator - states) / (1.0 + calibration.fragmentation);
        let gpu = case.spec.cluster.gpu.memory / gib;
        let reserved = (device + calibration.allocator_cache * dynamic).min(gpu);
        let predicted = match measure {
            MemoryMeasure::Device => reserved,
            MemoryMeasure::Reserved => reserved - outside_allocator,
            MemoryMeasure::Allocated => states + dynamic,
        };
        outcome.memory = Some((measured, predicted));
        outcome.memory_error = Some(predicted / measured - 1.0);
    }
    outcome
}

/// Mean and max absolute error of a list of signed errors.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ErrorStats {
    pub count: usize,
    pub mean: f64,
    pub max: f64,
}

impl ErrorStats {
    pub fn of(errors: impl Iterator<Item = f64>) -> ErrorStats {
        let mut stats = ErrorStats::default();
        let mut sum = 0.0;
        for error in errors {
            stats.count += 1;
            sum += error.abs();
            stats.max = stats.max.max(error.abs());
        }
        if stats.count > 0 {
            stats.mean = sum / stats.count as f64;
        }
        stats
    }
}

/// Per-source throughput and memory error statistics.
pub fn per_source(outcomes: &[Outcome]) -> BTreeMap<Source, (ErrorStats, ErrorStats)> {
    let mut map = BTreeMap::new();
    for source in outcomes.iter().map(|o| o.source) {
        if map.contains_key(&source) {
            continue;
        }
        let of_source = || outcomes.iter().filter(move |o| o.source == source);
        let throughput = ErrorStats::of(of_source().filter_map(|o| o.throughput_error));
        let memory = ErrorStats::of(of_source().filter_map(|o| o.memory_error));
        map.insert(source, (throughput, memory));
    }
    map
}
