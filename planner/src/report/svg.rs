//! The report's charts as inline SVG: pipeline timelines, per-stage memory bars and the
//! step-time breakdown. Every shape a test or a reader looks for carries a class; colours are
//! fixed (see [`palette`]) and edges are crisp so a screenshot shows them exactly.

use std::fmt::Write;

use tessel_symbolic::cost::{MemoryBreakdown, StageEstimate, TimeBreakdown};

use super::escape::escape;
use super::format::{coord, gib, percent, seconds};
use super::measured::{EventKind, MeasuredTimeline};
use super::timeline::{Pass, PredictedTimeline};

/// The colours of the charts (Tableau 10, which stays distinct in print and for most colour
/// vision deficiencies).
pub mod palette {
    pub const FORWARD: &str = "#4e79a7";
    pub const BACKWARD: &str = "#f28e2b";
    pub const COMM: &str = "#2f2f2f";
    pub const GRAD_SYNC: &str = "#9c755f";
    pub const OPTIMIZER_STEP: &str = "#ff9da7";
    pub const WEIGHTS: &str = "#59a14f";
    pub const GRADIENTS: &str = "#edc948";
    pub const OPTIMIZER_STATES: &str = "#b07aa1";
    pub const ACTIVATIONS: &str = "#e15759";
    pub const BUFFERS: &str = "#76b7b2";
    pub const LANE: &str = "#eef1f5";
}

/// Width of every chart's view box; the page scales it to the screen.
const WIDTH: f64 = 1200.0;
/// Left margin for lane labels.
const LABEL: f64 = 96.0;
const RIGHT: f64 = 30.0;
/// Boxes narrower than this get no micro-batch number.
const MIN_LABEL_WIDTH: f64 = 28.0;

fn plot_width() -> f64 {
    WIDTH - LABEL - RIGHT
}

fn x_of(t: f64, axis_s: f64) -> f64 {
    LABEL + t / axis_s * plot_width()
}

fn lane_height(lanes: usize) -> f64 {
    match lanes {
        0..=4 => 34.0,
        5..=8 => 26.0,
        9..=16 => 18.0,
        _ => 12.0,
    }
}

/// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `target` ticks.
fn tick_step(axis_s: f64, target: f64) -> f64 {
    let raw = axis_s / target;
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * power)
        .find(|step| *step >= raw)
        .unwrap_or(10.0 * power)
}

fn axis(out: &mut String, axis_s: f64, top: f64, bottom: f64) {
    let step = tick_step(axis_s, 10.0);
    let mut k = 0u32;
    loop {
        let t = step * f64::from(k);
        if t > axis_s * 1.0001 {
            break;
        }
        let x = coord(x_of(t, axis_s));
        let _ = write!(
            out,
            r#"<line class="tick" x1="{x}" y1="{}" x2="{x}" y2="{}"/><text class="tick-label" x="{x}" y="{}" text-anchor="middle">{}</text>"#,
            coord(top),
            coord(bottom),
            coord(bottom + 14.0),
            escape(&seconds(t))
        );
        k += 1;
    }
}

/// Position and size of a rectangle.
#[derive(Clone, Copy)]
struct Area {
    x: f64,
    y: f64,
    w: f64,
    h: f64,
}

fn area(x: f64, y: f64, w: f64, h: f64) -> Area {
    Area { x, y, w, h }
}

fn rect(out: &mut String, class: &str, fill: &str, at: Area, title: &str) {
    let Area { x, y, w, h } = at;
    let _ = write!(
        out,
        r#"<rect class="{class}" x="{}" y="{}" width="{}" height="{}" fill="{fill}"><title>{}</title></rect>"#,
        coord(x),
        coord(y),
        coord(w.max(0.0)),
        coord(h),
        escape(title)
    );
}

fn lane_label(out: &mut String, y: f64, h: f64, text: &str) {
    let _ = write!(
        out,
        r#"<text class="lane-label" x="{}" y="{}" text-anchor="end">{}</text>"#,
        coord(LABEL - 8.0),
        coord(y + h / 2.0 + 4.0),
        escape(text)
    );
}

