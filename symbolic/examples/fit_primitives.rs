//! Fits every primitive to the published microbenchmarks and this project's GEMM and copy
//! sweeps (`load_fit_microbenchmarks`) and prints, for each kind, its
//! errors in the fit and with each source held out, then the fitted parameters.
//!
//! `cargo run --release -p tessel-symbolic --example fit_primitives [-- --score DIR]`: with
//! `--score`, also the fitted primitives' errors on DIR's measurements, which no fit reads
//! (`data/microbench/two-nodes/`; `measured-h100/` for its attention calls).

use std::path::PathBuf;

use tessel_symbolic::primitives::fit::{
    fit_and_score, gemm_source_disagreement, median, score_unseen, PrimitiveScore,
};
use tessel_symbolic::primitives::{load_fit_microbenchmarks, load_microbenchmarks};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let unseen = match args.as_slice() {
        [] => None,
        [flag, dir] if flag == "--score" => Some(PathBuf::from(dir)),
        _ => {
            eprintln!("usage: fit_primitives [--score DIR]");
            std::process::exit(2);
        }
    };
    let data = match load_fit_microbenchmarks(None) {
        Ok(data) => data,
        Err(err) => {
            eprintln!("{err}");
            std::process::exit(1);
        }
    };
    let (fitted, scores) = fit_and_score(&data);
    print_scores(&scores);
    let mut disagreement = gemm_source_disagreement(&data);
    println!(
        "\nTwo sources timing GEMM shapes in common on the same GPU: {} pairs of sources, median over pairs of their median difference {:.1} %",
        disagreement.len(),
        100.0 * median(&mut disagreement)
    );
    if let Some(dir) = unseen {
        match load_microbenchmarks(std::slice::from_ref(&dir)) {
            Ok(unseen) => {
                println!(
                    "\nThe fitted primitives on {} (never fitted):\n",
                    dir.display()
                );
                print_scores(&score_unseen(&fitted, &unseen));
            }
            Err(err) => {
                eprintln!("{err}");
                std::process::exit(1);
            }
        }
    }
    println!("\n{fitted:#?}");
    if std::env::var_os("VERBOSE").is_some() {
        use tessel_symbolic::primitives::fit::{gemm_generation, predict_collective, predict_gemm};
        for r in &data.collectives {
            println!(
                "C {:>6.2} {:?} n={} pn={} bytes={} meas={:.1}us pred={:.1}us {}",
                predict_collective(r, &fitted.collectives) / r.seconds,
                r.kind,
                r.ranks,
                r.per_node,
                r.bytes,
                r.seconds * 1e6,
                predict_collective(r, &fitted.collectives) * 1e6,
                &r.system[..r.system.len().min(30)]
            );
        }
        for r in &data.gemms {
            let p = predict_gemm(
                r,
                &fitted.gemms[gemm_generation(r).name()],
                fitted.power_capped_gemm_rate,
            );
            println!(
                "G {:>6.2} {} {} {} meas={:.1}TF pred={:.1}TF {} {}",
                p / r.seconds,
                r.m,
                r.n,
                r.k,
                2.0 * r.m * r.n * r.k / r.seconds / 1e12,
                2.0 * r.m * r.n * r.k / p / 1e12,
                &r.gpu[..r.gpu.len().min(20)],
                &r.source[..r.source.len().min(40)]
            );
        }
    }
}

fn print_scores(scores: &[PrimitiveScore]) {
    println!("| primitive | rows | sources | median error, source held out | median over sources, held out | mean, held out | median, each source's level divided out | median in the fit |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for score in scores {
        let mean = score.held_out.iter().map(|e| e.abs()).sum::<f64>()
            / score.held_out.len().max(1) as f64;
        let median_cell = |errors: &[f64]| {
            if errors.is_empty() {
                "–".to_string()
            } else {
                format!("{:.1} %", 100.0 * PrimitiveScore::median_abs(errors))
            }
        };
        let in_fit = median_cell(&score.in_fit);
        let shape = median_cell(&score.held_out_shape);
        let by_source = median_cell(&score.held_out_by_source);
        println!(
            "| {} | {} | {} | {:.1} % | {by_source} | {:.1} % | {shape} | {in_fit} |",
            score.kind,
            score.rows,
            score.sources,
            100.0 * PrimitiveScore::median_abs(&score.held_out),
            100.0 * mean,
        );
    }
}
