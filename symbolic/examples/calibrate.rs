//! Offline calibration and its honest check.
//!
//! 1. Throughput: a coordinate search of 5 parameters (Ampere's and Hopper's GEMM efficiencies,
//!    Hopper's FP8 levels following its bf16 one at the GEMM primitive's measured FP8 rates,
//!    `primitives::fp8_speedup` and `FP8_ROWWISE_RATE`; Ampere's memory efficiency of the
//!    fused stacks (Hopper's, and every generation's under eager PyTorch, is measured:
//!    `EAGER_ELEMENTWISE`), DeepSpeed's kernels relative to Megatron-LM's, GEMMs on misaligned
//!    attention heads relative to aligned ones), each inside a
//!    physically plausible range, on every source with complete configurations. Each source
//!    weighs the same (its mean absolute error), so the 149 MPT rows do not drown the 8 rows of
//!    Korthikanti et al., whose Table 5 also carries its own target term. The full fit starts
//!    from the round priors and from the committed values and keeps the better.
//! 2. Leave-one-source-out cross-validation: the same search with one source held out,
//!    started from the same priors, and that source's error under the parameters fitted
//!    without it: the estimate of the error on runs the model has not seen.
//! 3. Memory: the three overhead parameters (the memory outside the caching allocator,
//!    fragmentation, the allocator's cache in reserved readings) on the memory rows, penalising
//!    completed runs predicted not to fit and runs that ran out of memory predicted to fit;
//!    then the same fit with each memory source held out.
//!
//! Prints markdown for `symbolic/tests/validation_preamble.md`; the committed defaults in
//! `symbolic/src/cost/calibration.rs` are the full fit's output.
//!
//! `cargo run --release -p tessel-symbolic --example calibrate` (`SKIP_CV=1` stops after the
//! full fit, for trying a change to the model; `HELD_OUT=symbolic/data/held_out_errors.csv`
//! writes every row's error under the fit that held its source out, and the regime runs'
//! errors under the committed calibration, for the prediction intervals).

use std::collections::{BTreeMap, BTreeSet};

use tessel_symbolic::cost::{Calibration, GpuGeneration, KernelEfficiency};
use tessel_symbolic::uncertainty::{render_held_out, HeldOutRun, RunTraits};
use tessel_symbolic::validation::{
    default_data_path, default_regimes_path, evaluate_case, evaluate_regimes, load_cases,
    load_regime_cases, Case, ErrorStats, Outcome, Source, Throughput,
};

#[derive(Clone, Copy, Debug)]
struct State {
    cal: Calibration,
    ampere: KernelEfficiency,
    hopper: KernelEfficiency,
}

/// A fitted parameter: its name, the range the search may use, and the rows that carry it.
struct Parameter {
    name: &'static str,
    low: f64,
    high: f64,
    data: &'static str,
}

const fn parameter(name: &'static str, low: f64, high: f64, data: &'static str) -> Parameter {
    Parameter {
        name,
        low,
        high,
        data,
    }
}

/// The throughput parameters and their plausible ranges: kernel efficiencies between what
/// unfused eager kernels and tuned vendor kernels reach, software factors between much slower
/// and a little faster.
const THROUGHPUT: [Parameter; 5] = [
    parameter(
        "ampere.matmul",
        0.55,
        0.92,
        "A100 and V100 runs: Korthikanti, BLOOM, MT-NLG, MPT A100, torchtitan A100, Megatron-LM README",
    ),
    parameter(
        "hopper.matmul",
        0.50,
        0.85,
        "H100 runs (FP8 ones at the measured FP8 speedup): MPT H100, torchtitan, NeMo",
    ),
    parameter(
        "ampere.memory",
        0.40,
        0.92,
        "A100 and V100 runs of Megatron-LM and DeepSpeed (fused elementwise passes)",
    ),
    // DeepSpeed's kernels relative to Megatron-LM's: between much slower and a little faster.
    parameter(
        "deepspeed_kernels",
        0.6,
        1.1,
        "DeepSpeed runs: BLOOM, MT-NLG",
    ),
    // GEMMs on misaligned operands: from CUDA cores at a fifth of their peak to full speed.
    parameter("misaligned_matmul", 0.05, 1.0, "BLOOM head-count sweeps"),
];

