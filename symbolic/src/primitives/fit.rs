//! Fitting each primitive to its microbenchmarks, and scoring it on the sources its fit never
//! saw (leave one source out).
//!
//! The loss is the mean absolute log ratio of predicted to measured time, each source
//! weighing the same (a 70-row sweep does not drown a 5-row one). Parameters move inside
//! physical ranges by a bounded coordinate search, from the committed values.

use std::collections::BTreeMap;

use super::attention::{attention_tflops, kernel_of_label, AttentionKernel, AttentionParams};
use super::collective::{
    collective_time, launched_by_one_thread, Collective, CollectiveParams, Group,
};
use super::gemm::{gemm_time, GemmParams, POWER_CAPPED_GEMM_RATE};
use super::microbench::{
    AttentionMeasurement, CollectiveMeasurement, GemmMeasurement, MemoryMeasurement,
    Microbenchmarks,
};
use crate::cost::GpuGeneration;

/// A parameter's range.
#[derive(Clone, Copy, Debug)]
pub struct Range {
    pub name: &'static str,
    pub low: f64,
    pub high: f64,
}

const fn range(name: &'static str, low: f64, high: f64) -> Range {
    Range { name, low, high }
}

/// Minimises `loss` over `ranges` from `start` by coordinate search with shrinking steps.
pub fn minimize(loss: impl Fn(&[f64]) -> f64, start: &[f64], ranges: &[Range]) -> Vec<f64> {
    let mut x: Vec<f64> = start
        .iter()
        .zip(ranges)
        .map(|(v, r)| v.clamp(r.low, r.high))
        .collect();
    let mut best = loss(&x);
    let mut step = 0.25;
    while step > 1e-4 {
        let mut improved = false;
        for i in 0..x.len() {
            let span = ranges[i].high - ranges[i].low;
            for direction in [1.0, -1.0] {
                loop {
                    let mut trial = x.clone();
                    trial[i] =
                        (x[i] + direction * step * span).clamp(ranges[i].low, ranges[i].high);
                    if trial[i] == x[i] {
                        break;
                    }
                    let value = loss(&trial);
                    if value < best {
                        best = value;
                        x = trial;
                        improved = true;
                    } else {
                        break;
                    }
                }
            }
        }
        if !improved {
            step /= 2.0;
        }
    }
    x
}

/// Mean over sources of the mean absolute log ratio within each source.
fn source_weighted<T: Sourced>(rows: &[&T], error: impl Fn(&T) -> f64) -> f64 {
    let mut by_source: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
    for row in rows {
        let entry = by_source.entry(row.fit_unit()).or_default();
        entry.0 += error(row).abs();
        entry.1 += 1;
    }
    if by_source.is_empty() {
        return 0.0;
    }
    by_source
        .values()
        .map(|(sum, n)| sum / *n as f64)
        .sum::<f64>()
        / by_source.len() as f64
}

/// Relative error of a prediction against a measurement, signed (positive: predicted larger).
pub fn relative_error(predicted: f64, measured: f64) -> f64 {
    predicted / measured - 1.0
}

// --- collectives ----------------------------------------------------------------------------

pub const COLLECTIVE_RANGES: [Range; 9] = [
    range("call_latency_s", 1e-6, 60e-6),
    range("intra_step_s", 0.2e-6, 20e-6),
    range("inter_step_s", 1e-6, 30e-6),
    range("ll_intra_step_s", 0.1e-6, 10e-6),
    range("ll_inter_step_s", 0.5e-6, 30e-6),
    range("intra_efficiency", 0.4, 0.95),
    range("inter_efficiency", 0.4, 0.98),
    range("nvls_efficiency", 0.3, 0.95),
    range("launch_s", 0.5e-6, 10e-6),
];

fn collective_params(x: &[f64]) -> CollectiveParams {
    CollectiveParams {
        call_latency_s: x[0],
        intra_step_s: x[1],
        inter_step_s: x[2],
        ll_intra_step_s: x[3],
        ll_inter_step_s: x[4],
        intra_efficiency: x[5],
        inter_efficiency: x[6],
        nvls_efficiency: x[7],
        launch_s: x[8],
    }
}