fn svg_open(out: &mut String, id: &str, height: f64, label: &str) {
    let _ = write!(
        out,
        r#"<svg id="{id}" class="chart" viewBox="0 0 {} {}" role="img" aria-label="{}" shape-rendering="crispEdges" xmlns="http://www.w3.org/2000/svg">"#,
        coord(WIDTH),
        coord(height),
        escape(label)
    );
}

/// The predicted timeline: one lane per stage, forward and backward boxes with their exposed
/// communication darkened at the end, gaps for the bubble, then gradient sync and optimizer.
pub fn predicted_timeline_svg(timeline: &PredictedTimeline, axis_s: f64) -> String {
    let h = lane_height(timeline.lanes.len());
    let top = 8.0;
    let height = top + h * timeline.lanes.len() as f64 + 24.0;
    let mut out = String::new();
    svg_open(
        &mut out,
        "predicted-timeline",
        height,
        "predicted pipeline timeline",
    );
    let bottom = top + h * timeline.lanes.len() as f64;
    axis(&mut out, axis_s, top, bottom);
    for (i, lane) in timeline.lanes.iter().enumerate() {
        let y = top + h * i as f64;
        let _ = write!(
            out,
            r#"<rect class="lane" x="{}" y="{}" width="{}" height="{}" fill="{}"/>"#,
            coord(LABEL),
            coord(y + 2.0),
            coord(plot_width()),
            coord(h - 4.0),
            palette::LANE
        );
        lane_label(&mut out, y, h, &format!("stage {}", lane.stage));
        let (by, bh) = (y + 3.0, h - 6.0);
        for b in &lane.boxes {
            let (class, fill, word) = match b.pass {
                Pass::Forward => ("fwd", palette::FORWARD, "forward"),
                Pass::Backward => ("bwd", palette::BACKWARD, "backward"),
            };
            let x0 = x_of(b.start_s, axis_s);
            let x1 = x_of(b.end_s, axis_s);
            let title = format!(
                "{word} micro-batch {} chunk {}: {} to {} ({}, of which exposed communication {})",
                b.microbatch,
                b.chunk,
                seconds(b.start_s),
                seconds(b.end_s),
                seconds(b.end_s - b.start_s),
                seconds(b.comm_s)
            );
            rect(&mut out, class, fill, area(x0, by, x1 - x0, bh), &title);
            let comm_w = (x_of(b.comm_s, axis_s) - LABEL).min(x1 - x0);
            if comm_w >= 0.5 {
                let _ = write!(
                    out,
                    r#"<rect class="comm" x="{}" y="{}" width="{}" height="{}" fill="{}" fill-opacity="0.45"/>"#,
                    coord(x1 - comm_w),
                    coord(by + bh * 0.55),
                    coord(comm_w),
                    coord(bh * 0.45),
                    palette::COMM
                );
            }
            if x1 - x0 >= MIN_LABEL_WIDTH && h >= 18.0 {
                let _ = write!(
                    out,
                    r#"<text class="box-label" x="{}" y="{}" text-anchor="middle">{}</text>"#,
                    coord((x0 + x1) / 2.0),
                    coord(by + bh / 2.0 + 3.5),
                    b.microbatch
                );
            }
        }
        let sync_x = x_of(lane.tail_start_s, axis_s);
        let sync_w = x_of(lane.tail_comm_s, axis_s) - LABEL;
        rect(
            &mut out,
            "tail grad-sync",
            palette::GRAD_SYNC,
            area(sync_x, by, sync_w, bh),
            &format!(
                "exposed gradient reduction and offload: {}",
                seconds(lane.tail_comm_s)
            ),
        );
        rect(
            &mut out,
            "tail optimizer-step",
            palette::OPTIMIZER_STEP,
            area(
                sync_x + sync_w,
                by,
                x_of(lane.optimizer_s, axis_s) - LABEL,
                bh,
            ),
            &format!("optimizer step: {}", seconds(lane.optimizer_s)),
        );
    }
    let step_x = coord(x_of(timeline.predicted_step_s, axis_s));
    let _ = write!(
        out,
        r#"<line class="step-line" x1="{step_x}" y1="{}" x2="{step_x}" y2="{}"/>"#,
        coord(top),
        coord(bottom)
    );
    out.push_str("</svg>");
    out
}

