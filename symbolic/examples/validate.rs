//! Prints per-row validation errors (a development aid; `docs/VALIDATION.md` is written by
//! `cargo test -p tessel-symbolic --test validation -- --ignored`).

use tessel_symbolic::cost::{Calibration, KernelEfficiency};
use tessel_symbolic::validation::{default_data_path, evaluate, load_cases, per_source};

fn main() {
    let (cases, skipped) = match load_cases(&default_data_path()) {
        Ok(loaded) => loaded,
        Err(err) => {
            eprintln!("{err}");
            return;
        }
    };
    let efficiency = |case: &tessel_symbolic::validation::Case| {
        KernelEfficiency::for_gpu(&case.spec.cluster.gpu)
    };
    let outcomes = evaluate(&cases, Calibration::default(), &efficiency);
    let detail: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    for case in cases.iter().filter(|c| detail.contains(&c.line)) {
        let model = tessel_symbolic::cost::CostModel::new(&case.spec);
        if let Ok(Ok(est)) = model.map(|m| m.estimate(&case.strategy)) {
            println!(
                "line {} {:?} step {:.3}",
                case.line, case.strategy, est.step_time_s
            );
            println!("  {:?}", est.time);
            for st in est.stages.iter().take(2) {
                println!(
                    "  stage {} layers {} mem {:?}",
                    st.stage, st.layers, st.memory
                );
            }
            println!("  peak {:.2} GiB", est.peak_memory_gib);
        }
    }
    for (case, o) in cases.iter().zip(&outcomes) {
        let s = &case.strategy;
        let shares = tessel_symbolic::cost::CostModel::new(&case.spec)
            .ok()
            .and_then(|m| m.estimate(s).ok())
            .map_or(String::new(), |e| {
                let t = &e.time;
                let step = e.step_time_s;
                let share = |x: f64| format!("{:2.0}", 100.0 * x / step);
                format!(
                    "c{} r{} tp{} pp{} dp{} b{} o{} | mem {:.1} GiB",
                    share(t.compute),
                    share(t.recompute),
                    share(t.tp_comm),
                    share(t.pp_comm),
                    share(t.dp_comm),
                    share(t.bubble),
                    share(t.optimizer),
                    e.peak_memory_gib
                )
            });
        println!(
            "{:4} {:12} {:24} t{}p{}d{}c{} mb{} z{} {:10} thr {:>7} mem {:>7} mfu {:.3} fitsOK {} {} {}",
            o.line,
            o.source.label().chars().take(12).collect::<String>(),
            o.model.chars().take(24).collect::<String>(),
            s.tp,
            s.pp,
            s.dp,
            s.cp,
            s.microbatch,
            s.zero,
            format!("{:?}", s.recompute).chars().take(10).collect::<String>(),
            o.throughput_error
                .map_or("-".into(), |e| format!("{:+.1}%", 100.0 * e)),
            o.memory_error
                .map_or("-".into(), |e| format!("{:+.1}%", 100.0 * e)),
            o.mfu,
            o.oom != o.predicted_fits,
            shares,
            o.error.clone().unwrap_or_default()
        );
    }
    for (source, (t, m)) in per_source(&outcomes) {
        println!(
            "{:30} thr n={} mean {:.1}% max {:.1}% | mem n={} mean {:.1}% max {:.1}%",
            source.label(),
            t.count,
            100.0 * t.mean,
            100.0 * t.max,
            m.count,
            100.0 * m.mean,
            100.0 * m.max
        );
    }
    let ran_but_predicted_oom = outcomes
        .iter()
        .filter(|o| o.error.is_none() && !o.oom && !o.predicted_fits)
        .count();
    let oom_caught = outcomes
        .iter()
        .filter(|o| o.oom && !o.predicted_fits)
        .count();
    let ooms = outcomes.iter().filter(|o| o.oom).count();
    println!(
        "ran but predicted not to fit: {ran_but_predicted_oom}; OOM caught {oom_caught}/{ooms}"
    );
    println!("skipped {}", skipped.len());
}
