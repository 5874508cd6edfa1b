//! Deterministic renderings of an [`Estimate`]: a human table and canonical JSON with floats
//! rounded to 6 significant digits, so that output is byte-stable across machines.

use std::fmt::Write;

use serde_json::{json, Map, Value};
use tessel_grammar::{EncoderPlacement, Recompute, Spec, Strategy};

use super::{Estimate, MemoryBreakdown, MultimodalEstimate, TimeBreakdown};
use crate::uncertainty::PredictionInterval;

/// Rounds to 6 significant digits (0 and non-finite values pass through as 0).
pub fn round6(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return 0.0;
    }
    let digits = 6 - 1 - x.abs().log10().floor() as i32;
    let scale = 10f64.powi(digits);
    let rounded = (x * scale).round() / scale;
    // Re-parse through the shortest representation so equal values print identically.
    format!("{rounded:.*}", digits.max(0) as usize)
        .parse()
        .unwrap_or(rounded)
}

fn memory_json(m: &MemoryBreakdown) -> Value {
    json!({
        "weights": round6(m.weights),
        "gradients": round6(m.gradients),
        "optimizer": round6(m.optimizer),
        "activations": round6(m.activations),
        "buffers": round6(m.buffers),
        "total": round6(m.total()),
    })
}

fn time_json(t: &TimeBreakdown) -> Value {
    json!({
        "compute": round6(t.compute),
        "recompute": round6(t.recompute),
        "tp_comm": round6(t.tp_comm),
        "cp_comm": round6(t.cp_comm),
        "ep_comm": round6(t.ep_comm),
        "pp_comm": round6(t.pp_comm),
        "dp_comm": round6(t.dp_comm),
        "offload": round6(t.offload),
        "bubble": round6(t.bubble),
        "optimizer": round6(t.optimizer),
    })
}

/// The estimate as JSON with sorted keys and rounded floats (serde_json's map is ordered).
pub fn estimate_json(estimate: &Estimate) -> Value {
    let stages: Vec<Value> = estimate
        .stages
        .iter()
        .map(|s| {
            json!({
                "stage": s.stage,
                "layers": s.layers,
                "memory_gib": memory_json(&s.memory),
                "time_s": time_json(&s.time),
            })
        })
        .collect();
    let mut map = Map::new();
    map.insert("step_time_s".into(), json!(round6(estimate.step_time_s)));
    map.insert("tokens_per_s".into(), json!(round6(estimate.tokens_per_s)));
    map.insert(
        "tokens_per_s_per_gpu".into(),
        json!(round6(estimate.tokens_per_s_per_gpu)),
    );
    map.insert(
        "model_tflops_per_gpu".into(),
        json!(round6(estimate.model_tflops_per_gpu)),
    );
    map.insert(
        "hardware_tflops_per_gpu".into(),
        json!(round6(estimate.hardware_tflops_per_gpu)),
    );
    map.insert("mfu".into(), json!(round6(estimate.mfu)));
    map.insert("hfu".into(), json!(round6(estimate.hfu)));
    map.insert(
        "peak_memory_gib".into(),
        json!(round6(estimate.peak_memory_gib)),
    );
    map.insert(
        "memory_capacity_gib".into(),
        json!(round6(estimate.memory_capacity_gib)),
    );
    map.insert("fits".into(), json!(estimate.fits));
    if let Some(interval) = &estimate.interval {
        let pair = |[low, high]: [f64; 2]| json!([round6(low), round6(high)]);
        map.insert("step_time_s_interval".into(), pair(interval.step_time_s));
        map.insert("tokens_per_s_interval".into(), pair(interval.tokens_per_s));
        map.insert("coverage".into(), json!(interval.coverage));
        map.insert(
            "interval_basis".into(),
            json!({
                "runs": interval.runs,
                "distance": round6(interval.distance),
                "unvalidated": interval.unvalidated,
            }),
        );
    }
    map.insert("time_s".into(), time_json(&estimate.time));
    map.insert("stages".into(), Value::Array(stages));
    if let Some(mm) = &estimate.multimodal {
        map.insert(
            "multimodal".into(),
            json!({
                "placement": mm.placement,
                "encoder_tp": mm.encoder_tp,
                "encoder_recompute": mm.encoder_recompute,
                "encoder_replicas": mm.encoder_replicas,
                "encoder_gpus": mm.encoder_gpus,
                "items_per_step": round6(mm.items_per_step),
                "encoder_microbatch_s": round6(mm.encoder_microbatch_s),
                "encoder_memory_gib": round6(mm.encoder_memory_gib),
                "reorder": mm.reorder,
                "imbalance_in_order_s": round6(mm.imbalance_in_order_s),
                "imbalance_reordered_s": round6(mm.imbalance_reordered_s),
            }),
        );
    }
    Value::Object(map)
}

