//! Human-readable forms of a plan: a terminal table and Markdown.

use std::fmt::Write;

use tessel_symbolic::cost::step_interval_label;

use crate::placement::PoolPlacement;
use crate::plan::{Plan, PlanConfig, SolverStatus};
use crate::space::{offload_label, per_stage_label, recompute_label};

/// A runner-up's configuration in one line: `tp 4 pp 8 dp 32 cp 1 ep 1 v 8 mb 1 zero 1 sp`.
pub(crate) fn config_label(c: &PlanConfig) -> String {
    format!(
        "tp {} pp {} dp {} cp {} ep {}{} v {} mb {} zero {}{}{}",
        c.tp,
        c.pp,
        c.dp,
        c.cp,
        c.ep,
        folded_label(c, " etp "),
        c.interleave,
        c.microbatch,
        c.zero,
        match c.dp_shard {
            Some(shard) if shard != c.dp => format!(" shard {shard}"),
            _ => String::new(),
        },
        if c.sequence_parallel { " sp" } else { "" }
    )
}

/// Model layers `[first, last)` as people count them: `16–17`, or `32` for one layer.
pub(crate) fn layer_range_label(&[first, last]: &[u64; 2]) -> String {
    if last <= first {
        // An end chunk holding only the embedding or the loss.
        return "none".to_string();
    }
    let last = last - 1;
    if last == first {
        first.to_string()
    } else {
        format!("{first}–{last}")
    }
}

fn ranges_label(ranges: &[[u64; 2]]) -> String {
    ranges
        .iter()
        .map(layer_range_label)
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn degrees_label(plan: &Plan) -> String {
    let c = &plan.config;
    format!(
        "dp {} · tp {} · pp {} · cp {} · ep {}{} · interleave {}",
        c.dp,
        c.tp,
        c.pp,
        c.cp,
        c.ep,
        folded_label(c, " · etp "),
        c.interleave
    )
}

/// The experts' own tensor-parallel degree after `separator` when they are folded, else nothing.
fn folded_label(c: &PlanConfig, separator: &str) -> String {
    match c.etp {
        Some(etp) if etp != c.tp => format!("{separator}{etp}"),
        _ => String::new(),
    }
}

/// `lora_fa rank 16 on qkv, o, mlp`: what trains, when the spec fine-tunes with adapters.
fn finetune_label(plan: &Plan) -> Option<String> {
    let f = plan.spec.train.finetune.filter(|f| f.is_adapter())?;
    Some(format!(
        "{} rank {} on {}, the model frozen",
        f.method.name(),
        f.rank,
        f.targets.names().join(", ")
    ))
}

/// `powersgd rank 4 on every bucket`: which data-parallel gradient buckets the plan sends
/// compressed, when its spec compresses any.
fn compression_label(plan: &Plan) -> Option<String> {
    let c = plan.spec.train.grad_compression?;
    let stages = &plan.prediction.stages;
    let all = |pick: fn(&tessel_symbolic::cost::CompressedBuckets) -> bool| {
        let n = stages
            .iter()
            .filter(|s| s.compressed.as_ref().is_some_and(pick))
            .count();
        match n {
            0 => "whole",
            n if n == stages.len() => "compressed",
            _ => "compressed on some stages",
        }
    };
    let (layers, edges) = (all(|b| b.layers), all(|b| b.edges));
    let wheres = match (layers, edges) {
        ("compressed", "compressed") => " on every bucket".to_string(),
        ("whole", "whole") => " on no bucket: sending them whole is faster".to_string(),
        _ => format!(": the layers' buckets {layers}, the embedding's and output layer's {edges}"),
    };
    Some(format!("{}{wheres}", c.label()))
}

/// Tempo's kernels, when the plan runs them.
fn kernels_label(plan: &Plan) -> Option<&'static str> {
    plan.spec
        .train
        .memory_saving_kernels
        .is_on()
        .then_some("Tempo's in-place GELU and norms, dropout output rebuilt in backward")
}

fn batching_label(plan: &Plan) -> String {
    let c = &plan.config;
    format!(
        "micro-batch {} × {} per step, ZeRO {}, sequence parallel {}",
        c.microbatch,
        c.microbatches,
        tessel_grammar::zero_label(c.zero, c.dp, c.dp_shard),
        if c.sequence_parallel { "on" } else { "off" }
    )
}

/// Recompute and offload, per stage when the stages differ.
pub(crate) fn choices_label(plan: &Plan) -> String {
    if plan.stages.is_empty() {
        return "no stages".to_string();
    }
    let recompute: Vec<String> = plan
        .stages
        .iter()
        .map(|s| recompute_label(s.recompute))
        .collect();
    let offload: Vec<String> = plan
        .stages
        .iter()
        .map(|s| offload_label(&s.offload))
        .collect();
    format!(
        "recompute {}, offload {}",
        per_stage_label(&recompute),
        per_stage_label(&offload)
    )
}