/// The parameters in [`COLLECTIVE_RANGES`]' order.
pub fn collective_values(p: &CollectiveParams) -> Vec<f64> {
    vec![
        p.call_latency_s,
        p.intra_step_s,
        p.inter_step_s,
        p.ll_intra_step_s,
        p.ll_inter_step_s,
        p.intra_efficiency,
        p.inter_efficiency,
        p.nvls_efficiency,
        p.launch_s,
    ]
}

pub fn predict_collective(row: &CollectiveMeasurement, params: &CollectiveParams) -> f64 {
    let group = Group {
        ranks: row.ranks,
        per_node: row.per_node,
        max_nodes: row.ranks,
    };
    let call = collective_time(row.kind, row.bytes, &group, &row.links, params);
    launched_by_one_thread(call, row.gpus_per_thread, params)
}

/// The collectives' fit loss at parameters `x` (in [`COLLECTIVE_RANGES`]' order).
pub fn collective_loss(rows: &[&CollectiveMeasurement], x: &[f64]) -> f64 {
    let params = collective_params(x);
    source_weighted(rows, |r| (predict_collective(r, &params) / r.seconds).ln())
}

/// NCCL's parameters fitted on `rows` within `ranges` (in [`COLLECTIVE_RANGES`]' order).
pub fn fit_collectives(
    rows: &[&CollectiveMeasurement],
    start: &CollectiveParams,
    ranges: &[Range],
) -> CollectiveParams {
    collective_params(&minimize(
        |x| collective_loss(rows, x),
        &collective_values(start),
        ranges,
    ))
}

// --- GEMMs ----------------------------------------------------------------------------------

pub const GEMM_RANGES: [Range; 4] = [
    range("efficiency", 0.5, 1.0),
    range("k_overhead", 0.0, 1024.0),
    range("tile_half_area", 0.0, 65536.0),
    range("launch_s", 0.0, 10e-6),
];

fn gemm_params(x: &[f64]) -> GemmParams {
    GemmParams {
        efficiency: x[0],
        k_overhead: x[1],
        tile_half_area: x[2],
        launch_s: x[3],
    }
}

/// The parameters in [`GEMM_RANGES`]' order.
pub fn gemm_values(p: &GemmParams) -> Vec<f64> {
    vec![p.efficiency, p.k_overhead, p.tile_half_area, p.launch_s]
}

/// The time `params` give `row`; a sweep run at the power cap runs at `power_capped_rate` of
/// the primitive's level.
pub fn predict_gemm(row: &GemmMeasurement, params: &GemmParams, power_capped_rate: f64) -> f64 {
    let level = if row.power_capped {
        power_capped_rate
    } else {
        1.0
    };
    let params = GemmParams {
        efficiency: params.efficiency * level,
        ..*params
    };
    gemm_time(row.m, row.n, row.k, 1.0, 2.0, &row.device, &params)
}

pub fn gemm_generation(row: &GemmMeasurement) -> GpuGeneration {
    if row.gpu.contains("sm_90") {
        GpuGeneration::Hopper
    } else {
        GpuGeneration::from_name(&row.gpu)
    }
}

/// The GEMM measurements of one GPU generation.
fn gemms_of(data: &Microbenchmarks, generation: GpuGeneration) -> Vec<&GemmMeasurement> {
    data.gemms
        .iter()
        .filter(|r| gemm_generation(r) == generation)
        .collect()
}

/// The rate of a GEMM timed at the GPU's power cap, relative to the primitive's level.
pub const POWER_CAPPED_RANGE: Range = range("power_capped_rate", 0.5, 1.0);

/// The GEMMs' fit loss at parameters `x` (in [`GEMM_RANGES`]' order, then optionally
/// [`POWER_CAPPED_RANGE`]'s; without it, the committed [`POWER_CAPPED_GEMM_RATE`]).
pub fn gemm_loss(rows: &[&GemmMeasurement], x: &[f64]) -> f64 {
    let params = gemm_params(x);
    let power_capped_rate = x.get(4).copied().unwrap_or(POWER_CAPPED_GEMM_RATE);
    source_weighted(rows, |r| {
        (predict_gemm(r, &params, power_capped_rate) / r.seconds).ln()
    })
}