/// The memory overheads and their plausible ranges.
const MEMORY: [Parameter; 3] = [
    // The CUDA context (about 0.5 GB) and one to three NCCL communicators' buffers (0.5–1.6 GB
    // each: NVIDIA/nccl#864 and #964).
    parameter(
        "outside_allocator_bytes",
        1.0e9,
        6.0e9,
        "device-memory rows: BLOOM; fits of completed and out-of-memory runs",
    ),
    parameter(
        "fragmentation",
        0.03,
        0.30,
        "memory rows: BLOOM, torchtitan, Mist",
    ),
    // Cached freed blocks in reserved readings: none up to half the dynamic memory again.
    parameter(
        "allocator_cache",
        0.0,
        0.5,
        "reserved-memory rows: BLOOM, torchtitan",
    ),
];

impl State {
    fn efficiency(&self, case: &Case) -> KernelEfficiency {
        match GpuGeneration::from_name(&case.spec.cluster.gpu.name) {
            GpuGeneration::Ampere => self.ampere,
            // Volta shares Ampere's GEMM primitive, levels and memory system fraction.
            GpuGeneration::Volta => KernelEfficiency {
                generation: GpuGeneration::Volta,
                ..self.ampere
            },
            GpuGeneration::Hopper => self.hopper,
            // Ada's level is a prior: Mist's two L4 runs are too few to fit one.
            _ => KernelEfficiency::for_gpu(&case.spec.cluster.gpu),
        }
    }

    fn slot(&mut self, name: &str) -> Option<&mut f64> {
        Some(match name {
            "ampere.matmul" => &mut self.ampere.matmul,
            "hopper.matmul" => &mut self.hopper.matmul,
            "ampere.memory" => &mut self.ampere.memory,
            "deepspeed_kernels" => &mut self.cal.deepspeed_kernels,
            "misaligned_matmul" => &mut self.cal.misaligned_matmul,
            "outside_allocator_bytes" => &mut self.cal.outside_allocator_bytes,
            "fragmentation" => &mut self.cal.fragmentation,
            "allocator_cache" => &mut self.cal.allocator_cache,
            _ => return None,
        })
    }

    fn set(&mut self, parameter: &Parameter, value: f64) {
        if let Some(slot) = self.slot(parameter.name) {
            *slot = value.clamp(parameter.low, parameter.high);
        }
    }

    fn clone_get(&self, name: &str) -> f64 {
        let mut copy = *self;
        copy.get(name)
    }

    fn get(&mut self, name: &str) -> f64 {
        self.slot(name).map_or(0.0, |slot| *slot)
    }
}

/// Round starting values, the same for the full fit and every held-out fit, so that no fit
/// starts from a point another fit chose (the committed defaults are the full fit's output
/// and would leak the held-out source into its own cross-validation fit).
const PRIORS: [(&str, f64); 8] = [
    ("ampere.matmul", 0.75),
    ("hopper.matmul", 0.70),
    ("ampere.memory", 0.70),
    ("deepspeed_kernels", 1.0),
    // A100's fp16 peak without tensor cores over its tensor-core peak, 78 / 312 TFLOP/s
    // (NVIDIA A100 datasheet).
    ("misaligned_matmul", 0.25),
    // The CUDA context and one NCCL communicator.
    ("outside_allocator_bytes", 1.5e9),
    ("fragmentation", 0.10),
    ("allocator_cache", 0.10),
];

fn outcomes(cases: &[&Case], state: &State) -> Vec<Outcome> {
    cases
        .iter()
        .map(|case| evaluate_case(case, state.cal, state.efficiency(case)))
        .collect()
}

fn throughput_by_source(cases: &[&Case], outs: &[Outcome]) -> BTreeMap<Source, ErrorStats> {
    let mut errors: BTreeMap<Source, Vec<f64>> = BTreeMap::new();
    for (case, outcome) in cases.iter().zip(outs) {
        if let Some(error) = outcome.throughput_error {
            errors.entry(case.source).or_default().push(error);
        }
    }
    errors
        .into_iter()
        .map(|(source, list)| (source, ErrorStats::of(list.into_iter())))
        .collect()
}

fn table5(cases: &[&Case], outs: &[Outcome]) -> ErrorStats {
    ErrorStats::of(
        cases
            .iter()
            .zip(outs)
            .filter(|(c, _)| c.source == Source::Korthikanti && c.table.starts_with("Table 5"))
            .filter_map(|(_, o)| o.throughput_error),
    )
}

/// Mean over sources of each source's mean error, plus Korthikanti's Table 5 target term
/// when it is in the fit set.
fn throughput_objective(cases: &[&Case], state: &State) -> f64 {
    let outs = outcomes(cases, state);
    let by_source = throughput_by_source(cases, &outs);
    if by_source.is_empty() {
        return 0.0;
    }
    let balanced = by_source.values().map(|s| s.mean).sum::<f64>() / by_source.len() as f64;
    let table5 = table5(cases, &outs);
    let target = if table5.count > 0 {
        2.0 * table5.mean + 0.5 * table5.max
    } else {
        0.0
    };
    balanced + target
}

