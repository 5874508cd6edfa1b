//! The cost model's errors on runs it was not fitted to, stored with each run's traits:
//! every published run predicted by the fit that left its source out (leave one source out),
//! and every regime run (`data/regimes/`), which no fit sees. Written by
//! `cargo run --release -p tessel-symbolic --example calibrate` with `HELD_OUT=path`; the
//! committed table is `symbolic/data/held_out_errors.csv`.

use std::sync::OnceLock;

use super::run_traits::RunTraits;

/// One run predicted without having been fitted to.
#[derive(Clone, Debug, PartialEq)]
pub struct HeldOutRun {
    /// The source it was held out with (`Korthikanti et al.`), or `regime: <name>`.
    pub group: String,
    pub model: String,
    pub traits: RunTraits,
    /// ln(predicted step time / measured step time): positive when predicted slower.
    pub log_error: f64,
}

const HEADER_LEAD: [&str; 2] = ["group", "model"];

/// The committed held-out errors.
pub fn held_out_runs() -> &'static [HeldOutRun] {
    static RUNS: OnceLock<Vec<HeldOutRun>> = OnceLock::new();
    RUNS.get_or_init(|| {
        parse_held_out(include_str!("../../data/held_out_errors.csv"))
            .expect("the committed held-out table parses (a test checks it)")
    })
}

/// Writes the table: a header, then one row per run, in the order given.
pub fn render_held_out(runs: &[HeldOutRun]) -> String {
    let mut header: Vec<&str> = HEADER_LEAD.to_vec();
    header.extend(RunTraits::COLUMNS);
    header.push("log_error");
    let mut text = header.join(",");
    text.push('\n');
    for run in runs {
        let mut fields = vec![clean(&run.group), clean(&run.model)];
        fields.extend(run.traits.to_fields());
        fields.push(format!("{:.5}", run.log_error));
        text.push_str(&fields.join(","));
        text.push('\n');
    }
    text
}

/// Reads what [`render_held_out`] wrote.
pub fn parse_held_out(text: &str) -> Result<Vec<HeldOutRun>, String> {
    let mut lines = text.lines().enumerate();
    let expected = render_held_out(&[]);
    match lines.next() {
        Some((_, header)) if header == expected.trim_end() => {}
        _ => {
            return Err(format!(
                "line 1: expected the header `{}`",
                expected.trim_end()
            ))
        }
    }
    let width = HEADER_LEAD.len() + RunTraits::COLUMNS.len() + 1;
    lines
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(index, line)| {
            let fields: Vec<&str> = line.split(',').collect();
            let at = |message: String| format!("line {}: {message}", index + 1);
            if fields.len() != width {
                return Err(at(format!("{} fields, expected {width}", fields.len())));
            }
            let traits = RunTraits::from_fields(&fields[2..width - 1]).map_err(at)?;
            let log_error = fields[width - 1]
                .parse::<f64>()
                .ok()
                .filter(|e| e.is_finite())
                .ok_or_else(|| at(format!("`{}` is not an error", fields[width - 1])))?;
            Ok(HeldOutRun {
                group: fields[0].to_string(),
                model: fields[1].to_string(),
                traits,
                log_error,
            })
        })
        .collect()
}

/// Commas would split the field; the names never need them.
fn clean(text: &str) -> String {
    text.replace(',', ";")
}
