//! The cost model against closed forms: Korthikanti et al.'s activation memory, state bytes by
//! ZeRO stage, ring collective volumes, the 1F1B step composition, and Megatron's FLOP
//! formulas.

use tessel_grammar::{
    ClusterSpec, Fp8Scaling, Framework, GpuEfficiency, GpuSpec, Link, MlpKind, ModelSpec,
    NormKernel, NormKind, Offload, OverlapSpec, PeakCompute, PositionKind, Precision, Recompute,
    RecomputeModules, SearchSpace, Spec, Strategy, TrainSpec,
};
use tessel_symbolic::cost::{
    render_estimate_json, render_estimate_table, Calibration, ComputeParams, CostError, CostModel,
    GpuGeneration, KernelEfficiency, Output, PipelineShape, StageCost, StrategyOverrides,
};
use tessel_symbolic::primitives::{
    attention_forward_rate, gemm_time, AttentionKernel, AttentionParams, CollectiveParams,
    GemmDevice, GemmParams, COMPOSITE_RMSNORM, EAGER_ELEMENTWISE, EAGER_EXPERT_HOST,
    HBM_STREAM_FRACTION, HOST_ADAM_PARAMS_PER_S,
};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn gpt(layers: u64, hidden: u64, heads: u64) -> ModelSpec {
    ModelSpec {
        name: "gpt".into(),
        layers,
        hidden,
        heads,
        kv_heads: heads,
        head_dim: hidden / heads.max(1),
        ffn_hidden: 4 * hidden,
        vocab: 51200,
        mlp: MlpKind::Gelu,
        norm: NormKind::Layernorm,
        tie_embeddings: true,
        bias: true,
        max_seq_len: Some(2048),
        position: PositionKind::Learned,
        moe: None,
        encoders: Vec::new(),
    }
}

