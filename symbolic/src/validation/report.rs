//! The markdown report of a validation run (`docs/VALIDATION.md`).

use std::fmt::Write;

use super::cases::{Case, Skipped, Source, Throughput};
use super::evaluate::{per_source, ErrorStats, Outcome};
use super::ranking::ranking_per_source;

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// Renders the report: per-source errors, Korthikanti Table 5, out-of-memory rows, every row,
/// and the rows that could not be costed.
pub fn render_validation_markdown(
    cases: &[Case],
    outcomes: &[Outcome],
    skipped: &[Skipped],
    preamble: &str,
) -> String {
    let mut out = String::new();
    out.push_str(preamble);
    let table5 = ErrorStats::of(
        cases
            .iter()
            .zip(outcomes)
            .filter(|(c, _)| c.source == Source::Korthikanti && c.table.starts_with("Table 5"))
            .filter_map(|(_, o)| o.throughput_error),
    );
    let _ = writeln!(
        out,
        "\n**Korthikanti et al. Table 5** ({} iteration times): mean error {}, max {} \
         (targets 3 % and 6 %; Calculon reports 3.65 % and 8.87 %).",
        table5.count,
        pct(table5.mean),
        pct(table5.max)
    );
    out.push_str("\n## Errors per source\n\n");
    out.push_str(
        "Absolute percentage error of the prediction against the measurement. Throughput is \
         compared in the unit the source gives (step time, else tokens/s per GPU); memory in \
         the source's measure (device, reserved or allocated). In the table of every row the \
         error is signed, predicted / measured − 1 in the source's unit: positive is a longer \
         predicted step where the source gives step times and a higher predicted throughput \
         where it gives tokens/s.\n\n",
    );
    out.push_str(
        "| source | role | rows | throughput rows | mean | max | memory rows | mean | max |\n",
    );
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    let stats = per_source(outcomes);
    for (source, (throughput, memory)) in &stats {
        let rows = outcomes.iter().filter(|o| o.source == *source).count();
        let role = source.role();
        let cell = |s: &ErrorStats| {
            if s.count == 0 {
                ("–".to_string(), "–".to_string())
            } else {
                (pct(s.mean), pct(s.max))
            }
        };
        let (tm, tx) = cell(throughput);
        let (mm, mx) = cell(memory);
        let _ = writeln!(
            out,
            "| {} | {role} | {rows} | {} | {tm} | {tx} | {} | {mm} | {mx} |",
            source.label(),
            throughput.count,
            memory.count
        );
    }
    let everything = (
        ErrorStats::of(outcomes.iter().filter_map(|o| o.throughput_error)),
        ErrorStats::of(outcomes.iter().filter_map(|o| o.memory_error)),
    );
    let cell = |s: &ErrorStats| {
        if s.count == 0 {
            "– | –".to_string()
        } else {
            format!("{} | {}", pct(s.mean), pct(s.max))
        }
    };
    let _ = writeln!(
        out,
        "| **all sources** | | | {} | {} | {} | {} |",
        everything.0.count,
        cell(&everything.0),
        everything.1.count,
        cell(&everything.1)
    );

    out.push_str("\n## Ranking of configurations\n\n");
    out.push_str(
        "Within each group of runs of the same model on the same GPUs with the same sequence \
         length, global batch and precision (three runs or more), the Spearman correlation \
         between predicted and measured throughput, and how often the predicted fastest \
         configuration is the measured fastest.\n\n",
    );
    out.push_str("| source | groups | mean Spearman | predicted best = measured best |\n|---|---:|---:|---:|\n");
    for (source, stats) in ranking_per_source(cases, outcomes) {
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} | {} of {} |",
            source.label(),
            stats.groups,
            stats.mean_spearman,
            stats.top1_hits,
            stats.groups
        );
    }

    out.push_str("\n## Out-of-memory runs\n\n");
    out.push_str("| line | model | tp·pp·dp | micro-batch | predicted peak vs capacity |\n|---|---|---|---:|---|\n");
    for (case, outcome) in cases.iter().zip(outcomes).filter(|(c, _)| c.oom) {
        let verdict = if outcome.predicted_fits {
            "predicted to fit (wrong)"
        } else {
            "predicted not to fit (right)"
        };
        let _ = writeln!(
            out,
            "| {} | {} | {}·{}·{} | {} | {verdict} |",
            case.line,
            case.model,
            case.strategy.tp,
            case.strategy.pp,
            case.strategy.dp,
            case.strategy.microbatch
        );
    }

    out.push_str("\n## Runs that ran but are predicted not to fit\n\n");
    let false_oom: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| o.error.is_none() && !o.oom && !o.predicted_fits)
        .collect();
    let _ =
        writeln!(
        out,
        "{} of {} costed runs that completed are predicted not to fit (memory over-estimated):\n",
        false_oom.len(),
        outcomes.iter().filter(|o| o.error.is_none() && !o.oom).count()
    );
    for outcome in false_oom {
        let _ = writeln!(
            out,
            "- line {}: {} — {}",
            outcome.line,
            outcome.source.label(),
            outcome.model
        );
    }

    out.push_str("\n## Every costed row\n\n");
    out.push_str("| line | source | model | tp·pp·dp·cp | mb | recompute | measured | predicted | error | memory measured → predicted (GiB) | error |\n");
    out.push_str("|---:|---|---|---|---:|---|---:|---:|---:|---|---:|\n");
    for (case, outcome) in cases.iter().zip(outcomes) {
        let s = &case.strategy;
        let (measured, predicted) = match outcome.throughput {
            Some((Throughput::StepTime(m), p)) => (format!("{m:.3} s"), format!("{p:.3} s")),
            Some((Throughput::TokensPerGpu(m), p)) => {
                (format!("{m:.0} tok/s"), format!("{p:.0} tok/s"))
            }
            None => ("–".into(), "–".into()),
        };
        let error = outcome.throughput_error.map_or("–".into(), pct);
        let memory = outcome
            .memory
            .map_or("–".into(), |(m, p)| format!("{m:.1} → {p:.1}"));
        let memory_error = outcome.memory_error.map_or("–".into(), pct);
        let predicted = match &outcome.error {
            Some(err) => format!("error: {err}"),
            None => predicted,
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {}·{}·{}·{} | {} | {:?} | {measured} | {predicted} | {error} | {memory} | {memory_error} |",
            case.line,
            case.source.label(),
            case.model,
            s.tp,
            s.pp,
            s.dp,
            s.cp,
            s.microbatch,
            s.recompute
        );
    }

    out.push_str("\n## Assumptions made for fields a row leaves empty\n\n");
    let mut assumptions: Vec<(String, String)> = cases
        .iter()
        .flat_map(|c| {
            c.assumptions
                .iter()
                .map(move |a| (c.source.label().to_string(), a.clone()))
        })
        .collect();
    assumptions.sort();
    assumptions.dedup();
    for (source, assumption) in assumptions {
        let _ = writeln!(out, "- {source}: {assumption}");
    }

    out.push_str("\n## Rows not costed\n\n| line | source | model | why |\n|---:|---|---|---|\n");
    for skip in skipped {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            skip.line,
            skip.source.label(),
            skip.model,
            skip.reason
        );
    }
    out
}
