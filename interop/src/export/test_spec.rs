//! A small, valid spec for the unit tests of the exporters.

use tessel_grammar::*;

pub(crate) fn llama_like(layers: u64) -> Spec {
    Spec {
        model: ModelSpec {
            name: "tiny".into(),
            layers,
            hidden: 256,
            heads: 8,
            kv_heads: 2,
            head_dim: 32,
            ffn_hidden: 688,
            vocab: 32000,
            mlp: MlpKind::Swiglu,
            norm: NormKind::Rmsnorm,
            tie_embeddings: false,
            bias: false,
            max_seq_len: Some(4096),
            position: PositionKind::Rope,
            moe: None,
            encoders: Vec::new(),
        },
        cluster: ClusterSpec {
            name: "box".into(),
            gpu: GpuSpec {
                name: "H100_SXM".into(),
                memory: 80e9,
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
            },
            nodes: 1,
            gpus_per_node: 8,
            intra_node: Link {
                bandwidth: 450e9,
                latency: 3e-6,
            },
            inter_node: Link {
                bandwidth: 50e9,
                latency: 10e-6,
            },
            host_link: 55e9,
            host_memory: 2e12,
            calibration: None,
            pools: Vec::new(),
            between_pools: None,
        },
        train: TrainSpec {
            seq_len: 2048,
            global_batch: 64,
            precision: Precision::Bf16,
            optimizer: Optimizer::Adam,
            flash_attention: true,
            attention_kernel: None,
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