/// The measured timeline of one traced step, drawn like the predicted one; communication
/// events run in a thin strip at the bottom of the lane, since they may overlap compute.
pub fn measured_timeline_svg(timeline: &MeasuredTimeline, axis_s: f64, scale: f64) -> String {
    let h = lane_height(timeline.lanes.len());
    let top = 8.0;
    let height = top + h * timeline.lanes.len() as f64 + 24.0;
    let bottom = top + h * timeline.lanes.len() as f64;
    let mut out = String::new();
    svg_open(
        &mut out,
        "measured-timeline",
        height,
        "measured pipeline timeline",
    );
    axis(&mut out, axis_s, top, bottom);
    for (i, lane) in timeline.lanes.iter().enumerate() {
        let y = top + h * i as f64;
        let _ = write!(
            out,
            r#"<rect class="lane" x="{}" y="{}" width="{}" height="{}" fill="{}"/>"#,
            coord(LABEL),
            coord(y + 2.0),
            coord(plot_width()),
            coord(h - 4.0),
            palette::LANE
        );
        lane_label(
            &mut out,
            y,
            h,
            &format!("stage {} (r{})", lane.stage, lane.rank),
        );
        let (by, bh) = (y + 3.0, h - 6.0);
        for event in &lane.events {
            let x0 = x_of(event.start_s * scale, axis_s);
            let w = x_of(event.end_s * scale, axis_s) - x0;
            let title = format!(
                "{}: {} to {}",
                event.name,
                seconds(event.start_s),
                seconds(event.end_s)
            );
            match event.kind {
                EventKind::Forward => rect(
                    &mut out,
                    "m-fwd",
                    palette::FORWARD,
                    area(x0, by, w, bh),
                    &title,
                ),
                EventKind::Backward => rect(
                    &mut out,
                    "m-bwd",
                    palette::BACKWARD,
                    area(x0, by, w, bh),
                    &title,
                ),
                EventKind::Optimizer => rect(
                    &mut out,
                    "m-opt",
                    palette::OPTIMIZER_STEP,
                    area(x0, by, w, bh),
                    &title,
                ),
                EventKind::Comm | EventKind::Other => rect(
                    &mut out,
                    "m-comm",
                    palette::COMM,
                    area(x0, by + bh * 0.7, w, bh * 0.3),
                    &title,
                ),
            }
        }
    }
    out.push_str("</svg>");
    out
}