fn selene(nodes: u64) -> ClusterSpec {
    ClusterSpec {
        name: "selene".into(),
        gpu: GpuSpec {
            name: "A100-SXM4-80GB".into(),
            memory: 80.0 * GIB,
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
        nodes,
        gpus_per_node: 8,
        intra_node: Link {
            bandwidth: 300e9,
            latency: 0.0,
        },
        inter_node: Link {
            bandwidth: 25e9,
            latency: 0.0,
        },
        host_link: 25e9,
        host_memory: 1e12,
        calibration: None,
        pools: Vec::new(),
        between_pools: None,
    }
}

fn spec(model: ModelSpec, nodes: u64, global_batch: u64) -> Spec {
    Spec {
        model,
        cluster: selene(nodes),
        train: TrainSpec {
            seq_len: 2048,
            global_batch,
            precision: Precision::Bf16,
            optimizer: tessel_grammar::Optimizer::Adam,
            flash_attention: false,
            attention_kernel: None,
            norm_kernel: None,
            // Korthikanti et al.'s activation formulas count the dropout masks.
            dropout: 0.1,
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

fn strategy(dp: u64, tp: u64, pp: u64, microbatch: u64) -> Strategy {
    Strategy {
        name: "s".into(),
        dp,
        tp,
        pp,
        microbatch,
        ..Strategy::default()
    }
}

/// A calibration without fixed overheads, so memory is exactly the formulas.
fn bare() -> Calibration {
    Calibration {
        outside_allocator_bytes: 0.0,
        fragmentation: 0.0,
        // Collectives without latency: only bytes over bandwidth.
        collectives: CollectiveParams {
            call_latency_s: 0.0,
            intra_step_s: 0.0,
            inter_step_s: 0.0,
            ll_intra_step_s: 0.0,
            ll_inter_step_s: 0.0,
            ..CollectiveParams::default()
        },
        ..Calibration::default()
    }
}

/// Activation bytes of one layer: the difference between a device with two layers and one.
fn layer_activation_bytes(spec: &Spec, s: &Strategy) -> f64 {
    let model = CostModel::with_calibration(spec, bare()).unwrap();
    let one = model.stage_cost(s, 0, 1, s.recompute, Offload::default());
    let two = model.stage_cost(s, 0, 2, s.recompute, Offload::default());
    two.memory.activations - one.memory.activations
}

/// The calibrated kernel fractions of the A100s in `selene`.
fn a100() -> KernelEfficiency {
    KernelEfficiency::for_gpu(&selene(1).gpu)
}

fn close(a: f64, b: f64, tolerance: f64) -> bool {
    (a - b).abs() <= tolerance * b.abs().max(1e-30)
}

#[test]
fn activations_match_korthikanti_closed_forms() {
    let (s, b, h, a) = (2048.0, 1.0, 12288.0, 96.0);
    let sbh = s * b * h;
    let spec = spec(gpt(96, 12288, 96), 8, 64);
    let t = 8.0;

    let no_parallelism = layer_activation_bytes(&spec, &strategy(64, 1, 1, 1));
    assert!(close(no_parallelism, sbh * (34.0 + 5.0 * a * s / h), 1e-12));

    let tensor = layer_activation_bytes(&spec, &strategy(8, 8, 1, 1));
    let expected = sbh * (10.0 + 24.0 / t + 5.0 * a * s / (h * t));
    assert!(close(tensor, expected, 1e-12), "{tensor} vs {expected}");

    let mut sp = strategy(8, 8, 1, 1);
    sp.sequence_parallel = true;
    let tensor_sequence = layer_activation_bytes(&spec, &sp);
    assert!(close(
        tensor_sequence,
        sbh / t * (34.0 + 5.0 * a * s / h),
        1e-12
    ));

    sp.recompute = Recompute::Selective;
    let selective = layer_activation_bytes(&spec, &sp);
    assert!(close(selective, 34.0 * sbh / t, 1e-12));

    let mut full = strategy(8, 8, 1, 1);
    full.recompute = Recompute::Full;
    assert!(close(
        layer_activation_bytes(&spec, &full),
        2.0 * sbh,
        1e-12
    ));
}

#[test]
fn flash_attention_removes_the_quadratic_term() {
    let mut spec = spec(gpt(96, 12288, 96), 8, 64);
    spec.train.flash_attention = true;
    let (s, h, a) = (2048.0, 12288.0, 96.0);
    let bytes = layer_activation_bytes(&spec, &strategy(64, 1, 1, 1));
    // 34·sbh plus the fp32 log-sum-exp per row and head (4·a·s·b bytes).
    assert!(close(bytes, s * h * 34.0 + 4.0 * a * s, 1e-12));
}

/// A small GPT without biases whose every block after `first_dense` has 8 experts, top-2.
fn small_moe(layers: u64, first_dense: u64) -> ModelSpec {
    let mut model = gpt(layers, 1024, 8);
    model.bias = false;
    model.moe = Some(tessel_grammar::MoeSpec {
        experts: 8,
        top_k: 2,
        every: 1,
        expert_ffn_hidden: 4096,
        shared_experts: 0,
        capacity_factor: 1.0,
        first_dense,
    });
    model
}

#[test]
fn dropout_keeps_two_masks_and_the_score_dropout() {
    let (s, h, a) = (2048.0, 12288.0, 96.0);
    let mut without = spec(gpt(96, 12288, 96), 8, 64);
    without.train.dropout = 0.0;
    let strategy = strategy(64, 1, 1, 1);
    // Korthikanti's 34 less the two 1-byte masks; scores: softmax output only (2 of 5).
    let bytes = layer_activation_bytes(&without, &strategy);
    assert!(close(bytes, s * h * (32.0 + 2.0 * a * s / h), 1e-12));
    without.train.flash_attention = true;
    let with_flash = layer_activation_bytes(&without, &strategy);
    assert!(close(with_flash, s * h * 32.0 + 4.0 * a * s, 1e-12));
}

/// Gradient bytes of one layer on a middle stage (the difference between two layers and one).
fn layer_gradient_bytes(spec: &Spec, s: &Strategy) -> f64 {
    let model = CostModel::with_calibration(spec, bare()).unwrap();
    let one = model.stage_cost(s, 1, 1, s.recompute, Offload::default());
    let two = model.stage_cost(s, 1, 2, s.recompute, Offload::default());
    two.memory.gradients - one.memory.gradients
}

#[test]
fn deepspeed_keeps_half_gradients_beside_an_fp32_buffer() {
    let h = 4096.0;
    let layer_params = 12.0 * h * h + 13.0 * h;
    let mut s = strategy(8, 1, 2, 1);
    s.zero = 1;
    let mut megatron = spec(gpt(8, 4096, 32), 2, 64);
    let mut deepspeed = megatron.clone();
    deepspeed.train.framework = Framework::Deepspeed;
    // bf16: Megatron's fp32 main gradients; DeepSpeed's bf16 gradients and its bf16
    // optimizer's full-size fp32 accumulation buffer.
    assert!(close(
        layer_gradient_bytes(&megatron, &s),
        4.0 * layer_params,
        1e-12
    ));
    assert!(close(
        layer_gradient_bytes(&deepspeed, &s),
        6.0 * layer_params,
        1e-12
    ));
    // fp16 with ZeRO-1: DeepSpeed's fp32 gradients are those of the rank's partition only.
    megatron.train.precision = Precision::Fp16;
    deepspeed.train.precision = Precision::Fp16;
    assert!(close(
        layer_gradient_bytes(&megatron, &s),
        2.0 * layer_params,
        1e-12
    ));
    let expected = (2.0 + 4.0 / 8.0) * layer_params;
    assert!(close(layer_gradient_bytes(&deepspeed, &s), expected, 1e-12));
    // ZeRO-2 shards the half-precision gradients too.
    s.zero = 2;
    let expected = (2.0 + 4.0) / 8.0 * layer_params;
    assert!(close(layer_gradient_bytes(&deepspeed, &s), expected, 1e-12));
    // bf16 under ZeRO-2 and 3 runs DeepSpeed's ZeRO optimizers, not its full-buffer
    // BF16_Optimizer: both copies are the rank's partition.
    deepspeed.train.precision = Precision::Bf16;
    for zero in [2, 3] {
        s.zero = zero;
        let expected = (2.0 + 4.0) / 8.0 * layer_params;
        assert!(close(layer_gradient_bytes(&deepspeed, &s), expected, 1e-12));
    }
}

#[test]
fn deepspeed_fp16_zero_keeps_two_buckets() {
    let buffers = |framework: Framework, precision: Precision, zero: u8| {
        let mut spec = spec(gpt(8, 4096, 32), 2, 64);
        spec.train.framework = framework;
        spec.train.precision = precision;
        let model = CostModel::with_calibration(&spec, bare()).unwrap();
        let mut s = strategy(8, 1, 2, 1);
        s.zero = zero;
        model
            .stage_cost(&s, 0, 4, Recompute::None, Offload::default())
            .memory
            .buffers
    };
    let megatron = buffers(Framework::Megatron, Precision::Fp16, 1);
    let deepspeed = buffers(Framework::Deepspeed, Precision::Fp16, 1);
    // reduce_bucket_size and allgather_bucket_size, 5e8 fp16 elements each.
    assert!(close(deepspeed - megatron, 2.0 * 5e8 * 2.0, 1e-9));
    assert_eq!(buffers(Framework::Deepspeed, Precision::Fp16, 0), megatron);
    assert_eq!(
        buffers(Framework::Deepspeed, Precision::Bf16, 1),
        buffers(Framework::Megatron, Precision::Bf16, 1)
    );
}

#[test]
fn deepspeed_pipeline_splits_activations_over_tp_and_blocks() {
    let (s, h, t) = (2048.0, 12288.0, 8.0);
    let pp_seconds = |framework: Framework| {
        let mut spec = spec(gpt(96, 12288, 96), 64, 64);
        spec.train.framework = framework;
        let model = CostModel::with_calibration(&spec, bare()).unwrap();
        let out = model.stage_outputs(
            &strategy(8, 8, 8, 1),
            3,
            12,
            Recompute::None,
            Offload::default(),
        );
        out[Output::PpComm.index()]
    };
    // Stages are a node apart: the inter-node link at its NCCL efficiency, no latency here.
    let per_byte = 1.0 / (25e9 * CollectiveParams::default().inter_efficiency);
    let activation = s * h * 2.0;
    // Megatron: the 1/t slice, send paired with receive (2 transfers).
    let megatron = pp_seconds(Framework::Megatron);
    assert!(close(megatron, 2.0 * activation / t * per_byte, 1e-12));
    // DeepSpeed: the 1/t slice as well, in four blocking transfers.
    let deepspeed = pp_seconds(Framework::Deepspeed);
    assert!(close(deepspeed, 4.0 * activation / t * per_byte, 1e-12));
}

#[test]
fn deepspeed_kernels_run_at_their_calibrated_fraction() {
    let compute = |framework: Framework| {
        let mut spec = spec(gpt(8, 4096, 32), 1, 64);
        spec.train.framework = framework;
        // The same memory-bound fraction under every stack (eager FSDP's is its own test).
        spec.cluster.gpu.efficiency.memory = Some(a100().memory);
        let cal = Calibration {
            deepspeed_kernels: 0.8,
            layer_overhead_s: 0.0,
            ..bare()
        };
        let model = CostModel::with_calibration(&spec, cal).unwrap();
        let out = model.stage_outputs(
            &strategy(8, 1, 1, 1),
            0,
            8,
            Recompute::None,
            Offload::default(),
        );
        out[Output::Compute.index()]
    };
    let megatron = compute(Framework::Megatron);
    // Every kernel's rate at 0.8 of Megatron-LM's; the GEMMs' fixed launch cost (a few µs
    // each, under 2 % here) is the same under any software.
    let ratio = compute(Framework::Deepspeed) / megatron;
    assert!(ratio < 1.0 / 0.8 && ratio > 1.0 / 0.8 - 0.02, "{ratio}");
    assert!(close(compute(Framework::Fsdp), megatron, 1e-12));
}

#[test]
fn key_value_heads_are_replicated_past_tensor_parallelism() {
    let mut model = gpt(4, 4096, 32);
    model.kv_heads = 2;
    model.bias = false;
    let (h, q, kv) = (4096.0, 4096.0, 2.0 * 128.0);
    let spec = spec(model, 1, 64);
    let cost = CostModel::with_calibration(&spec, bare()).unwrap();
    let layer_weights = |tp: u64| {
        let s = strategy(8 / tp, tp, 1, 1);
        let one = cost.stage_cost(&s, 1, 1, Recompute::None, Offload::default());
        let two = cost.stage_cost(&s, 1, 2, Recompute::None, Offload::default());
        (two.memory.weights - one.memory.weights) / 2.0
    };
    // Query/output and the MLP split over tp; the two key/value heads over at most two ranks.
    let expected = |t: f64, kv_ranks: f64| {
        2.0 * h * q / t + 2.0 * h * kv / kv_ranks + 2.0 * h * 4.0 * h / t + 2.0 * 2.0 * h
    };
    assert!(close(layer_weights(2), expected(2.0, 2.0), 1e-12));
    assert!(close(layer_weights(8), expected(8.0, 2.0), 1e-12));
}

#[test]
fn expert_states_shard_over_the_expert_data_parallel_group() {
    let mut model = small_moe(2, 0);
    model.tie_embeddings = false;
    let spec = spec(model, 1, 64);
    let cost = CostModel::with_calibration(&spec, bare()).unwrap();
    let optimizer = |ep: u64| {
        let mut s = strategy(8, 1, 2, 1);
        s.pp = 1;
        s.ep = ep;
        s.zero = 1;
        let one = cost.stage_cost(&s, 1, 1, Recompute::None, Offload::default());
        let two = cost.stage_cost(&s, 1, 2, Recompute::None, Offload::default());
        two.memory.optimizer - one.memory.optimizer
    };
    let experts = 8.0 * 2.0 * 1024.0 * 4096.0;
    let dense = 4.0 * 1024.0 * 1024.0 + 2.0 * 2.0 * 1024.0 + 8.0 * 1024.0;
    // 12 bytes per parameter: dense over the 8 data-parallel ranks, each expert over the
    // 8/ep ranks that hold it.
    for ep in [1, 2, 8] {
        let per_gpu = experts / ep as f64;
        let expected = 12.0 * (dense / 8.0 + per_gpu / (8.0 / ep as f64));
        assert!(close(optimizer(ep), expected, 1e-9), "ep {ep}");
    }
}

#[test]
fn the_dense_first_layers_are_the_first_stage_s() {
    let weights = |first_dense: u64, stage: u64| {
        let spec = spec(small_moe(4, first_dense), 1, 64);
        let cost = CostModel::with_calibration(&spec, bare()).unwrap();
        let s = strategy(4, 1, 2, 1);
        cost.stage_cost(&s, stage, 2, Recompute::None, Offload::default())
            .memory
            .weights
    };
    // Layers 2 and 3 carry experts either way: the second stage does not see the dense layer.
    assert_eq!(weights(1, 1), weights(0, 1));
    // The first stage trades one expert block for a dense one.
    let model = small_moe(4, 1);
    let moe = model.moe.as_ref().unwrap();
    let experts = (moe.experts * model.mlp_matmul_params(moe.expert_ffn_hidden)) as f64;
    let router = (model.hidden * moe.experts) as f64;
    let dense = model.mlp_matmul_params(model.ffn_hidden) as f64;
    let saved = 2.0 * (experts + router - dense);
    assert!(close(weights(0, 0) - weights(1, 0), saved, 1e-9));
}

#[test]
fn state_bytes_by_zero_stage() {
    let model = gpt(24, 2048, 16);
    let params = model.parameter_count().total as f64;
    let spec = spec(model, 2, 64);
    let cost = CostModel::with_calibration(&spec, bare()).unwrap();
    let n = 16.0;
    let expected = [
        (0, 2.0, 4.0, 12.0),
        (1, 2.0, 4.0, 12.0 / n),
        (2, 2.0, 4.0 / n, 12.0 / n),
        (3, 4.0 / n, 4.0 / n, 8.0 / n),
    ];
    for (zero, weights, grads, optimizer) in expected {
        let mut s = strategy(16, 1, 1, 1);
        s.zero = zero;
        let stage = cost.stage_cost(&s, 0, 24, Recompute::None, Offload::default());
        let m = stage.memory;
        assert!(
            close(m.weights, weights * params, 1e-9),
            "zero {zero} weights"
        );
        assert!(
            close(m.gradients, grads * params, 1e-9),
            "zero {zero} grads"
        );
        assert!(
            close(m.optimizer, optimizer * params, 1e-9),
            "zero {zero} opt"
        );
    }
}

#[test]
fn tensor_parallel_ring_volume() {
    // One node, 8-way tp, no latency: 4 all-reduces per layer (2 forward, 2 backward) of
    // b·s·h bf16 activations, each moving 2(n−1)/n of the buffer at the NCCL efficiency.
    let spec = spec(gpt(4, 4096, 32), 1, 8);
    let cal = bare();
    let model = CostModel::with_calibration(&spec, cal).unwrap();
    let s = strategy(1, 8, 1, 1);
    let est = model.estimate(&s).unwrap();
    let bytes = 2048.0 * 4096.0 * 2.0;
    let per_collective = 2.0 * 7.0 / 8.0 * bytes / (300e9 * cal.collectives.intra_efficiency);
    let m = 8.0;
    let expected = m * 4.0 * 4.0 * per_collective;
    assert!(close(est.time.tp_comm, expected, 1e-9));

    // Full recompute repeats the forward's two all-reduces.
    let mut full = s.clone();
    full.recompute = Recompute::Full;
    let est = model.estimate(&full).unwrap();
    assert!(close(
        est.time.tp_comm,
        m * 4.0 * 6.0 * per_collective,
        1e-9
    ));
}

#[test]
fn data_parallel_all_reduce_volume_across_nodes() {
    // 16-way dp over two nodes. A ring runs 8 channels, one NIC each, and moves 2(n−1)/n of
    // the fp32 gradients at 8 × the per-GPU inter-node bandwidth; NCCL's tree moves half that
    // through the NICs but twice the buffer through each GPU's NVLink, and is the faster here.
    let model_spec = gpt(2, 1024, 16);
    let params = model_spec.parameter_count().total as f64;
    let mut spec = spec(model_spec, 2, 16);
    let cal = bare();
    let nics = 8.0 * 25e9 * cal.collectives.inter_efficiency;
    let nvlink = 300e9 * cal.collectives.intra_efficiency;
    let gradients = 4.0 * params;
    let ring = 2.0 * 15.0 / 16.0 * gradients / nics.min(nvlink);
    let expected = (gradients / nics).max(2.0 * gradients / nvlink);
    assert!(expected < ring, "{expected} vs {ring}");
    let dp_comm = |spec: &Spec| {
        let model = CostModel::with_calibration(spec, cal).unwrap();
        model.estimate(&strategy(16, 1, 1, 1)).unwrap().time.dp_comm
    };
    // Overlapped (Megatron-Core's default): what exceeds the last backward, never less than
    // the last of the 40M-parameter buckets.
    let buckets = (params / 40e6).ceil();
    let overlapped = dp_comm(&spec);
    assert!(
        overlapped <= expected * (1.0 + 1e-9),
        "{overlapped} vs {expected}"
    );
    assert!(overlapped >= expected / buckets * (1.0 - 1e-9));
    // Without overlap, all of it, in one call.
    spec.train.overlap = Some(OverlapSpec {
        grad_reduce: Some(false),
        param_gather: None,
        tp_comm: None,
    });
    assert!(close(dp_comm(&spec), expected, 1e-9));
}

#[test]
fn one_f_one_b_step_composition() {
    let shape = PipelineShape {
        sum_weight: 1.0,
        max_weight: 7.0,
    };
    let stage = |microbatch_s: f64, tail_s: f64| StageCost {
        microbatch_s,
        tail_s,
        ..StageCost::default()
    };
    // Uniform stages: (m + p − 1) slots of the stage time plus the largest tail.
    let uniform = [
        stage(1.0, 0.1),
        stage(1.0, 0.3),
        stage(1.0, 0.2),
        stage(1.0, 0.1),
    ];
    assert!(close(
        shape.step_time(&uniform),
        (8.0 + 4.0 - 1.0) + 0.3,
        1e-12
    ));
    // One slow stage dominates the steady state.
    let uneven = [
        stage(1.0, 0.0),
        stage(2.0, 0.0),
        stage(1.0, 0.0),
        stage(1.0, 0.0),
    ];
    assert!(close(shape.step_time(&uneven), 5.0 + 7.0 * 2.0, 1e-12));
}

#[test]
fn estimate_is_consistent_with_stage_costs_and_shape() {
    let spec = spec(gpt(96, 12288, 96), 8, 64);
    let model = CostModel::new(&spec).unwrap();
    let mut s = strategy(1, 8, 8, 1);
    s.interleave = 3;
    s.sequence_parallel = true;
    s.recompute = Recompute::Selective;
    let shape = model.pipeline_shape(&s);
    assert!(close(shape.sum_weight, 1.0 / 3.0, 1e-12));
    assert!(close(shape.max_weight, 64.0 - 1.0 / 3.0, 1e-12));
    let est = model.estimate(&s).unwrap();
    let stages: Vec<StageCost> = est
        .stages
        .iter()
        .map(|st| model.stage_cost(&s, st.stage, st.layers, s.recompute, s.offload))
        .collect();
    assert!(close(est.step_time_s, shape.step_time(&stages), 1e-12));
    assert!(close(est.time.total(), est.step_time_s, 1e-9));
    for stage in &est.stages {
        assert!(close(stage.time.total(), est.step_time_s, 1e-9));
    }
}

#[test]
fn flops_follow_megatron_formulas() {
    // GPT-3 175B on 64 A100s (Korthikanti's configuration).
    let spec = spec(gpt(96, 12288, 96), 8, 64);
    let model = CostModel::new(&spec).unwrap();
    let (b, l, s, h, v) = (64.0, 96.0, 2048.0, 12288.0, 51200.0);
    let model_flops = 72.0 * b * l * s * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * h * l));
    let full_flops = 96.0 * b * l * s * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * h * l));
    let selective_flops = 72.0 * b * l * s * h * h * (1.0 + s / (3.0 * h) + v / (12.0 * h * l));
    for (recompute, hardware) in [
        (Recompute::Full, full_flops),
        (Recompute::Selective, selective_flops),
        (Recompute::None, model_flops),
    ] {
        let mut st = strategy(1, 8, 8, 1);
        st.recompute = recompute;
        let est = model.estimate(&st).unwrap();
        let per_gpu = |flops: f64| flops / est.step_time_s / 64.0;
        // Megatron's formula leaves out biases and norms: 0.03 % here.
        assert!(close(
            est.model_tflops_per_gpu * 1e12,
            per_gpu(model_flops),
            5e-4
        ));
        assert!(
            close(est.hardware_tflops_per_gpu * 1e12, per_gpu(hardware), 5e-4),
            "{recompute:?}: {} vs {}",
            est.hardware_tflops_per_gpu * 1e12,
            per_gpu(hardware)
        );
        assert!(close(est.mfu, per_gpu(model_flops) / 312e12, 5e-4));
    }
}

