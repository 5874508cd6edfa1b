//! The primitives against their microbenchmarks: the committed parameters are what the fit
//! finds (so the constants in the code cannot drift from the data), and each primitive kind's
//! error with its sources held out stays where `docs/VALIDATION.md` reports it, also on
//! measurements no fit reads and on each GPU the project measured, held out.

use tessel_symbolic::cost::GpuGeneration;
use tessel_symbolic::primitives::fit::{
    fit_and_score, gemm_source_disagreement, score_unseen, PrimitiveScore,
};
use tessel_symbolic::primitives::{
    default_microbench_dirs, device_of, fp8_speedup, gemm_time, load_fit_microbenchmarks,
    load_microbenchmarks, project_microbench_dir, AttentionKernel, AttentionParams,
    CollectiveParams, GemmParams, PassBytes, COMPOSITE_RMSNORM, EAGER_ELEMENTWISE,
    EAGER_EXPERT_HOST, FP8_ROWWISE_RATE, HBM_STREAM_FRACTION, HOST_ADAM_PARAMS_PER_S,
    MEASURED_DIRS, NORM_BYTES, POWER_CAPPED_GEMM_RATE, SWIGLU_BYTES,
};
use tessel_symbolic::validation::Table;

fn close(fitted: f64, committed: f64, what: &str) {
    let scale = committed.abs().max(1e-9);
    assert!(
        ((fitted - committed) / scale).abs() < 0.02,
        "{what}: the fit gives {fitted}, the code commits {committed}; update the constant"
    );
}

