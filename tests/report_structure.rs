//! Structural checks of `tessel report` pages: one box per forward and backward, memory bars
//! that add up to the plan's stage totals, nothing fetched from the network, escaped text,
//! deterministic bytes, the measured timeline of a real CPU run, and the CLI's errors.

mod common;

use common::tessel;
use std::path::{Path, PathBuf};
use std::process::Command;

use tessel_planner::report::{
    disagreements, parse_trace, predicted_timeline, render_report, EventKind, Pass,
};
use tessel_planner::Plan;
use tessel_runtime::{launch_cpu, ExecutionPlan, LaunchOptions};

/// Plans `spec` (with extra `tessel plan` arguments) into `dir`; returns the file and the plan.
fn make_plan(dir: &Path, name: &str, spec: &str, extra: &[&str]) -> (PathBuf, Plan) {
    let path = dir.join(format!("{name}.json"));
    let mut args = vec!["plan", spec, "-o", path.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = tessel(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan = Plan::from_json(&std::fs::read_to_string(&path).unwrap()).unwrap();
    (path, plan)
}

fn make_report(plan: &Path, extra: &[&str]) -> String {
    let html = plan.with_extension("html");
    let mut args = vec![
        "report",
        plan.to_str().unwrap(),
        "-o",
        html.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = tessel(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(html).unwrap()
}

fn tiny(dir: &Path) -> (PathBuf, Plan) {
    make_plan(
        dir,
        "tiny",
        "tests/report/tiny.tsl",
        &["--strategy", "pipelined"],
    )
}

fn count(html: &str, needle: &str) -> usize {
    html.matches(needle).count()
}

/// The value of attribute `name` in the tag text `tag`.
fn attribute(tag: &str, name: &str) -> Option<f64> {
    let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    let end = tag[start..].find('"')? + start;
    tag[start..end].parse().ok()
}

#[test]
fn one_box_per_forward_and_backward() {
    let dir = tempfile::tempdir().unwrap();
    let (path, plan) = tiny(dir.path());
    let c = plan.config;
    assert_eq!((c.pp, c.microbatches, c.interleave), (2, 4, 2));
    let html = make_report(&path, &[]);
    let boxes = (c.pp * c.microbatches * c.interleave) as usize;
    assert_eq!(count(&html, r#"<rect class="fwd""#), boxes);
    assert_eq!(count(&html, r#"<rect class="bwd""#), boxes);
    assert_eq!(
        count(&html, r#"class="tail optimizer-step""#),
        c.pp as usize
    );

    // An expert-parallel, interleaved pipeline: the spec's Megatron-Core-style strategy.
    let (path, plan) = make_plan(
        dir.path(),
        "mixtral",
        "specs/mixtral-8x7b.tsl",
        &["--strategy", "megatron_core_style"],
    );
    let c = plan.config;
    let html = make_report(&path, &[]);
    let boxes = (c.pp * c.microbatches * c.interleave) as usize;
    assert!(c.ep > 1 && c.interleave > 1, "{c:?}");
    assert_eq!(count(&html, r#"<rect class="fwd""#), boxes);
    assert_eq!(count(&html, r#"<rect class="bwd""#), boxes);
}

#[test]
fn the_simulated_timeline_respects_dependencies_and_matches_the_prediction() {
    let dir = tempfile::tempdir().unwrap();
    // Two stages of four interleaved chunks of 4 layers each: every chunk alike.
    let degrees = ["--ep", "8", "--tp", "1", "--pp", "2", "--interleave", "4"];
    let (_, plan) = make_plan(dir.path(), "mixtral", "specs/mixtral-8x7b.tsl", &degrees);
    let timeline = predicted_timeline(&plan).unwrap();
    let (p, m, v) = (timeline.stages, timeline.microbatches, timeline.chunks);
    assert_eq!((p, v), (2, 4));
    // Each (micro-batch, virtual stage) runs forward once and backward once; a forward starts
    // after the previous virtual stage's forward ends, a backward after the next one's backward.
    let find = |pass: Pass, mb: u64, vs: u64| {
        let lane = &timeline.lanes[(vs % p) as usize];
        let found: Vec<_> = lane
            .boxes
            .iter()
            .filter(|b| b.pass == pass && b.microbatch == mb && b.chunk == vs / p)
            .collect();
        assert_eq!(found.len(), 1, "{pass:?} mb {mb} vs {vs}");
        *found[0]
    };
    for mb in 0..m {
        for vs in 0..p * v {
            let f = find(Pass::Forward, mb, vs);
            let b = find(Pass::Backward, mb, vs);
            assert!(b.start_s >= f.end_s - 1e-12);
            if vs > 0 {
                assert!(f.start_s >= find(Pass::Forward, mb, vs - 1).end_s - 1e-12);
            }
            if vs + 1 < p * v {
                assert!(b.start_s >= find(Pass::Backward, mb, vs + 1).end_s - 1e-12);
            }
        }
    }
    // The chunks are equal, so the schedule's end is the prediction's step time.
    let end = timeline.end_s();
    let step = plan.prediction.step_time_s;
    assert!((end - step).abs() / step < 1e-3, "end {end} vs step {step}");
    // Busy time per lane = m·(forward + backward) + tail, so idle time = step − busy.
    for lane in &timeline.lanes {
        let busy: f64 = lane.boxes.iter().map(|b| b.end_s - b.start_s).sum();
        assert!(busy > 0.0 && busy < end);
    }
}

#[test]
fn memory_bars_add_up_to_the_stage_totals() {
    let dir = tempfile::tempdir().unwrap();
    let (path, plan) = make_plan(dir.path(), "llama70", "specs/llama3-70b.tsl", &[]);
    let html = make_report(&path, &[]);
    let mut seen = 0;
    let mut px_per_gib: Vec<f64> = Vec::new();
    for group in html.split(r#"<g class="mem-bar""#).skip(1) {
        let group = &group[..group.find("</g>").unwrap()];
        let stage = attribute(group, "data-stage").unwrap() as usize;
        let total = attribute(group, "data-total-gib").unwrap();
        let expected = plan.prediction.stages[stage].memory.total();
        assert!(
            (total - expected).abs() < 1e-3,
            "stage {stage}: {total} vs {expected}"
        );
        let segments: Vec<&str> = group.split("<rect ").skip(1).collect();
        assert_eq!(segments.len(), 5, "five components per bar");
        let sum: f64 = segments
            .iter()
            .map(|s| attribute(s, "data-gib").unwrap())
            .sum();
        assert!(
            (sum - total).abs() < 1e-3,
            "stage {stage}: {sum} vs {total}"
        );
        let width: f64 = segments
            .iter()
            .map(|s| attribute(s, "width").unwrap())
            .sum();
        px_per_gib.push(width / total);
        seen += 1;
    }
    assert_eq!(seen, plan.config.pp as usize);
    // Every bar uses the same scale, so bar lengths compare.
    let first = px_per_gib[0];
    assert!(
        px_per_gib.iter().all(|r| (r - first).abs() < 0.01),
        "{px_per_gib:?}"
    );
}

#[test]
fn the_page_is_self_contained_and_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = make_plan(dir.path(), "mixtral", "specs/mixtral-8x7b.tsl", &[]);
    let html = make_report(&path, &[]);
    assert!(html.starts_with("<!DOCTYPE html>"));
    for forbidden in [
        "<script", "<link", "<img", "@import", "url(", " src=", " href=",
    ] {
        assert!(!html.contains(forbidden), "found {forbidden}");
    }
    // The only URLs are SVG namespace names, which are never fetched.
    let namespace = r#"xmlns="http://www.w3.org/2000/svg""#;
    assert_eq!(
        count(&html, "http://") + count(&html, "https://"),
        count(&html, namespace)
    );
    assert!(html.contains(r#"id="runners-up""#) && html.contains("class=\"runner-up\""));
    assert!(html.contains("@media print"));
    assert_eq!(make_report(&path, &[]), html, "same plan, same bytes");
}

#[test]
fn text_from_the_plan_is_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let (_, mut plan) = make_plan(dir.path(), "mixtral", "specs/mixtral-8x7b.tsl", &[]);
    let evil = r#"<script>alert("x")</script>&'"#;
    plan.model = evil.to_string();
    plan.runners_up[0].reason = evil.to_string();
    let html = render_report(&plan, None).unwrap();
    assert!(!html.contains("<script"));
    let escaped = "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&#39;";
    assert!(count(&html, escaped) >= 3, "title, heading and runner-up");
}

#[test]
fn a_real_cpu_trace_is_drawn_per_stage() {
    let dir = tempfile::tempdir().unwrap();
    let (path, plan) = tiny(dir.path());
    let trace = dir.path().join("trace.json");
    let execution = ExecutionPlan::from_strategy(
        &plan.spec.model,
        &plan.strategy(),
        plan.global_batch,
        plan.seq_len,
    )
    .unwrap();
    let mut options = LaunchOptions::new(2);
    options.trace = Some(trace.clone());
    launch_cpu(&plan.spec.model, &execution, &options).unwrap();

    let measured = parse_trace(&std::fs::read_to_string(&trace).unwrap(), &plan).unwrap();
    assert_eq!((measured.steps, measured.step_index), (2, 1));
    let stages: Vec<u64> = measured.lanes.iter().map(|l| l.stage).collect();
    assert_eq!(stages, vec![0, 1]);
    // Stage 1 starts at rank dp·cp·tp = 4 in the rank map (pipeline outermost).
    assert_eq!(measured.lanes[1].rank, 4);

    let html = make_report(&path, &["--trace", trace.to_str().unwrap()]);
    let boxes = (plan.config.pp * plan.config.microbatches * plan.config.interleave) as usize;
    assert_eq!(count(&html, r#"<rect class="m-fwd""#), boxes);
    assert_eq!(count(&html, r#"<rect class="m-bwd""#), boxes);
    assert_eq!(
        count(&html, r#"<rect class="m-opt""#),
        plan.config.pp as usize
    );
    assert!(html.contains("Step 2 of 2 from the trace"));

    // The table of disagreements: every traced stage's five categories, largest first, the
    // measured compute of each stage being the sum of its forward and backward events.
    let rows = disagreements(&measured, &plan.prediction.stages);
    assert_eq!(rows.len(), 5 * stages.len());
    let gaps: Vec<f64> = rows
        .iter()
        .map(|r| (r.measured_s - r.predicted_s).abs())
        .collect();
    assert!(gaps.windows(2).all(|w| w[0] >= w[1]), "{gaps:?}");
    let compute = rows
        .iter()
        .find(|r| r.stage == 0 && r.category.starts_with("compute"))
        .unwrap();
    let traced: f64 = measured.lanes[0]
        .events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Forward | EventKind::Backward))
        .map(|e| e.end_s - e.start_s)
        .sum();
    assert!((compute.measured_s - traced).abs() < 1e-12);
    assert!(html.contains("Measured against predicted, largest differences first"));
    assert!(html.contains("<td>gradient reduction</td>"));
}

#[test]
fn bad_input_is_a_message_and_exit_code_1() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = tiny(dir.path());
    let missing = tessel(&["report", "no/such/plan.json"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read the plan"));

    let trace = dir.path().join("foreign.json");
    std::fs::write(
        &trace,
        r#"{"traceEvents": [{"name": "forward mb0 c0", "cat": "forward", "ph": "X", "pid": 0, "tid": 99, "ts": 0, "dur": 5}]}"#,
    )
    .unwrap();
    let out = tessel(&[
        "report",
        path.to_str().unwrap(),
        "-o",
        dir.path().join("r.html").to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("rank 99 is not in the plan's rank map"),
        "{stderr}"
    );
}

#[test]
fn open_without_a_browser_is_a_message_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = tiny(dir.path());
    let html = dir.path().join("open.html");
    let out = Command::new(env!("CARGO_BIN_EXE_tessel"))
        .args([
            "report",
            path.to_str().unwrap(),
            "-o",
            html.to_str().unwrap(),
            "--open",
        ])
        .env_remove("BROWSER")
        .env("PATH", dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(html.is_file());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no browser found"));
}
