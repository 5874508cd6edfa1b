//! Why a configuration loses against another: the time components it spends more on.

use tessel_symbolic::cost::{Estimate, TimeBreakdown};

use crate::objective::Objective;

fn components(time: &TimeBreakdown) -> [(&'static str, f64); 10] {
    [
        ("compute", time.compute),
        ("recompute", time.recompute),
        ("tensor-parallel communication", time.tp_comm),
        ("context-parallel communication", time.cp_comm),
        ("expert-parallel communication", time.ep_comm),
        ("pipeline communication", time.pp_comm),
        ("data-parallel communication", time.dp_comm),
        ("offload traffic", time.offload),
        ("pipeline bubble", time.bubble),
        ("optimizer step", time.optimizer),
    ]
}

/// The component `worse` loses most on against `best`, and a sentence with the numbers; or,
/// when it is predicted faster and lost on the objective's bound, that bound.
pub fn loss_reason(best: &Estimate, worse: &Estimate, objective: Objective) -> (String, String) {
    let slower = worse.step_time_s - best.step_time_s;
    if slower < 0.0 {
        // Predicted faster, ranked lower: it lost on the high end of its interval.
        let (ours, theirs) = (
            objective.ranked_step_time(best),
            objective.ranked_step_time(worse),
        );
        let thin = worse
            .interval
            .as_ref()
            .filter(|i| !i.unvalidated.is_empty())
            .map_or(String::new(), |i| {
                format!(
                    " (no validated run near it has {})",
                    i.unvalidated.join(", ")
                )
            });
        let reason = format!(
            "predicted {:.1} ms faster per step, but the high end of its 80 % interval is {theirs:.3} s against {ours:.3} s{thin}",
            -slower * 1e3
        );
        return ("its interval".to_string(), reason);
    }
    let ours = components(&best.time);
    let theirs = components(&worse.time);
    let mut deltas: Vec<(&str, f64)> = ours
        .iter()
        .zip(theirs.iter())
        .map(|((name, a), (_, b))| (*name, b - a))
        .collect();
    // Largest loss first; ties keep the fixed component order.
    deltas.sort_by(|a, b| b.1.total_cmp(&a.1));
    let percent = if best.step_time_s > 0.0 {
        100.0 * slower / best.step_time_s
    } else {
        0.0
    };
    let losses: Vec<String> = deltas
        .iter()
        .filter(|(_, delta)| *delta > 0.0)
        .take(2)
        .map(|(name, delta)| format!("+{:.1} ms {name}", delta * 1e3))
        .collect();
    let main = deltas
        .first()
        .filter(|(_, delta)| *delta > 0.0)
        .map_or("nothing: ties on step time".to_string(), |(name, _)| {
            name.to_string()
        });
    let reason = if losses.is_empty() {
        format!("{:.1} ms ({percent:.1}%) slower per step", slower * 1e3)
    } else {
        format!(
            "{:.1} ms ({percent:.1}%) slower per step: {}",
            slower * 1e3,
            losses.join(", ")
        )
    };
    (main, reason)
}