#[test]
fn korthikanti_175b_mfu_is_close_to_published() {
    // Table 5 / README: 175B, tp 8, pp 8, interleave 3, selective + sp: MFU 51.4 %.
    let mut spec = spec(gpt(96, 12288, 96), 8, 64);
    spec.cluster.intra_node.latency = 5e-6;
    spec.cluster.inter_node.latency = 10e-6;
    let model = CostModel::new(&spec).unwrap();
    let mut s = strategy(1, 8, 8, 1);
    s.interleave = 3;
    s.sequence_parallel = true;
    s.recompute = Recompute::Selective;
    let est = model.estimate(&s).unwrap();
    assert!((est.mfu - 0.514).abs() < 0.03, "mfu {}", est.mfu);
    assert!(est.fits);
}

#[test]
fn invalid_inputs_are_errors_not_panics() {
    let base = spec(gpt(96, 12288, 96), 8, 64);
    let mut fp8 = base.clone();
    fp8.train.precision = Precision::Fp8;
    assert!(matches!(
        CostModel::new(&fp8),
        Err(CostError::InvalidSpec { .. })
    ));
    let model = CostModel::new(&base).unwrap();
    let cases = [
        strategy(2, 8, 8, 1),  // 128 ≠ 64 GPUs
        strategy(1, 8, 8, 3),  // 64 sequences not divisible by 3
        strategy(1, 64, 1, 1), // 96 heads not divisible by 64
        strategy(1, 1, 64, 1), // ok shapes but 96 layers cannot fill... fine: 64 ≤ 96
        strategy(0, 8, 8, 1),
    ];
    let results: Vec<bool> = cases.iter().map(|s| model.estimate(s).is_err()).collect();
    assert_eq!(results, vec![true, true, true, false, true]);
    let mut interleaved = strategy(1, 8, 8, 1);
    interleaved.interleave = 13; // 8·13 = 104 chunks > 96 layers
    let err = model.estimate(&interleaved).unwrap_err();
    assert!(err.to_string().contains("96 layers"), "{err}");
    let mut staged = strategy(1, 8, 8, 1);
    staged.stages = Some(vec![12; 7]);
    assert!(model.estimate(&staged).is_err());
    let mut zeros = base.clone();
    zeros.model.hidden = 0;
    assert!(CostModel::new(&zeros).is_err());
}

#[test]
fn renderings_are_deterministic() {
    let spec = spec(gpt(24, 2048, 16), 1, 64);
    let model = CostModel::new(&spec).unwrap();
    let s = strategy(8, 1, 1, 8);
    let est = model.estimate(&s).unwrap();
    let json = render_estimate_json(&est);
    assert_eq!(json, render_estimate_json(&model.estimate(&s).unwrap()));
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(value["stages"].as_array().map(Vec::len), Some(1));
    let table = render_estimate_table(&spec, &s, &est);
    assert!(table.contains("step time"));
    assert!(table.contains("MFU"));
    assert_eq!(table, render_estimate_table(&spec, &s, &est));
}

#[test]
fn overrides_rebuild_dp() {
    let s = strategy(8, 1, 1, 1);
    let over = StrategyOverrides {
        tp: Some(2),
        ..Default::default()
    };
    assert_eq!(over.apply(&s, 8).dp, 4);
}

fn llama405b() -> ModelSpec {
    ModelSpec {
        name: "llama3-405b".into(),
        layers: 126,
        hidden: 16384,
        heads: 128,
        kv_heads: 8,
        head_dim: 128,
        ffn_hidden: 53248,
        vocab: 128256,
        mlp: MlpKind::Swiglu,
        norm: NormKind::Rmsnorm,
        tie_embeddings: false,
        bias: false,
        max_seq_len: None,
        position: PositionKind::Rope,
        moe: None,
        encoders: Vec::new(),
    }
}

#[test]
fn llama405b_on_sixteen_interleaved_stages() {
    let mut spec = spec(llama405b(), 256, 2048);
    spec.train.seq_len = 8192;
    spec.train.flash_attention = true;
    let model = CostModel::new(&spec).unwrap();
    let mut s = strategy(16, 8, 16, 1);
    s.interleave = 4;
    s.sequence_parallel = true;
    s.zero = 1;
    s.recompute = Recompute::Full;
    let est = model.estimate(&s).unwrap();
    let layers: Vec<u64> = est.stages.iter().map(|st| st.layers).collect();
    assert_eq!(layers.iter().sum::<u64>(), 126);
    assert_eq!(layers.len(), 16);
    // 64 chunks of 1–2 layers: the end devices hold the fewest.
    assert!(layers[0] <= layers[1] && layers[15] <= layers[14]);
    assert!(est.mfu > 0.2 && est.mfu < 0.7, "mfu {}", est.mfu);
    assert!(est.time.bubble > 0.0);
}

