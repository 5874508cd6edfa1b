//! Specs and the analytic cost model shared by the planner's tests and benchmark.
#![allow(dead_code)] // each test binary uses part of the shared helpers

pub mod synthetic_model;

use tessel_grammar::{
    ClusterSpec, GpuEfficiency, GpuSpec, Link, MlpKind, ModelSpec, MoeSpec, NormKind, Optimizer,
    PeakCompute, PositionKind, Precision, SearchSpace, Spec, TrainSpec,
};

pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

#[allow(clippy::too_many_arguments)]
pub fn dense_model(
    name: &str,
    layers: u64,
    hidden: u64,
    heads: u64,
    kv_heads: u64,
    ffn_hidden: u64,
    vocab: u64,
    mlp: MlpKind,
) -> ModelSpec {
    ModelSpec {
        name: name.to_string(),
        layers,
        hidden,
        heads,
        kv_heads,
        head_dim: hidden / heads,
        ffn_hidden,
        vocab,
        mlp,
        norm: NormKind::Rmsnorm,
        tie_embeddings: false,
        bias: false,
        max_seq_len: None,
        position: PositionKind::Rope,
        moe: None,
        encoders: Vec::new(),
    }
}

pub fn gpt3_175b() -> ModelSpec {
    dense_model("gpt3_175b", 96, 12288, 96, 96, 49152, 50257, MlpKind::Gelu)
}

pub fn llama3_405b() -> ModelSpec {
    dense_model(
        "llama3_405b",
        126,
        16384,
        128,
        8,
        53248,
        128256,
        MlpKind::Swiglu,
    )
}

pub fn mixtral_8x7b() -> ModelSpec {
    let mut model = dense_model(
        "mixtral_8x7b",
        32,
        4096,
        32,
        8,
        14336,
        32000,
        MlpKind::Swiglu,
    );
    model.moe = Some(MoeSpec {
        experts: 8,
        top_k: 2,
        every: 1,
        expert_ffn_hidden: 14336,
        shared_experts: 0,
        capacity_factor: 1.0,
        first_dense: 0,
    });
    model
}

/// An H100 SXM cluster (figures from NVIDIA's H100 datasheet: 80 GB HBM3, 989 TFLOPS dense
/// BF16, 3.35 TB/s; NVLink 4 at 450 GB/s per direction; one 400 Gb/s NIC per GPU).
pub fn h100_cluster(nodes: u64, gpus_per_node: u64, memory_gib: f64) -> ClusterSpec {
    ClusterSpec {
        name: format!("h100_{}", nodes * gpus_per_node),
        gpu: GpuSpec {
            name: "H100_SXM".to_string(),
            memory: memory_gib * GIB,
            peak: PeakCompute {
                bf16: 989e12,
                fp16: 989e12,
                fp8: 1979e12,
                fp32: 67e12,
                tf32: 494e12,
            },
            hbm_bandwidth: 3.35e12,
            efficiency: GpuEfficiency::default(),
            compute_units: None,
            gemm_tile: None,
        },
        nodes,
        gpus_per_node,
        intra_node: Link {
            bandwidth: 450e9,
            latency: 3e-6,
        },
        inter_node: Link {
            bandwidth: 50e9,
            latency: 10e-6,
        },
        host_link: 55e9,
        host_memory: 2048.0 * GIB,
        calibration: None,
        pools: Vec::new(),
        between_pools: None,
    }
}

pub fn spec(model: ModelSpec, cluster: ClusterSpec, seq_len: u64, global_batch: u64) -> Spec {
    Spec {
        model,
        cluster,
        train: TrainSpec {
            seq_len,
            global_batch,
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
        strategies: Vec::new(),
        search: SearchSpace::default(),
    }
}

/// Every way to put `layers` layers on `stages` stages, at least `least` each (the brute-force
/// tests' splits).
pub fn splits(layers: u64, stages: u64, least: u64) -> Vec<Vec<u64>> {
    if stages == 1 {
        return if layers >= least {
            vec![vec![layers]]
        } else {
            Vec::new()
        };
    }
    let mut all = Vec::new();
    for first in least..=layers.saturating_sub((stages - 1) * least) {
        for mut rest in splits(layers - first, stages - 1, least) {
            rest.insert(0, first);
            all.push(rest);
        }
    }
    all
}