/// The GEMM primitive fitted on `rows`, with the rate of the sweeps among them that ran at the
/// power cap (which stays at the committed rate when none did).
pub fn fit_gemm_primitive(rows: &[&GemmMeasurement], start: &GemmParams) -> (GemmParams, f64) {
    let mut values = gemm_values(start);
    values.push(POWER_CAPPED_GEMM_RATE);
    let mut ranges = GEMM_RANGES.to_vec();
    ranges.push(POWER_CAPPED_RANGE);
    let x = minimize(|x| gemm_loss(rows, x), &values, &ranges);
    (gemm_params(&x), x[4])
}

/// The GEMM primitive fitted on `rows` (a cluster's own GEMMs, none at the power cap) within
/// `ranges` (in [`GEMM_RANGES`]' order).
pub fn fit_gemms(rows: &[&GemmMeasurement], start: &GemmParams, ranges: &[Range]) -> GemmParams {
    gemm_params(&minimize(
        |x| gemm_loss(rows, x),
        &gemm_values(start),
        ranges,
    ))
}

// --- attention ------------------------------------------------------------------------------

pub const ATTENTION_RANGES: [Range; 5] = [
    range("efficiency", 0.1, 1.5),
    range("seq_half", 0.0, 4096.0),
    range("head_dim_half", 0.0, 256.0),
    range("causal", 0.5, 1.0),
    range("backward", 0.4, 1.2),
];

fn attention_params(x: &[f64]) -> AttentionParams {
    AttentionParams {
        efficiency: x[0],
        seq_half: x[1],
        head_dim_half: x[2],
        causal: x[3],
        backward: x[4],
    }
}

fn attention_values(p: &AttentionParams) -> Vec<f64> {
    vec![
        p.efficiency,
        p.seq_half,
        p.head_dim_half,
        p.causal,
        p.backward,
    ]
}

pub fn predict_attention(row: &AttentionMeasurement, params: &AttentionParams) -> f64 {
    attention_tflops(
        row.peak_flops,
        row.seq_len,
        row.head_dim,
        row.causal,
        &row.direction,
        params,
    ) / 1e12
}

pub fn fit_attention(rows: &[&AttentionMeasurement], start: &AttentionParams) -> AttentionParams {
    let loss = |x: &[f64]| {
        let params = attention_params(x);
        source_weighted(rows, |r| (r.tflops / predict_attention(r, &params)).ln())
    };
    attention_params(&minimize(loss, &attention_values(start), &ATTENTION_RANGES))
}

/// The kernel class and generation an attention measurement belongs to, if the cost model
/// uses that kernel.
pub fn attention_class(row: &AttentionMeasurement) -> Option<(GpuGeneration, AttentionKernel)> {
    let generation = GpuGeneration::from_name(&row.gpu);
    let kernel = kernel_of_label(&row.kernel)?;
    Some((generation, kernel))
}

// --- memory-bound passes --------------------------------------------------------------------

/// The fraction of datasheet HBM bandwidth a streaming kernel reaches, fitted on `rows`: the
/// median ratio (one number for every GPU).
pub fn fit_stream_fraction(rows: &[&MemoryMeasurement]) -> f64 {
    let mut ratios: Vec<f64> = rows
        .iter()
        .map(|r| r.bandwidth / r.datasheet_bandwidth)
        .collect();
    median(&mut ratios)
}

pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        0.5 * (values[mid - 1] + values[mid])
    }
}

// --- scoring --------------------------------------------------------------------------------

