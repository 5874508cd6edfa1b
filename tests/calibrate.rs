//! `tessel calibrate` through the binary, on the cited nccl-tests samples of
//! `tests/traces/nccl-tests/`.

mod common;

use common::{stdout, tessel};

const SPEC: &str = "tests/specs/a3mega-h100-16.tsl";
const A3MEGA: &str = "tests/traces/nccl-tests/a3mega-all-reduce-2x8.txt";
const H800_TABLE: &str = "tests/traces/nccl-tests/h800-all-reduce-1x8.txt";

fn calibration(args: &[&str]) -> serde_json::Value {
    let mut all = vec!["calibrate"];
    all.extend_from_slice(args);
    serde_json::from_str(&stdout(&tessel(&all))).expect("the calibration is JSON")
}

#[test]
fn a_two_node_sweep_fits_the_collectives_closer_than_the_published_fit() {
    let cal = calibration(&[A3MEGA, "--spec", SPEC]);
    assert_eq!(cal["format"], "tessel-calibration/1");
    assert_eq!(cal["cluster"], "a3mega_16");
    let input = &cal["inputs"][0];
    assert_eq!(input["measures"], "all_reduce");
    assert_eq!(input["ranks"], 16);
    assert_eq!(input["ranks_per_node"], 8);
    assert_eq!(input["rows"], 31);
    let before = cal["collectives_fit"]["median_error_before"]
        .as_f64()
        .unwrap();
    let after = cal["collectives_fit"]["median_error_after"]
        .as_f64()
        .unwrap();
    assert!(after < 0.6 * before, "{before} → {after}");
    assert!(after < 0.2, "{after}");
    // Same input, same bytes.
    assert_eq!(cal, calibration(&[A3MEGA, "--spec", SPEC]));
}

#[test]
fn explain_names_the_parameters_and_the_file_is_written() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let out = dir.path().join("cluster.cal.json");
    let out = out.to_str().expect("utf-8 path");
    let text = stdout(&tessel(&[
        "calibrate",
        A3MEGA,
        "--spec",
        SPEC,
        "-o",
        out,
        "--explain",
    ]));
    assert!(
        text.contains("calibrated cluster a3mega_16 from 1 file (31 measurements)"),
        "{text}"
    );
    for name in [
        "call_latency_s",
        "inter_efficiency",
        "ll_intra_step_s",
        "supported",
    ] {
        assert!(text.contains(name), "{name} missing from\n{text}");
    }
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap();
    assert_eq!(written["collectives_fit"]["rows"], 31);
    // Each parameter's supported values bracket its fit.
    for p in written["collectives_fit"]["parameters"].as_array().unwrap() {
        let (after, low, high) = (
            p["after"].as_f64().unwrap(),
            p["supported"][0].as_f64().unwrap(),
            p["supported"][1].as_f64().unwrap(),
        );
        assert!(low <= after && after <= high, "{p}");
    }
}

#[test]
fn gemm_timings_fit_the_gemm_primitive_beside_the_collectives() {
    let cal = calibration(&[
        A3MEGA,
        "tests/traces/gemm/h100-cublas-fp16.csv",
        "--spec",
        SPEC,
    ]);
    assert_eq!(cal["inputs"][1]["kind"], "gemm-csv");
    assert_eq!(cal["inputs"][1]["rows"], 28);
    let fit = &cal["gemm_fit"];
    let before = fit["median_error_before"].as_f64().unwrap();
    let after = fit["median_error_after"].as_f64().unwrap();
    assert!(after < 0.5 * before, "{before} → {after}");
    assert!(cal["gemm"]["efficiency"].as_f64().is_some());
    assert!(cal["collectives"]["call_latency_s"].as_f64().is_some());
    // A CSV that is not GEMM timings.
    let output = tessel(&["calibrate", "data/regimes/runs.csv", "--spec", SPEC]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("not a GEMM timing CSV"), "{stderr}");
}

