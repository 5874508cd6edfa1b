//! `tessel calibrate TRACE... --spec SPEC [-o cluster.cal.json] [--explain]`: the cost model's
//! primitives refitted to measurements from the user's own cluster. Reads nccl-tests output
//! (the collective, rank count and ranks per node come from the output's device list and test
//! name, else from the file name and the options), PyTorch profiler traces (their NCCL
//! kernels, with the sizes PyTorch records), Tessel's own `launch --trace` files (their
//! data-parallel collectives) and CSVs of GEMM timings (`*.csv`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use tessel_grammar::{ClusterSpec, Precision, Spec};
use tessel_interop::traces::{
    kineto_trace, parse_gemm_csv, parse_nccl_tests, read_trace_json, tessel_trace, NcclTestsRun,
    StepWork, TesselTrace, TracedRun,
};
use tessel_symbolic::calibration::{
    fit_cluster_collectives, fit_cluster_compute, fit_cluster_gemms, rank_jitter, CalibrationInput,
    ClusterCalibration, PrimitiveFit, StageWork, TracedStep, CALIBRATION_FORMAT,
};
use tessel_symbolic::cost::{Calibration, GpuGeneration};
use tessel_symbolic::primitives::fit::median;
use tessel_symbolic::primitives::{
    Collective, CollectiveMeasurement, CollectiveParams, GemmDevice, GemmMeasurement, GemmParams,
    Links,
};

use super::{load_spec, write_output, EXIT_BAD_INPUT};

#[derive(clap::Args)]
pub struct Args {
    /// Measurement files: nccl-tests output (`all_reduce_perf`, `all_gather_perf`,
    /// `reduce_scatter_perf`, `alltoall_perf`, `sendrecv_perf`), PyTorch profiler traces or
    /// `tessel launch --trace` files (JSON), or a `.csv` of GEMM timings (columns m, n, k and
    /// time_us, time_ms or tflops).
    #[arg(required = true)]
    pub traces: Vec<PathBuf>,
    /// The spec whose cluster was measured (its GPUs and links).
    #[arg(long)]
    pub spec: PathBuf,
    /// Where to write the calibration (JSON); standard output without it.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// The collective, for output that does not name its test and a file name that does not
    /// say it (`all_reduce`, `all_gather`, `reduce_scatter`, `alltoall`, `sendrecv`).
    #[arg(long)]
    pub collective: Option<String>,
    /// Ranks of the run, for output without its `# Using devices` list.
    #[arg(long)]
    pub ranks: Option<u64>,
    /// Ranks per node, for output without its device list (default: the cluster's GPUs per
    /// node, at most the ranks).
    #[arg(long)]
    pub per_node: Option<u64>,
    /// Print every parameter before and after, the values the measurements support (the fit's
    /// error within 10 % of its minimum, the others held), and which stopped on its bound.
    #[arg(long)]
    pub explain: bool,
}

