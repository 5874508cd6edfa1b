//! What changed between two serving plans, and whether it is a regression: the chosen
//! deployment, its GPUs, its goodput per GPU and its latencies at the workload's rate.

use std::fmt::Write;

use serde::Serialize;

use super::plan::{PlannedDeployment, ServingPlan};

/// One compared quantity.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ServingChange {
    pub what: String,
    pub old: f64,
    pub new: f64,
    /// `(new − old) / old`, percent.
    pub change_pct: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ServingDiff {
    pub old_label: String,
    pub new_label: String,
    pub spec_changed: bool,
    pub old_deployment: String,
    pub new_deployment: String,
    pub changes: Vec<ServingChange>,
    /// Why the new plan is a regression; empty when it is not.
    pub failures: Vec<String>,
}

fn describe(d: &PlannedDeployment) -> String {
    let phases: Vec<String> = d
        .phases
        .iter()
        .map(|p| {
            format!(
                "{} {}× tp{} pp{} ≤{} seqs {} tokens",
                p.role, p.instances, p.tp, p.pp, p.max_sequences, p.max_batched_tokens
            )
        })
        .collect();
    format!("{} ({}), {} GPUs", d.kind, phases.join(" + "), d.gpus)
}

/// Compares `old` and `new`; with `fail_on_regression`, a fall of goodput per GPU by more than
/// that many percent is a failure. A new plan whose simulated attainment misses its SLO always
/// is.
pub fn diff_serving_plans(
    (old_label, old): (&str, &ServingPlan),
    (new_label, new): (&str, &ServingPlan),
    fail_on_regression: Option<f64>,
) -> ServingDiff {
    let (o, n) = (&old.chosen, &new.chosen);
    let change = |what: &str, old: f64, new: f64| ServingChange {
        what: what.to_string(),
        old,
        new,
        change_pct: if old == 0.0 {
            0.0
        } else {
            (new - old) / old * 100.0
        },
    };
    let changes = vec![
        change(
            "goodput per GPU (requests/s)",
            o.goodput_per_gpu,
            n.goodput_per_gpu,
        ),
        change("GPUs", o.gpus as f64, n.gpus as f64),
        change("capacity (requests/s)", o.sustained_rate, n.sustained_rate),
        change("ttft p90 (s)", o.at_rate.ttft_p90_s, n.at_rate.ttft_p90_s),
        change("tpot p90 (s)", o.at_rate.tpot_p90_s, n.at_rate.tpot_p90_s),
        change("SLO attainment", o.at_rate.attainment, n.at_rate.attainment),
    ];
    let mut failures = Vec::new();
    if let Some(pct) = fail_on_regression {
        let fall = -changes[0].change_pct;
        if fall > pct {
            failures.push(format!(
                "goodput per GPU fell {fall:.1} % ({:.4} → {:.4} requests/s), more than {pct} %",
                o.goodput_per_gpu, n.goodput_per_gpu
            ));
        }
    }
    if n.at_rate.attainment < new.slo.attainment {
        failures.push(format!(
            "the new plan meets its SLO for {:.1} % of requests, below the {:.0} % asked",
            n.at_rate.attainment * 100.0,
            new.slo.attainment * 100.0
        ));
    }
    ServingDiff {
        old_label: old_label.to_string(),
        new_label: new_label.to_string(),
        spec_changed: old.spec_digest != new.spec_digest,
        old_deployment: describe(o),
        new_deployment: describe(n),
        changes,
        failures,
    }
}

impl ServingDiff {
    pub fn to_json(&self) -> String {
        serde_json::to_value(self)
            .map(|v| crate::canonical_json::to_canonical_string(&v))
            .unwrap_or_default()
    }

    /// For a terminal (`markdown`: a table for a pull request).
    pub fn render(&self, markdown: bool) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "serving plans: {} → {}",
            self.old_label, self.new_label
        );
        if self.spec_changed {
            let _ = writeln!(out, "the spec changed");
        }
        if self.old_deployment == self.new_deployment {
            let _ = writeln!(out, "deployment unchanged: {}", self.new_deployment);
        } else {
            let _ = writeln!(
                out,
                "deployment: {}\n         → {}",
                self.old_deployment, self.new_deployment
            );
        }
        if markdown {
            let _ = writeln!(out, "\n| | old | new | change |\n|---|---:|---:|---:|");
        }
        for c in &self.changes {
            if markdown {
                let _ = writeln!(
                    out,
                    "| {} | {:.4} | {:.4} | {:+.1} % |",
                    c.what, c.old, c.new, c.change_pct
                );
            } else {
                let _ = writeln!(
                    out,
                    "  {:<30} {:>10.4} → {:>10.4}  ({:+.1} %)",
                    c.what, c.old, c.new, c.change_pct
                );
            }
        }
        out
    }
}