/// Mean memory error per source (balanced), plus 0.3 % per completed run predicted not to
/// fit and per out-of-memory run predicted to fit.
fn memory_objective(cases: &[&Case], state: &State) -> f64 {
    let outs = outcomes(cases, state);
    let mut errors: BTreeMap<Source, Vec<f64>> = BTreeMap::new();
    for (case, outcome) in cases.iter().zip(&outs) {
        if let Some(error) = outcome.memory_error {
            errors.entry(case.source).or_default().push(error);
        }
    }
    let balanced = errors
        .values()
        .map(|list| ErrorStats::of(list.iter().copied()).mean)
        .sum::<f64>()
        / errors.len().max(1) as f64;
    let (wrong_fit, wrong_oom) = fit_mistakes(&outs);
    balanced + 0.003 * (wrong_fit + wrong_oom) as f64
}

/// Completed runs predicted not to fit, and out-of-memory runs predicted to fit.
fn fit_mistakes(outs: &[Outcome]) -> (usize, usize) {
    let costed = outs.iter().filter(|o| o.error.is_none());
    let wrong_fit = costed
        .clone()
        .filter(|o| !o.oom && !o.predicted_fits)
        .count();
    let wrong_oom = costed.filter(|o| o.oom && o.predicted_fits).count();
    (wrong_fit, wrong_oom)
}

fn search(
    parameters: &[Parameter],
    cases: &[&Case],
    state: &mut State,
    objective: fn(&[&Case], &State) -> f64,
) -> f64 {
    let mut best = objective(cases, state);
    let factors = [0.7, 0.85, 0.93, 0.97, 1.03, 1.07, 1.15, 1.4];
    for _ in 0..10 {
        let mut improved = false;
        for parameter in parameters {
            let current = state.get(parameter.name);
            let mut candidates: Vec<f64> = factors.iter().map(|f| current * f).collect();
            candidates.extend([parameter.low, parameter.high]);
            for value in candidates {
                let mut trial = *state;
                trial.set(parameter, value);
                let score = objective(cases, &trial);
                if score < best - 1e-7 {
                    best = score;
                    *state = trial;
                    improved = true;
                }
            }
        }
        if !improved {
            break;
        }
    }
    best
}

fn percent(x: f64) -> String {
    format!("{:.1} %", 100.0 * x)
}