/// `, ranked by the pessimistic step time` for a searched plan; nothing for a fixed one.
fn ranked_by(plan: &Plan) -> String {
    if plan.solver.status == SolverStatus::Fixed {
        String::new()
    } else {
        format!(", ranked by the {} step time", plan.objective.name())
    }
}

/// The chosen configuration, its prediction and per-stage memory against capacity.
pub fn render_table(plan: &Plan) -> String {
    let p = &plan.prediction;
    let mut out = String::new();
    let encoder_gpus = p.multimodal.as_ref().map_or(0, |mm| mm.encoder_gpus);
    let _ = writeln!(
        out,
        "plan for {} on {} ({} GPUs{}, {} per node)",
        plan.model,
        plan.cluster,
        plan.gpus,
        if encoder_gpus > 0 {
            format!(" and {encoder_gpus} for the encoders")
        } else {
            String::new()
        },
        plan.gpus_per_node
    );
    let _ = writeln!(out, "  degrees      {}", degrees_label(plan));
    let _ = writeln!(out, "  batching     {}", batching_label(plan));
    if let Some(label) = finetune_label(plan) {
        let _ = writeln!(out, "  finetune     {label}");
    }
    if let Some(label) = kernels_label(plan) {
        let _ = writeln!(out, "  kernels      {label}");
    }
    if let Some(label) = compression_label(plan) {
        let _ = writeln!(out, "  gradients    {label}");
    }
    let _ = writeln!(out, "  stages       {}", choices_label(plan));
    if let Some(mm) = &p.multimodal {
        let _ = writeln!(
            out,
            "  encoders     {}",
            tessel_symbolic::cost::encoder_placement_label(mm)
        );
        let _ = writeln!(
            out,
            "  uneven items {}",
            tessel_symbolic::cost::uneven_items_label(mm)
        );
    }
    if let Some(placement) = &plan.placement {
        let _ = writeln!(out, "  pools        {}", pools_label(placement));
        let _ = writeln!(out, "  placements   {}", tried_label(placement));
    }
    let _ = writeln!(
        out,
        "  step time    {:.3} s{}   tokens/s {:.0}   MFU {:.1}%   HFU {:.1}%",
        p.step_time_s,
        step_interval_label(p),
        p.tokens_per_s,
        p.mfu * 100.0,
        p.hfu * 100.0
    );
    let _ = writeln!(
        out,
        "  memory       peak {:.1} of {:.1} GiB per GPU{}",
        p.peak_memory_gib,
        p.memory_capacity_gib,
        if p.fits { "" } else { "  (does NOT fit)" }
    );
    let _ = writeln!(
        out,
        "  solver       {} (objective {:.3} s){}",
        plan.solver.status.as_str(),
        plan.solver.objective_s,
        ranked_by(plan)
    );
    if let Some(file) = &plan.spec.cluster.calibration {
        let _ = writeln!(out, "  calibration  {}", file.label());
    }
    if let Some(checkpoints) = &plan.checkpoints {
        let _ = writeln!(
            out,
            "  checkpoints  {}",
            crate::checkpoint_line(checkpoints)
        );
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "  {:>5}  {:>6}  {:<22}  {:>9}  {:>9}  {:>9}  {:>9}  {:>9}  {:>9}",
        "stage", "layers", "model layers", "weights", "grads", "optim", "activ", "buffers", "total"
    );
    for (stage, estimate) in plan.stages.iter().zip(&p.stages) {
        let m = &estimate.memory;
        let _ = writeln!(
            out,
            "  {:>5}  {:>6}  {:<22}  {:>9.2}  {:>9.2}  {:>9.2}  {:>9.2}  {:>9.2}  {:>9.2}",
            stage.stage,
            stage.layers,
            ranges_label(&stage.layer_ranges),
            m.weights,
            m.gradients,
            m.optimizer,
            m.activations,
            m.buffers,
            m.total()
        );
    }
    let _ = writeln!(
        out,
        "  memory in GiB per GPU; capacity {:.2} GiB",
        p.memory_capacity_gib
    );
    if !plan.runners_up.is_empty() {
        let _ = writeln!(out);
        let _ = writeln!(out, "  runners-up");
        for (rank, r) in plan.runners_up.iter().enumerate() {
            let _ = writeln!(
                out,
                "  {}. {}: {:.3} s, {:.0} tokens/s, MFU {:.1}%; {}",
                rank + 2,
                config_label(&r.config),
                r.step_time_s,
                r.tokens_per_s,
                r.mfu * 100.0,
                r.reason
            );
        }
    }
    out
}