#[test]
fn a_pytorch_profiler_trace_gives_its_nccl_kernels() {
    let cal = calibration(&[
        "tests/traces/kineto/hta-nccl-a100-2ranks.json",
        "--spec",
        SPEC,
    ]);
    let input = &cal["inputs"][0];
    assert_eq!(input["kind"], "pytorch-profiler");
    assert_eq!(input["measures"], "all_reduce");
    // The 15 all-reduces; broadcasts are no collective the cost model uses.
    assert_eq!(input["rows"], 15);
    assert_eq!(input["ranks"], 2);
    assert_eq!(input["ranks_per_node"], 2);
}

#[test]
fn a_profiler_trace_with_shapes_fits_the_gemm_primitive() {
    let cal = calibration(&[
        "tests/traces/kineto/tracelens-qwen1.5-0.5b-h100-gemms.json",
        "--spec",
        SPEC,
    ]);
    assert_eq!(cal["inputs"][0]["measures"], "gemm");
    assert_eq!(cal["gemm_fit"]["rows"], 168);
    let before = cal["gemm_fit"]["median_error_before"].as_f64().unwrap();
    let after = cal["gemm_fit"]["median_error_after"].as_f64().unwrap();
    assert!(after < 0.5 * before && after < 0.05, "{before} → {after}");
    assert!(cal.get("collectives").is_none());
}

#[test]
fn an_h200_sweep_and_profiler_trace_fit_the_gemm_primitive() {
    // Measured by scripts/gpu/check.sh on the H200 this project was lent (tests/traces/gemm
    // and tests/traces/kineto READMEs).
    let spec = "tests/specs/h200-1.tsl";
    let sweep = calibration(&[
        "tests/traces/gemm/h200-cublas-bf16-sweep.csv",
        "--spec",
        spec,
    ]);
    assert_eq!(sweep["gemm_fit"]["rows"], 65);
    let before = sweep["gemm_fit"]["median_error_before"].as_f64().unwrap();
    let after = sweep["gemm_fit"]["median_error_after"].as_f64().unwrap();
    assert!(before > 0.12 && after < 0.06, "{before} → {after}");
    let traced = calibration(&[
        "tests/traces/kineto/h200-mm-addmm-bf16.json",
        "--spec",
        spec,
    ]);
    assert_eq!(traced["inputs"][0]["measures"], "gemm");
    assert_eq!(traced["gemm_fit"]["rows"], 6);
}

#[test]
fn a_table_without_its_device_list_needs_the_rank_count() {
    let output = tessel(&["calibrate", H800_TABLE, "--spec", SPEC]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("give --ranks N"), "{stderr}");
    // The collective comes from the file name.
    let cal = calibration(&[H800_TABLE, "--spec", SPEC, "--ranks", "8"]);
    assert_eq!(cal["inputs"][0]["measures"], "all_reduce");
    assert_eq!(cal["inputs"][0]["ranks_per_node"], 8);
}

#[test]
fn foreign_files_are_refused_with_a_reason() {
    let output = tessel(&[
        "calibrate",
        "tests/traces/nccl-tests/README.md",
        "--spec",
        SPEC,
    ]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("README.md: line"), "{stderr}");
    assert!(stderr.contains("not nccl-tests output"), "{stderr}");
    let output = tessel(&["calibrate", "no/such/file.txt", "--spec", SPEC]);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot read it"));
}

/// The calibrated A3 Mega spec, its cluster file and its calibration, copied to `dir`.
fn calibrated_copy(dir: &std::path::Path) -> std::path::PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let spec = std::fs::read_to_string(root.join("tests/specs/a3mega-h100-16-calibrated.tsl"))
        .unwrap()
        .replace("../../specs/clusters/dgx-h100.tsl", "dgx-h100.tsl");
    std::fs::copy(
        root.join("specs/clusters/dgx-h100.tsl"),
        dir.join("dgx-h100.tsl"),
    )
    .unwrap();
    std::fs::copy(
        root.join("tests/specs/a3mega-16.cal.json"),
        dir.join("a3mega-16.cal.json"),
    )
    .unwrap();
    let path = dir.join("spec.tsl");
    std::fs::write(&path, spec).unwrap();
    path
}