pub fn run(args: &Args) -> ExitCode {
    let spec = match load_spec(&args.spec) {
        Ok(spec) => spec,
        Err(code) => return code,
    };
    let mut inputs = Vec::new();
    let mut collectives = Vec::new();
    let mut gemms = Vec::new();
    let mut steps = Vec::new();
    for path in &args.traces {
        let read = match std::fs::read_to_string(path) {
            Err(error) => Err(format!("cannot read it: {error}")),
            Ok(text)
                if path
                    .extension()
                    .is_some_and(|e| e.eq_ignore_ascii_case("csv")) =>
            {
                read_gemm_csv(path, &text, &spec).map(|(input, rows)| {
                    gemms.extend(rows);
                    input
                })
            }
            Ok(text) if text.trim_start().starts_with(['{', '[']) => {
                // One JSON document, read once: Tessel's trace if it records collectives,
                // else the PyTorch profiler's.
                read_trace_json(&text)
                    .map_err(|e| e.to_string())
                    .and_then(|value| match tessel_trace(&value) {
                        Ok(traced) => read_tessel(path, &traced, args, &spec).map(|read| {
                            collectives.extend(read.collectives);
                            gemms.extend(read.gemms);
                            steps.extend(read.step);
                            read.input
                        }),
                        Err(_) => read_kineto(path, &value, args, &spec).map(|(input, c, g)| {
                            collectives.extend(c);
                            gemms.extend(g);
                            input
                        }),
                    })
            }
            Ok(text) => read_nccl_tests(path, &text, args, &spec).map(|(input, rows)| {
                collectives.extend(rows);
                input
            }),
        };
        match read {
            Ok(input) => inputs.push(input),
            Err(message) => {
                eprintln!("error: {}: {message}", path.display());
                return ExitCode::from(EXIT_BAD_INPUT);
            }
        }
    }
    let (collectives, collectives_fit) = split(
        (!collectives.is_empty())
            .then(|| fit_cluster_collectives(&collectives, &CollectiveParams::default())),
    );
    let generation = GpuGeneration::from_name(&spec.cluster.gpu.name);
    let (gemm, gemm_fit) = split(
        (!gemms.is_empty())
            .then(|| fit_cluster_gemms(&gemms, &GemmParams::for_generation(generation))),
    );
    let base = Calibration {
        collectives: collectives.unwrap_or_default(),
        gemm,
        ..Calibration::default()
    };
    let (compute, compute_fit) = if steps.is_empty() {
        (None, None)
    } else {
        match fit_cluster_compute(&steps, &base) {
            Ok((params, fit)) => (Some(params), Some(fit)),
            Err(error) => {
                eprintln!("error: the traced runs cannot be predicted: {error}");
                return ExitCode::from(EXIT_BAD_INPUT);
            }
        }
    };
    let calibration = ClusterCalibration {
        format: CALIBRATION_FORMAT.to_string(),
        cluster: spec.cluster.name.clone(),
        inputs,
        collectives,
        collectives_fit,
        gemm,
        gemm_fit,
        compute,
        compute_fit,
    };
    let json = serde_json::to_string_pretty(&calibration).expect("a calibration serialises") + "\n";
    let Some(output) = &args.output else {
        return write_output(None, &json);
    };
    let code = write_output(Some(output), &json);
    if code == ExitCode::SUCCESS {
        print!("{}", summary(&calibration, args.explain));
        println!("wrote {}", output.display());
    }
    code
}

fn split<T>(fitted: Option<(T, PrimitiveFit)>) -> (Option<T>, Option<PrimitiveFit>) {
    match fitted {
        Some((params, fit)) => (Some(params), Some(fit)),
        None => (None, None),
    }
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into(),
    )
}

/// A CSV's GEMM timings, on the spec's GPU.
fn read_gemm_csv(
    path: &Path,
    text: &str,
    spec: &Spec,
) -> Result<(CalibrationInput, Vec<GemmMeasurement>), String> {
    let timings = parse_gemm_csv(text).map_err(|e| e.to_string())?;
    let file = file_name(path);
    let rows: Vec<GemmMeasurement> = timings
        .iter()
        .map(|t| gemm_measured(&file, spec, (t.m, t.n, t.k), &t.dtype, t.seconds))
        .collect();
    let input = CalibrationInput {
        file,
        kind: "gemm-csv".to_string(),
        measures: "gemm".to_string(),
        ranks: None,
        ranks_per_node: None,
        rows: rows.len(),
    };
    Ok((input, rows))
}

/// One timed GEMM (`m × k` by `k × n`, `bf16`, `fp16` or `fp32`) on the spec's GPU.
fn gemm_measured(
    file: &str,
    spec: &Spec,
    (m, n, k): (u64, u64, u64),
    dtype: &str,
    seconds: f64,
) -> GemmMeasurement {
    let gpu = &spec.cluster.gpu;
    GemmMeasurement {
        source: file.to_string(),
        measurement: file.to_string(),
        gpu: gpu.name.clone(),
        m: m as f64,
        n: n as f64,
        k: k as f64,
        device: GemmDevice::of(
            gpu,
            match dtype {
                "fp16" => gpu.peak.fp16,
                "fp32" => gpu.peak.fp32,
                _ => gpu.peak.bf16,
            },
            gpu.hbm_bandwidth,
        ),
        seconds,
        // The cluster's level is what its own timings give, whatever the GPU's power state.
        power_capped: false,
    }
}

