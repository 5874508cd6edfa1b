//! Prints the serving model against every published measurement it covers
//! (`data/serving/measurements.csv`): `cargo run --release -p tessel-planner --example
//! serving_validation`.

use tessel_planner::serving::validation::{default_measurements_path, read_measurements, score};

fn main() {
    let rows = read_measurements(&default_measurements_path()).expect("the measurements read");
    let scored = score(&rows);
    println!("| source | model | GPUs | kind | batch | in/out | measured | predicted | error |");
    println!("|---|---|---:|---|---:|---|---:|---:|---:|");
    for s in &scored {
        let r = &s.row;
        println!(
            "| {} | {} | {}×{} tp{} pp{} | {} | {} | {}/{} | {} {} | {:.4} | {:+.1} % |",
            r.source,
            r.model.split(' ').next().unwrap_or(""),
            r.tp * r.pp,
            r.gpu,
            r.tp,
            r.pp,
            r.kind,
            r.batch
                .map_or(r.requests.map_or("".into(), |n| format!("{n} req")), |b| b
                    .to_string()),
            r.input_len,
            r.output_len,
            r.value,
            r.unit,
            s.predicted,
            s.error * 100.0
        );
    }
    let mut errors: Vec<f64> = scored.iter().map(|s| s.error.abs()).collect();
    errors.sort_by(f64::total_cmp);
    let mean = errors.iter().sum::<f64>() / errors.len() as f64;
    let within = errors.iter().filter(|e| **e <= 0.15).count();
    println!(
        "\n{} rows: mean |error| {:.1} %, median {:.1} %, {} within 15 %",
        errors.len(),
        mean * 100.0,
        errors[errors.len() / 2] * 100.0,
        within
    );
}