#[test]
fn mixture_of_experts_with_expert_parallelism() {
    let mut model = llama405b();
    model.name = "mixtral".into();
    model.layers = 32;
    model.hidden = 4096;
    model.heads = 32;
    model.head_dim = 128;
    model.ffn_hidden = 14336;
    model.vocab = 32000;
    model.moe = Some(tessel_grammar::MoeSpec {
        experts: 8,
        top_k: 2,
        every: 1,
        expert_ffn_hidden: 14336,
        shared_experts: 0,
        capacity_factor: 1.0,
        first_dense: 0,
    });
    let mut spec = spec(model, 8, 256);
    spec.train.seq_len = 4096;
    spec.train.flash_attention = true;
    let cost = CostModel::new(&spec).unwrap();
    let mut s = strategy(16, 2, 2, 1);
    s.ep = 8;
    s.zero = 1;
    s.sequence_parallel = true;
    let with_ep = cost.estimate(&s).unwrap();
    assert!(with_ep.time.ep_comm > 0.0);
    s.ep = 1;
    let without = cost.estimate(&s).unwrap();
    assert_eq!(without.time.ep_comm, 0.0);
    // Expert parallelism shards the experts: less weight memory per GPU.
    assert!(with_ep.stages[0].memory.weights < without.stages[0].memory.weights / 2.0);
    s.ep = 3;
    assert!(cost.estimate(&s).is_err());
}

#[test]
fn cost_model_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<CostModel>();
}

#[test]
fn huge_degrees_are_rejected_without_overflow() {
    let spec = spec(gpt(96, 12288, 96), 8, 64);
    let model = CostModel::new(&spec).unwrap();
    let mut s = strategy(u64::MAX, u64::MAX, u64::MAX, u64::MAX);
    s.interleave = u64::MAX;
    s.ep = u64::MAX;
    assert!(model.estimate(&s).is_err());
    assert_eq!(
        tessel_symbolic::cost::spread_layers(10, u64::MAX, 2).len() as u64,
        10
    );
}

#[test]
fn named_intermediates_evaluate_like_the_inlined_expressions() {
    let spec = spec(gpt(96, 12288, 96), 8, 64);
    let model = CostModel::new(&spec).unwrap();
    let (slots, inlined) = model.stage_cost_exprs();
    assert_eq!(slots.len(), tessel_symbolic::cost::Slot::ALL.len());
    for (zero, recompute, stage) in [
        (0, Recompute::Full, 0),
        (1, Recompute::Selective, 3),
        (3, Recompute::Partial { full_layers: 2 }, 7),
    ] {
        let mut s = strategy(1, 8, 8, 1);
        s.zero = zero;
        s.interleave = 2;
        let values = tessel_symbolic::cost::slot_values(&s, 64, stage, 12, recompute, s.offload);
        let env = |symbol: &tessel_symbolic::Symbol| {
            let index = slots.iter().position(|slot| slot == symbol).unwrap();
            values[index]
        };
        let direct: Vec<f64> = inlined.iter().map(|expr| expr.eval(&env)).collect();
        let staged = model.stage_outputs(&s, stage, 12, recompute, s.offload);
        for (a, b) in direct.iter().zip(&staged) {
            assert!(close(*a, *b, 1e-12), "{a} vs {b}");
        }
    }
}

/// Per-layer activation bytes held by pipeline device `stage` (the in-flight micro-batches
/// times one layer's activations).
fn held_per_layer(model: &CostModel, s: &Strategy, stage: u64) -> f64 {
    let one = model.stage_cost(s, stage, 1, s.recompute, Offload::default());
    let two = model.stage_cost(s, stage, 2, s.recompute, Offload::default());
    two.memory.activations - one.memory.activations
}

#[test]
fn in_flight_micro_batches_under_1f1b_and_interleaving() {
    let spec = spec(gpt(96, 12288, 96), 8, 64);
    let model = CostModel::with_calibration(&spec, bare()).unwrap();
    let plain = strategy(1, 8, 8, 1);
    let first = held_per_layer(&model, &plain, 0);
    // Stage i of p holds min(p − i, m) micro-batches.
    assert!(close(
        held_per_layer(&model, &plain, 3),
        first * 5.0 / 8.0,
        1e-12
    ));
    assert!(close(held_per_layer(&model, &plain, 7), first / 8.0, 1e-12));
    // Interleaving multiplies the first stage's by 1 + (p − 1)/(p·v) (Korthikanti et al.).
    let mut interleaved = plain.clone();
    interleaved.interleave = 3;
    let factor = 1.0 + 7.0 / (8.0 * 3.0);
    assert!(close(
        held_per_layer(&model, &interleaved, 0),
        first * factor,
        1e-12
    ));
    // Fewer micro-batches than stages cap what is in flight.
    let few = spec_with_batch(4);
    let model = CostModel::with_calibration(&few, bare()).unwrap();
    let per_layer = held_per_layer(&model, &plain, 0);
    assert!(close(per_layer, first * 4.0 / 8.0, 1e-12));
}

fn spec_with_batch(global_batch: u64) -> Spec {
    spec(gpt(96, 12288, 96), 8, global_batch)
}

/// A small deterministic generator (64-bit LCG) for input sweeps.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    fn pick(&mut self, choices: &[u64]) -> u64 {
        choices[(self.next() as usize) % choices.len()]
    }
}

#[test]
fn arbitrary_inputs_never_panic() {
    let mut rng = Lcg(7);
    let degrees = [0, 1, 1, 1, 2, 2, 4, 8, 8, 16, u64::MAX];
    let (mut models, mut estimates) = (0, 0);
    for _ in 0..20_000 {
        let heads = rng.pick(&[0, 1, 8, 8, 96, 96]);
        let hidden = rng.pick(&[0, 1024, 12288, 12288]);
        let mut model = gpt(rng.pick(&[0, 1, 2, 7, 96, 96]), hidden, heads);
        if rng.pick(&[0, 1, 2, 3]) == 0 {
            model.kv_heads = rng.pick(&[0, 1, 8]);
            model.head_dim = rng.pick(&[0, 64, 128]);
        }
        if rng.pick(&[0, 1, 2]) == 0 {
            model.moe = Some(tessel_grammar::MoeSpec {
                experts: rng.pick(&[0, 1, 8, 8]),
                top_k: rng.pick(&[0, 1, 2, 2, 9]),
                every: rng.pick(&[0, 1, 1, 2]),
                expert_ffn_hidden: rng.pick(&[0, 1024, 1024]),
                shared_experts: rng.pick(&[0, 1]),
                capacity_factor: [f64::NAN, 0.0, 1.25, 1.25][rng.pick(&[0, 1, 2, 3]) as usize],
                first_dense: rng.pick(&[0, 0, 1, 200]),
            });
        }
        let nodes = rng.pick(&[0, 1, 8, 8, 64]);
        let mut spec = spec(model, nodes, rng.pick(&[0, 1, 64, 1536, 1536]));
        spec.train.seq_len = rng.pick(&[0, 1, 2048, 2048, 2048]);
        spec.train.flash_attention = rng.pick(&[0, 1]) == 1;
        spec.train.compile = rng.pick(&[0, 1]) == 1;
        spec.train.framework = Framework::ALL[rng.pick(&[0, 1, 2, 3]) as usize];
        spec.search.memory_limit = [0.95, 0.95, f64::NAN, -1.0][rng.pick(&[0, 1, 2, 3]) as usize];
        let Ok(cost) = CostModel::new(&spec) else {
            continue;
        };
        models += 1;
        let (tp, pp, cp) = (rng.pick(&degrees), rng.pick(&degrees), rng.pick(&degrees));
        let gpus = spec.cluster.total_gpus();
        let model_parallel = tp.saturating_mul(pp).saturating_mul(cp).max(1);
        let dp = if rng.pick(&[0, 1, 2]) > 0 {
            gpus / model_parallel
        } else {
            rng.pick(&degrees)
        };
        let mut s = strategy(dp, tp, pp, rng.pick(&[0, 1, 1, 2, 3]));
        s.cp = cp;
        s.ep = rng.pick(&[1, 1, 1, 2, 8, 0]);
        s.interleave = rng.pick(&[1, 1, 1, 2, 3, 0, u64::MAX]);
        s.sequence_parallel = rng.pick(&[0, 1]) == 1;
        s.zero = rng.pick(&[0, 1, 2, 3, 4]) as u8;
        s.recompute = [
            Recompute::None,
            Recompute::Selective,
            Recompute::Full,
            Recompute::Partial { full_layers: 3 },
        ][rng.pick(&[0, 1, 2, 3]) as usize];
        s.offload.weights =
            [0.0, 0.0, 0.0, 0.0, 0.5, 2.0, f64::NAN][rng.pick(&[0, 1, 2, 3, 4, 5, 6]) as usize];
        if rng.pick(&[0, 1, 2, 3]) == 0 {
            s.stages = Some(vec![rng.pick(&[0, 1, 48]); rng.pick(&[0, 1, 2]) as usize]);
        }
        if let Ok(est) = cost.estimate(&s) {
            estimates += 1;
            assert!(est.step_time_s.is_finite() && est.step_time_s > 0.0);
            assert!(est.peak_memory_gib.is_finite() && est.peak_memory_gib > 0.0);
            let _ = render_estimate_table(&spec, &s, &est);
            let _ = render_estimate_json(&est);
        }
        let _ = cost.stage_cost(
            &s,
            rng.pick(&degrees),
            rng.pick(&degrees),
            s.recompute,
            s.offload,
        );
        let _ = cost.pipeline_shape(&s);
    }
    // The sweep reaches valid models and valid strategies, not only rejections.
    assert!(
        models > 1000 && estimates > 5,
        "{models} models, {estimates} estimates"
    );
}

