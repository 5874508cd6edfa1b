//! `tessel plan --explain`: which constraint shapes the plan and what each runner-up loses on.

use std::fmt::Write;

use tessel_grammar::Recompute;
use tessel_symbolic::cost::step_interval_label;

use crate::plan::{Plan, SolverStatus};
use crate::render::{choices_label, degrees_label};

/// Memory counts as binding once the fullest stage uses this share of its capacity.
const TIGHT_MEMORY: f64 = 0.9;

pub fn render_explain(plan: &Plan) -> String {
    let p = &plan.prediction;
    let mut out = String::new();
    if let Some(choice) = &plan.finetune_choice {
        out.push_str(&crate::explain_finetune_choice(choice));
    }
    if let Some(choice) = &plan.kernels_choice {
        out.push_str(&crate::explain_kernels_choice(choice));
    }
    if let Some(choice) = &plan.placement_choice {
        out.push_str(&crate::explain_placement_choice(choice));
    }
    if let Some(choice) = &plan.compression_choice {
        out.push_str(&crate::explain_compression_choice(choice));
    }
    let fullest = p
        .stages
        .iter()
        .max_by(|a, b| a.memory.total().total_cmp(&b.memory.total()));
    let saves_memory = plan
        .stages
        .iter()
        .any(|s| s.recompute != Recompute::None || !s.offload.is_none());
    if let Some(fullest) = fullest {
        let used = fullest.memory.total();
        let share = if p.memory_capacity_gib > 0.0 {
            used / p.memory_capacity_gib
        } else {
            0.0
        };
        // A searched plan recomputes or offloads only when memory demands it (both cost time);
        // a fixed strategy may do so by choice.
        let searched = plan.solver.status != SolverStatus::Fixed;
        if (searched && saves_memory) || share >= TIGHT_MEMORY {
            let _ = writeln!(
                out,
                "memory binds on stage {}: {:.1} of {:.1} GiB ({:.0}%), activations {:.1} GiB.",
                fullest.stage,
                used,
                p.memory_capacity_gib,
                share * 100.0,
                fullest.memory.activations
            );
            if saves_memory {
                let _ = writeln!(
                    out,
                    "  to fit, the plan uses {} ({:.1} ms recompute, {:.1} ms offload per step).",
                    choices_label(plan),
                    p.time.recompute * 1e3,
                    p.time.offload * 1e3
                );
            }
        } else {
            let _ = writeln!(
                out,
                "compute binds: every stage has memory to spare (the fullest, stage {}, uses {:.1} of {:.1} GiB, {:.0}%).",
                fullest.stage,
                used,
                p.memory_capacity_gib,
                share * 100.0
            );
            if saves_memory {
                let _ = writeln!(
                    out,
                    "  the strategy uses {} anyway ({:.1} ms recompute, {:.1} ms offload per step).",
                    choices_label(plan),
                    p.time.recompute * 1e3,
                    p.time.offload * 1e3
                );
            }
        }
    }
    let t = &p.time;
    let parts = [
        ("compute", t.compute),
        ("recompute", t.recompute),
        ("tensor-parallel communication", t.tp_comm),
        ("context-parallel communication", t.cp_comm),
        ("expert-parallel communication", t.ep_comm),
        ("pipeline communication", t.pp_comm),
        ("data-parallel communication", t.dp_comm),
        ("offload traffic", t.offload),
        ("pipeline bubble", t.bubble),
        ("optimizer step", t.optimizer),
    ];
    let total = t.total();
    let _ = writeln!(
        out,
        "step time {:.3} s on the critical path:",
        p.step_time_s
    );
    for (name, seconds) in parts.iter().filter(|(_, s)| *s > 0.0) {
        let share = if total > 0.0 { seconds / total } else { 0.0 };
        let _ = writeln!(
            out,
            "  {name:<32} {:>10.1} ms  {:>5.1}%",
            seconds * 1e3,
            share * 100.0
        );
    }
    let layers: Vec<String> = plan.stages.iter().map(|s| s.layers.to_string()).collect();
    let _ = writeln!(out, "layers per stage: [{}]", layers.join(", "));
    let _ = writeln!(
        out,
        "solver: {} (objective {:.3} s).",
        plan.solver.status.as_str(),
        plan.solver.objective_s
    );
    let s = &plan.search;
    if plan.solver.status == SolverStatus::Fixed {
        return out;
    }
    let _ = writeln!(
        out,
        "search: {} combinations, {} rejected by divisibility, {} not run by {}, {} screened, {} cannot fit, {} beaten by the bound, {} evaluated, {} MILPs.",
        s.candidates_enumerated,
        s.rejected_divisibility,
        s.rejected_framework,
        plan.spec.train.framework.software(),
        s.screened,
        s.pruned_memory,
        s.pruned_bound,
        s.evaluated,
        s.milps_solved
    );
    for r in &plan.runners_up {
        let _ = writeln!(
            out,
            "runner-up {} loses on {}: {}.",
            crate::render::config_label(&r.config),
            r.loses_on,
            r.reason
        );
    }
    if let Some(checkpoints) = &plan.checkpoints {
        for line in crate::checkpoint_explanation(checkpoints) {
            let _ = writeln!(out, "{line}");
        }
    }
    out
}

/// What the plan rests on that the validation data does not cover, and the best plan inside
/// the validated region (`validated`: the search restricted to it) with what it gives up.
pub fn render_validated_alternative(plan: &Plan, validated: Option<&Plan>) -> String {
    let Some(interval) = &plan.prediction.interval else {
        return String::new();
    };
    let mut out = format!(
        "thin validation: the plan relies on {}, which none of the {} validated runs nearest to it has; its interval is widened for it.\n",
        interval.unvalidated.join(", "),
        interval.runs
    );
    let objective = plan.objective;
    let chosen = objective.ranked_step_time(&plan.prediction);
    match validated {
        Some(other) => {
            let theirs = objective.ranked_step_time(&other.prediction);
            let _ = writeln!(
                out,
                "  inside the validated region the best plan is {} with {}: {} step time {:.3} s{} against {:.3} s, giving up {:.1}%.",
                degrees_label(other),
                choices_label(other),
                objective.name(),
                theirs,
                step_interval_label(&other.prediction),
                chosen,
                (theirs / chosen - 1.0) * 100.0
            );
        }
        None => {
            let _ = writeln!(out, "  no plan inside the validated region fits.");
        }
    }
    out
}
