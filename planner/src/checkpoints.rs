//! The checkpoint interval of a plan whose spec says how often its GPUs fail
//! (`train.failures`): the target with the best goodput (`tessel_symbolic::checkpoint`), its
//! interval in optimizer steps at the plan's predicted step time, and what else was weighed.

use serde::{Deserialize, Serialize};
use tessel_grammar::Spec;
use tessel_symbolic::checkpoint::{checkpoint_options, CheckpointCost, Unavailable};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointPlan {
    /// The target with the best goodput; `None` when none is available.
    pub chosen: Option<CheckpointCost>,
    /// Optimizer steps between checkpoints (at least 1).
    pub interval_steps: Option<u64>,
    /// The other targets costed, best first.
    pub alternatives: Vec<CheckpointCost>,
    /// Targets the job cannot use, and why.
    pub unavailable: Vec<Unavailable>,
}

/// The checkpoint plan of `spec` at `step_time_s` a step; `None` without `train.failures`.
pub fn checkpoint_plan(spec: &Spec, step_time_s: f64) -> Option<CheckpointPlan> {
    let (mut costed, unavailable) = checkpoint_options(spec)?;
    let chosen = (!costed.is_empty()).then(|| costed.remove(0));
    let interval_steps = chosen.map(|c| {
        (c.interval_s / step_time_s.max(f64::MIN_POSITIVE))
            .round()
            .max(1.0) as u64
    });
    Some(CheckpointPlan {
        chosen,
        interval_steps,
        alternatives: costed,
        unavailable,
    })
}

/// One line for the plan's table: the interval, the target, what it costs and the goodput.
pub fn checkpoint_line(plan: &CheckpointPlan) -> String {
    match (&plan.chosen, plan.interval_steps) {
        (Some(c), Some(steps)) => format!(
            "every {} ({steps} step{}) to {}, {} each; goodput {:.1} %, {} a day lost to \
             failures and {} to checkpoints (job MTBF {})",
            duration(c.interval_s),
            if steps == 1 { "" } else { "s" },
            target_label(c),
            duration(c.write_s),
            c.goodput * 100.0,
            duration(c.lost_to_failures_per_day_s),
            duration(c.checkpointing_per_day_s),
            duration(c.job_mtbf_s)
        ),
        _ => {
            let reasons: Vec<String> = plan
                .unavailable
                .iter()
                .map(|u| format!("{}: {}", u.target.name(), u.reason))
                .collect();
            format!("none possible ({})", reasons.join("; "))
        }
    }
}

/// Why the chosen target: the others' goodput, or why they cannot be used.
pub fn checkpoint_explanation(plan: &CheckpointPlan) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(c) = &plan.chosen {
        out.push(format!(
            "checkpoints to {}: {:.2} GB per GPU written in {} and recovered in {}",
            target_label(c),
            c.bytes_per_gpu / 1e9,
            duration(c.write_s),
            duration(c.recover_s)
        ));
    }
    for other in &plan.alternatives {
        out.push(format!(
            "  {} instead: every {}, {} each, goodput {:.1} %",
            target_label(other),
            duration(other.interval_s),
            duration(other.write_s),
            other.goodput * 100.0
        ));
    }
    for u in &plan.unavailable {
        out.push(format!("  {} not possible: {}", u.target.name(), u.reason));
    }
    out
}

fn target_label(c: &CheckpointCost) -> &'static str {
    match c.target {
        tessel_grammar::CheckpointTarget::Host => "host memory",
        tessel_grammar::CheckpointTarget::Disk => "disk",
    }
}

/// Seconds as the largest unit that keeps them readable.
fn duration(s: f64) -> String {
    if s >= 7200.0 {
        format!("{:.1} h", s / 3600.0)
    } else if s >= 120.0 {
        format!("{:.1} min", s / 60.0)
    } else if s >= 1.0 {
        format!("{s:.1} s")
    } else {
        format!("{:.1} ms", s * 1e3)
    }
}