/// One nccl-tests file's measurements, with what they were measured on.
fn read_nccl_tests(
    path: &Path,
    text: &str,
    args: &Args,
    spec: &Spec,
) -> Result<(CalibrationInput, Vec<CollectiveMeasurement>), String> {
    let run = parse_nccl_tests(text).map_err(|e| e.to_string())?;
    let file = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into(),
    );
    let kind = collective_of(&run, &file, args.collective.as_deref())?;
    let ranks = run.ranks().or(args.ranks).ok_or_else(|| {
        "the output has no `# Using devices` list, so its rank count is unknown; give --ranks N"
            .to_string()
    })?;
    let per_node = run
        .ranks_per_host()
        .or(args.per_node)
        .unwrap_or(spec.cluster.gpus_per_node)
        .min(ranks)
        .max(1);
    if ranks < 2 {
        return Err(format!(
            "{ranks} rank: a collective needs two or more to measure anything"
        ));
    }
    let gpus_per_thread = run.gpus_per_thread.unwrap_or(1) as f64;
    let rows = run
        .rows
        .iter()
        .map(|row| CollectiveMeasurement {
            gpus_per_thread,
            ..measured(
                &file,
                spec,
                kind,
                (ranks, per_node),
                row.bytes,
                row.out_of_place_us * 1e-6,
            )
        })
        .collect::<Vec<_>>();
    let input = CalibrationInput {
        file,
        kind: "nccl-tests".to_string(),
        measures: kind.name().to_string(),
        ranks: Some(ranks),
        ranks_per_node: Some(per_node),
        rows: rows.len(),
    };
    Ok((input, rows))
}

/// A PyTorch profiler trace's NCCL kernels, each its own measurement of its collective over
/// its process group, placed on the spec's nodes by global rank; and its GEMMs with shapes,
/// timed by the kernels they launched.
fn read_kineto(
    path: &Path,
    document: &serde_json::Value,
    args: &Args,
    spec: &Spec,
) -> Result<
    (
        CalibrationInput,
        Vec<CollectiveMeasurement>,
        Vec<GemmMeasurement>,
    ),
    String,