/// Errors of one primitive kind: in the fit and with each source held out.
#[derive(Clone, Debug, Default)]
pub struct PrimitiveScore {
    pub kind: String,
    pub rows: usize,
    pub sources: usize,
    /// Relative errors of every row under the full fit.
    pub in_fit: Vec<f64>,
    /// Relative errors of every row under the fit without its source.
    pub held_out: Vec<f64>,
    /// The same, each source's median error divided out: how well the primitive's dependence
    /// on shape, size and group transfers, apart from the level each source's system ran at.
    pub held_out_shape: Vec<f64>,
    /// Each source's median absolute held-out error: the score with every source weighing
    /// alike, however many rows it has.
    pub held_out_by_source: Vec<f64>,
}

impl PrimitiveScore {
    pub fn median_abs(errors: &[f64]) -> f64 {
        median(&mut errors.iter().map(|e| e.abs()).collect::<Vec<_>>())
    }
}

/// The fitted primitives.
#[derive(Clone, Debug)]
pub struct FittedPrimitives {
    pub collectives: CollectiveParams,
    pub gemms: BTreeMap<&'static str, GemmParams>,
    /// The rate of GEMMs timed at the power cap, relative to the primitive's level (Hopper's
    /// fit: the generation the project's sweeps ran on).
    pub power_capped_gemm_rate: f64,
    pub attention: BTreeMap<String, AttentionParams>,
    pub stream_fraction: f64,
}

/// A measurement's published source, the unit the fit weighs.
trait Sourced {
    fn source(&self) -> &str;

    /// The unit a primitive is held out by: the source, or the measurement of which the
    /// source is one copy among several.
    fn held_out_unit(&self) -> &str {
        self.source()
    }

    /// The unit the fit weighs alike: the source, or the system its files all measured.
    fn fit_unit(&self) -> &str {
        self.source()
    }
}

/// Collectives are held out and weighed by the system measured: a sweep published as one
/// file per collective (Together's, xxrjun's) is one measurement of one machine.
impl Sourced for CollectiveMeasurement {
    fn source(&self) -> &str {
        &self.source
    }

    fn held_out_unit(&self) -> &str {
        &self.system
    }

    fn fit_unit(&self) -> &str {
        &self.system
    }
}

impl Sourced for GemmMeasurement {
    fn source(&self) -> &str {
        &self.source
    }

    fn held_out_unit(&self) -> &str {
        &self.measurement
    }
}

impl Sourced for AttentionMeasurement {
    fn source(&self) -> &str {
        &self.source
    }
}

impl Sourced for MemoryMeasurement {
    fn source(&self) -> &str {
        &self.source
    }
}

/// The distinct units `rows` are held out by, sorted.
fn sources<'a, T: Sourced>(rows: &[&'a T]) -> Vec<&'a str> {
    let mut all: Vec<&str> = rows.iter().map(|r| r.held_out_unit()).collect();
    all.sort_unstable();
    all.dedup();
    all
}

/// Each row's error under the parameters `fit` finds without the row's source (leave one
/// source out), in the order of `rows`.
fn held_out_errors<T: Sourced, P>(
    rows: &[&T],
    fit: impl Fn(&[&T]) -> P,
    error: impl Fn(&T, &P) -> f64,
) -> Vec<f64> {
    let mut errors = vec![0.0; rows.len()];
    for source in sources(rows) {
        let kept: Vec<&T> = rows
            .iter()
            .copied()
            .filter(|r| r.held_out_unit() != source)
            .collect();
        let without = fit(&kept);
        for (slot, row) in errors.iter_mut().zip(rows) {
            if row.held_out_unit() == source {
                *slot = error(row, &without);
            }
        }
    }
    errors
}

/// Each source's median of `value` over its errors among `errors` (aligned with `rows`).
fn per_source<'a, T: Sourced>(
    rows: &[&'a T],
    errors: &[f64],
    value: impl Fn(f64) -> f64,
) -> BTreeMap<&'a str, f64> {
    sources(rows)
        .into_iter()
        .map(|source| {
            let mut of_source: Vec<f64> = rows
                .iter()
                .zip(errors)
                .filter(|(r, _)| r.held_out_unit() == source)
                .map(|(_, e)| value(*e))
                .collect();
            (source, median(&mut of_source))
        })
        .collect()
}