/// The plan as Markdown, for pull requests and reports.
/// `pipeline across pools: train (A100_80GB) stage 0, ranks 0–31; loan (L40S) stages 1–2, …`
fn pools_label(placement: &PoolPlacement) -> String {
    let span = |what: &str, [first, last]: [u64; 2]| {
        if last == first + 1 {
            format!("{what} {first}")
        } else {
            format!("{what}s {first}–{}", last.saturating_sub(1))
        }
    };
    let pools: Vec<String> = placement
        .pools
        .iter()
        .map(|p| {
            let work = match (p.replicas, p.microbatches) {
                (Some(replicas), Some(m)) => {
                    format!("{} × {m} micro-batches", span("replica", replicas))
                }
                _ => span("stage", p.stages),
            };
            format!("{} ({}) {work}, {}", p.name, p.gpu, span("rank", p.ranks))
        })
        .collect();
    format!("{}: {}", placement.placement, pools.join("; "))
}

/// Every placement tried: `pipeline across pools 6.354 s; pool train 16.161 s; …`.
fn tried_label(placement: &PoolPlacement) -> String {
    let tried: Vec<String> = placement
        .tried
        .iter()
        .map(|t| match (t.step_time_s, &t.why_not) {
            (Some(step), _) => format!("{} {step:.3} s", t.placement),
            (None, Some(why)) => format!("{}: {why}", t.placement),
            (None, None) => t.placement.clone(),
        })
        .collect();
    tried.join("; ")
}

pub fn render_markdown(plan: &Plan) -> String {
    let p = &plan.prediction;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### Plan: {} on {} ({} GPUs)\n",
        plan.model, plan.cluster, plan.gpus
    );
    let _ = writeln!(out, "| | |\n|---|---|");
    let _ = writeln!(out, "| degrees | {} |", degrees_label(plan));
    let _ = writeln!(out, "| batching | {} |", batching_label(plan));
    if let Some(label) = finetune_label(plan) {
        let _ = writeln!(out, "| finetune | {label} |");
    }
    if let Some(label) = kernels_label(plan) {
        let _ = writeln!(out, "| kernels | {label} |");
    }
    if let Some(label) = compression_label(plan) {
        let _ = writeln!(out, "| gradients | {label} |");
    }
    let _ = writeln!(out, "| stages | {} |", choices_label(plan));
    if let Some(placement) = &plan.placement {
        let _ = writeln!(out, "| pools | {} |", pools_label(placement));
        let _ = writeln!(out, "| placements | {} |", tried_label(placement));
    }
    let _ = writeln!(
        out,
        "| step time | {:.3} s{} |",
        p.step_time_s,
        step_interval_label(p)
    );
    if plan.solver.status != SolverStatus::Fixed {
        let _ = writeln!(out, "| ranked by | {} step time |", plan.objective.name());
    }
    let _ = writeln!(out, "| tokens/s | {:.0} |", p.tokens_per_s);
    let _ = writeln!(
        out,
        "| MFU / HFU | {:.1}% / {:.1}% |",
        p.mfu * 100.0,
        p.hfu * 100.0
    );
    let _ = writeln!(
        out,
        "| peak memory | {:.1} of {:.1} GiB |",
        p.peak_memory_gib, p.memory_capacity_gib
    );
    let _ = writeln!(out, "| solver | {} |", plan.solver.status.as_str());
    if let Some(checkpoints) = &plan.checkpoints {
        let _ = writeln!(
            out,
            "| checkpoints | {} |",
            crate::checkpoint_line(checkpoints)
        );
    }
    let _ = writeln!(out, "| spec digest | `{}` |\n", plan.spec_digest);
    let _ = writeln!(
        out,
        "| stage | layers | model layers | weights | gradients | optimizer | activations | buffers | total (GiB) |"
    );
    let _ = writeln!(out, "|---:|---:|---|---:|---:|---:|---:|---:|---:|");
    for (stage, estimate) in plan.stages.iter().zip(&p.stages) {
        let m = &estimate.memory;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            stage.stage,
            stage.layers,
            ranges_label(&stage.layer_ranges),
            m.weights,
            m.gradients,
            m.optimizer,
            m.activations,
            m.buffers,
            m.total()
        );
    }
    if !plan.runners_up.is_empty() {
        let _ = writeln!(
            out,
            "\n| runner-up | step time | tokens/s | MFU | loses on |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---|");
        for r in &plan.runners_up {
            let _ = writeln!(
                out,
                "| {} | {:.3} s | {:.0} | {:.1}% | {} |",
                config_label(&r.config),
                r.step_time_s,
                r.tokens_per_s,
                r.mfu * 100.0,
                r.reason
            );
        }
    }
    out
}
