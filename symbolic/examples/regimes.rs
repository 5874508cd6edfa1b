//! Predicts the regime runs (`data/regimes/runs.csv`) and prints each with its error, then
//! the mean absolute error and the mean signed error per regime.
//!
//! `cargo run --release -p tessel-symbolic --example regimes` (`SPECS=1` prints each spec).

use std::collections::BTreeMap;

use tessel_symbolic::validation::{default_regimes_path, evaluate_regimes, load_regime_cases};

fn main() {
    let cases = load_regime_cases(&default_regimes_path()).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    });
    let outcomes = evaluate_regimes(&cases).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    });
    let mut by_regime: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for o in &outcomes {
        if std::env::var_os("SPECS").is_some() {
            println!("{}", o.case.spec_text);
        }
        let t = &o.estimate.time;
        println!(
            "{:<20} {:<22} {:>6} GPUs  step {:>8.3} s  error {:>+6.1} %  mfu {:.3}  [compute {:.2} recompute {:.2} tp {:.2} pp {:.2} dp {:.2} ep {:.2} bubble {:.2} opt {:.2}]",
            o.case.regime, o.case.model, o.case.gpus, o.estimate.step_time_s, 100.0 * o.step_error, o.estimate.mfu,
            t.compute, t.recompute, t.tp_comm, t.pp_comm, t.dp_comm, t.ep_comm, t.bubble, t.optimizer
        );
        by_regime
            .entry(o.case.regime.as_str())
            .or_default()
            .push(o.step_error);
    }
    let mut all = Vec::new();
    for (regime, errors) in &by_regime {
        let mean_abs = errors.iter().map(|e| e.abs()).sum::<f64>() / errors.len() as f64;
        let bias = errors.iter().sum::<f64>() / errors.len() as f64;
        println!(
            "{regime:<20} rows {:>2}  mean |error| {:>5.1} %  bias {:>+6.1} %",
            errors.len(),
            100.0 * mean_abs,
            100.0 * bias
        );
        all.extend(errors.iter().copied());
    }
    let mean_abs = all.iter().map(|e| e.abs()).sum::<f64>() / all.len() as f64;
    println!(
        "all                  rows {:>2}  mean |error| {:>5.1} %",
        all.len(),
        100.0 * mean_abs
    );
}