/// The PyTorch-native stacks run their memory-bound passes as eager kernels, at the measured
/// eager fraction on every generation, unless compiled; the fused stacks keep the generation's
/// fraction, and a fraction the spec gives is kept.
#[test]
fn eager_stacks_run_memory_bound_passes_at_the_eager_fraction() {
    let memory = |framework: Framework, compile: bool, given: Option<f64>| {
        let mut spec = spec(gpt(8, 4096, 32), 1, 64);
        spec.train.framework = framework;
        spec.train.compile = compile;
        spec.cluster.gpu.efficiency.memory = given;
        KernelEfficiency::for_gpu(&spec.cluster.gpu)
            .for_training(&spec.train, &bare())
            .memory
    };
    let fused = a100().memory;
    assert!(fused > EAGER_ELEMENTWISE);
    assert_eq!(memory(Framework::Fsdp, false, None), EAGER_ELEMENTWISE);
    assert_eq!(memory(Framework::Fsdp, true, None), fused);
    assert_eq!(memory(Framework::Megatron, false, None), fused);
    assert_eq!(memory(Framework::Tessel, false, None), fused);
    assert_eq!(memory(Framework::Fsdp, false, Some(0.6)), 0.6);
}

/// An eager stack's RMSNorm runs as float32 operators (torchtitan's and Hugging Face's Llama)
/// at their measured fraction unless the spec says its norms are fused; a LayerNorm and every
/// norm of the fused stacks run at the step's memory-bound fraction.
#[test]
fn eager_rmsnorm_runs_as_float32_operators_unless_fused() {
    let (tokens, h) = (2048.0, 4096.0);
    let compute =
        |framework: Framework, norm: NormKind, kernel: Option<NormKernel>, layers: u64| {
            let mut model = gpt(8, 4096, 32);
            model.norm = norm;
            let mut spec = spec(model, 1, 64);
            spec.train.framework = framework;
            spec.train.norm_kernel = kernel;
            let model = CostModel::with_calibration(&spec, bare()).unwrap();
            let s = strategy(8, 1, 1, 1);
            model.stage_outputs(&s, 1, layers, Recompute::None, Offload::default())
                [Output::Compute.index()]
        };
    let rms = |kernel: Option<NormKernel>, layers: u64| {
        compute(Framework::Fsdp, NormKind::Rmsnorm, kernel, layers)
    };
    assert_eq!(rms(None, 8), rms(Some(NormKernel::Composite), 8));
    // Per layer two norms move 4 bytes an element forward and 6 backward.
    let extra = |layers: u64| rms(None, layers) - rms(Some(NormKernel::Fused), layers);
    let per_layer = 2.0 * 10.0 * h * tokens / 2.039e12;
    assert!(close(
        extra(8) - extra(4),
        4.0 * per_layer * (1.0 / COMPOSITE_RMSNORM - 1.0 / EAGER_ELEMENTWISE),
        1e-9
    ));
    let layernorm = |kernel| compute(Framework::Fsdp, NormKind::Layernorm, kernel, 8);
    assert_eq!(layernorm(None), layernorm(Some(NormKernel::Fused)));
    let megatron = |kernel| compute(Framework::Megatron, NormKind::Rmsnorm, kernel, 8);
    assert_eq!(megatron(None), megatron(Some(NormKernel::Fused)));
    assert!(megatron(Some(NormKernel::Composite)) > megatron(None));
}

/// An offloaded optimizer step costs its copies over the host link (fp32 gradients down, bf16
/// weights up) and the host's CPU Adam, whose rate the node's GPUs share: with 8 GPUs on a host
/// each rank's update takes twice as long as with 4.
#[test]
fn an_offloaded_optimizer_step_runs_at_the_hosts_rate() {
    let tail = |gpus_per_node: u64| {
        let mut spec = spec(gpt(8, 4096, 32), 1, 64);
        spec.cluster.gpus_per_node = gpus_per_node;
        let model = CostModel::with_calibration(&spec, bare()).unwrap();
        let offload = Offload {
            optimizer: 1.0,
            ..Offload::default()
        };
        let s = strategy(gpus_per_node, 1, 1, 1);
        model.stage_outputs(&s, 0, 8, Recompute::None, offload)[Output::OffloadTail.index()]
    };
    let (eight, four) = (tail(8), tail(4));
    // Without ZeRO every rank updates all `n` parameters: tail = n·(6 / link + g / rate).
    let params = (eight - four) * HOST_ADAM_PARAMS_PER_S / 4.0;
    assert!(params > 1e9 && params < 3e9, "{params}");
    assert!(close(
        four,
        params * (6.0 / 25e9 + 4.0 / HOST_ADAM_PARAMS_PER_S),
        1e-9
    ));
}

/// Stage outputs of an FP8 job on a GPU with an fp8 peak, under `framework` and `scaling`.
fn fp8_outputs(
    framework: Framework,
    scaling: Fp8Scaling,
    cal: Calibration,
    s: &Strategy,
    layers: u64,
) -> [f64; Output::ALL.len()] {
    let mut spec = spec(gpt(8, 4096, 32), 2, 64);
    spec.cluster.gpu.peak.fp8 = 624e12;
    spec.train.precision = Precision::Fp8;
    spec.train.framework = framework;
    spec.train.fp8_scaling = Some(scaling);
    // Nothing overlapped, so that ZeRO-3's traffic is all exposed and comparable.
    spec.train.overlap = Some(OverlapSpec {
        grad_reduce: Some(false),
        param_gather: Some(false),
        tp_comm: Some(false),
    });
    let model = CostModel::with_calibration(&spec, cal).unwrap();
    model.stage_outputs(s, 1, layers, Recompute::None, Offload::default())
}

/// The bare calibration with row-scaled GEMMs as fast as tensor-scaled ones, so that the FP8
/// recipes differ by their casts alone.
fn fp8_calibration() -> Calibration {
    Calibration {
        fp8_rowwise_matmul: 1.0,
        layer_overhead_s: 0.0,
        ..bare()
    }
}

#[test]
fn fp8_scalings_pay_their_cast_passes_and_kernels() {
    let (tokens, h) = (2048.0, 4096.0);
    let cal = fp8_calibration();
    let s = strategy(16, 1, 1, 1);
    let compute_under = |framework: Framework, scaling: Fp8Scaling, cal: Calibration| {
        fp8_outputs(framework, scaling, cal, &s, 8)[Output::Compute.index()]
    };
    let compute =
        |scaling: Fp8Scaling, cal: Calibration| compute_under(Framework::Megatron, scaling, cal);
    let delayed = compute(Fp8Scaling::Delayed, cal);
    // Per layer, the cast inputs are the QKV and MLP inputs (h each), the output projection's
    // (h) and the down projection's (4h): 7h per token in backward, and in forward too outside
    // Transformer Engine, whose norms and activation write their FP8 outputs themselves (h,
    // the output projection's input, is cast in forward).
    let bandwidth = 2.039e12 * a100().memory;
    let per_byte = 8.0 * tokens * (1.0 + 7.0) * h / bandwidth;
    // The PyTorch-native stack's casts are eager kernels.
    let fsdp = |scaling: Fp8Scaling| compute_under(Framework::Fsdp, scaling, cal);
    assert!(close(
        fsdp(Fp8Scaling::Tensorwise) - fsdp(Fp8Scaling::Delayed),
        2.0 * per_byte * (7.0 + 7.0) / 8.0 * a100().memory / EAGER_ELEMENTWISE,
        1e-9
    ));
    // Tensor-wise: an amax read of 2 bytes more; row-wise: 5 more (column scales and casts).
    assert!(close(
        compute(Fp8Scaling::Tensorwise, cal) - delayed,
        2.0 * per_byte,
        1e-9
    ));
    let rowwise = compute(Fp8Scaling::Rowwise, cal);
    assert!(close(rowwise - delayed, 5.0 * per_byte, 1e-9));
    // Row-scaled GEMMs at their calibrated fraction of the tensor-scaled ones.
    let slow = Calibration {
        fp8_rowwise_matmul: 0.5,
        ..cal
    };
    assert!(compute(Fp8Scaling::Rowwise, slow) > rowwise);
    assert_eq!(
        compute(Fp8Scaling::Tensorwise, slow),
        compute(Fp8Scaling::Tensorwise, cal)
    );
}

#[test]
fn torchao_casts_rowwise_inputs_after_the_sequence_parallel_gather() {
    // Tensor parallelism 2 with sequence parallelism. torchao's tensor-wise plans cast the
    // norms' outputs (2h per token) on each rank's half of the sequence and gather them in
    // fp8; its row-wise recipe gathers bf16 and casts the whole sequence on every rank. The
    // other inputs (the output projection's h and the down projection's 4h) are split over
    // the ranks either way: 2.5h.
    let (tokens, h) = (2048.0, 4096.0);
    let cal = fp8_calibration();
    let mut s = strategy(8, 2, 1, 1);
    s.sequence_parallel = true;
    let compute = |scaling: Fp8Scaling| {
        fp8_outputs(Framework::Fsdp, scaling, cal, &s, 8)[Output::Compute.index()]
    };
    // Forward and backward each cast every input: row-wise 8 bytes an element, tensor-wise 5.
    let rowwise = 2.0 * 8.0 * (2.0 + 2.5) * h;
    let tensorwise = 2.0 * 5.0 * (1.0 + 2.5) * h;
    let bandwidth = 2.039e12 * EAGER_ELEMENTWISE;
    assert!(close(
        compute(Fp8Scaling::Rowwise) - compute(Fp8Scaling::Tensorwise),
        8.0 * tokens * (rowwise - tensorwise) / bandwidth,
        1e-9
    ));
}