/// The memory components in drawing order: name, CSS class, colour, value.
pub fn memory_components(
    m: &MemoryBreakdown,
) -> [(&'static str, &'static str, &'static str, f64); 5] {
    [
        ("weights", "mem-weights", palette::WEIGHTS, m.weights),
        (
            "gradients",
            "mem-gradients",
            palette::GRADIENTS,
            m.gradients,
        ),
        (
            "optimizer states",
            "mem-optimizer",
            palette::OPTIMIZER_STATES,
            m.optimizer,
        ),
        (
            "activations",
            "mem-activations",
            palette::ACTIVATIONS,
            m.activations,
        ),
        ("buffers", "mem-buffers", palette::BUFFERS, m.buffers),
    ]
}

/// One stacked bar per stage (GiB per GPU), against the capacity line.
pub fn memory_svg(stages: &[StageEstimate], capacity_gib: f64) -> String {
    let label = 64.0;
    let right = 118.0;
    let width = 600.0;
    let h = match stages.len() {
        0..=8 => 30.0,
        9..=16 => 20.0,
        _ => 12.0,
    };
    let top = 8.0;
    let bottom = top + h * stages.len() as f64;
    let height = bottom + 26.0;
    let largest = stages
        .iter()
        .map(|s| s.memory.total())
        .fold(capacity_gib, f64::max)
        .max(1e-9);
    let plot = width - label - right;
    let x_of = |gib: f64| label + gib / largest * plot;
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg id="memory-chart" class="chart" viewBox="0 0 {} {}" role="img" aria-label="memory per stage" shape-rendering="crispEdges" xmlns="http://www.w3.org/2000/svg">"#,
        coord(width),
        coord(height)
    );
    let step = tick_step(largest, 6.0);
    let mut k = 0u32;
    while step * f64::from(k) <= largest * 1.0001 {
        let value = step * f64::from(k);
        let x = coord(x_of(value));
        let _ = write!(
            out,
            r#"<line class="tick" x1="{x}" y1="{}" x2="{x}" y2="{}"/><text class="tick-label" x="{x}" y="{}" text-anchor="middle">{}</text>"#,
            coord(top),
            coord(bottom),
            coord(bottom + 14.0),
            format_args!("{value:.0}")
        );
        k += 1;
    }
    for (i, stage) in stages.iter().enumerate() {
        let y = top + h * i as f64;
        let total = stage.memory.total();
        let _ = write!(
            out,
            r#"<g class="mem-bar" data-stage="{}" data-total-gib="{:.4}">"#,
            stage.stage, total
        );
        let _ = write!(
            out,
            r#"<text class="lane-label" x="{}" y="{}" text-anchor="end">stage {}</text>"#,
            coord(label - 8.0),
            coord(y + h / 2.0 + 4.0),
            stage.stage
        );
        let mut x = label;
        for (name, class, fill, value) in memory_components(&stage.memory) {
            let w = value / largest * plot;
            let _ = write!(
                out,
                r#"<rect class="mem {class}" data-gib="{value:.4}" x="{}" y="{}" width="{}" height="{}" fill="{fill}"><title>{}</title></rect>"#,
                coord(x),
                coord(y + 4.0),
                coord(w.max(0.0)),
                coord(h - 8.0),
                escape(&format!("stage {} {name}: {}", stage.stage, gib(value)))
            );
            x += w;
        }
        let _ = write!(
            out,
            r#"<text class="bar-value" x="{}" y="{}">{} · {}</text></g>"#,
            coord(x_of(largest) + 6.0),
            coord(y + h / 2.0 + 4.0),
            escape(&gib(total)),
            escape(&percent(total / capacity_gib.max(1e-9)))
        );
    }
    let cx = coord(x_of(capacity_gib));
    let _ = write!(
        out,
        r#"<line class="capacity" x1="{cx}" y1="{}" x2="{cx}" y2="{}"/><text class="capacity-label" x="{cx}" y="{}" text-anchor="middle">capacity {}</text>"#,
        coord(top - 4.0),
        coord(bottom + 2.0),
        coord(bottom + 24.0),
        escape(&gib(capacity_gib))
    );
    out.push_str("</svg>");
    out
}

/// The step-time components in drawing order: name, CSS class, colour, seconds.
pub fn time_components(t: &TimeBreakdown) -> [(&'static str, &'static str, &'static str, f64); 10] {
    [
        ("compute", "t-compute", "#3d5a80", t.compute),
        ("recompute", "t-recompute", "#98c1d9", t.recompute),
        ("tensor-parallel comm", "t-tp", "#6d597a", t.tp_comm),
        ("context-parallel comm", "t-cp", "#b56576", t.cp_comm),
        ("expert-parallel comm", "t-ep", "#e56b6f", t.ep_comm),
        ("pipeline comm", "t-pp", "#eaac8b", t.pp_comm),
        ("data-parallel comm", "t-dp", "#8d6e63", t.dp_comm),
        ("offload", "t-offload", "#a5a58d", t.offload),
        ("pipeline bubble", "t-bubble", "#cfd4da", t.bubble),
        ("optimizer", "t-optimizer", "#c9184a", t.optimizer),
    ]
}

/// The step time as one stacked bar of its critical-path components.
pub fn breakdown_svg(time: &TimeBreakdown) -> String {
    let width = 600.0;
    let total = time.total().max(1e-12);
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg id="time-chart" class="chart" viewBox="0 0 {} 40" role="img" aria-label="step time breakdown" shape-rendering="crispEdges" xmlns="http://www.w3.org/2000/svg">"#,
        coord(width)
    );
    let mut x = 0.0;
    for (name, class, fill, value) in time_components(time) {
        let w = value / total * width;
        if w > 0.0 {
            rect(
                &mut out,
                &format!("time {class}"),
                fill,
                area(x, 4.0, w, 32.0),
                &format!("{name}: {} ({})", seconds(value), percent(value / total)),
            );
        }
        x += w;
    }
    out.push_str("</svg>");
    out
}