#[test]
fn committed_primitives_are_the_fit_and_hold_out_of_it() {
    let data = match load_fit_microbenchmarks(None) {
        Ok(data) => data,
        Err(err) => {
            eprintln!("skipped: {err}");
            return;
        }
    };
    let (fitted, scores) = fit_and_score(&data);

    let c = fitted.collectives;
    let k = CollectiveParams::default();
    close(c.call_latency_s, k.call_latency_s, "call latency");
    close(c.intra_step_s, k.intra_step_s, "intra step");
    close(c.inter_step_s, k.inter_step_s, "inter step");
    close(c.ll_intra_step_s, k.ll_intra_step_s, "LL intra step");
    close(c.ll_inter_step_s, k.ll_inter_step_s, "LL inter step");
    close(c.intra_efficiency, k.intra_efficiency, "intra efficiency");
    close(c.inter_efficiency, k.inter_efficiency, "inter efficiency");
    close(
        c.nvls_efficiency,
        k.nvls_efficiency,
        "NVLink SHARP efficiency",
    );
    close(
        c.launch_s,
        k.launch_s,
        "launch from a thread driving several GPUs",
    );
    for (label, generation) in [
        ("ampere", GpuGeneration::Ampere),
        ("hopper", GpuGeneration::Hopper),
    ] {
        let f = fitted.gemms[label];
        let k = GemmParams::for_generation(generation);
        close(f.efficiency, k.efficiency, "GEMM efficiency");
        close(f.tile_half_area, k.tile_half_area, "GEMM tile half area");
    }
    close(
        fitted.power_capped_gemm_rate,
        POWER_CAPPED_GEMM_RATE,
        "GEMM rate at the power cap",
    );
    for (label, generation, kernel) in [
        (
            "ampere.flash2",
            GpuGeneration::Ampere,
            AttentionKernel::Flash2,
        ),
        (
            "hopper.flash2",
            GpuGeneration::Hopper,
            AttentionKernel::Flash2,
        ),
        (
            "ampere.flash1",
            GpuGeneration::Ampere,
            AttentionKernel::Flash1,
        ),
        (
            "hopper.flash1",
            GpuGeneration::Hopper,
            AttentionKernel::Flash1,
        ),
        (
            "hopper.cudnn",
            GpuGeneration::Hopper,
            AttentionKernel::Cudnn,
        ),
    ] {
        let f: AttentionParams = fitted.attention[label];
        let k = AttentionParams::for_kernel(generation, kernel);
        close(f.efficiency, k.efficiency, label);
        close(f.causal, k.causal, label);
    }
    close(
        fitted.stream_fraction,
        HBM_STREAM_FRACTION,
        "HBM stream fraction",
    );

    // Held-out medians as reported (docs/VALIDATION.md), with a little room: a change that
    // makes a primitive transfer worse fails here.
    for score in &scores {
        let median = PrimitiveScore::median_abs(&score.held_out);
        let bound = match score.kind.as_str() {
            // Five sources, two of them Triton's tutorial timing the same squares 40 % apart.
            "GEMM: ampere" => 0.19,
            "GEMM: hopper" => 0.05,
            "attention (fused kernels)" => 0.13,
            kind if kind.starts_with("memory") => 0.10,
            kind if kind.contains("degraded") => 0.75,
            // Held out by the machine measured: each collective's rows come from 1-10 of
            // them, most on a fabric of their own (`data/microbench/README.md`).
            "collective: all_gather" => 0.17,
            "collective: all_reduce" => 0.19,
            "collective: alltoall" => 0.17,
            "collective: reduce_scatter" => 0.09,
            "collective: sendrecv" => 0.20,
            kind => panic!("no bound for {kind}"),
        };
        assert!(median <= bound, "{}: held-out median {median}", score.kind);
    }

    // Weighing every source alike, Hopper's GEMMs are where the published sources put them:
    // the project's two sweeps are 690 of the 865 rows, and each published source's level
    // held out is 8-34 % off.
    let hopper = scores
        .iter()
        .find(|s| s.kind == "GEMM: hopper")
        .expect("Hopper GEMMs");
    let by_source = PrimitiveScore::median_abs(&hopper.held_out_by_source);
    assert!(
        by_source <= 0.21,
        "Hopper GEMMs, median over sources {by_source}"
    );

    // A step's GEMMs take the primitive's shape (tiles, waves, short `k`), not its level (the
    // end-to-end `matmul` replaces it): held out, the shape transfers within 10 %, while two
    // sources timing the same shapes on the same GPU differ by a median of about a fifth.
    for score in scores.iter().filter(|s| s.kind.starts_with("GEMM")) {
        let shape = PrimitiveScore::median_abs(&score.held_out_shape);
        assert!(shape <= 0.10, "{}: shape median {shape}", score.kind);
    }
    let mut disagreement = gemm_source_disagreement(&data);
    assert!(disagreement.len() >= 15, "{} pairs", disagreement.len());
    let floor = tessel_symbolic::primitives::fit::median(&mut disagreement);
    assert!(floor > 0.15, "sources disagree by {floor}");

    // Sets no fit reads (data/microbench/multinode/ and two-nodes/, published, gathered after
    // the fit; the attention calls of the project's sweeps): the fitted primitives transfer to
    // them as far as the bounds say.
    for (folder, kind, rows, bound) in [
        // All-reduce across 4-16 nodes: the one set of NCCL parameters is 2-4 times slow on
        // small messages there and off by up to 76 % on large ones
        // (data/microbench/multinode/README.md). The bound keeps the miss from growing.
        ("multinode", "collective: all_reduce", 146, 0.54),
        // Two nodes of A100, H100 and H200 over InfiniBand, RoCE and EFA
        // (data/microbench/two-nodes/README.md). The primitive misses what it lacks: a
        // network latency and efficiency per fabric (GCP A3 Ultra's small gathers run 2-5
        // times faster than the one fitted network step).
        ("two-nodes", "collective: all_gather", 72, 0.68),
        ("two-nodes", "collective: all_reduce", 128, 0.42),
        // The project's attention sweeps (SDPA's cuDNN and FlashAttention-2 backends, PyTorch
        // 2.11): the fit leaves them out (`MEASURED_DIRS`), and the published fit predicts
        // them within 10 % by median.
        ("measured-h100", "attention (fused kernels)", 192, 0.11),
        ("measured-h200", "attention (fused kernels)", 96, 0.12),
    ] {
        let unseen =
            load_microbenchmarks(&[project_microbench_dir(folder)]).expect("the measurements load");
        let scores = score_unseen(&fitted, &unseen);
        let score = scores.iter().find(|s| s.kind == kind).expect(kind);
        let median = PrimitiveScore::median_abs(&score.held_out);
        assert_eq!(score.rows, rows, "{folder}: {kind}");
        assert!(median <= bound, "{kind} on {folder}: median {median}");
    }
}