fn main() {
    let (cases, _) = match load_cases(&default_data_path()) {
        Ok(loaded) => loaded,
        Err(err) => {
            eprintln!("{err}");
            return;
        }
    };
    let default_for = |generation: GpuGeneration| {
        cases
            .iter()
            .find(|c| GpuGeneration::from_name(&c.spec.cluster.gpu.name) == generation)
            .map(|c| KernelEfficiency::for_gpu(&c.spec.cluster.gpu))
    };
    let (Some(ampere), Some(hopper)) = (
        default_for(GpuGeneration::Ampere),
        default_for(GpuGeneration::Hopper),
    ) else {
        eprintln!("the table lacks a GPU generation");
        return;
    };
    let committed = State {
        cal: Calibration::default(),
        ampere,
        hopper,
    };
    let mut prior = committed;
    for (name, value) in PRIORS {
        if let Some(parameter) = THROUGHPUT.iter().chain(&MEMORY).find(|p| p.name == name) {
            prior.set(parameter, value);
        }
    }
    let all: Vec<&Case> = cases.iter().filter(|c| c.throughput.is_some()).collect();
    if std::env::var_os("PARAMETERS").is_some() {
        print_parameter_table(&committed);
        return;
    }

    // The coordinate search finds a local minimum: the full fit starts from the round priors
    // and from the committed values and keeps the better. Held-out fits start from the
    // priors only, since the committed values saw the held-out source.
    let mut fitted = prior;
    let from_prior = search(&THROUGHPUT, &all, &mut fitted, throughput_objective);
    let mut refitted = committed;
    if search(&THROUGHPUT, &all, &mut refitted, throughput_objective) < from_prior {
        fitted = refitted;
    }
    let memory_cases: Vec<&Case> = cases.iter().collect();
    search(&MEMORY, &memory_cases, &mut fitted, memory_objective);
    println!("{fitted:#?}");
    print_parameter_table(&fitted);
    let full_outs = outcomes(&memory_cases, &fitted);
    let (wrong_fit, wrong_oom) = fit_mistakes(&full_outs);
    println!("completed runs predicted not to fit: {wrong_fit}; out-of-memory runs predicted to fit: {wrong_oom}");
    println!("\nParameters on a bound:");
    for parameter in THROUGHPUT.iter().chain(&MEMORY) {
        let value = fitted.get(parameter.name);
        if (value - parameter.low).abs() < 1e-12 || (value - parameter.high).abs() < 1e-12 {
            println!(
                "- {} = {value} (range {} – {})",
                parameter.name, parameter.low, parameter.high
            );
        }
    }

    if std::env::var_os("SKIP_CV").is_some() {
        return;
    }
    let in_fit_outs = outcomes(&all, &fitted);
    let in_fit = throughput_by_source(&all, &in_fit_outs);
    let sources: Vec<Source> = in_fit.keys().copied().collect();
    println!(
        "\n| held-out source | rows | error in the full fit | error held out (fit on the others) |"
    );
    println!("|---|---:|---:|---:|");
    let mut held_out_runs = Vec::new();
    let mut held_out_errors = Vec::new();
    for source in sources {
        let rest: Vec<&Case> = all.iter().copied().filter(|c| c.source != source).collect();
        let held: Vec<&Case> = all.iter().copied().filter(|c| c.source == source).collect();
        let mut state = prior;
        search(&THROUGHPUT, &rest, &mut state, throughput_objective);
        let held_outs = outcomes(&held, &state);
        held_out_runs.extend(held_out_rows(&held, &held_outs));
        held_out_errors.extend(held_outs.iter().filter_map(|o| o.throughput_error));
        let held_out = throughput_by_source(&held, &held_outs);
        let stats = held_out.get(&source).copied().unwrap_or_default();
        let full = in_fit.get(&source).copied().unwrap_or_default();
        println!(
            "| {} | {} | {} (max {}) | {} (max {}) |",
            source.label(),
            stats.count,
            percent(full.mean),
            percent(full.max),
            percent(stats.mean),
            percent(stats.max)
        );
        if source == Source::Korthikanti {
            let table5 = table5(&held, &outcomes(&held, &state));
            println!(
                "|   Table 5 held out | {} | | {} (max {}) |",
                table5.count,
                percent(table5.mean),
                percent(table5.max)
            );
        }
    }

    // Every row under the fit that held its source out: the measure over all rows.
    let all_in_fit = ErrorStats::of(in_fit_outs.iter().filter_map(|o| o.throughput_error));
    let all_held_out = ErrorStats::of(held_out_errors.into_iter());
    println!(
        "| all rows | {} | {} (max {}) | {} (max {}) |",
        all_held_out.count,
        percent(all_in_fit.mean),
        percent(all_in_fit.max),
        percent(all_held_out.mean),
        percent(all_held_out.max)
    );

    if let Some(path) = std::env::var_os("HELD_OUT") {
        held_out_runs.extend(regime_rows());
        let text = render_held_out(&held_out_runs);
        if let Err(err) = std::fs::write(&path, text) {
            eprintln!("cannot write {}: {err}", path.to_string_lossy());
        }
    }

    // A GPU generation the fit never saw keeps its priors for the per-generation fractions:
    // this is the error on a new GPU before anyone measured a training run on it.
    println!("\n| held-out GPU generation | rows | error in the full fit | error held out |");
    println!("|---|---:|---:|---:|");
    for generation in [
        GpuGeneration::Volta,
        GpuGeneration::Ampere,
        GpuGeneration::Hopper,
        GpuGeneration::Ada,
    ] {
        let of = |c: &&Case| GpuGeneration::from_name(&c.spec.cluster.gpu.name) == generation;
        let rest: Vec<&Case> = all.iter().copied().filter(|c| !of(c)).collect();
        let held: Vec<&Case> = all.iter().copied().filter(of).collect();
        let mut state = prior;
        search(&THROUGHPUT, &rest, &mut state, throughput_objective);
        report_held(
            &format!("{generation:?}"),
            &held,
            &fitted,
            &state,
            throughput_error,
        );
    }

    // Fit on runs of at most 512 GPUs, predict the larger ones.
    println!("\n| held-out scale | rows | error in the full fit | error held out |");
    println!("|---|---:|---:|---:|");
    let gpus = |c: &Case| c.strategy.dp * c.strategy.tp * c.strategy.pp * c.strategy.cp;
    let small: Vec<&Case> = all.iter().copied().filter(|c| gpus(c) <= 512).collect();
    let large: Vec<&Case> = all.iter().copied().filter(|c| gpus(c) > 512).collect();
    let mut state = prior;
    search(&THROUGHPUT, &small, &mut state, throughput_objective);
    report_held(
        "runs on more than 512 GPUs (fit on ≤ 512)",
        &large,
        &fitted,
        &state,
        throughput_error,
    );

    // Memory with one source held out: the overheads refitted from their priors on the other
    // sources' memory rows and fit decisions, the throughput parameters as fitted.
    println!("\n| held-out source (memory) | rows | error in the full fit | error held out |");
    println!("|---|---:|---:|---:|");
    let with_memory: BTreeSet<Source> = memory_cases
        .iter()
        .filter(|c| c.memory.is_some())
        .map(|c| c.source)
        .collect();
    for source in with_memory {
        let (held, rest): (Vec<&Case>, Vec<&Case>) =
            memory_cases.iter().partition(|c| c.source == source);
        let mut state = fitted;
        for parameter in &MEMORY {
            state.set(parameter, prior.clone_get(parameter.name));
        }
        search(&MEMORY, &rest, &mut state, memory_objective);
        report_held(source.label(), &held, &fitted, &state, memory_error);
    }
}