#[test]
fn a_spec_with_a_calibration_predicts_with_it_and_says_so() {
    let text = stdout(&tessel(&[
        "estimate",
        "tests/specs/a3mega-h100-16-calibrated.tsl",
    ]));
    assert!(
        text.contains("cluster calibration       a3mega-16.cal.json (NCCL collectives; sha256 "),
        "{text}"
    );
    // The same spec without its calibration predicts other collective times.
    let dir = tempfile::tempdir().expect("a temporary directory");
    let spec = calibrated_copy(dir.path());
    let calibrated = tessel_grammar::load_file(&spec).unwrap();
    let mut published = calibrated.clone();
    published.cluster.calibration = None;
    let strategy = &calibrated.strategies[0];
    // Without overlap every byte of the reduction is exposed, so its time is NCCL's alone.
    let dp_comm = |spec: &tessel_grammar::Spec| {
        let mut spec = spec.clone();
        spec.train.overlap = Some(tessel_grammar::OverlapSpec {
            grad_reduce: Some(false),
            param_gather: Some(false),
            tp_comm: None,
        });
        let model = tessel_symbolic::cost::CostModel::new(&spec).unwrap();
        model.estimate(strategy).unwrap().time.dp_comm
    };
    let (with, without) = (dp_comm(&calibrated), dp_comm(&published));
    assert!((with / without - 1.0).abs() > 0.05, "{with} vs {without}");
    let file = calibrated.cluster.calibration.as_ref().unwrap();
    let written: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("a3mega-16.cal.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        file.collectives["inter_efficiency"],
        written["collectives"]["inter_efficiency"].as_f64().unwrap()
    );
}

#[test]
fn the_plan_and_its_report_name_the_calibration_and_a_change_makes_the_plan_stale() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let spec = calibrated_copy(dir.path());
    let spec = spec.to_str().unwrap();
    let plan = dir.path().join("plan.json");
    let plan = plan.to_str().unwrap();
    let text = stdout(&tessel(&["plan", spec, "-o", plan]));
    assert!(text.contains("  calibration  a3mega-16.cal.json"), "{text}");
    let output = tessel(&["plan", spec, "--check", plan]);
    assert_eq!(output.status.code(), Some(0));
    // The report says so too.
    let report = dir.path().join("report.html");
    stdout(&tessel(&["report", plan, "-o", report.to_str().unwrap()]));
    let html = std::fs::read_to_string(&report).unwrap();
    assert!(
        html.contains("Predicted with the cluster calibration a3mega-16.cal.json"),
        "no calibration line in the report"
    );
    let cal = dir.path().join("a3mega-16.cal.json");
    let mut value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cal).unwrap()).unwrap();
    value["collectives"]["inter_efficiency"] = serde_json::json!(0.5);
    std::fs::write(&cal, serde_json::to_string_pretty(&value).unwrap()).unwrap();
    let output = tessel(&["plan", spec, "--check", plan]);
    assert_eq!(
        output.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
}

#[test]
fn a_gemm_calibration_changes_the_compute_prediction() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let spec = calibrated_copy(dir.path());
    let cal = dir.path().join("a3mega-16.cal.json");
    stdout(&tessel(&[
        "calibrate",
        A3MEGA,
        "tests/traces/gemm/h100-cublas-fp16.csv",
        "--spec",
        SPEC,
        "-o",
        cal.to_str().unwrap(),
    ]));
    let calibrated = tessel_grammar::load_file(&spec).unwrap();
    let file = calibrated.cluster.calibration.as_ref().unwrap();
    assert!(
        file.label().contains("NCCL collectives, GEMMs"),
        "{}",
        file.label()
    );
    let mut published = calibrated.clone();
    published.cluster.calibration = None;
    let compute = |spec: &tessel_grammar::Spec| {
        let model = tessel_symbolic::cost::CostModel::new(spec).unwrap();
        model.estimate(&spec.strategies[0]).unwrap().time.compute
    };
    let (with, without) = (compute(&calibrated), compute(&published));
    assert!((with / without - 1.0).abs() > 0.01, "{with} vs {without}");
}

