//! Why a configuration loses against another: the time components it spends more on.

use tessel_symbolic::cost::{Estimate, TimeBreakdown};

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

/// The component `worse` loses most on against `best`, and a sentence with the numbers.
pub fn loss_reason(best: &Estimate, worse: &Estimate) -> (String, String) {
    let ours = components(&best.time);
    let theirs = components(&worse.time);
    let mut deltas: Vec<(&str, f64)> = ours
        .iter()
        .zip(theirs.iter())
        .map(|((name, a), (_, b))| (*name, b - a))
        .collect();
    // Largest loss first; ties keep the fixed component order.
    deltas.sort_by(|a, b| b.1.total_cmp(&a.1));
    let slower = worse.step_time_s - best.step_time_s;
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
