//! Data-parallel gradient compression in the cost model: on a slow network PowerSGD's buckets
//! go compressed and the step is faster, its error-feedback buffer and factors costing their
//! closed-form bytes; on InfiniBand nothing is compressed and the prediction is unchanged; under
//! ZeRO-1 (a reduce-scatter) nothing is compressed either.

use tessel_grammar::{load_str, CompressionMethod, GradCompression, Offload, Spec, Strategy};
use tessel_symbolic::cost::{Calibration, CostModel, StageCost};

const GPT: &str = r#"
model gpt3_2_7b { layers = 32; hidden = 2560; heads = 32; ffn_hidden = 10240; vocab = 50304
                  mlp = gelu; norm = layernorm; bias = true; position = learned
                  tie_embeddings = true; max_seq_len = 2048 }
cluster ethernet { gpu = A100_80GB; nodes = 4; gpus_per_node = 8
                   intra_node = { bandwidth = 300 GB/s }
                   inter_node = { bandwidth = 12.5 Gb/s, latency = 30 us } }
cluster infiniband { gpu = A100_80GB; nodes = 4; gpus_per_node = 8
                     intra_node = { bandwidth = 300 GB/s }
                     inter_node = { bandwidth = 200 Gb/s } }
train { model = gpt3_2_7b; cluster = ethernet; seq_len = 2048; global_batch = 512 }
"#;

fn spec(cluster: &str, method: Option<CompressionMethod>) -> Spec {
    let text = GPT.replace("cluster = ethernet", &format!("cluster = {cluster}"));
    let mut spec = load_str("compress.tsl", &text).unwrap();
    spec.train.grad_compression = method.map(|method| GradCompression {
        method,
        rank: 4,
        ratio: 0.01,
    });
    spec
}

fn strategy(zero: u8) -> Strategy {
    Strategy {
        name: "dp".into(),
        dp: 32,
        microbatch: 2,
        zero,
        ..Strategy::default()
    }
}

fn stage(spec: &Spec, layers: u64, zero: u8) -> StageCost {
    let model = CostModel::with_calibration(spec, Calibration::default()).unwrap();
    let s = strategy(zero);
    model.stage_cost(&s, 0, layers, s.recompute, Offload::default())
}

fn step(spec: &Spec, zero: u8) -> (f64, bool) {
    let model = CostModel::with_calibration(spec, Calibration::default()).unwrap();
    let e = model.estimate(&strategy(zero)).unwrap();
    let compressed = e.stages[0].compressed.is_some_and(|c| c.layers);
    (e.step_time_s, compressed)
}

/// PowerSGD's rank-4 factors of one GPT-3 2.7B layer on one GPU: `4·(rows + cols)` for the
/// query, key, value and output projections (2560 × 2560) and the two MLP matrices
/// (2560 × 10240 and back): 4·(4·5120 + 2·12800).
const FACTORS_PER_LAYER: f64 = 184_320.0;

#[test]
fn powersgd_compresses_on_a_slow_network_at_its_closed_form_cost() {
    let plain = spec("ethernet", None);
    let powersgd = spec("ethernet", Some(CompressionMethod::Powersgd));
    let (t_plain, _) = step(&plain, 0);
    let (t_powersgd, compressed) = step(&powersgd, 0);
    assert!(compressed);
    assert!(t_powersgd < 0.9 * t_plain, "{t_powersgd} vs {t_plain}");
    // Per layer: the fp32 gradient (4·P), and with PowerSGD also its error (4·P) and factors.
    let per_layer = |s: &Spec| stage(s, 2, 0).memory.gradients - stage(s, 1, 0).memory.gradients;
    let (g_plain, g_powersgd) = (per_layer(&plain), per_layer(&powersgd));
    let want = g_plain + 4.0 * FACTORS_PER_LAYER;
    assert!(
        (g_powersgd - 2.0 * g_plain - 4.0 * FACTORS_PER_LAYER).abs() < 1.0,
        "{g_powersgd} vs {want} + {g_plain}"
    );
}

#[test]
fn nothing_is_compressed_where_sending_whole_is_faster() {
    for method in [
        CompressionMethod::Powersgd,
        CompressionMethod::Topk,
        CompressionMethod::Fp8,
    ] {
        // InfiniBand: the all-reduce hides behind the backward; compressing only adds work.
        let (plain, _) = step(&spec("infiniband", None), 0);
        let (with, compressed) = step(&spec("infiniband", Some(method)), 0);
        assert!(!compressed, "{method:?}");
        assert_eq!(with, plain, "{method:?}");
        // ZeRO-1 reduce-scatters: no compression applies.
        let (plain, _) = step(&spec("ethernet", None), 1);
        let (with, compressed) = step(&spec("ethernet", Some(method)), 1);
        assert!(!compressed, "{method:?}");
        assert_eq!(with, plain, "{method:?}");
    }
}

#[test]
fn top_k_gathers_grow_with_the_ranks() {
    // Top-k's all-gather carries every rank's entries: at 1 % of 32 ranks, 32 % of the
    // gradient's entries with their indices, so it gains less than PowerSGD here.
    let (t_topk, _) = step(&spec("ethernet", Some(CompressionMethod::Topk)), 0);
    let (t_powersgd, _) = step(&spec("ethernet", Some(CompressionMethod::Powersgd)), 0);
    assert!(t_powersgd < t_topk, "{t_powersgd} vs {t_topk}");
}