/// The estimate as pretty-printed canonical JSON text.
pub fn render_estimate_json(estimate: &Estimate) -> String {
    serde_json::to_string_pretty(&estimate_json(estimate)).unwrap_or_default()
}

fn recompute_label(recompute: Recompute) -> String {
    match recompute {
        Recompute::None => "none".into(),
        Recompute::Selective => "selective".into(),
        Recompute::Full => "full".into(),
        Recompute::Partial { full_layers } => format!("partial ({full_layers} layers/stage)"),
        Recompute::Modules(modules) => format!("modules ({modules})"),
    }
}

/// One label for a uniform choice; the stages' labels in order when they differ.
fn strategy_recompute_label(strategy: &Strategy) -> String {
    match &strategy.stage_recompute {
        None => recompute_label(strategy.recompute),
        Some(stages) => {
            let labels: Vec<String> = stages.iter().map(|r| recompute_label(*r)).collect();
            format!("[{}] by stage", labels.join(", "))
        }
    }
}

/// ` (low–high unit, 80 %)` for the range `pick` takes from the estimate's interval; nothing
/// for an estimate without one (a plan written before intervals).
fn interval_label(
    est: &Estimate,
    pick: fn(&PredictionInterval) -> [f64; 2],
    decimals: usize,
    unit: &str,
) -> String {
    est.interval.as_ref().map_or(String::new(), |i| {
        let [low, high] = pick(i);
        format!(
            " ({low:.decimals$}–{high:.decimals$}{unit}, {:.0} %)",
            100.0 * i.coverage
        )
    })
}

/// ` (4.217–6.087 s, 80 %)`: the step time's interval, as tables print it.
pub fn step_interval_label(est: &Estimate) -> String {
    interval_label(est, |i| i.step_time_s, 3, " s")
}

/// Where an interval comes from, in a line: its runs, their distance, what none of them shares.
pub fn interval_basis(interval: &PredictionInterval) -> String {
    let mut text = format!(
        "the {} nearest validated runs (mean distance {:.2})",
        interval.runs, interval.distance
    );
    if !interval.unvalidated.is_empty() {
        let _ = write!(
            text,
            "; none of them has {}",
            interval.unvalidated.join(", ")
        );
    }
    text
}