/// Each source's median absolute error among `errors` (aligned with `rows`).
fn source_medians<T: Sourced>(rows: &[&T], errors: &[f64]) -> Vec<f64> {
    per_source(rows, errors, f64::abs).into_values().collect()
}

/// `errors` (aligned with `rows`) with each source's median log error divided out.
fn source_levels_removed<T: Sourced>(rows: &[&T], errors: &[f64]) -> Vec<f64> {
    let levels = per_source(rows, errors, f64::ln_1p);
    rows.iter()
        .zip(errors)
        .map(|(r, e)| (e.ln_1p() - levels[r.held_out_unit()]).exp_m1())
        .collect()
}

/// How far apart two sources put the same GEMM on the same GPU (the same datasheet peak): for
/// each pair of sources that timed shapes in common, the median relative difference over
/// those shapes. A level fitted without one of them cannot know this.
pub fn gemm_source_disagreement(data: &Microbenchmarks) -> Vec<f64> {
    let mut pairs: BTreeMap<(&str, &str), Vec<f64>> = BTreeMap::new();
    for (i, a) in data.gemms.iter().enumerate() {
        for b in &data.gemms[i + 1..] {
            let same = a.measurement != b.measurement
                && gemm_generation(a) == gemm_generation(b)
                && a.device.peak_flops == b.device.peak_flops
                && (a.m, a.n, a.k) == (b.m, b.n, b.k);
            if same {
                let key = if a.measurement < b.measurement {
                    (a.measurement.as_str(), b.measurement.as_str())
                } else {
                    (b.measurement.as_str(), a.measurement.as_str())
                };
                let difference = (a.seconds / b.seconds).ln().abs().exp_m1();
                pairs.entry(key).or_default().push(difference);
            }
        }
    }
    pairs
        .into_values()
        .map(|mut differences| median(&mut differences))
        .collect()
}

/// The collective measurements no fit reads (systems reported degraded, runs their source
/// superseded), and the others.
fn split_never_fitted(
    data: &Microbenchmarks,
) -> (Vec<&CollectiveMeasurement>, Vec<&CollectiveMeasurement>) {
    data.collectives.iter().partition(|r| r.never_fitted)
}

/// The collectives `rows` measure, each once, in name order.
fn kinds_of<'a>(rows: impl Iterator<Item = &'a CollectiveMeasurement>) -> Vec<Collective> {
    let mut kinds: Vec<Collective> = rows.map(|r| r.kind).collect();
    kinds.sort_unstable_by_key(|k| k.name());
    kinds.dedup();
    kinds
}