#[test]
fn collective_rows_carry_their_harness_and_precision() {
    let Ok(data) = load_fit_microbenchmarks(None) else {
        eprintln!("skipped: the shared microbenchmarks are not here");
        return;
    };
    let rows = |system: &str| {
        data.collectives
            .iter()
            .filter(|r| r.system.starts_with(system))
            .collect::<Vec<_>>()
    };
    // Together's sweeps ran one process driving the node's 8 GPUs (`-g 8`); XLA's table is
    // one thread per device.
    assert!(rows("single host gpu-dp-2jvzl")
        .iter()
        .all(|r| r.gpus_per_thread == 8.0));
    assert!(rows("single host with 8 sm_90")
        .iter()
        .all(|r| r.gpus_per_thread == 1.0));
    // stas00's all_reduce_bench.py prints bus bandwidth to two decimals: 0.01 and 0.02 GB/s
    // across 4 nodes at 32 and 64 KiB are not measurements to fit.
    let b200 = rows("AWS p6-b200");
    assert_eq!(b200.len(), 48);
    assert!(!b200.iter().any(|r| r.ranks == 32.0 && r.bytes <= 65536.0));
    // OCI's first two-node sweep is scored apart; the page's later run on the same nodes is
    // fitted.
    let oci = rows("2x OCI BM.GPU4.8");
    assert_eq!(oci.iter().filter(|r| r.never_fitted).count(), 28);
    assert_eq!(oci.iter().filter(|r| !r.never_fitted).count(), 2);
}