#[test]
fn a_traced_pipeline_run_fits_the_gemms_and_the_compute_of_each_stage() {
    let cal = calibration(&[
        "tests/traces/tessel/dense8-pp2-2steps.json",
        "--spec",
        "tests/launch/dense8.tsl",
    ]);
    assert_eq!(cal["inputs"][0]["measures"], "gemm compute");
    // Two ranks × 8 matmul shapes; each stage's busy time and optimizer step, and the step.
    assert_eq!(cal["gemm_fit"]["rows"], 16);
    assert_eq!(cal["compute_fit"]["rows"], 5);
    assert!(
        cal.get("collectives").is_none(),
        "no data parallelism: {cal}"
    );
    let before = cal["compute_fit"]["median_error_before"].as_f64().unwrap();
    let after = cal["compute_fit"]["median_error_after"].as_f64().unwrap();
    assert!(after < before, "{before} → {after}");
}

#[test]
fn a_tessel_launch_trace_gives_its_data_parallel_collectives() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let plan = dir.path().join("plan.json");
    let trace = dir.path().join("trace.json");
    let (plan, trace) = (plan.to_str().unwrap(), trace.to_str().unwrap());
    let spec = "tests/launch/dense8.tsl";
    stdout(&tessel(&[
        "plan", spec, "--gpus", "2", "--dp", "2", "--tp", "1", "--pp", "1", "-o", plan,
    ]));
    stdout(&tessel(&[
        "launch",
        plan,
        "--backend",
        "cpu",
        "--steps",
        "2",
        "--trace",
        trace,
    ]));
    let cal = calibration(&[trace, "--spec", spec]);
    let input = &cal["inputs"][0];
    assert_eq!(input["kind"], "tessel-trace");
    assert_eq!(input["ranks"], 2);
    assert_eq!(input["measures"], "all_reduce gemm compute", "{input}");
    assert!(input["rows"].as_u64().unwrap() >= 2, "{input}");
    // The matmuls each rank timed fit the GEMM primitive, the traced steps the compute: two
    // ranks' busy time and optimizer step, and the step time.
    assert!(cal["gemm_fit"]["rows"].as_u64().unwrap() >= 4, "{cal}");
    assert_eq!(cal["compute_fit"]["rows"], 3, "{cal}");
    for name in ["matmul", "memory", "layer_overhead_s"] {
        assert!(cal["compute"][name].as_f64().is_some(), "{name}: {cal}");
    }
    // One step after the first is too few to measure how the ranks' compute varies.
    assert_eq!(cal["compute"]["jitter"], 0.0, "{cal}");
    // The report draws the same trace without counting its collectives twice.
    let report = dir.path().join("report.html");
    stdout(&tessel(&[
        "report",
        plan,
        "--trace",
        trace,
        "-o",
        report.to_str().unwrap(),
    ]));

    // Calibrating the CPU cluster on it: a spec that reads the file predicts another step time
    // and names what the file calibrates.
    let cpu = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cpu");
    let written = dir.path().join("cpu.cal.json");
    stdout(&tessel(&[
        "calibrate",
        trace,
        "--spec",
        cpu.join("gelu-4l.tsl").to_str().unwrap(),
        "-o",
        written.to_str().unwrap(),
    ]));
    let cluster = std::fs::read_to_string(cpu.join("cpu-cluster.tsl")).unwrap();
    let calibrated = cluster.replacen(
        "cluster this_cpu {",
        "cluster this_cpu {\n  calibration = \"cpu.cal.json\"",
        1,
    );
    std::fs::write(dir.path().join("cpu-cluster.tsl"), calibrated).unwrap();
    std::fs::copy(cpu.join("gelu-4l.tsl"), dir.path().join("gelu-4l.tsl")).unwrap();
    let estimate = |spec: &std::path::Path| {
        stdout(&tessel(&["estimate", spec.to_str().unwrap(), "--dp", "2"]))
    };
    let with = estimate(&dir.path().join("gelu-4l.tsl"));
    assert!(
        with.contains("cpu.cal.json (NCCL collectives, GEMMs, compute; sha256 "),
        "{with}"
    );
    let step_time = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("step time"))
            .map(str::to_string)
    };
    let without = estimate(&cpu.join("gelu-4l.tsl"));
    assert_ne!(step_time(&with), step_time(&without), "{with}\n{without}");
}