#[test]
fn torchao_tensorwise_gathers_fp8_and_keeps_bf16_inputs() {
    let cal = bare();
    let mut s = strategy(8, 2, 1, 1);
    s.zero = 3;
    s.sequence_parallel = true;
    let outputs = |framework: Framework| {
        let one = fp8_outputs(framework, Fp8Scaling::Tensorwise, cal, &s, 1);
        let two = fp8_outputs(framework, Fp8Scaling::Tensorwise, cal, &s, 2);
        (one, two)
    };
    let ((te_one, te_two), (ao_one, ao_two)) =
        (outputs(Framework::Megatron), outputs(Framework::Fsdp));
    let layer =
        |one: &[f64], two: &[f64], output: Output| two[output.index()] - one[output.index()];
    // ZeRO-3 gathers a layer twice per micro-batch: one byte per weight instead of two saves
    // a third of the traffic beside the fp32 gradient reduce-scatter (2·2 + 4 bytes → 2·1 + 4).
    let te_dp = layer(&te_one, &te_two, Output::DpCommPerMicrobatch);
    let ao_dp = layer(&ao_one, &ao_two, Output::DpCommPerMicrobatch);
    assert!(close(ao_dp, te_dp * 6.0 / 8.0, 1e-9));
    // The forward all-gathers of sequence parallelism, a quarter of tp's traffic, move fp8.
    let te_tp = layer(&te_one, &te_two, Output::TpComm);
    let ao_tp = layer(&ao_one, &ao_two, Output::TpComm);
    assert!(close(ao_tp, te_tp * (1.0 - 0.25 * 0.5), 1e-9));
    // Transformer Engine keeps fp8 copies of GEMM inputs; torchao keeps the bf16 ones, as bf16
    // training does.
    let activations = |precision: Precision, framework: Framework| {
        let mut spec = spec(gpt(8, 4096, 32), 2, 64);
        spec.cluster.gpu.peak.fp8 = 624e12;
        spec.train.precision = precision;
        spec.train.framework = framework;
        layer_activation_bytes(&spec, &s)
    };
    let bf16 = activations(Precision::Bf16, Framework::Fsdp);
    assert_eq!(activations(Precision::Fp8, Framework::Fsdp), bf16);
    assert!(activations(Precision::Fp8, Framework::Megatron) < bf16);
}

#[test]
fn each_cross_entropy_holds_what_its_implementation_keeps_per_logit() {
    let (tokens, vocab) = (2048.0, 51200.0);
    let buffers = |framework: Framework, fused: Option<bool>, tp: u64| {
        let mut spec = spec(gpt(8, 4096, 32), 2, 64);
        spec.train.framework = framework;
        spec.train.fused_cross_entropy = fused;
        let model = CostModel::with_calibration(&spec, bare()).unwrap();
        let s = strategy(16 / tp, tp, 1, 1);
        model
            .stage_cost(&s, 0, 8, Recompute::None, Offload::default())
            .memory
            .buffers
    };
    let logits = |tp: f64, bytes: f64| tokens * vocab / tp * bytes;
    for tp in [1, 2] {
        // Megatron-LM's vocabulary-parallel loss: an fp32 softmax and a half-precision
        // gradient, 6 bytes per element of the vocabulary split over tp.
        let vocab_parallel = buffers(Framework::Megatron, None, tp);
        // flash-attn's fused loss on half-precision logits (llm-foundry): 2 + 2.
        let half = buffers(Framework::Fsdp, Some(true), tp);
        assert!(close(
            vocab_parallel - half,
            logits(tp as f64, 6.0 - 4.0),
            1e-9
        ));
        // PyTorch's cross-entropy on fp32 logits: 12.
        let unfused = buffers(Framework::Megatron, Some(false), tp);
        assert!(close(
            unfused - vocab_parallel,
            logits(tp as f64, 12.0 - 6.0),
            1e-9
        ));
        // The PyTorch-native stacks' loss-parallel cross-entropy over a split vocabulary: 16.
        let native = buffers(Framework::Fsdp, None, tp);
        let bytes = if tp > 1 { 16.0 } else { 12.0 };
        assert!(close(
            native - vocab_parallel,
            logits(tp as f64, bytes - 6.0),
            1e-9
        ));
    }
}

#[test]
fn deepspeed_keeps_in_flight_stage_outputs() {
    let (tokens, h) = (2048.0, 4096.0);
    let activations = |framework: Framework, stage: u64| {
        let mut spec = spec(gpt(8, 4096, 32), 2, 64);
        spec.train.framework = framework;
        let model = CostModel::with_calibration(&spec, bare()).unwrap();
        model
            .stage_cost(
                &strategy(4, 2, 2, 1),
                stage,
                4,
                Recompute::Full,
                Offload::default(),
            )
            .memory
            .activations
    };
    // The first of two stages holds two micro-batches in flight, each keeping its 2-byte
    // output of b·s·h elements until its backward; the last stage sends no output.
    let extra = activations(Framework::Deepspeed, 0) - activations(Framework::Megatron, 0);
    assert!(close(extra, 2.0 * 2.0 * tokens * h, 1e-12));
    assert_eq!(
        activations(Framework::Deepspeed, 1),
        activations(Framework::Megatron, 1)
    );
}

#[test]
fn misaligned_heads_slow_the_score_gemms() {
    let (tokens, s, t) = (2048.0, 2048.0, 8.0);
    let compute = |hidden: u64, heads: u64, misaligned_matmul: f64| {
        let cal = Calibration {
            misaligned_matmul,
            ..bare()
        };
        let model = CostModel::with_calibration(&spec(gpt(8, hidden, heads), 2, 64), cal).unwrap();
        let outputs = |layers| {
            model.stage_outputs(
                &strategy(2, 8, 1, 1),
                1,
                layers,
                Recompute::None,
                Offload::default(),
            )[Output::Compute.index()]
        };
        outputs(2) - outputs(1)
    };
    // 13824 / 128 = 108 fp16 elements per head, 216 bytes: not whole 16-byte words. Forward
    // QKᵀ and AV and their two backward GEMMs each run at the misaligned fraction.
    let head_dim = 108.0;
    let params = GemmParams {
        efficiency: a100().matmul,
        ..GemmParams::for_generation(GpuGeneration::Ampere)
    };
    let device = GemmDevice {
        peak_flops: 312e12,
        memory_bandwidth: 2.039e12 * HBM_STREAM_FRACTION,
        sms: 108.0,
        tile: None,
    };
    let heads = 128.0 / t;
    let gemm = |m: f64, n: f64, k: f64| gemm_time(m, n, k, heads, 2.0, &device, &params);
    // Scores (s × s over head_dim) and values (s × head_dim over s), each forward and its
    // input- and weight-gradient GEMMs.
    let one = |m: f64, n: f64, k: f64| gemm(m, n, k) + gemm(m, k, n) + gemm(k, n, m);
    let aligned_gemms = one(tokens, s, head_dim) + one(tokens, head_dim, s);
    let slowdown = compute(13824, 128, 0.25) - compute(13824, 128, 1.0);
    assert!(close(slowdown, aligned_gemms * (4.0 - 1.0), 1e-9));
    // 13824 / 96 = 144 elements, 288 bytes: aligned, so the fraction does not apply.
    assert_eq!(compute(13824, 96, 0.25), compute(13824, 96, 1.0));
}

#[test]
fn compiled_blocks_rebuild_norm_outputs_and_the_down_input() {
    let (tokens, h, ffn, t) = (2048.0, 4096.0, 4.0 * 4096.0, 2.0);
    let s = strategy(8, 2, 1, 1);
    let compiled = |compile: bool| {
        let mut spec = spec(gpt(8, 4096, 32), 2, 64);
        spec.train.compile = compile;
        spec
    };
    // The two norms' outputs (2h bytes each, replicated over tp without sequence parallelism)
    // and the down projection's input (2 bytes per ffn element, sharded over tp).
    let saved =
        layer_activation_bytes(&compiled(false), &s) - layer_activation_bytes(&compiled(true), &s);
    assert!(close(saved, tokens * (4.0 * h + 2.0 * ffn / t), 1e-12));
    // Backward writes them again.
    let compute = |compile: bool| {
        let model = CostModel::with_calibration(&compiled(compile), bare()).unwrap();
        model.stage_outputs(&s, 1, 1, Recompute::None, Offload::default())[Output::Compute.index()]
    };
    let bandwidth = 2.039e12 * a100().memory;
    assert!(close(
        compute(true) - compute(false),
        tokens * (4.0 * h + 2.0 * ffn / t) / bandwidth,
        1e-9
    ));
}

