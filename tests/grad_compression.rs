//! Gradient compression through the binary: `grad_compression = { method = auto }` picks
//! PowerSGD for GPT-3 2.7B on Ethernet-joined nodes and sends whole on InfiniBand, `--explain`
//! says why, a committed plan is current under `plan --check`, exporters say they cannot run
//! it, and `tessel launch` trains compressed plans of a tiny model for 400 steps along the
//! uncompressed plan's loss curve.

mod common;

use common::{launch_cpu_scaled, plan_explained_and_current, stdout, tessel};

#[test]
fn auto_compresses_on_ethernet_and_not_on_infiniband() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let plan = dir.path().join("compressed.json").display().to_string();
    let shown = plan_explained_and_current("specs/gpt3-2.7b-ethernet.tsl", &plan);
    assert!(
        shown.contains("gradients    powersgd rank 4: the layers' buckets compressed"),
        "{shown}"
    );
    assert!(
        shown.contains("grad_compression: powersgd: none "),
        "{shown}"
    );
    let exported = stdout(&tessel(&["export", &plan, "--to", "torchtitan"]));
    assert!(
        exported.contains("grad_compression = powersgd rank 4"),
        "{exported}"
    );

    let spec = std::fs::read_to_string("specs/gpt3-2.7b-ethernet.tsl").expect("the spec reads");
    let infiniband = spec.replace(
        "inter_node    = { bandwidth = 12.5 Gb/s, latency = 30 us }",
        "inter_node    = { bandwidth = 200 Gb/s }",
    );
    assert_ne!(infiniband, spec);
    let path = dir.path().join("infiniband.tsl");
    std::fs::write(&path, infiniband).expect("the spec writes");
    let shown = stdout(&tessel(&["plan", path.to_str().unwrap(), "--explain"]));
    assert!(!shown.contains("  gradients "), "{shown}");
    assert!(shown.contains("grad_compression: none: "), "{shown}");
}

const TINY: &str = r#"
model tiny { layers = 2; hidden = 32; heads = 4; kv_heads = 2; ffn_hidden = 64; vocab = 64
             mlp = swiglu; norm = rmsnorm; tie_embeddings = false; max_seq_len = 16 }
cluster ethernet { gpu = A100_80GB; nodes = 4; gpus_per_node = 1
                   inter_node = { bandwidth = 1 Gb/s, latency = 30 us } }
train { model = tiny; cluster = ethernet; seq_len = 16; global_batch = 16 COMPRESSION }
strategy dp4 { microbatch = 2; zero = 0 }
"#;

/// Plans the tiny job (with `compression` in its train block) and trains it 400 steps (Adam at
/// `tessel launch`'s learning rate, 1e-3): the plan's header and the mean loss of each 25 steps.
fn train_tiny(dir: &std::path::Path, name: &str, compression: &str) -> (String, Vec<f64>) {
    let spec = dir.join(format!("{name}.tsl"));
    std::fs::write(&spec, TINY.replace("COMPRESSION", compression)).expect("the spec writes");
    let plan = dir.join(format!("{name}.json")).display().to_string();
    let shown = stdout(&tessel(&[
        "plan",
        spec.to_str().unwrap(),
        "--strategy",
        "dp4",
        "-o",
        &plan,
    ]));
    let report = launch_cpu_scaled(&plan, "1", "400", &[]);
    let losses: Vec<f64> = report["losses"]
        .as_array()
        .expect("losses")
        .iter()
        .map(|l| l.as_f64().expect("a number"))
        .collect();
    let windows = losses
        .chunks(25)
        .map(|w| w.iter().sum::<f64>() / 25.0)
        .collect();
    (shown, windows)
}

/// Each 25-step window's mean loss within 3 % of the uncompressed run's from a method's step
/// on: top-k (10 %) from step 275, PowerSGD (rank 8) from step 325. Both learn slower at first
/// (what error feedback holds back reaches the model later) and catch up; fp8 follows the
/// uncompressed curve within 1 % from the start.
#[test]
fn compressed_plans_train_along_the_uncompressed_loss_curve() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (_, whole) = train_tiny(dir.path(), "whole", "");
    assert!(
        whole[15] < whole[0] - 1.0,
        "the uncompressed run must learn: {whole:?}"
    );
    for (name, compression, from_step, tolerance) in [
        ("topk", "topk, ratio = 10%", 275, 0.03),
        ("powersgd", "powersgd, rank = 8", 325, 0.03),
        ("fp8", "fp8", 0, 0.01),
    ] {
        let written = format!("\n  grad_compression = {{ method = {compression} }}");
        let (shown, curve) = train_tiny(dir.path(), name, &written);
        assert!(shown.contains(" on every bucket"), "{shown}");
        println!("{name:8} {curve:.3?}\nwhole    {whole:.3?}");
        for (w, (x, y)) in curve.iter().zip(&whole).enumerate().skip(from_step / 25) {
            assert!(
                (x - y).abs() <= tolerance * y,
                "{name}, steps {}–{}: {x:.3} against {y:.3}",
                25 * w,
                25 * w + 24
            );
        }
    }
}