> {
    let trace = kineto_trace(document).map_err(|e| e.to_string())?;
    let file = file_name(path);
    let gpus_per_node = spec.cluster.gpus_per_node.max(1);
    let rows: Vec<CollectiveMeasurement> = trace
        .collectives
        .iter()
        .filter(|c| c.group_size >= 2)
        .filter_map(|c| {
            let kind = collective_of_pytorch(&c.name)?;
            let per_node = args.per_node.unwrap_or_else(|| {
                let mut nodes: Vec<u64> = c.group_ranks.iter().map(|r| r / gpus_per_node).collect();
                nodes.sort_unstable();
                nodes
                    .chunk_by(|a, b| a == b)
                    .map(|same| same.len() as u64)
                    .max()
                    .unwrap_or(gpus_per_node)
            });
            Some(measured(
                &file,
                spec,
                kind,
                (c.group_size, per_node.clamp(1, c.group_size)),
                c.bytes,
                c.duration_us * 1e-6,
            ))
        })
        .collect();
    let gemms: Vec<GemmMeasurement> = trace
        .gemms
        .iter()
        .map(|g| gemm_measured(&file, spec, (g.m, g.n, g.k), g.dtype, g.duration_us * 1e-6))
        .collect();
    if rows.is_empty() && gemms.is_empty() {
        return Err(format!(
            "neither a Tessel trace with collectives nor a PyTorch profiler trace with an NCCL \
             kernel of a modelled collective, its size and group ({} collective kernels, none \
             all-reduce, all-gather, reduce-scatter or all-to-all over two or more ranks) or \
             a bf16/fp16 GEMM with its shapes; profile with PyTorch 2.1 or newer and \
             record_shapes=True",
            trace.collectives.len() + trace.skipped_collectives
        ));
    }
    let mut input = traced_input(file, "pytorch-profiler", &rows);
    if !gemms.is_empty() {
        input.measures = [input.measures.as_str(), "gemm"]
            .iter()
            .filter(|m| !m.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join(" ");
        input.rows += gemms.len();
    }
    Ok((input, rows, gemms))
}

/// What one Tessel trace measured.
struct TesselMeasurements {
    input: CalibrationInput,
    collectives: Vec<CollectiveMeasurement>,
    gemms: Vec<GemmMeasurement>,
    step: Option<TracedStep>,
}

/// A Tessel trace's data-parallel collectives, each call a measurement, and the run it
/// traced, when it records one: the matmuls each rank timed (each shape a measurement, at
/// the run's precision) and the run's step.
fn read_tessel(
    path: &Path,
    traced: &TesselTrace,
    args: &Args,
    spec: &Spec,
) -> Result<TesselMeasurements, String> {
    let file = file_name(path);
    let collectives: Vec<CollectiveMeasurement> = traced
        .collectives
        .iter()
        .filter(|c| c.ranks >= 2 && c.bytes > 0 && c.after_last_arrival_us > 0.0)
        .filter_map(|c| {
            let per_node = args
                .per_node
                .unwrap_or(spec.cluster.gpus_per_node)
                .clamp(1, c.ranks);
            Some(measured(
                &file,
                spec,
                Collective::from_name(&c.name)?,
                (c.ranks, per_node),
                c.bytes,
                c.after_last_arrival_us * 1e-6,
            ))
        })
        .collect();
    let (step, gemms) =
        match &traced.run {
            Some(run) => {
                let dtype = match run.spec.train.precision {
                    Precision::Fp32 => "fp32",
                    Precision::Fp16 => "fp16",
                    Precision::Bf16 | Precision::Fp8 => "bf16",
                };
                let gemms = run
                    .matmuls
                    .iter()
                    .map(|t| gemm_measured(&file, spec, (t.m, t.n, t.k), dtype, t.median_s))
                    .collect();
                (Some(traced_step(&file, run, spec)?), gemms)
            }
            None if collectives.is_empty() => return Err(
                "the Tessel trace has no collective over two or more ranks (a run without data \
                 parallelism) and does not record its run (trace it again with this `tessel \
                 launch`)"
                    .to_string(),
            ),
            None => (None, Vec::new()),
        };
    let mut input = traced_input(file, "tessel-trace", &collectives);
    if let Some(step) = &step {
        let measures = [
            input.measures.as_str(),
            if gemms.is_empty() { "" } else { "gemm" },
            "compute",
        ];
        input.measures = measures
            .iter()
            .filter(|m| !m.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join(" ");
        input.rows += gemms.len() + 2 * step.stages.len() + 1;
        let world = step.spec.cluster.total_gpus();
        input.ranks = Some(input.ranks.unwrap_or(0).max(world));
        input.ranks_per_node = Some(
            input
                .ranks_per_node
                .unwrap_or(0)
                .max(step.spec.cluster.gpus_per_node),
        );
    }
    Ok(TesselMeasurements {
        input,
        collectives,
        gemms,
        step,
    })
}

/// A traced run on the calibrated cluster (resized to the run's ranks), with each stage's
/// busy time and optimizer step and the step time: medians over the steps after the first,
/// which allocates (over every step when only one was traced).
fn traced_step(file: &str, run: &TracedRun, spec: &Spec) -> Result<TracedStep, String> {
    let median = |mut values: Vec<f64>| (!values.is_empty()).then(|| median(&mut values));
    let after_first = |steps: usize| usize::from(steps > 1);
    let step_s = median(run.step_time_s[after_first(run.step_time_s.len())..].to_vec())
        .filter(|s| *s > 0.0)
        .ok_or("the traced run has no step time")?;
    let mut stages = Vec::new();
    let mut jitters = Vec::new();
    for (stage, strategy) in (0..).zip(&run.stage_strategies) {
        let ranks = run.ranks.iter().filter(|r| r.stage == stage);
        // Ranks that meet only at the step's reduction keep their spread in their compute.
        let alone_in_the_step =
            strategy.tp == 1 && strategy.cp == 1 && strategy.ep == 1 && strategy.zero <= 1;
        if alone_in_the_step {
            let compute: Vec<Vec<f64>> = ranks
                .clone()
                .map(|r| {
                    r.steps
                        .iter()
                        .skip(after_first(r.steps.len()))
                        .map(|w| w.forward_s + w.backward_s)
                        .collect()
                })
                .collect();
            jitters.extend(rank_jitter(&compute));
        }
        let work: Vec<&StepWork> = ranks
            .flat_map(|r| r.steps.iter().skip(after_first(r.steps.len())))
            .collect();
        let busy = work
            .iter()
            .map(|w| w.forward_s + w.backward_s + w.reduce_s)
            .collect();
        let optimizer = work.iter().map(|w| w.optimizer_s).collect();
        let (Some(busy_s), Some(optimizer_s)) = (median(busy), median(optimizer)) else {
            return Err(format!("stage {stage} of the traced run finished no step"));
        };
        stages.push(StageWork {
            stage,
            busy_s,
            optimizer_s,
        });
    }
    let mut traced = run.spec.clone();
    traced.cluster = ClusterSpec {
        calibration: None,
        ..spec.cluster.clone()
    };
    let world = run
        .stage_strategies
        .first()
        .map_or(1, |s| s.dp * s.tp * s.pp * s.cp);
    let per_node = traced.cluster.gpus_per_node.max(1);
    if world <= per_node {
        traced.cluster.nodes = 1;
        traced.cluster.gpus_per_node = world;
    } else if world.is_multiple_of(per_node) {
        traced.cluster.nodes = world / per_node;
    } else {
        return Err(format!(
            "the traced run has {world} ranks, neither part of one of {}'s nodes nor whole nodes \
             of {per_node}",
            spec.cluster.name
        ));
    }
    Ok(TracedStep {
        source: file.to_string(),
        spec: traced,
        stage_strategies: run.stage_strategies.clone(),
        step_s,
        stages,
        jitter: (!jitters.is_empty()).then(|| jitters.iter().sum::<f64>() / jitters.len() as f64),
    })
}

/// A trace's input line: the collectives it measured, its largest group.
fn traced_input(file: String, kind: &str, rows: &[CollectiveMeasurement]) -> CalibrationInput {
    let mut names: Vec<&str> = rows.iter().map(|r| r.kind.name()).collect();
    names.sort_unstable();
    names.dedup();
    CalibrationInput {
        file,
        kind: kind.to_string(),
        measures: names.join(" "),
        ranks: rows.iter().map(|r| r.ranks as u64).max(),
        ranks_per_node: rows.iter().map(|r| r.per_node as u64).max(),
        rows: rows.len(),
    }
}

/// One timed collective on the spec's cluster.
fn measured(
    file: &str,
    spec: &Spec,
    kind: Collective,
    (ranks, per_node): (u64, u64),
    bytes: u64,
    seconds: f64,
) -> CollectiveMeasurement {
    CollectiveMeasurement {
        source: file.to_string(),
        system: spec.cluster.name.clone(),
        kind,
        ranks: ranks as f64,
        per_node: per_node as f64,
        bytes: bytes as f64,
        links: Links::of(&spec.cluster),
        seconds,
        // A process per GPU, as a trace's training run has.
        gpus_per_thread: 1.0,
        never_fitted: false,
    }
}

/// A name in lower case without separators: `All-Reduce_perf` → `allreduceperf`.
fn squashed(name: &str) -> String {
    name.chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// PyTorch's collective names, as its profiler records them.
fn collective_of_pytorch(name: &str) -> Option<Collective> {
    Some(match squashed(name).as_str() {
        "allreduce" | "allreducecoalesced" => Collective::AllReduce,
        "allgather" | "allgatherbase" | "allgatherintotensor" | "allgatherintotensorcoalesced" => {
            Collective::AllGather
        }
        "reducescatter"
        | "reducescatterbase"
        | "reducescattertensor"
        | "reducescattertensorcoalesced" => Collective::ReduceScatter,
        "alltoall" | "alltoallbase" | "alltoallsingle" => Collective::AllToAll,
        _ => return None,
    })
}

/// The collective: the option, else the test's name in the output, else the file's name.
fn collective_of(
    run: &NcclTestsRun,
    file: &str,
    option: Option<&str>,
) -> Result<Collective, String> {
    const NAMES: &str = "all_reduce, all_gather, reduce_scatter, alltoall or sendrecv";
    if let Some(name) = option.or(run.collective.as_deref()) {
        return Collective::from_name(name)
            .ok_or_else(|| format!("`{name}` is not a collective Tessel models ({NAMES})"));
    }
    let flat = squashed(file);
    [
        ("allreduce", Collective::AllReduce),
        ("allgather", Collective::AllGather),
        ("reducescatter", Collective::ReduceScatter),
        ("alltoall", Collective::AllToAll),
        ("all2all", Collective::AllToAll),
        ("sendrecv", Collective::SendRecv),
    ]
    .into_iter()
    .find(|(needle, _)| flat.contains(needle))
    .map(|(_, kind)| kind)
    .ok_or_else(|| {
        format!(
            "neither the output nor the file name says which collective it measured; give \
             --collective ({NAMES})"
        )
    })
}

/// What the calibration did, for the terminal.
fn summary(calibration: &ClusterCalibration, explain: bool) -> String {
    let rows: usize = calibration.inputs.iter().map(|i| i.rows).sum();
    let mut out = format!(
        "calibrated cluster {} from {} file{} ({rows} measurements)\n",
        calibration.cluster,
        calibration.inputs.len(),
        if calibration.inputs.len() == 1 {
            ""
        } else {
            "s"
        },
    );
    for input in &calibration.inputs {
        let placement = match (input.ranks, input.ranks_per_node) {
            (Some(ranks), Some(per_node)) => format!(", {ranks} ranks ({per_node} per node)"),
            _ => String::new(),
        };
        out.push_str(&format!(
            "  {}: {} {}{placement}, {} rows\n",
            input.file, input.kind, input.measures, input.rows
        ));
    }
    for (what, fit) in [
        ("collective", &calibration.collectives_fit),
        ("GEMM", &calibration.gemm_fit),
        ("step", &calibration.compute_fit),
    ] {
        if let Some(fit) = fit {
            out.push_str(&fit_summary(what, fit, explain));
        }
    }
    if let Some(compute) = calibration.compute.filter(|c| c.jitter > 0.0) {
        out.push_str(&format!(
            "  rank jitter {:.1} % (measured: each rank's compute about its stage's mean)\n",
            100.0 * compute.jitter
        ));
    }
    out
}

fn fit_summary(what: &str, fit: &PrimitiveFit, explain: bool) -> String {
    let mut out = format!(
        "  {what} median error {:.1} % with the committed parameters, {:.1} % fitted\n",
        100.0 * fit.median_error_before,
        100.0 * fit.median_error_after
    );
    let on_bound: Vec<&str> = fit
        .parameters
        .iter()
        .filter(|p| p.on_bound)
        .map(|p| p.name.as_str())
        .collect();
    if !on_bound.is_empty() {
        out.push_str(&format!(
            "    on the bound of its range: {} (the measurements would take it further)\n",
            on_bound.join(", ")
        ));
    }
    if explain {
        out.push_str(&format!(
            "    {:<18} {:>12} {:>12} {:>12}  {:<24} range\n",
            "parameter", "committed", "fitted", "moved", "supported"
        ));
        for p in &fit.parameters {
            let moved = if p.before != 0.0 {
                format!("{:+.1} %", 100.0 * (p.after / p.before - 1.0))
            } else {
                "-".to_string()
            };
            let supported = format!(
                "{}–{}",
                value(&p.name, p.supported[0]),
                value(&p.name, p.supported[1])
            );
            out.push_str(&format!(
                "    {:<18} {:>12} {:>12} {:>12}  {supported:<24} {}–{}{}\n",
                p.name,
                value(&p.name, p.before),
                value(&p.name, p.after),
                moved,
                value(&p.name, p.low),
                value(&p.name, p.high),
                if p.on_bound { "  on bound" } else { "" }
            ));
        }
    }
    out
}

/// Seconds in microseconds, fractions as they are.
fn value(name: &str, v: f64) -> String {
    if name.ends_with("_s") {
        format!("{:.2} us", v * 1e6)
    } else {
        format!("{v:.3}")
    }
}