#[test]
fn megatron_runs_hopper_native_attention() {
    let (tokens, s, h, peak) = (2048.0, 2048.0, 4096.0, 989e12);
    let compute = |framework: Framework, kernel: Option<AttentionKernel>, gpu: &str| {
        let mut spec = spec(gpt(8, 4096, 32), 1, 64);
        spec.cluster.gpu.name = gpu.into();
        spec.cluster.gpu.peak.bf16 = peak;
        // The same memory-bound fraction under both stacks: only the attention differs.
        spec.cluster.gpu.efficiency.memory = Some(0.5);
        spec.train.flash_attention = true;
        spec.train.framework = framework;
        spec.train.attention_kernel = kernel;
        let model = CostModel::with_calibration(&spec, bare()).unwrap();
        let out = model.stage_outputs(
            &strategy(8, 1, 1, 1),
            0,
            8,
            Recompute::None,
            Offload::default(),
        );
        out[Output::Compute.index()]
    };
    // Causal flash attention over 8 layers: the forward at the kernel's benchmarked rate for
    // this sequence and head width (outside Megatron-LM at the fraction of it the step's GEMMs
    // sustain of their benchmarked level), the 2.5× backward at the kernel's backward ratio.
    let flops = 8.0 * 4.0 * s * h * 0.5 * tokens;
    let time = |generation: GpuGeneration, kernel: AttentionKernel, in_step: f64| {
        let params = AttentionParams::for_kernel(generation, kernel);
        let forward = attention_forward_rate(peak, s, h / 32.0, true, &params) * in_step;
        flops / forward * (1.0 + 2.5 / params.backward)
    };
    let sustained = |gpu: &str| {
        let mut spec = spec(gpt(8, 4096, 32), 1, 64);
        spec.cluster.gpu.name = gpu.into();
        KernelEfficiency::for_gpu(&spec.cluster.gpu).sustained_fraction(&bare())
    };
    let in_step = sustained("H100-SXM");
    // Hopper's GEMMs sustain 0.68 of peak in a step against the 0.85 of their benchmarks.
    assert!(close(in_step, 0.6799 / 0.8501, 1e-9));
    let megatron = compute(Framework::Megatron, None, "H100-SXM");
    let fsdp = compute(Framework::Fsdp, None, "H100-SXM");
    let (flash, native) = (
        time(GpuGeneration::Hopper, AttentionKernel::Flash2, in_step),
        time(GpuGeneration::Hopper, AttentionKernel::Cudnn, 1.0),
    );
    assert!(native < flash);
    assert!(close(fsdp - megatron, flash - native, 1e-9));
    // A kernel the spec names replaces the framework's own.
    let fsdp_flash1 = compute(Framework::Fsdp, Some(AttentionKernel::Flash1), "H100-SXM");
    let flash1 = time(GpuGeneration::Hopper, AttentionKernel::Flash1, in_step);
    assert!(close(fsdp_flash1 - fsdp, flash1 - flash, 1e-9));
    // Off Hopper the two default kernels are of a kind (cuDNN shares flash-attention 2's fit)
    // and differ by the step fraction alone.
    let a100_megatron = compute(Framework::Megatron, None, "A100-SXM4-80GB");
    let a100_fsdp = compute(Framework::Fsdp, None, "A100-SXM4-80GB");
    let a100 = |in_step: f64| time(GpuGeneration::Ampere, AttentionKernel::Flash2, in_step);
    assert!(close(
        a100_fsdp - a100_megatron,
        a100(sustained("A100-SXM4-80GB")) - a100(1.0),
        1e-9
    ));
}

#[test]
fn expert_dispatch_moves_each_ranks_sequence_shard() {
    let (tokens, h, t, e) = (2048.0, 1024.0, 2.0, 4.0);
    let spec = spec(small_moe(4, 0), 2, 64);
    let cal = Calibration {
        ep_overlap: 0.0,
        ..bare()
    };
    let model = CostModel::with_calibration(&spec, cal).unwrap();
    let mut s = strategy(8, 2, 1, 1);
    s.ep = 4;
    s.sequence_parallel = true;
    let ep_comm = |s: &Strategy, layers| {
        model.stage_outputs(s, 0, layers, Recompute::None, Offload::default())
            [Output::EpComm.index()]
    };
    let layer = ep_comm(&s, 2) - ep_comm(&s, 1);
    // The 4 expert-parallel ranks sit 2 GPUs apart, 8 GPUs: one node, on NVLink. Each tp rank
    // dispatches its half of the tokens, top-2 copies of each; the tp-sharded experts gather
    // the second copy over tp (the first is the dense MLP's sequence-parallel gather).
    let per_byte = 1.0 / (300e9 * cal.collectives.intra_efficiency);
    let all_to_all = (e - 1.0) / e * (tokens / t * 2.0 * h * 2.0) * per_byte;
    let regather = (t - 1.0) / t * (tokens * 1.0 * h * 2.0) * per_byte;
    // Dispatch and combine, forward and backward.
    assert!(close(layer, 4.0 * (all_to_all + regather), 1e-9));
    // Without sequence parallelism every tp rank holds, and dispatches, all tokens.
    s.sequence_parallel = false;
    let replicated = ep_comm(&s, 2) - ep_comm(&s, 1);
    assert!(close(replicated, 4.0 * all_to_all * t, 1e-9));
}

#[test]
fn overlapped_tensor_parallel_collectives_expose_their_last_chunk_and_taken_sms() {
    let tp_comm = |tp_comm: bool, hidden: u64| {
        let mut spec = spec(gpt(8, hidden, 32), 1, 8);
        spec.train.overlap = Some(OverlapSpec {
            grad_reduce: None,
            param_gather: None,
            tp_comm: Some(tp_comm),
        });
        let model = CostModel::with_calibration(&spec, bare()).unwrap();
        model.stage_outputs(
            &strategy(1, 8, 1, 1),
            0,
            8,
            Recompute::None,
            Offload::default(),
        )[Output::TpComm.index()]
    };
    // A wide model's GEMMs outlast its collectives: overlapped, what stays exposed is the last
    // of the reduce-scatters' four chunks (an eighth of the traffic) and the row-parallel
    // GEMMs' time on the 24 SMs the reduce-scatters hold (of the A100's 108).
    let (plain, overlapped) = (tp_comm(false, 8192), tp_comm(true, 8192));
    assert!(plain > 0.0);
    assert!(
        overlapped > plain / 8.0 && overlapped < plain / 2.0,
        "{overlapped} of {plain}"
    );
    // Never more than without overlap.
    assert!(tp_comm(true, 1024) <= tp_comm(false, 1024));
}

#[test]
fn recomputed_modules_drop_their_outputs_and_re_run_them() {
    // The GPT of Korthikanti's table with tp 8 + sp: the norms' outputs are 4sbh/t of a
    // layer's activations; recomputing them re-runs two norm passes in backward.
    let (s, b, h) = (2048.0, 1.0, 12288.0);
    let sbh = s * b * h;
    let spec = spec(gpt(96, 12288, 96), 8, 64);
    let mut sp = strategy(8, 8, 1, 1);
    sp.sequence_parallel = true;
    sp.recompute = Recompute::Selective;
    let selective = layer_activation_bytes(&spec, &sp);
    let norms = RecomputeModules::CORE_ATTN.with(RecomputeModules::LAYERNORM);
    sp.recompute = Recompute::Modules(norms);
    let with_norms = layer_activation_bytes(&spec, &sp);
    assert!(close(selective - with_norms, 4.0 * sbh / 8.0, 1e-12));

    let model = CostModel::with_calibration(&spec, bare()).unwrap();
    let recompute = |r: Recompute| {
        model.stage_outputs(&sp, 0, 2, r, Offload::default())[Output::Recompute.index()]
    };
    let norm_pass = recompute(Recompute::Modules(norms)) - recompute(Recompute::Selective);
    assert!(norm_pass > 0.0);
    assert!(norm_pass < 0.05 * recompute(Recompute::Full));
}

#[test]
fn recomputing_the_experts_activation_drops_the_down_projection_input() {
    let spec = spec(small_moe(2, 0), 1, 64);
    let mut s = strategy(8, 1, 1, 1);
    s.recompute = Recompute::None;
    let kept = layer_activation_bytes(&spec, &s);
    s.recompute = Recompute::Modules(RecomputeModules::MOE_ACT);
    let dropped = kept - layer_activation_bytes(&spec, &s);
    // 2048 tokens × top-2 copies × the expert width 4096 × 2 bytes.
    assert!(
        close(dropped, 2048.0 * 2.0 * 4096.0 * 2.0, 1e-12),
        "{dropped}"
    );
}

#[test]
fn folded_experts_keep_whole_experts_and_the_same_work() {
    // Tessel's loop: the experts' GEMM work alone, without a Python loop's host pace.
    let mut spec = spec(small_moe(2, 0), 1, 64);
    spec.train.framework = Framework::Tessel;
    let cost = CostModel::with_calibration(&spec, bare()).unwrap();
    let stage = |etp: Option<u64>, ep: u64| {
        let mut s = strategy(2, 4, 1, 1);
        s.sequence_parallel = true;
        s.ep = ep;
        s.etp = etp;
        let outputs = cost.stage_outputs(&s, 0, 2, Recompute::None, Offload::default());
        let value = |output: Output| outputs[output.index()];
        (
            value(Output::Weights),
            value(Output::Compute),
            value(Output::EpComm),
        )
    };
    // tp 4 × dp 2: unfolded, ep 2 splits each expert over the 4 tp ranks; folded (etp 1),
    // ep 8 puts one whole expert on each of the 8 GPUs. Same expert parameters per GPU.
    let (unfolded_weights, unfolded_compute, _) = stage(None, 2);
    let (folded_weights, folded_compute, folded_ep) = stage(Some(1), 8);
    assert!(close(folded_weights, unfolded_weights, 1e-12));
    // The experts' GEMM work per GPU is the same; only its shapes and the communication move.
    assert!(close(folded_compute, unfolded_compute, 0.15));
    assert!(folded_ep > 0.0);
}