/// Fits every primitive on all of `data` and scores each kind with its sources held out.
pub fn fit_and_score(data: &Microbenchmarks) -> (FittedPrimitives, Vec<PrimitiveScore>) {
    let mut scores = Vec::new();

    // Collectives: one parameter set for every kind, fitted on systems running as expected,
    // scored per kind; systems reported degraded are scored apart under the full fit.
    let (degraded, rows) = split_never_fitted(data);
    let start = CollectiveParams::default();
    let full = fit_collectives(&rows, &start, &COLLECTIVE_RANGES);
    let error = |r: &CollectiveMeasurement, p: &CollectiveParams| {
        relative_error(predict_collective(r, p), r.seconds)
    };
    let held_out = held_out_errors(
        &rows,
        |kept| fit_collectives(kept, &start, &COLLECTIVE_RANGES),
        error,
    );
    let held_out_shape = source_levels_removed(&rows, &held_out);
    for kind in kinds_of(rows.iter().copied()) {
        let of_kind = |r: &&CollectiveMeasurement| r.kind == kind;
        let kind_rows: Vec<&CollectiveMeasurement> = rows.iter().copied().filter(of_kind).collect();
        let of_kind_only = |errors: &[f64]| -> Vec<f64> {
            rows.iter()
                .zip(errors)
                .filter(|(r, _)| of_kind(r))
                .map(|(_, e)| *e)
                .collect()
        };
        let kind_held_out = of_kind_only(&held_out);
        scores.push(PrimitiveScore {
            kind: format!("collective: {}", kind.name()),
            rows: kind_rows.len(),
            sources: sources(&kind_rows).len(),
            in_fit: kind_rows.iter().map(|r| error(r, &full)).collect(),
            held_out_by_source: source_medians(&kind_rows, &kind_held_out),
            held_out: kind_held_out,
            held_out_shape: of_kind_only(&held_out_shape),
        });
    }
    if !degraded.is_empty() {
        scores.push(PrimitiveScore {
            kind: "collective: systems reported degraded (never fitted)".to_string(),
            rows: degraded.len(),
            sources: sources(&degraded).len(),
            in_fit: Vec::new(),
            held_out: degraded.iter().map(|r| error(r, &full)).collect(),
            held_out_shape: Vec::new(),
            held_out_by_source: Vec::new(),
        });
    }

    // GEMMs: one parameter set per GPU generation.
    let mut gemms = BTreeMap::new();
    let mut power_capped_gemm_rate = POWER_CAPPED_GEMM_RATE;
    for generation in [GpuGeneration::Ampere, GpuGeneration::Hopper] {
        let rows = gemms_of(data, generation);
        if rows.is_empty() {
            continue;
        }
        let start = GemmParams::for_generation(generation);
        let fitted = fit_gemm_primitive(&rows, &start);
        let error = |r: &GemmMeasurement, (params, rate): &(GemmParams, f64)| {
            relative_error(predict_gemm(r, params, *rate), r.seconds)
        };
        let held_out = held_out_errors(&rows, |kept| fit_gemm_primitive(kept, &start), error);
        scores.push(PrimitiveScore {
            kind: format!("GEMM: {}", generation.name()),
            rows: rows.len(),
            sources: sources(&rows).len(),
            in_fit: rows.iter().map(|r| error(r, &fitted)).collect(),
            held_out_shape: source_levels_removed(&rows, &held_out),
            held_out_by_source: source_medians(&rows, &held_out),
            held_out,
        });
        if rows.iter().any(|r| r.power_capped) {
            power_capped_gemm_rate = fitted.1;
        }
        gemms.insert(generation.name(), fitted.0);
    }

    // Attention: one parameter set per (generation, kernel class); errors of the time the
    // rate implies.
    let mut attention = BTreeMap::new();
    let mut classes: BTreeMap<String, Vec<&AttentionMeasurement>> = BTreeMap::new();
    for row in &data.attention {
        if let Some((generation, kernel)) = attention_class(row) {
            classes
                .entry(format!("{}.{}", generation.name(), kernel.name()))
                .or_default()
                .push(row);
        }
    }
    let mut attention_score = PrimitiveScore {
        kind: "attention (fused kernels)".to_string(),
        ..Default::default()
    };
    let error = |r: &AttentionMeasurement, p: &AttentionParams| {
        relative_error(predict_attention(r, p), r.tflops).recip_rate()
    };
    for (class, rows) in &classes {
        let start = AttentionParams::default();
        let fitted = fit_attention(rows, &start);
        attention_score.rows += rows.len();
        attention_score.sources += sources(rows).len();
        attention_score
            .in_fit
            .extend(rows.iter().map(|r| error(r, &fitted)));
        let fit = |kept: &[&AttentionMeasurement]| {
            if kept.is_empty() {
                start
            } else {
                fit_attention(kept, &start)
            }
        };
        let held_out = held_out_errors(rows, fit, error);
        attention_score
            .held_out_shape
            .extend(source_levels_removed(rows, &held_out));
        attention_score
            .held_out_by_source
            .extend(source_medians(rows, &held_out));
        attention_score.held_out.extend(held_out);
        attention.insert(class.clone(), fitted);
    }
    scores.push(attention_score);

    // Memory-bound passes: one fraction of datasheet bandwidth.
    let rows: Vec<&MemoryMeasurement> = data.memory.iter().collect();
    let stream_fraction = fit_stream_fraction(&rows);
    let error = |r: &MemoryMeasurement, fraction: &f64| {
        relative_error(r.bandwidth, fraction * r.datasheet_bandwidth)
    };
    let held_out = held_out_errors(&rows, fit_stream_fraction, error);
    scores.push(PrimitiveScore {
        kind: "memory-bound pass (HBM)".to_string(),
        rows: rows.len(),
        sources: sources(&rows).len(),
        in_fit: rows.iter().map(|r| error(r, &stream_fraction)).collect(),
        held_out_shape: source_levels_removed(&rows, &held_out),
        held_out_by_source: source_medians(&rows, &held_out),
        held_out,
    });

    (
        FittedPrimitives {
            collectives: full,
            gemms,
            power_capped_gemm_rate,
            attention,
            stream_fraction,
        },
        scores,
    )
}

