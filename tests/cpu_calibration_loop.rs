//! The calibration loop of issue #18 on the one machine every session has: the CPU backend's
//! ranks as the "GPUs" of `tests/cpu/cpu-cluster.tsl`. Three strategies of `gelu_4l` are
//! trained with `--trace`, twice each, `tessel calibrate` fits the cluster to the six traces,
//! and the calibrated spec then predicts the step time of other strategies of `gelu_4l` and of
//! a second model, `swiglu_6l`, which are trained and timed: median error ≤ 10 %, worst ≤ 25 %.
//!
//! A shared 2-core machine drifts in speed over minutes (one CI run predicted nine of twelve
//! strategies 2–25 % slow, the median 10.0 %, after calibrating on runs timed a minute
//! earlier), which biases every prediction alike. So a reference strategy, the first one
//! calibrated on, is timed beside the calibration runs and between the predicted ones, and the
//! predicted runs' measured times are scaled by the reference's median while predicting over
//! its median while calibrating. The table shows the raw times too. Each predicted strategy is
//! timed twice, in two passes in opposite orders, and measured as the mean of the two.
//!
//! It measures time, so it is `#[ignore]`d in the ordinary test run (which shares the cores
//! among test binaries) and `.ci/run` runs it once, alone, after the suite:
//! `cargo test --test cpu_calibration_loop -- --ignored`. It prints the table of predicted
//! against measured step times that docs/CALIBRATION.md shows.

mod common;

use common::{launch_cpu, stdout, tessel};
use std::path::Path;
use tessel_symbolic::primitives::fit::median;

/// Steps each run trains; the first (which allocates) is left out of the median.
const STEPS: &str = "8";

/// The strategies calibrated on, all of `gelu_4l`.
const CALIBRATED_ON: [&[&str]; 3] = [
    &["--dp", "2", "--microbatch", "1"],
    &["--tp", "2", "--microbatch", "2"],
    &["--pp", "2", "--microbatch", "1"],
];

/// The strategies predicted: another batching, ZeRO, recompute, sequence parallelism, one rank
/// alone, and the second model.
const PREDICTED: [(&str, &[&str]); 12] = [
    (
        "gelu-4l",
        &["--dp", "2", "--microbatch", "2", "--zero", "1"],
    ),
    (
        "gelu-4l",
        &["--dp", "2", "--microbatch", "1", "--zero", "3"],
    ),
    (
        "gelu-4l",
        &["--dp", "2", "--microbatch", "4", "--recompute", "full"],
    ),
    (
        "gelu-4l",
        &[
            "--tp",
            "2",
            "--microbatch",
            "1",
            "--sequence-parallel",
            "true",
        ],
    ),
    (
        "gelu-4l",
        &["--pp", "2", "--microbatch", "2", "--recompute", "full"],
    ),
    ("gelu-4l", &["--gpus", "1", "--microbatch", "2"]),
    ("swiglu-6l", &["--dp", "2", "--microbatch", "1"]),
    (
        "swiglu-6l",
        &["--dp", "2", "--microbatch", "2", "--zero", "2"],
    ),
    ("swiglu-6l", &["--tp", "2", "--microbatch", "2"]),
    ("swiglu-6l", &["--pp", "2", "--microbatch", "1"]),
    (
        "swiglu-6l",
        &["--pp", "2", "--microbatch", "2", "--recompute", "full"],
    ),
    ("swiglu-6l", &["--gpus", "1", "--microbatch", "4"]),
];

fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// Writes the plan of `strategy` for `spec` and returns its predicted step time.
fn plan(spec: &Path, strategy: &[&str], out: &Path) -> f64 {
    let mut args = vec!["plan", path(spec), "-o", path(out)];
    args.extend_from_slice(strategy);
    stdout(&tessel(&args));
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out).expect("the plan was written"))
            .expect("the plan is JSON");
    plan["prediction"]["step_time_s"]
        .as_f64()
        .expect("a predicted step time")
}

/// Trains the plan at full size (`--scale 1`) and returns the median step time after the
/// first step.
fn launch(plan: &Path, trace: Option<&Path>) -> f64 {
    let extra = match trace {
        Some(trace) => vec!["--trace", path(trace)],
        None => Vec::new(),
    };
    let report = launch_cpu(plan, STEPS, &extra);
    let mut times: Vec<f64> = report["step_time_s"]
        .as_array()
        .expect("step times")
        .iter()
        .skip(1)
        .map(|t| t.as_f64().expect("a step time"))
        .collect();
    median(&mut times)
}

/// `0..count` and back: two passes in opposite orders, so a drift in the machine's speed
/// weighs on every run alike.
fn there_and_back(count: usize) -> impl Iterator<Item = usize> {
    (0..count).chain((0..count).rev())
}

/// The example specs copied into `dir` beside a cluster that reads `calibration`.
fn calibrated_specs(dir: &Path, calibration: &str) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cpu");
    let cluster = std::fs::read_to_string(source.join("cpu-cluster.tsl")).unwrap();
    let calibrated = cluster.replacen(
        "cluster this_cpu {",
        &format!("cluster this_cpu {{\n  calibration   = \"{calibration}\""),
        1,
    );
    assert_ne!(
        calibrated, cluster,
        "the cluster block is where the test expects it"
    );
    std::fs::write(dir.join("cpu-cluster.tsl"), calibrated).unwrap();
    for spec in ["gelu-4l.tsl", "swiglu-6l.tsl"] {
        std::fs::copy(source.join(spec), dir.join(spec)).unwrap();
    }
}

