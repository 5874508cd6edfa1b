//! A serving plan as a table for a terminal, as markdown, and the `--explain` notes.

use std::fmt::Write;

use super::plan::{PlannedDeployment, ServingPlan};

fn ms(seconds: f64) -> String {
    format!("{:.1} ms", seconds * 1e3)
}

fn phases(d: &PlannedDeployment) -> String {
    d.phases
        .iter()
        .map(|p| {
            let role = match p.role.as_str() {
                "both" => String::new(),
                role => format!("{role} "),
            };
            format!(
                "{role}{}× tp{} pp{} (≤{} seqs, {} tokens/iter)",
                p.instances, p.tp, p.pp, p.max_sequences, p.max_batched_tokens
            )
        })
        .collect::<Vec<_>>()
        .join(" + ")
}

fn describe(d: &PlannedDeployment) -> String {
    let transfer = d
        .kv_transfer
        .as_ref()
        .map_or(String::new(), |t| format!(", KV over {t}"));
    format!("{}: {}{transfer}", d.kind, phases(d))
}

/// The plan for a terminal: the chosen deployment, its latencies, the runners-up.
pub fn render_serving_table(plan: &ServingPlan) -> String {
    let mut out = String::new();
    let c = &plan.chosen;
    let _ = writeln!(
        out,
        "serving plan for {} on {} ({} GPUs), {}",
        plan.model, plan.cluster, plan.gpus_available, plan.engine
    );
    let _ = writeln!(
        out,
        "workload: {:.3} requests/s ({} simulated, seed {}){}",
        plan.workload.rate,
        plan.workload.requests,
        plan.workload.seed,
        plan.workload
            .trace
            .as_ref()
            .map_or(String::new(), |t| format!(", trace {t}"))
    );
    let _ = writeln!(
        out,
        "SLO: ttft ≤ {}, tpot ≤ {}, for {:.0} % of requests\n",
        ms(plan.slo.ttft),
        ms(plan.slo.tpot),
        plan.slo.attainment * 100.0
    );
    let _ = writeln!(out, "chosen: {}", describe(c));
    let _ = writeln!(
        out,
        "  GPUs {} of {}; goodput {:.3} requests/s per GPU; serves up to {:.3} requests/s \
         ({:.3} per GPU)",
        c.gpus, plan.gpus_available, c.goodput_per_gpu, c.sustained_rate, c.capacity_per_gpu
    );
    for p in &c.phases {
        let _ = writeln!(
            out,
            "  {}: weights {:.1} GB per GPU, KV cache {} tokens per instance",
            p.role,
            p.weight_bytes_per_gpu / 1e9,
            p.kv_cache_tokens
        );
    }
    let a = &c.at_rate;
    let _ = writeln!(out, "  at {:.3} requests/s:", plan.workload.rate);
    let _ = writeln!(
        out,
        "    ttft p50 {}  p90 {}  p99 {}",
        ms(a.ttft_p50_s),
        ms(a.ttft_p90_s),
        ms(a.ttft_p99_s)
    );
    let _ = writeln!(
        out,
        "    tpot p50 {}  p90 {}  p99 {}",
        ms(a.tpot_p50_s),
        ms(a.tpot_p90_s),
        ms(a.tpot_p99_s)
    );
    let _ = writeln!(
        out,
        "    SLO attained by {:.1} % (ttft {:.1} %, tpot {:.1} %)",
        a.attainment * 100.0,
        a.ttft_attainment * 100.0,
        a.tpot_attainment * 100.0
    );
    if !plan.runners_up.is_empty() {
        let _ = writeln!(out, "\nrunners-up:");
        for (i, r) in plan.runners_up.iter().enumerate() {
            let _ = writeln!(
                out,
                "  {}. {} — {} GPUs, {:.3} requests/s per GPU, ttft p90 {}, tpot p90 {}, \
                 attained {:.1} %",
                i + 1,
                describe(r),
                r.gpus,
                r.goodput_per_gpu,
                ms(r.at_rate.ttft_p90_s),
                ms(r.at_rate.tpot_p90_s),
                r.at_rate.attainment * 100.0
            );
        }
    }
    let _ = writeln!(
        out,
        "\nsearch: {} instance configurations simulated, {} deployments serve the rate, {} \
         passed over when simulated whole",
        plan.search.configurations, plan.search.deployments, plan.search.rejected
    );
    out
}

/// The plan as markdown, for a pull request.
pub fn render_serving_markdown(plan: &ServingPlan) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### Serving plan: {} on {}\n\n{:.3} requests/s; SLO ttft ≤ {}, tpot ≤ {} for {:.0} %\n",
        plan.model,
        plan.cluster,
        plan.workload.rate,
        ms(plan.slo.ttft),
        ms(plan.slo.tpot),
        plan.slo.attainment * 100.0
    );
    let _ = writeln!(
        out,
        "| | deployment | GPUs | goodput/GPU | ttft p90 | tpot p90 | attained |\n|---|---|---:|---:|---:|---:|---:|"
    );
    for (i, d) in std::iter::once(&plan.chosen)
        .chain(&plan.runners_up)
        .enumerate()
    {
        let label = if i == 0 {
            "**chosen**".to_string()
        } else {
            format!("{i}")
        };
        let _ = writeln!(
            out,
            "| {label} | {} | {} | {:.3} | {} | {} | {:.1} % |",
            describe(d),
            d.gpus,
            d.goodput_per_gpu,
            ms(d.at_rate.ttft_p90_s),
            ms(d.at_rate.tpot_p90_s),
            d.at_rate.attainment * 100.0
        );
    }
    out
}

/// Which target binds the chosen deployment, and what each runner-up gives up: deployments
/// are ranked by the GPUs that serve the rate, then by their capacity per GPU.
pub fn render_serving_explain(plan: &ServingPlan) -> String {
    let mut out = String::new();
    let c = &plan.chosen;
    let target = match c.binding.as_str() {
        "ttft" => format!("time to first token ({})", ms(plan.slo.ttft)),
        "tpot" => format!("time per output token ({})", ms(plan.slo.tpot)),
        other => other.to_string(),
    };
    let _ = writeln!(
        out,
        "binding target: {target}. Above {:.3} requests/s per {} the {} is the first target \
         fewer than {:.0} % of requests meet.",
        c.sustained_rate,
        if c.kind == "colocated" {
            "deployment"
        } else {
            "deployment (its scarcer phase)"
        },
        c.binding,
        plan.slo.attainment * 100.0
    );
    for r in &plan.runners_up {
        let capacity = (1.0 - r.capacity_per_gpu / c.capacity_per_gpu) * 100.0;
        let _ = writeln!(
            out,
            "- {}: {} GPUs (chosen: {}), {capacity:.1} % less capacity per GPU, bound by {}",
            describe(r),
            r.gpus,
            c.gpus,
            r.binding
        );
    }
    out
}