fn throughput_error(outcome: &Outcome) -> Option<f64> {
    outcome.throughput_error
}

fn memory_error(outcome: &Outcome) -> Option<f64> {
    outcome.memory_error
}

/// Every fitted value, its range, the rows that carry it, and whether it sits on a bound.
fn print_parameter_table(state: &State) {
    println!("\n| parameter | value | range | fitted on | on a bound |");
    println!("|---|---:|---|---|---|");
    for parameter in THROUGHPUT.iter().chain(&MEMORY) {
        let value = state.clone_get(parameter.name);
        let on_bound = (value - parameter.low).abs() <= 1e-9 * parameter.low.abs().max(1e-12)
            || (value - parameter.high).abs() <= 1e-9 * parameter.high.abs();
        println!(
            "| `{}` | {} | {} – {} | {} | {} |",
            parameter.name,
            significant(value),
            significant(parameter.low),
            significant(parameter.high),
            parameter.data,
            if on_bound { "**yes**" } else { "no" }
        );
    }
}

fn significant(x: f64) -> String {
    if x == 0.0 {
        "0".to_string()
    } else if x.abs() >= 1e6 || x.abs() < 1e-3 {
        format!("{x:.3e}")
    } else {
        format!("{:.4}", x)
    }
}

/// One line of a held-out table: the rows' mean `error` (of throughput or of memory) under the
/// full fit and under `state`.
fn report_held(
    label: &str,
    held: &[&Case],
    fitted: &State,
    state: &State,
    error: fn(&Outcome) -> Option<f64>,
) {
    let errors = |state: &State| ErrorStats::of(outcomes(held, state).iter().filter_map(error));
    let (full, out) = (errors(fitted), errors(state));
    println!(
        "| {label} | {} | {} (max {}) | {} (max {}) |",
        out.count,
        percent(full.mean),
        percent(full.max),
        percent(out.mean),
        percent(out.max)
    );
}

/// The held-out rows of one source: each costed run's log step-time error.
fn held_out_rows(held: &[&Case], outs: &[Outcome]) -> Vec<HeldOutRun> {
    held.iter()
        .zip(outs)
        .filter_map(|(case, outcome)| {
            let (measured, predicted) = outcome.throughput?;
            let log_error = match measured {
                Throughput::StepTime(step) => (predicted / step).ln(),
                Throughput::TokensPerGpu(tokens) => (tokens / predicted).ln(),
            };
            Some(HeldOutRun {
                group: case.source.label().to_string(),
                model: case.model.clone(),
                traits: RunTraits::of(&case.spec, &case.strategy),
                log_error,
            })
        })
        .collect()
}

/// The regime runs under the committed calibration (no fit sees them).
fn regime_rows() -> Vec<HeldOutRun> {
    let outcomes = load_regime_cases(&default_regimes_path()).and_then(|c| evaluate_regimes(&c));
    match outcomes {
        Ok(outcomes) => outcomes
            .iter()
            .map(|o| HeldOutRun {
                group: format!("regime: {}", o.case.regime),
                model: o.case.model.clone(),
                traits: RunTraits::of(&o.case.spec, &o.case.spec.strategies[0]),
                log_error: o.log_step_error(),
            })
            .collect(),
        Err(err) => {
            eprintln!("{err}");
            Vec::new()
        }
    }
}