#[test]
#[ignore = "times training steps: run alone with --ignored (CI does, once)"]
fn a_calibrated_cpu_cluster_predicts_strategies_it_never_ran() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let dir = dir.path();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cpu");

    let reference = dir.join("reference.json");
    plan(&source.join("gelu-4l.tsl"), CALIBRATED_ON[0], &reference);
    // (strategy, predicted before calibrating, measured)
    let mut calibration_runs: Vec<(&[&str], f64, f64)> = CALIBRATED_ON
        .iter()
        .enumerate()
        .map(|(i, &strategy)| {
            let plan_file = dir.join(format!("c{i}.json"));
            let before = plan(&source.join("gelu-4l.tsl"), strategy, &plan_file);
            (strategy, before, 0.0)
        })
        .collect();
    // Each strategy is traced twice, in two passes in opposite orders, as the predicted ones
    // are timed: one traced run of `--dp 2` once ran 9 % faster than the reference runs of the
    // same strategy beside it, and the fit carried that into every prediction.
    let mut traces = Vec::new();
    let mut reference_while_calibrating = Vec::new();
    for i in there_and_back(CALIBRATED_ON.len()) {
        let trace = dir.join(format!("c{i}-{}.trace", traces.len()));
        reference_while_calibrating.push(launch(&reference, None));
        calibration_runs[i].2 += launch(&dir.join(format!("c{i}.json")), Some(&trace)) / 2.0;
        traces.push(trace);
    }
    let reference_calibrating = median(&mut reference_while_calibrating);
    let mut args = vec!["calibrate"];
    args.extend(traces.iter().map(|t| path(t)));
    let (spec, calibration) = (source.join("gelu-4l.tsl"), dir.join("cpu.cal.json"));
    args.extend_from_slice(&["--spec", path(&spec), "-o", path(&calibration), "--explain"]);
    println!("{}", stdout(&tessel(&args)));
    calibrated_specs(dir, "cpu.cal.json");

    // (model, strategy, role, predicted before calibrating, after, measured, measured raw)
    let mut rows = Vec::new();
    for (i, (strategy, before, measured)) in calibration_runs.into_iter().enumerate() {
        let after = plan(
            &dir.join("gelu-4l.tsl"),
            strategy,
            &dir.join(format!("c{i}.json")),
        );
        rows.push((
            "gelu-4l",
            strategy.join(" "),
            "calibrated on",
            before,
            after,
            measured,
            measured,
        ));
    }
    let mut predicted = Vec::new();
    for (i, (model, strategy)) in PREDICTED.iter().enumerate() {
        let plan_file = dir.join(format!("p{i}.json"));
        let spec_name = format!("{model}.tsl");
        let before = plan(&source.join(&spec_name), strategy, &plan_file);
        let after = plan(&dir.join(&spec_name), strategy, &plan_file);
        predicted.push((*model, strategy, before, after, plan_file));
    }
    // Each strategy is timed twice, in two passes in opposite orders, and its time is the mean:
    // on this machine one run's median step moves by 10–20 % from one minute to the next.
    let mut raw_times = vec![0.0; predicted.len()];
    let mut reference_while_predicting = vec![launch(&reference, None)];
    for i in there_and_back(predicted.len()) {
        raw_times[i] += launch(&predicted[i].4, None) / 2.0;
        reference_while_predicting.push(launch(&reference, None));
    }
    // The machine's speed while predicting relative to while calibrating: one factor from the
    // medians, since a single reference run is as noisy as the run it would correct.
    let reference_predicting = median(&mut reference_while_predicting);
    let drift = reference_predicting / reference_calibrating;
    let mut errors = Vec::new();
    for ((model, strategy, before, after, _), raw) in predicted.into_iter().zip(raw_times) {
        let measured = raw / drift;
        errors.push((after - measured).abs() / measured);
        rows.push((
            model,
            strategy.join(" "),
            "predicted",
            before,
            after,
            measured,
            raw,
        ));
    }

    println!(
        "reference `{}`: {:.0} ms while calibrating, {:.0} ms while predicting",
        CALIBRATED_ON[0].join(" "),
        reference_calibrating * 1e3,
        reference_predicting * 1e3
    );
    println!("| model | strategy | role | measured (raw) | before | error | calibrated | error |");
    println!("|---|---|---|---:|---:|---:|---:|---:|");
    for (model, strategy, role, before, after, measured, raw) in &rows {
        println!(
            "| {model} | `{strategy}` | {role} | {:.0} ms ({:.0}) | {:.0} ms | {:+.1} % | {:.0} ms | {:+.1} % |",
            measured * 1e3,
            raw * 1e3,
            before * 1e3,
            (before / measured - 1.0) * 100.0,
            after * 1e3,
            (after / measured - 1.0) * 100.0,
        );
    }
    errors.sort_by(f64::total_cmp);
    let median = (errors[(errors.len() - 1) / 2] + errors[errors.len() / 2]) / 2.0;
    let worst = errors[errors.len() - 1];
    println!(
        "predicted {} strategies: median error {:.1} %, worst {:.1} %",
        errors.len(),
        median * 100.0,
        worst * 100.0
    );
    assert!(median <= 0.10, "median error {:.1} %", median * 100.0);
    assert!(worst <= 0.25, "worst error {:.1} %", worst * 100.0);
}