#[test]
fn each_measured_gpu_is_predicted_by_the_fit_without_it() {
    // This project's GEMM sweeps on a lent H100 and a lent H200 (the same script, run back to
    // back at the power cap), each held out in turn: the primitive fitted on the published
    // sources and the other GPU predicts its 344-346 GEMMs of transformer shapes within 3.0
    // and 3.1 % by median.
    for held_out in MEASURED_DIRS {
        let Ok(data) = load_fit_microbenchmarks(Some(held_out)) else {
            eprintln!("skipped: the shared microbenchmarks are not here");
            return;
        };
        let (fitted, _) = fit_and_score(&data);
        let unseen =
            load_microbenchmarks(&[project_microbench_dir(held_out)]).expect("the sweep loads");
        let scores = score_unseen(&fitted, &unseen);
        let score = scores
            .iter()
            .find(|s| s.kind == "GEMM: hopper")
            .expect("GEMMs");
        let median = PrimitiveScore::median_abs(&score.held_out);
        assert!(median <= 0.04, "GEMMs of {held_out}: median {median}");
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    (values[(n - 1) / 2] + values[n / 2]) / 2.0
}

#[test]
fn the_eager_expert_loop_constants_are_the_measured_medians() {
    // Columns from the right (the GPU's name holds a comma): tflops, forward µs per expert,
    // forward and backward µs per expert, ..., the run (10th). The constants are run 2's
    // medians, the first to time the forward alone; runs 1 and 3, other machines, bound the
    // spread between hosts.
    let text =
        std::fs::read_to_string(project_microbench_dir("measured-h100").join("expert_loop.csv"))
            .expect("expert_loop.csv");
    let (mut forward, mut backward, mut every) = (Vec::new(), Vec::new(), Vec::new());
    for line in text.lines().skip(1) {
        let fields: Vec<&str> = line.trim().split(',').collect();
        let number = |from_end: usize| fields[fields.len() - from_end].parse::<f64>().ok();
        let per_expert = number(3).expect("µs per expert") * 1e-6;
        every.push(per_expert);
        if let (Some(2.0), Some(forward_only)) = (number(10), number(2)) {
            forward.push(forward_only * 1e-6);
            backward.push(per_expert - forward_only * 1e-6);
        }
    }
    assert_eq!((forward.len(), every.len()), (4, 12));
    close(
        median(forward),
        EAGER_EXPERT_HOST.forward_s,
        "forward host time per expert",
    );
    close(
        median(backward),
        EAGER_EXPERT_HOST.backward_s,
        "backward host time per expert",
    );
    let constant = EAGER_EXPERT_HOST.forward_s + EAGER_EXPERT_HOST.backward_s;
    for per_expert in every {
        assert!(
            (0.6..=1.05).contains(&(per_expert / constant)),
            "{per_expert} s per expert against {constant}"
        );
    }
}

/// Liger-Kernel's published timings of `torch.nn.LayerNorm` (float32, forward and backward
/// together) on an A100 and an H100 (`data/microbench/liger/`), scored, not fitted: counted with
/// the bytes the model charges a norm, the same native kernel reaches the same fraction of
/// each GPU's HBM bandwidth, so a memory-bound pass's fraction is the kernel's, not the
/// generation's.
#[test]
fn a_memory_bound_kernel_reaches_the_same_fraction_on_ampere_and_hopper() {
    // Columns: gpu, kernel, provider, mode, rows, hidden, dtype, time (ms), timestamp, version.
    let text = std::fs::read_to_string(project_microbench_dir("liger").join("layer_norm.csv"))
        .expect("layer_norm.csv");
    let median_fraction = |generation: &str| {
        let fractions: Vec<f64> = text
            .lines()
            .skip(1)
            .map(|line| line.split(',').collect::<Vec<_>>())
            .filter(|f| f[0].contains(generation) && f[3] == "full" && f[6] == "float32")
            .map(|f| {
                let number = |i: usize| f[i].parse::<f64>().expect("number");
                // NORM_BYTES counts 2-byte elements; these are 4-byte.
                let bytes =
                    2.0 * (NORM_BYTES.forward + NORM_BYTES.backward) * number(4) * number(5);
                let bandwidth = device_of(f[0]).expect("a known GPU").memory_bandwidth;
                bytes / (number(7) * 1e-3) / bandwidth
            })
            .collect();
        assert_eq!(fractions.len(), 5, "{generation}");
        median(fractions)
    };
    let (ampere, hopper) = (median_fraction("A100"), median_fraction("H100"));
    assert!((0.35..=0.45).contains(&ampere), "A100: {ampere}");
    assert!((0.35..=0.45).contains(&hopper), "H100: {hopper}");
    assert!((ampere / hopper - 1.0).abs() < 0.1, "{ampere} vs {hopper}");
}

#[test]
fn the_host_adam_rate_is_the_median_of_the_published_timings() {
    // Columns: source, date, framework, optimizer, model, parameters per host, GPUs per host,
    // host, seconds, what was timed. Quoted fields hold commas; the numbers come before them.
    let text =
        std::fs::read_to_string(project_microbench_dir("host-optimizer").join("cpu_adam.csv"))
            .expect("cpu_adam.csv");
    let rates: Vec<f64> = text
        .lines()
        .skip(1)
        .map(|line| {
            let fields: Vec<&str> = line.split(',').collect();
            let number = |i: usize| fields[i].parse::<f64>().expect("number");
            number(5) / number(8)
        })
        .collect();
    assert_median_of_measurements(
        rates,
        3,
        0.5e9..=3e9,
        HOST_ADAM_PARAMS_PER_S,
        "the host's CPU Adam rate",
    );
}

/// `values` are `count` measurements, each within `range`, and `constant` is their median.
fn assert_median_of_measurements(
    values: Vec<f64>,
    count: usize,
    range: std::ops::RangeInclusive<f64>,
    constant: f64,
    what: &str,
) {
    assert_eq!(values.len(), count, "{what}: {values:?}");
    for value in &values {
        assert!(range.contains(value), "{what}: {value} outside {range:?}");
    }
    close(median(values), constant, what);
}

/// Each row's fraction of its GPU's datasheet HBM bandwidth for the passes `bytes_of` names
/// (the bytes the cost model charges them, forward and backward), in `DIR/FILE` of the
/// project's measurements.
fn pass_fractions(dir: &str, file: &str, bytes_of: impl Fn(&str) -> Option<PassBytes>) -> Vec<f64> {
    let path = project_microbench_dir(dir).join(file);
    let table = Table::read(&path).expect("a measured table");
    table
        .rows()
        .filter_map(|(_, get)| {
            let pass = bytes_of(&get("op"))?;
            let number = |name: &str| get(name).parse::<f64>().expect("number");
            let bandwidth = device_of(&get("gpu"))
                .expect("a known GPU")
                .memory_bandwidth;
            let bytes = (pass.forward + pass.backward) * number("tokens") * number("hidden");
            Some(bytes / (number("forward_backward_us") * 1e-6) / bandwidth)
        })
        .collect()
}

#[test]
fn the_eager_elementwise_fraction_is_the_measured_median() {
    // The residual add's backward is no kernel at all (autograd passes the gradient on), and
    // the float32 norm has a fraction of its own (below).
    let fractions = pass_fractions("measured-h100", "elementwise.csv", |op| match op {
        "rms_norm_functional" => Some(NORM_BYTES),
        "swiglu" => Some(SWIGLU_BYTES),
        _ => None,
    });
    assert_median_of_measurements(
        fractions,
        8,
        0.2..=0.4,
        EAGER_ELEMENTWISE,
        "the eager elementwise fraction",
    );
}

#[test]
fn the_composite_rmsnorm_fraction_is_the_measured_median() {
    // torchtitan's float32 RMSNorm, timed in two leases with two scripts.
    let composite = |op: &str| {
        matches!(op, "rmsnorm_eager_fp32" | "rmsnorm_composite_fp32").then_some(NORM_BYTES)
    };
    let mut fractions = pass_fractions("measured-h100", "elementwise.csv", composite);
    fractions.extend(pass_fractions("measured-h100", "eager/ops.csv", composite));
    assert_median_of_measurements(
        fractions,
        8,
        0.05..=0.06,
        COMPOSITE_RMSNORM,
        "the float32 RMSNorm's fraction",
    );
    // The fraction is the kernels': on the H200's faster HBM the same operators reach
    // nearly the same share of it (no fit reads these rows).
    let h200 = pass_fractions("measured-h200", "eager/ops.csv", composite);
    assert_eq!(h200.len(), 4);
    for fraction in &h200 {
        assert!(
            (fraction / COMPOSITE_RMSNORM - 1.0).abs() < 0.15,
            "{fraction}"
        );
    }
}

#[test]
fn hoppers_fp8_speedup_is_the_measured_median() {
    // Columns: gpu (quoted, holds a comma), dtype, m, n, k, tflops, ... Each shape is timed in
    // bf16, FP8 with one scale per tensor and FP8 with a scale per row, one after another.
    let text =
        std::fs::read_to_string(project_microbench_dir("measured-h100").join("fp8/gemm.csv"))
            .expect("fp8/gemm.csv");
    let mut rates: std::collections::BTreeMap<(String, String, String, String), [f64; 3]> =
        Default::default();
    for line in text.lines().skip(1) {
        let after_gpu = line.split('"').nth(2).expect("quoted GPU name");
        let fields: Vec<&str> = after_gpu.trim_start_matches(',').split(',').collect();
        // The notes, the last quoted field, begin with the GEMM's place in the layer.
        let what = line
            .rsplit('"')
            .nth(1)
            .expect("quoted notes")
            .split(';')
            .next();
        let key = (
            fields[1].to_string(),
            fields[2].to_string(),
            fields[3].to_string(),
            what.unwrap_or_default().to_string(),
        );
        let slot = match fields[0] {
            "bf16" => 0,
            "fp8 (tensorwise)" => 1,
            "fp8 (rowwise)" => 2,
            other => panic!("unknown dtype {other}"),
        };
        rates.entry(key).or_default()[slot] = fields[4].parse().expect("TFLOP/s");
    }
    assert_eq!(rates.len(), 52);
    let speedups: Vec<f64> = rates.values().map(|r| r[1] / r[0]).collect();
    close(
        median(speedups),
        fp8_speedup(GpuGeneration::Hopper),
        "Hopper's FP8 GEMM speedup over bf16",
    );
    close(
        median(rates.values().map(|r| r[2] / r[1]).collect()),
        FP8_ROWWISE_RATE,
        "row-scaled over tensor-scaled FP8 GEMMs",
    );
}

#[test]
fn fp8_gemms_are_the_bf16_primitive_at_the_measured_speedup() {
    // Azure's published cuBLASLt FP8 sweeps of an ND H100 v5 and an ND H200 v5
    // (`shared/data/microbench/gemm.csv`, Azure/AI-benchmarking-guide), which no fit reads:
    // the Hopper GEMM primitive, fitted on bf16 measurements, at the FP8 speedup measured on
    // this project's H100 sweep, with one byte an element.
    // The committed primitives are the fit of these folders, so they are there when it runs.
    let shared = &default_microbench_dirs()[0];
    let table = Table::read(&shared.join("gemm.csv")).expect("the shared gemm.csv");
    let hopper = GemmParams::for_generation(GpuGeneration::Hopper);
    let params = GemmParams {
        efficiency: hopper.efficiency * fp8_speedup(GpuGeneration::Hopper),
        ..hopper
    };
    let mut errors = Vec::new();
    for (_, get) in table.rows() {
        if get("dtype") != "fp8" || !get("gpu").contains("(Azure ND H") {
            continue;
        }
        let number = |column: &str| get(column).parse::<f64>().expect("number");
        let (m, n, k, tflops) = (number("m"), number("n"), number("k"), number("tflops"));
        let device = device_of(&get("gpu")).expect("a Hopper GPU");
        let predicted = gemm_time(m, n, k, 1.0, 1.0, &device, &params);
        let measured = 2.0 * m * n * k / (tflops * 1e12);
        errors.push((predicted / measured - 1.0).abs());
    }
    assert_eq!(errors.len(), 18);
    // 7.3 %, held out of every fit: the large squares, timed after 10,000 warm-ups, are
    // predicted 5–9 % fast, the skinny 802816 × 192 × 768 27–33 % fast.
    let error = median(errors);
    assert!(error < 0.10, "median error {error:.3}");
}