/// Turns a relative error of a rate into the relative error of the time it implies.
trait RateToTime {
    fn recip_rate(self) -> f64;
}

impl RateToTime for f64 {
    fn recip_rate(self) -> f64 {
        1.0 / (1.0 + self) - 1.0
    }
}

/// Errors of `fitted` on measurements none of its fits saw (a folder kept apart from the
/// microbenchmark folders, such as `data/microbench/measured-h200/`), per kind: every error
/// is held out by construction, so `in_fit` stays empty.
pub fn score_unseen(fitted: &FittedPrimitives, data: &Microbenchmarks) -> Vec<PrimitiveScore> {
    fn score<T: Sourced>(
        kind: String,
        rows: &[&T],
        error: impl Fn(&T) -> Option<f64>,
    ) -> PrimitiveScore {
        let scored: Vec<&T> = rows
            .iter()
            .copied()
            .filter(|r| error(r).is_some())
            .collect();
        let held_out: Vec<f64> = scored.iter().filter_map(|r| error(r)).collect();
        PrimitiveScore {
            kind,
            rows: scored.len(),
            sources: sources(&scored).len(),
            in_fit: Vec::new(),
            held_out_shape: source_levels_removed(&scored, &held_out),
            held_out_by_source: source_medians(&scored, &held_out),
            held_out,
        }
    }
    let mut scores = Vec::new();
    let collective_error = |r: &CollectiveMeasurement| {
        Some(relative_error(
            predict_collective(r, &fitted.collectives),
            r.seconds,
        ))
    };
    let (degraded, healthy) = split_never_fitted(data);
    for kind in kinds_of(healthy.iter().copied()) {
        let rows: Vec<&CollectiveMeasurement> =
            healthy.iter().copied().filter(|r| r.kind == kind).collect();
        let name = format!("collective: {}", kind.name());
        scores.push(score(name, &rows, collective_error));
    }
    if !degraded.is_empty() {
        let name = "collective: systems reported degraded".to_string();
        scores.push(score(name, &degraded, collective_error));
    }
    for generation in [GpuGeneration::Ampere, GpuGeneration::Hopper] {
        let rows = gemms_of(data, generation);
        if let (false, Some(params)) = (rows.is_empty(), fitted.gemms.get(generation.name())) {
            scores.push(score(format!("GEMM: {}", generation.name()), &rows, |r| {
                Some(relative_error(
                    predict_gemm(r, params, fitted.power_capped_gemm_rate),
                    r.seconds,
                ))
            }));
        }
    }
    let rows: Vec<&AttentionMeasurement> = data.attention.iter().collect();
    if !rows.is_empty() {
        scores.push(score("attention (fused kernels)".into(), &rows, |r| {
            let (generation, kernel) = attention_class(r)?;
            let params =
                fitted
                    .attention
                    .get(&format!("{}.{}", generation.name(), kernel.name()))?;
            Some(relative_error(predict_attention(r, params), r.tflops).recip_rate())
        }));
    }
    let rows: Vec<&MemoryMeasurement> = data.memory.iter().collect();
    if !rows.is_empty() {
        scores.push(score("memory-bound pass (HBM)".into(), &rows, |r| {
            Some(relative_error(
                r.bandwidth,
                fitted.stream_fraction * r.datasheet_bandwidth,
            ))
        }));
    }
    scores
}
