//! The report page: headline numbers, timelines, memory, step-time breakdown, configuration and
//! runners-up, with a stylesheet that reads on a laptop screen and in print.

use std::fmt::Write;

use super::error::ReportError;
use super::escape::escape;
use super::format::{gib, offload, percent, rate, recompute, seconds};
use super::measured::MeasuredTimeline;
use super::svg::{
    breakdown_svg, measured_timeline_svg, memory_components, memory_svg, palette,
    predicted_timeline_svg, time_components,
};
use super::timeline::predicted_timeline;
use crate::plan::{Plan, PlanConfig, RunnerUp};
use crate::space::per_stage_label;

const STYLE: &str = r#"
:root { color-scheme: light; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: #1d2430; background: #f6f7f9; }
main { max-width: 1320px; margin: 0 auto; padding: 14px 20px 32px; }
h1 { font-size: 21px; margin: 0 0 2px; }
h2 { font-size: 16px; margin: 0 0 6px; }
.sub { color: #5b6472; margin: 0 0 10px; }
section { background: #fff; border: 1px solid #dde1e7; border-radius: 6px; padding: 10px 14px; margin: 0 0 12px; }
.cards { display: grid; grid-template-columns: repeat(6, 1fr); gap: 8px; margin: 0 0 12px; }
.card { background: #fff; border: 1px solid #dde1e7; border-radius: 6px; padding: 6px 10px; }
.card .k { color: #5b6472; font-size: 12px; }
.card .v { font-size: 18px; font-weight: 600; }
.grid2 { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; }
.grid2 > section { margin: 0; }
svg.chart { width: 100%; height: auto; display: block; }
.tick { stroke: #d3d8df; stroke-width: 1; }
.tick-label, .lane-label, .bar-value, .capacity-label { font: 11px system-ui, "DejaVu Sans", sans-serif; fill: #4a5260; }
.box-label { font: 9px system-ui, "DejaVu Sans", sans-serif; fill: #fff; pointer-events: none; }
.capacity { stroke: #c0392b; stroke-width: 2; stroke-dasharray: 5 3; }
.capacity-label { fill: #c0392b; }
.step-line { stroke: #1d2430; stroke-width: 1.5; stroke-dasharray: 4 3; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 14px; margin: 4px 0 0; font-size: 12px; color: #4a5260; }
.legend span::before { content: ""; display: inline-block; width: 11px; height: 11px; margin-right: 5px; vertical-align: -1px; background: var(--c); border: 1px solid rgba(0,0,0,.15); }
.note { color: #5b6472; font-size: 12px; margin: 4px 0 0; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { text-align: left; padding: 3px 8px; border-bottom: 1px solid #e8ebef; vertical-align: top; }
th { color: #5b6472; font-weight: 600; }
table.compact { width: auto; margin-bottom: 8px; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
@media (max-width: 900px) { .cards { grid-template-columns: repeat(3, 1fr); } .grid2 { grid-template-columns: 1fr; } }
@media print {
  body { background: #fff; font-size: 11px; }
  main { max-width: none; padding: 0; }
  section, .card { border-color: #bbb; break-inside: avoid; }
  .cards { grid-template-columns: repeat(6, 1fr); }
  .grid2 { grid-template-columns: 1fr 1fr; }
  * { -webkit-print-color-adjust: exact; print-color-adjust: exact; }
  @page { size: A4 landscape; margin: 10mm; }
}
"#;

/// The largest differences between the traced step and the prediction, by stage and category.
fn disagreement_table(
    measured: &MeasuredTimeline,
    stages: &[tessel_symbolic::cost::StageEstimate],
) -> String {
    let rows = super::measured::disagreements(measured, stages);
    let mut out = String::from(
        "<h3>Measured against predicted, largest differences first</h3>\n<table>\n<tr><th>stage</th><th>category</th><th class=\"num\">measured</th><th class=\"num\">predicted</th><th class=\"num\">difference</th></tr>\n",
    );
    for row in rows.iter().take(10) {
        let difference = row.measured_s - row.predicted_s;
        let relative = if row.predicted_s > 0.0 {
            format!(" ({:+.0}%)", 100.0 * difference / row.predicted_s)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}{}</td></tr>",
            row.stage,
            escape(row.category),
            seconds(row.measured_s),
            seconds(row.predicted_s),
            if difference >= 0.0 { "+" } else { "−" },
            escape(&format!("{}{relative}", seconds(difference.abs())))
        );
    }
    out.push_str("</table>\n");
    out
}

/// The whole page for `plan`, with the measured timeline when a trace is given.
pub fn render_report(
    plan: &Plan,
    measured: Option<&MeasuredTimeline>,
) -> Result<String, ReportError> {
    let timeline = predicted_timeline(plan)?;
    let prediction = &plan.prediction;
    let mut page = String::new();
    page.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    page.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    let _ = writeln!(
        page,
        "<title>{}</title>",
        escape(&format!("Tessel plan: {} on {}", plan.model, plan.cluster))
    );
    let _ = writeln!(page, "<style>{STYLE}</style>\n</head>\n<body>\n<main>");
    let _ = writeln!(
        page,
        "<h1>{}</h1>\n<p class=\"sub\">{}</p>",
        escape(&format!("{} on {}", plan.model, plan.cluster)),
        escape(&format!(
            "{} GPUs ({} per node, {}) · sequence {} · global batch {} · {} · spec {}",
            plan.gpus,
            plan.gpus_per_node,
            plan.spec.cluster.gpu.name,
            plan.seq_len,
            plan.global_batch,
            config_summary(&plan.config),
            plan.spec_digest.get(..12).unwrap_or(&plan.spec_digest)
        ))
    );
    if let Some(file) = &plan.spec.cluster.calibration {
        let _ = writeln!(
            page,
            "<p class=\"sub\">{}</p>",
            escape(&format!(
                "Predicted with the cluster calibration {}",
                file.label()
            ))
        );
    }

    page.push_str("<div class=\"cards\">\n");
    let cards = [
        ("step time", seconds(prediction.step_time_s)),
        ("tokens/s", rate(prediction.tokens_per_s)),
        ("MFU", percent(prediction.mfu)),
        ("HFU", percent(prediction.hfu)),
        (
            "peak memory",
            format!(
                "{:.2} / {:.0} GiB",
                prediction.peak_memory_gib, prediction.memory_capacity_gib
            ),
        ),
        ("solver", plan.solver.status.as_str().to_string()),
    ];
    for (key, value) in cards {
        let _ = writeln!(
            page,
            "<div class=\"card\"><div class=\"k\">{}</div><div class=\"v\">{}</div></div>",
            escape(key),
            escape(&value)
        );
    }
    page.push_str("</div>\n");

    let measured_step = measured.map_or(0.0, |m| m.step_s);
    let predicted_end = timeline.end_s().max(prediction.step_time_s);
    // Measured and predicted share an axis when they are within 4x; otherwise the measured
    // step is scaled onto the predicted one and the factor is said.
    let (axis_s, measured_scale) = match measured {
        Some(_) if measured_step > 0.0 => {
            let ratio = measured_step / predicted_end;
            if (0.25..=4.0).contains(&ratio) {
                (predicted_end.max(measured_step), 1.0)
            } else {
                (predicted_end, 1.0 / ratio)
            }
        }
        _ => (predicted_end, 1.0),
    };

    let schedule_name = if timeline.chunks > 1 {
        format!("interleaved 1F1B with {} chunks per stage", timeline.chunks)
    } else {
        "1F1B".to_string()
    };
    let _ = writeln!(
        page,
        "<section id=\"timeline\">\n<h2>Predicted timeline of one step</h2>\n<p class=\"note\">{}</p>",
        escape(&format!(
            "{schedule_name}: {} stages × {} micro-batches{}. Numbers in boxes are micro-batches; \
             gaps are the pipeline bubble.",
            timeline.stages,
            timeline.microbatches,
            if timeline.chunks > 1 {
                format!(" × {} chunks", timeline.chunks)
            } else {
                String::new()
            }
        ))
    );
    page.push_str(&predicted_timeline_svg(&timeline, axis_s));
    page.push_str(&legend(&[
        ("forward", palette::FORWARD),
        ("backward (with recompute)", palette::BACKWARD),
        ("exposed communication", palette::COMM),
        ("gradient reduction / offload", palette::GRAD_SYNC),
        ("optimizer step", palette::OPTIMIZER_STEP),
        ("idle (pipeline bubble)", palette::LANE),
    ]));
    let end = timeline.end_s();
    let _ = writeln!(
        page,
        "<p class=\"note\">{}</p>\n</section>",
        escape(&format!(
            "The schedule simulated with each stage's predicted forward and backward times ends \
             at {}; the predicted step time (dashed line) is {} ({} apart). Forward : backward \
             compute is 1 : 2, recompute joins the backward, exposed communication is split \
             like compute.",
            seconds(end),
            seconds(prediction.step_time_s),
            percent((end - prediction.step_time_s).abs() / prediction.step_time_s.max(1e-12))
        ))
    );

    if let Some(measured) = measured {
        let scale_note = if measured_scale == 1.0 {
            "drawn on the same time axis as the prediction".to_string()
        } else {
            format!(
                "scaled by {:.3} onto the predicted step's axis",
                measured_scale
            )
        };
        let _ = writeln!(
            page,
            "<section id=\"measured\">\n<h2>Measured timeline</h2>\n<p class=\"note\">{}</p>",
            escape(&format!(
                "Step {} of {} from the trace: {} measured against {} predicted ({:+.1}%), {scale_note}.",
                measured.step_index + 1,
                measured.steps,
                seconds(measured.step_s),
                seconds(prediction.step_time_s),
                (measured.step_s / prediction.step_time_s.max(1e-12) - 1.0) * 100.0
            ))
        );
        page.push_str(&measured_timeline_svg(measured, axis_s, measured_scale));
        page.push_str(&legend(&[
            ("forward", palette::FORWARD),
            ("backward", palette::BACKWARD),
            ("communication", palette::COMM),
            ("optimizer", palette::OPTIMIZER_STEP),
        ]));
        page.push_str(&disagreement_table(measured, &prediction.stages));
        page.push_str("</section>\n");
    }

    page.push_str("<div class=\"grid2\">\n<section id=\"memory\">\n<h2>Memory per GPU by stage (GiB, share of capacity)</h2>\n");
    page.push_str(&memory_svg(
        &prediction.stages,
        prediction.memory_capacity_gib,
    ));
    let first = prediction
        .stages
        .first()
        .map(|s| s.memory)
        .unwrap_or_default();
    let memory_legend: Vec<(&str, &str)> = memory_components(&first)
        .iter()
        .map(|(name, _, colour, _)| (*name, *colour))
        .collect();
    page.push_str(&legend(&memory_legend));
    page.push_str("</section>\n");

    page.push_str("<section id=\"breakdown\">\n<h2>Step time breakdown (critical path)</h2>\n");
    page.push_str(&breakdown_svg(&prediction.time));
    page.push_str("<table>\n<tr><th>component</th><th class=\"num\">time</th><th class=\"num\">share</th></tr>\n");
    let total = prediction.time.total().max(1e-12);
    for (name, _, colour, value) in time_components(&prediction.time) {
        if value <= 0.0 {
            continue;
        }
        let _ = writeln!(
            page,
            "<tr><td><span class=\"legend\"><span style=\"--c:{colour}\">{}</span></span></td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            escape(name),
            escape(&seconds(value)),
            escape(&percent(value / total))
        );
    }
    let _ = writeln!(
        page,
        "<tr><th>step</th><th class=\"num\">{}</th><th class=\"num\">100.0%</th></tr>\n</table>\n</section>\n</div>",
        escape(&seconds(prediction.step_time_s))
    );

    page.push_str(&configuration_section(plan));
    page.push_str(&runners_up_section(plan));
    page.push_str("</main>\n</body>\n</html>\n");
    Ok(page)
}

fn legend(items: &[(&str, &str)]) -> String {
    let mut out = String::from("<div class=\"legend\">");
    for (name, colour) in items {
        let _ = write!(out, "<span style=\"--c:{colour}\">{}</span>", escape(name));
    }
    out.push_str("</div>\n");
    out
}

/// `dp 32 · tp 4 · pp 8 × 8 chunks · cp 1 · ep 1 · mb 1 × 16 · ZeRO 1 · SP`.
fn config_summary(c: &PlanConfig) -> String {
    let mut parts = vec![
        format!("dp {}", c.dp),
        format!("tp {}", c.tp),
        if c.interleave > 1 {
            format!("pp {} × {} chunks", c.pp, c.interleave)
        } else {
            format!("pp {}", c.pp)
        },
    ];
    if c.cp > 1 {
        parts.push(format!("cp {}", c.cp));
    }
    if c.ep > 1 {
        parts.push(format!("ep {}", c.ep));
    }
    parts.push(format!("micro-batch {} × {}", c.microbatch, c.microbatches));
    parts.push(format!("ZeRO {}", c.zero));
    if c.sequence_parallel {
        parts.push("SP".to_string());
    }
    parts.join(" · ")
}

fn configuration_section(plan: &Plan) -> String {
    let c = &plan.config;
    let mut out = String::from(
        "<section id=\"configuration\">\n<h2>Chosen configuration</h2>\n<table class=\"compact\">\n<tr>",
    );
    let headers = [
        "dp",
        "tp",
        "pp",
        "cp",
        "ep",
        "chunks",
        "micro-batch",
        "micro-batches",
        "ZeRO",
        "seq. parallel",
    ];
    for h in headers {
        let _ = write!(out, "<th class=\"num\">{}</th>", escape(h));
    }
    out.push_str("</tr>\n<tr>");
    let values = [
        c.dp.to_string(),
        c.tp.to_string(),
        c.pp.to_string(),
        c.cp.to_string(),
        c.ep.to_string(),
        c.interleave.to_string(),
        c.microbatch.to_string(),
        c.microbatches.to_string(),
        c.zero.to_string(),
        if c.sequence_parallel { "on" } else { "off" }.to_string(),
    ];
    for v in values {
        let _ = write!(out, "<td class=\"num\">{}</td>", escape(&v));
    }
    out.push_str("</tr>\n</table>\n<table>\n<tr><th>stage</th><th class=\"num\">layers</th><th>layer ranges</th><th>recompute</th><th>offload</th><th class=\"num\">memory</th><th class=\"num\">idle in step</th></tr>\n");
    for (stage, predicted) in plan.stages.iter().zip(&plan.prediction.stages) {
        let ranges: Vec<String> = stage
            .layer_ranges
            .iter()
            .map(|[a, b]| format!("{a}–{}", b.saturating_sub(1)))
            .collect();
        let _ = writeln!(
            out,
            "<tr><td>{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            stage.stage,
            stage.layers,
            escape(&ranges.join(", ")),
            escape(&recompute(&stage.recompute)),
            escape(&offload(&stage.offload)),
            escape(&gib(predicted.memory.total())),
            escape(&seconds(predicted.time.bubble))
        );
    }
    out.push_str("</table>\n</section>\n");
    out
}

fn runner_up_summary(r: &RunnerUp) -> String {
    let layers: Vec<String> = r.stages.iter().map(u64::to_string).collect();
    format!(
        "{} · recompute {} · offload {} · layers {}",
        config_summary(&r.config),
        per_stage_label(
            &r.stage_recomputes()
                .iter()
                .map(recompute)
                .collect::<Vec<_>>()
        ),
        per_stage_label(&r.stage_offloads().iter().map(offload).collect::<Vec<_>>()),
        layers.join("/")
    )
}

fn runners_up_section(plan: &Plan) -> String {
    let mut out =
        String::from("<section id=\"runners-up\">\n<h2>Runners-up and why they lose</h2>\n");
    if plan.runners_up.is_empty() {
        out.push_str(
            "<p class=\"note\">The search kept no runners-up for this plan.</p>\n</section>\n",
        );
        return out;
    }
    out.push_str("<table>\n<tr><th>configuration</th><th class=\"num\">step time</th><th class=\"num\">vs chosen</th><th class=\"num\">tokens/s</th><th class=\"num\">MFU</th><th>loses on</th><th>why</th></tr>\n");
    let chosen = plan.prediction.step_time_s.max(1e-12);
    let _ = writeln!(
        out,
        "<tr class=\"chosen\"><td><b>chosen:</b> {}</td><td class=\"num\">{}</td><td class=\"num\">—</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td></td><td></td></tr>",
        escape(&config_summary(&plan.config)),
        escape(&seconds(plan.prediction.step_time_s)),
        escape(&rate(plan.prediction.tokens_per_s)),
        escape(&percent(plan.prediction.mfu))
    );
    for r in &plan.runners_up {
        let _ = writeln!(
            out,
            "<tr class=\"runner-up\"><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{:+.1}%</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td></tr>",
            escape(&runner_up_summary(r)),
            escape(&seconds(r.step_time_s)),
            (r.step_time_s / chosen - 1.0) * 100.0,
            escape(&rate(r.tokens_per_s)),
            escape(&percent(r.mfu)),
            escape(&r.loses_on),
            escape(&r.reason)
        );
    }
    out.push_str("</table>\n</section>\n");
    out
}
