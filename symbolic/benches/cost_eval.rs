//! Throughput of the cost model's evaluation, for a GPT-3 175B spec on 1024 A100s: full stage
//! costs (every time and memory output of one pipeline device) per second through the compiled
//! program that `CostModel::stage_cost` runs, against tree evaluation of the same expressions,
//! and whole step predictions (every device's stage cost combined into a step time and a peak
//! memory). `cargo bench -p tessel-symbolic --bench cost_eval` runs it for a few seconds and
//! prints the machine's load average beside the numbers; under `cargo test` it runs a handful
//! of iterations only.

use std::hint::black_box;
use std::time::{Duration, Instant};

use tessel_grammar::{
    ClusterSpec, GpuEfficiency, GpuSpec, Link, MlpKind, ModelSpec, NormKind, Offload, Optimizer,
    PeakCompute, PositionKind, Precision, Recompute, SearchSpace, Spec, Strategy, TrainSpec,
};
use tessel_symbolic::cost::{slot_values, stage_layers, CostModel, Slot, StageCost};
use tessel_symbolic::Expr;

fn spec() -> Spec {
    Spec {
        model: ModelSpec {
            name: "gpt3-175b".into(),
            layers: 96,
            hidden: 12288,
            heads: 96,
            kv_heads: 96,
            head_dim: 128,
            ffn_hidden: 49152,
            vocab: 51200,
            mlp: MlpKind::Gelu,
            norm: NormKind::Layernorm,
            tie_embeddings: true,
            bias: true,
            max_seq_len: Some(2048),
            position: PositionKind::Learned,
            moe: None,
            encoders: Vec::new(),
        },
        cluster: ClusterSpec {
            name: "dgx-a100".into(),
            gpu: GpuSpec {
                name: "A100-SXM4-80GB".into(),
                memory: 80.0 * 1024.0 * 1024.0 * 1024.0,
                peak: PeakCompute {
                    bf16: 312e12,
                    fp16: 312e12,
                    fp8: 0.0,
                    fp32: 19.5e12,
                    tf32: 156e12,
                },
                hbm_bandwidth: 2.039e12,
                efficiency: GpuEfficiency::default(),
                compute_units: None,
                gemm_tile: None,
            },
            nodes: 128,
            gpus_per_node: 8,
            intra_node: Link {
                bandwidth: 300e9,
                latency: 5e-6,
            },
            inter_node: Link {
                bandwidth: 25e9,
                latency: 10e-6,
            },
            host_link: 25e9,
            host_memory: 2e12,
            calibration: None,
            pools: Vec::new(),
            between_pools: None,
        },
        train: TrainSpec {
            seq_len: 2048,
            global_batch: 1536,
            precision: Precision::Bf16,
            optimizer: Optimizer::Adam,
            flash_attention: true,
            attention_kernel: None,
            norm_kernel: None,
            dropout: 0.0,
            framework: Default::default(),
            fp8_scaling: None,
            fused_cross_entropy: None,
            compile: false,
            memory_saving_kernels: tessel_grammar::MemorySavingKernels::Off,
            overlap: None,
            failures: None,
            finetune: None,
            grad_compression: None,
            multimodal: None,
        },
        strategies: vec![],
        search: SearchSpace::default(),
    }
}

fn count_nodes(expr: &Expr) -> usize {
    1 + match expr {
        Expr::Const(_) | Expr::Sym(_) => 0,
        Expr::Sum(items) | Expr::Product(items) | Expr::Max(items) | Expr::Min(items) => {
            items.iter().map(count_nodes).sum()
        }
        Expr::Div(a, b) => count_nodes(a) + count_nodes(b),
        Expr::Ceil(a) => count_nodes(a),
    }
}