#[test]
fn deepspeed_zero3_gathers_again_what_outlives_the_reuse_distance_under_recompute() {
    // DeepSpeed's ZeRO-3 with its default `stage3_max_reuse_distance` (1e9 elements): after a
    // layer's recomputed forward, each linear layer's weight is kept for its backward only if
    // the weights used in between, twice the later linear layers', number fewer.
    let dp_comm = |framework: Framework, hidden: u64, recompute: Recompute, prefetch: bool| {
        let mut spec = spec(gpt(4, hidden, hidden / 128), 2, 256);
        // One compute unit: no SMs for NCCL to take, so a hidden gather costs nothing and the
        // prefetched case shows only what is exposed.
        spec.cluster.gpu.compute_units = Some(1);
        spec.train.framework = framework;
        spec.train.overlap = Some(OverlapSpec {
            grad_reduce: Some(false),
            param_gather: Some(prefetch),
            tp_comm: None,
        });
        let cost = CostModel::with_calibration(&spec, bare()).unwrap();
        let mut s = strategy(16, 1, 1, 16);
        s.zero = 3;
        cost.stage_outputs(&s, 0, 4, recompute, Offload::default())
            [Output::DpCommPerMicrobatch.index()]
    };
    let regathered = |framework: Framework, hidden: u64| {
        dp_comm(framework, hidden, Recompute::Full, false)
            - dp_comm(framework, hidden, Recompute::None, false)
    };
    // GPT-3 175B's block (h = 12,288): QKV 3h², output h², MLP 4h² and 4h². Between the MLP
    // in's recomputed forward and its backward lie 8h² = 1.2e9 weights, so QKV, the output
    // and the MLP in (8h² of 12h²) are gathered again; the MLP out is used right away.
    let hidden = 12288u64;
    // One layer's gather: prefetched behind 16 sequences of compute, all but the first
    // layer's gather of each pass hide, 2·(4 − 1) of them.
    let gather = (dp_comm(Framework::Deepspeed, hidden, Recompute::None, false)
        - dp_comm(Framework::Deepspeed, hidden, Recompute::None, true))
        / 6.0;
    let expected = 4.0 * (8.0 / 12.0) * gather;
    let extra = regathered(Framework::Deepspeed, hidden);
    assert!(close(extra, expected, 1e-6), "{extra} vs {expected}");
    // A 2,048-wide block's weights all lie within the distance: nothing is gathered again.
    assert!(regathered(Framework::Deepspeed, 2048).abs() < 1e-12);
    // FSDP recomputes inside the unit's backward, with its weights already gathered.
    assert!(regathered(Framework::Fsdp, hidden).abs() < 1e-12);
}

/// The data-parallel time per micro-batch and at the step's end of 4 layers of `model` on
/// one stage at dp 8 under ZeRO `zero`: fp32, nothing overlapped, memory-bound passes at half
/// of HBM bandwidth, collectives without latency.
fn zero_dp_comm(model: &ModelSpec, framework: Framework, zero: u8) -> (f64, f64) {
    let mut spec = spec(model.clone(), 1, 64);
    spec.train.framework = framework;
    spec.train.precision = Precision::Fp32;
    spec.cluster.gpu.efficiency.memory = Some(0.5);
    spec.train.overlap = Some(OverlapSpec {
        grad_reduce: Some(false),
        param_gather: Some(false),
        tp_comm: None,
    });
    let cost = CostModel::with_calibration(&spec, bare()).unwrap();
    let mut s = strategy(8, 1, 1, 1);
    s.zero = zero;
    let out = cost.stage_outputs(&s, 0, 4, Recompute::None, Offload::default());
    (
        out[Output::DpCommPerMicrobatch.index()],
        out[Output::DpCommTail.index()],
    )
}

#[test]
fn tessel_s_zero3_copies_its_gathered_weights_and_gradients_through_flat_buffers() {
    // Tessel's runtime copies each gathered block out of its flat buffer in forward and again
    // in backward, and each micro-batch's gradients into one before their reduce-scatter:
    // per parameter 4 + 4 bytes moved per gather and 4 + 4 per gradient in fp32, at the
    // memory-bound fraction. FSDP's ZeRO-3 is priced without them; nothing else differs.
    let model = gpt(4, 2048, 16);
    let params = model.parameter_count().total as f64;
    let copies =
        zero_dp_comm(&model, Framework::Tessel, 3).0 - zero_dp_comm(&model, Framework::Fsdp, 3).0;
    let expected = params * (2.0 * 8.0 + 8.0) / (2.039e12 * 0.5);
    assert!(close(copies, expected, 1e-9), "{copies} vs {expected}");
}

#[test]
fn tessel_s_zero2_reduces_every_micro_batch_through_a_flat_buffer() {
    // Tessel's runtime reduce-scatters each micro-batch's gradients as each piece's backward
    // ends, copied into a flat buffer first (4 + 4 bytes per fp32 gradient), and reduces
    // nothing at the step's end; Megatron-LM's distributed optimizer reduces the same bytes
    // once, at the end. Without latencies the transfers are the same seconds.
    let model = gpt(4, 2048, 16);
    let params = model.parameter_count().total as f64;
    let (tessel_microbatch, tessel_tail) = zero_dp_comm(&model, Framework::Tessel, 2);
    let (megatron_microbatch, megatron_tail) = zero_dp_comm(&model, Framework::Megatron, 2);
    assert_eq!(megatron_microbatch, 0.0);
    let copies = params * 8.0 / (2.039e12 * 0.5);
    let reduce = megatron_tail - tessel_tail;
    assert!(reduce > 0.0, "{megatron_tail} vs {tessel_tail}");
    assert!(
        close(tessel_microbatch - copies, reduce, 1e-9),
        "{tessel_microbatch} − {copies} vs {reduce}"
    );
}

#[test]
fn a_measured_jitter_makes_every_rank_wait_for_the_slowest() {
    // σ = 0.1: two ranks wait σ/√π of their compute, sixteen σ · 1.766 (the expected maximum
    // of 16 standard normals); one rank waits for nobody.
    let spec = spec(gpt(8, 2048, 16), 2, 64);
    let compute = |jitter: f64, dp: u64| {
        let cal = bare().with_compute(ComputeParams {
            matmul: 0.6,
            memory: 0.6,
            layer_overhead_s: 0.0,
            jitter,
        });
        let cost = CostModel::with_calibration(&spec, cal).unwrap();
        cost.stage_outputs(
            &strategy(dp, 1, 1, 1),
            0,
            8,
            Recompute::None,
            Offload::default(),
        )[Output::Compute.index()]
    };
    for (dp, expected_max) in [
        (1, 0.0),
        (2, 1.0 / std::f64::consts::PI.sqrt()),
        (16, 1.7660),
    ] {
        let ratio = compute(0.1, dp) / compute(0.0, dp);
        assert!(
            close(ratio, 1.0 + 0.1 * expected_max, 1e-4),
            "dp {dp}: {ratio}"
        );
    }
}

#[test]
fn hybrid_sharding_shards_within_a_node_and_all_reduces_across_replicas() {
    // 16-way dp over two nodes under FSDP's ZeRO-3, sharded over all 16 ranks or, hybrid, over
    // the 8 of a node with 2 replicas.
    let model = gpt(24, 2048, 16);
    let params = model.parameter_count().total as f64;
    let mut spec = spec(model, 2, 64);
    spec.train.framework = tessel_grammar::Framework::Fsdp;
    spec.train.overlap = Some(OverlapSpec {
        grad_reduce: Some(false),
        param_gather: Some(false),
        tp_comm: None,
    });
    let cal = bare();
    let cost = CostModel::with_calibration(&spec, cal).unwrap();
    let mut full = strategy(16, 1, 1, 1);
    full.zero = 3;
    let hybrid = Strategy {
        dp_shard: Some(8),
        ..full.clone()
    };
    let stage = |s: &Strategy| {
        let outputs = cost.stage_outputs(s, 0, 24, Recompute::None, Offload::default());
        move |output: Output| outputs[output.index()]
    };
    let (full_stage, hybrid_stage) = (stage(&full), stage(&hybrid));
    // States shard over 8 ranks instead of 16: twice the bytes (ZeRO-3: fp32 weights, 4-byte
    // gradients and 8 bytes of moments per parameter).
    assert!(close(
        full_stage(Output::OptimizerStates),
        8.0 * params / 16.0,
        1e-9
    ));
    assert!(close(
        hybrid_stage(Output::OptimizerStates),
        8.0 * params / 8.0,
        1e-9
    ));
    assert!(close(
        hybrid_stage(Output::Weights),
        2.0 * full_stage(Output::Weights),
        1e-9
    ));
    // The per-layer gathers and reduce-scatters stay on NVLink: cheaper than across nodes.
    assert!(hybrid_stage(Output::DpCommPerMicrobatch) < full_stage(Output::DpCommPerMicrobatch));
    // Once per step, each rank's 1/8 gradient shard (fp32) is all-reduced with its peer on the
    // other node: a ring of two moves 2·(1/2) of the buffer over the 8 NICs' share.
    assert_eq!(full_stage(Output::DpCommTail), 0.0);
    let shard_bytes = 4.0 * params / 8.0;
    let calls = 24.0 + 1.0;
    let per_call = shard_bytes / calls;
    let bandwidth = 25e9 * cal.collectives.inter_efficiency;
    let expected = calls * 2.0 * 0.5 * per_call / bandwidth;
    assert!(
        close(hybrid_stage(Output::DpCommTail), expected, 0.05),
        "{} vs {expected}",
        hybrid_stage(Output::DpCommTail)
    );
}

#[test]
fn a_sequential_expert_loop_runs_at_the_host_pace_when_its_gemms_are_short() {
    // One layer of 8 experts (1024 → 4096) over 128 tokens, top-2: 32 tokens per expert,
    // microseconds of GEMM each. Megatron-LM's loop issues each expert from Python, so the
    // layer costs at least the host's time for 8 experts; Tessel's runtime has no such loop.
    let compute = |framework: Framework| {
        let mut spec = spec(small_moe(1, 0), 1, 64);
        spec.train.seq_len = 128;
        spec.train.framework = framework;
        let cost = CostModel::with_calibration(&spec, bare()).unwrap();
        let outputs = cost.stage_outputs(
            &strategy(8, 1, 1, 1),
            0,
            1,
            Recompute::None,
            Offload::default(),
        );
        outputs[Output::Compute.index()]
    };
    let host = 8.0 * (EAGER_EXPERT_HOST.forward_s + EAGER_EXPERT_HOST.backward_s);
    let megatron = compute(Framework::Megatron);
    let tessel = compute(Framework::Tessel);
    assert!(megatron >= host, "{megatron} < {host}");
    assert!(tessel < 0.5 * host, "{tessel}");
    // The loop's host time replaces the experts' GEMM time, not the rest of the layer.
    assert!(megatron < tessel + host, "{megatron} vs {tessel} + {host}");
}