/// A deterministic human-readable table of an estimate (`tessel estimate --format table`).
pub fn render_estimate_table(spec: &Spec, strategy: &Strategy, est: &Estimate) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} on {} × {} ({} GPUs): strategy `{}`",
        spec.model.name,
        spec.cluster.nodes,
        spec.cluster.gpus_per_node,
        spec.cluster.total_gpus(),
        strategy.name
    );
    let _ = writeln!(
        out,
        "dp {} · tp {} · pp {} · cp {} · ep {}{} | micro-batch {} | interleave {} | recompute {} | sequence parallel {} | ZeRO {}",
        strategy.dp,
        strategy.tp,
        strategy.pp,
        strategy.cp,
        strategy.ep,
        match strategy.expert_tp() {
            etp if etp != strategy.tp => format!(" · etp {etp}"),
            _ => String::new(),
        },
        strategy.microbatch,
        strategy.interleave,
        strategy_recompute_label(strategy),
        if strategy.sequence_parallel { "on" } else { "off" },
        strategy.zero_label()
    );
    out.push('\n');
    let rows = [
        (
            "step time",
            format!("{:.4} s{}", est.step_time_s, step_interval_label(est)),
        ),
        (
            "tokens/s",
            format!(
                "{:.1}{}",
                est.tokens_per_s,
                interval_label(est, |i| i.tokens_per_s, 0, "")
            ),
        ),
        (
            "tokens/s per GPU",
            format!("{:.1}", est.tokens_per_s_per_gpu),
        ),
        (
            "model TFLOP/s per GPU",
            format!("{:.1}", est.model_tflops_per_gpu),
        ),
        (
            "hardware TFLOP/s per GPU",
            format!("{:.1}", est.hardware_tflops_per_gpu),
        ),
        ("MFU", format!("{:.1}%", 100.0 * est.mfu)),
        ("HFU", format!("{:.1}%", 100.0 * est.hfu)),
        (
            "peak memory",
            format!(
                "{:.2} GiB of {:.2} GiB ({})",
                est.peak_memory_gib,
                est.memory_capacity_gib,
                if est.fits { "fits" } else { "does not fit" }
            ),
        ),
    ];
    for (name, value) in rows {
        let _ = writeln!(out, "{name:<26}{value}");
    }
    if let Some(interval) = est.interval.as_ref() {
        let _ = writeln!(out, "{:<26}{}", "interval from", interval_basis(interval));
    }
    if let Some(file) = &spec.cluster.calibration {
        let _ = writeln!(out, "{:<26}{}", "cluster calibration", file.label());
    }
    out.push_str("\ntime per step (s)\n");
    let t = &est.time;
    for (name, value) in [
        ("compute", t.compute),
        ("recompute", t.recompute),
        ("tp comm", t.tp_comm),
        ("cp comm", t.cp_comm),
        ("ep comm", t.ep_comm),
        ("pp comm", t.pp_comm),
        ("dp comm", t.dp_comm),
        ("offload", t.offload),
        ("pipeline bubble", t.bubble),
        ("optimizer", t.optimizer),
    ] {
        let _ = writeln!(out, "  {name:<24}{value:>12.4}");
    }
    if let Some(mm) = &est.multimodal {
        let _ = writeln!(out, "\n{:<26}{}", "encoders", encoder_placement_label(mm));
        let _ = writeln!(out, "{:<26}{}", "uneven items", uneven_items_label(mm));
    }
    out.push_str("\nmemory per GPU by stage (GiB)\n");
    let _ = writeln!(
        out,
        "  {:>5} {:>6} {:>9} {:>9} {:>9} {:>11} {:>9} {:>9}",
        "stage", "layers", "weights", "grads", "optim", "activations", "buffers", "total"
    );
    for stage in &est.stages {
        let m = &stage.memory;
        let _ = writeln!(
            out,
            "  {:>5} {:>6} {:>9.2} {:>9.2} {:>9.2} {:>11.2} {:>9.2} {:>9.2}",
            stage.stage,
            stage.layers,
            m.weights,
            m.gradients,
            m.optimizer,
            m.activations,
            m.buffers,
            m.total()
        );
    }
    out
}

/// Where the encoders run and their load, in words.
pub fn encoder_placement_label(mm: &MultimodalEstimate) -> String {
    let recompute = if mm.encoder_recompute {
        " with full recompute"
    } else {
        ""
    };
    let placement = match mm.placement {
        EncoderPlacement::Separate => format!(
            "on {} GPUs of their own, {} replicas of tp {}{recompute}",
            mm.encoder_gpus, mm.encoder_replicas, mm.encoder_tp
        ),
        _ => format!(
            "on the first stage, {} replicas of tp {}{recompute}",
            mm.encoder_replicas, mm.encoder_tp
        ),
    };
    format!(
        "{placement}; {:.0} items per step, {:.4} s per micro-batch, {:.2} GiB per GPU",
        mm.items_per_step, mm.encoder_microbatch_s, mm.encoder_memory_gib
    )
}

/// What uneven item counts cost a step, in data order and reordered, in words.
pub fn uneven_items_label(mm: &MultimodalEstimate) -> String {
    let chosen = if mm.reorder {
        "reordered"
    } else {
        "in data order"
    };
    format!(
        "{:.4} s per step in data order, {:.4} s reordered ({chosen} in the step time)",
        mm.imbalance_in_order_s, mm.imbalance_reordered_s
    )
}

#[cfg(test)]
mod tests {
    use super::round6;

    #[test]
    fn six_significant_digits() {
        assert_eq!(round6(0.000123456789), 0.000123457);
        assert_eq!(round6(123456789.0), 123457000.0);
        assert_eq!(round6(1.0 / 3.0), 0.333333);
        assert_eq!(round6(-2.5e-7), -2.5e-7);
        assert_eq!(round6(f64::NAN), 0.0);
        assert_eq!(round6(0.0), 0.0);
    }
}