fn main() {
    let benchmarking = std::env::args().any(|a| a == "--bench");
    let spec = spec();
    let model = CostModel::new(&spec).expect("the benchmark spec is valid");
    let (slots, outputs) = model.stage_cost_exprs();
    let nodes: usize = outputs.iter().map(count_nodes).sum();
    let strategy = Strategy {
        name: "bench".into(),
        dp: 16,
        tp: 8,
        pp: 8,
        interleave: 2,
        recompute: Recompute::Selective,
        sequence_parallel: true,
        zero: 1,
        ..Strategy::default()
    };
    let values = slot_values(
        &strategy,
        96,
        3,
        12,
        Recompute::Selective,
        Offload::default(),
    );
    let env = |symbol: &tessel_symbolic::Symbol| {
        Slot::index_of(symbol.name()).map_or(f64::NAN, |index| values[index])
    };
    let staged = model.staged_exprs();
    let staged_nodes: usize = staged
        .bindings
        .iter()
        .chain(&staged.outputs)
        .map(count_nodes)
        .sum();
    let budget = if benchmarking {
        Duration::from_secs(3)
    } else {
        Duration::from_millis(50)
    };
    let start = Instant::now();
    let mut evaluations = 0u64;
    let mut sink = 0.0;
    while start.elapsed() < budget {
        for expr in &outputs {
            sink += expr.eval(&env);
        }
        evaluations += 1;
    }
    let per_second = evaluations as f64 / start.elapsed().as_secs_f64();
    black_box(sink);
    let start = Instant::now();
    let mut staged_evaluations = 0u64;
    while start.elapsed() < budget {
        black_box(staged.eval(black_box(&values)));
        staged_evaluations += 1;
    }
    let staged_per_second = staged_evaluations as f64 / start.elapsed().as_secs_f64();
    let start = Instant::now();
    let mut compiled = 0u64;
    while start.elapsed() < budget {
        for _ in 0..1000 {
            black_box(model.stage_cost(
                black_box(&strategy),
                3,
                12,
                Recompute::Selective,
                Offload::default(),
            ));
        }
        compiled += 1000;
    }
    let compiled_per_second = compiled as f64 / start.elapsed().as_secs_f64();
    // A whole step: the cost of each of the pp devices, combined by the pipeline shape, and
    // the peak memory over devices (what the planner evaluates per candidate).
    let layers = stage_layers(&spec, &strategy);
    let shape = model.pipeline_shape(&strategy);
    let mut costs: Vec<StageCost> = Vec::with_capacity(layers.len());
    let start = Instant::now();
    let mut steps = 0u64;
    while start.elapsed() < budget {
        for _ in 0..100 {
            costs.clear();
            for (stage, &count) in layers.iter().enumerate() {
                costs.push(model.stage_cost(
                    black_box(&strategy),
                    stage as u64,
                    count,
                    Recompute::Selective,
                    Offload::default(),
                ));
            }
            let peak = costs.iter().map(|c| c.memory.total()).fold(0.0, f64::max);
            black_box((shape.step_time(&costs), peak));
        }
        steps += 100;
    }
    let steps_per_second = steps as f64 / start.elapsed().as_secs_f64();
    let start = Instant::now();
    let mut estimates = 0u64;
    while start.elapsed() < budget {
        black_box(model.estimate(&strategy).map(|e| e.step_time_s).ok());
        estimates += 1;
    }
    let estimates_per_second = estimates as f64 / start.elapsed().as_secs_f64();
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|_| "unknown".into());
    println!(
        "{} slots, {} outputs, {nodes} expression nodes",
        slots.len(),
        outputs.len()
    );
    println!("stage-cost evaluations, inlined trees: {per_second:.0}/s on one core");
    println!(
        "stage-cost evaluations, {} named intermediates ({staged_nodes} nodes): {staged_per_second:.0}/s",
        staged.bindings.len()
    );
    println!(
        "stage costs through the compiled program ({} instructions in {} runs): {compiled_per_second:.0}/s",
        model.program().map_or(0, |p| p.num_instructions()),
        model.program().map_or(0, |p| p.num_runs())
    );
    println!(
        "whole steps ({} devices' stage costs, step time and peak memory): {steps_per_second:.0}/s",
        layers.len()
    );
    println!("full estimates (8 stages, validation included): {estimates_per_second:.0}/s");
    println!("load average (1, 5, 15 min): {load}");
}
