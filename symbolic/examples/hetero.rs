//! Predicts the published runs on two GPU types (`data/hetero/runs.csv`) and prints each with
//! its error, then the mean absolute, median absolute and mean signed error of the mixed and
//! the one-type rows, and the rank correlation of predicted and measured step times.
//!
//! `cargo run --release -p tessel-symbolic --example hetero` (`SPECS=1` prints each spec).

use tessel_symbolic::validation::{
    default_hetero_path, evaluate_hetero, load_hetero_cases, spearman,
};

fn main() {
    let outcomes = load_hetero_cases(&default_hetero_path())
        .and_then(|cases| evaluate_hetero(&cases))
        .unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(1)
        });
    for o in &outcomes {
        if std::env::var_os("SPECS").is_some() {
            println!("{}", o.case.spec_text);
        }
        println!(
            "line {:>3}  {:<5}  {:<20}  measured {:>5.2} s  predicted {:>6.3} s  error {:>+6.1} %",
            o.case.line,
            if o.case.mixed { "mixed" } else { "T4" },
            o.case.label,
            o.case.measured_s,
            o.predicted_s,
            100.0 * o.error
        );
    }
    for mixed in [true, false] {
        let rows: Vec<_> = outcomes.iter().filter(|o| o.case.mixed == mixed).collect();
        let measured: Vec<f64> = rows.iter().map(|o| o.case.measured_s).collect();
        let predicted: Vec<f64> = rows.iter().map(|o| o.predicted_s).collect();
        let mut errors: Vec<f64> = rows.iter().map(|o| o.error).collect();
        let n = errors.len() as f64;
        let mean_abs = errors.iter().map(|e| e.abs()).sum::<f64>() / n;
        let bias = errors.iter().sum::<f64>() / n;
        errors.sort_by(|a, b| a.abs().total_cmp(&b.abs()));
        let median = errors[errors.len() / 2].abs();
        println!(
            "{:<28} rows {:>2}  mean |error| {:>5.1} %  median {:>5.1} %  bias {:>+6.1} %  Spearman {:.2}",
            if mixed { "12 V100 + 4 T4 (across pools)" } else { "16 T4" },
            errors.len(),
            100.0 * mean_abs,
            100.0 * median,
            100.0 * bias,
            spearman(&measured, &predicted)
        );
    }
}
