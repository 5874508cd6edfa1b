//! `tessel export` to Megatron-LM, torchtitan and DeepSpeed: golden files for representative
//! strategies, every emitted flag or key checked against the target's documented names, and the
//! output parsed back by an independent reader (bash, a TOML parser, a JSON parser).

mod common;

use std::collections::BTreeSet;

use common::check_golden;
use tessel_grammar::*;
use tessel_interop::{export, export_with, ExportOptions, ExportOutput, ExportTarget};

fn h100_cluster(nodes: u64) -> ClusterSpec {
    // NVIDIA H100 SXM datasheet: 80 GB HBM3, 989 TFLOPS dense BF16, 3.35 TB/s; NVLink 4
    // 450 GB/s per direction; one 400 Gb/s NIC per GPU.
    ClusterSpec {
        name: format!("h100_{}", nodes * 8),
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
            gemm_tile: None,
        },
        nodes,
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
    }
}

fn llama(name: &str, layers: u64, hidden: u64, heads: u64, ffn: u64) -> ModelSpec {
    ModelSpec {
        name: name.into(),
        layers,
        hidden,
        heads,
        kv_heads: 8,
        head_dim: hidden / heads,
        ffn_hidden: ffn,
        vocab: 128_256,
        mlp: MlpKind::Swiglu,
        norm: NormKind::Rmsnorm,
        tie_embeddings: false,
        bias: false,
        max_seq_len: Some(8192),
        position: PositionKind::Rope,
        moe: None,
        encoders: Vec::new(),
    }
}

fn strategy(name: &str, dp: u64, tp: u64, pp: u64) -> Strategy {
    Strategy {
        name: name.into(),
        dp,
        tp,
        pp,
        ..Strategy::default()
    }
}

fn spec(model: ModelSpec, cluster: ClusterSpec, train: TrainSpec, s: Strategy) -> Spec {
    Spec {
        model,
        cluster,
        train,
        strategies: vec![s],
        search: SearchSpace::default(),
    }
}

fn train(seq_len: u64, global_batch: u64, precision: Precision) -> TrainSpec {
    TrainSpec {
        seq_len,
        global_batch,
        precision,
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
    }
}

/// Llama 3 70B on 1024 H100s as Meta and Megatron-LM run it: tp 8, pp 4 with 5 virtual stages,
/// sequence parallel, selective recompute, distributed optimizer.
fn llama70b_dense() -> Spec {
    let mut s = strategy("megatron_reference", 32, 8, 4);
    s.interleave = 5;
    s.recompute = Recompute::Selective;
    s.sequence_parallel = true;
    s.zero = 1;
    spec(
        llama("llama3_70b", 80, 8192, 64, 28672),
        h100_cluster(128),
        train(8192, 512, Precision::Bf16),
        s,
    )
}

/// Mixtral 8x7B on 128 GPUs with 8-way expert parallelism and full recompute.
fn mixtral_ep() -> Spec {
    let mut model = llama("mixtral_8x7b", 32, 4096, 32, 14336);
    model.vocab = 32000;
    model.max_seq_len = Some(32768);
    model.moe = Some(MoeSpec {
        experts: 8,
        top_k: 2,
        every: 1,
        expert_ffn_hidden: 14336,
        shared_experts: 0,
        capacity_factor: 1.0,
        first_dense: 0,
    });
    let mut s = strategy("expert_parallel", 16, 2, 4);
    s.ep = 8;
    s.recompute = Recompute::Full;
    s.sequence_parallel = true;
    s.zero = 1;
    spec(
        model,
        h100_cluster(16),
        train(4096, 1024, Precision::Bf16),
        s,
    )
}

/// Llama 3 8B on 16 GPUs, pure data parallelism with ZeRO-3, half the optimizer state and all
/// weights offloaded to the host, full recompute.
fn llama8b_zero3_offload() -> Spec {
    let mut s = strategy("zero3_offload", 16, 1, 1);
    s.zero = 3;
    s.microbatch = 2;
    s.recompute = Recompute::Full;
    s.offload = Offload {
        optimizer: 0.5,
        weights: 1.0,
        gradients: 0.0,
        activations: 0.0,
    };
    spec(
        llama("llama3_8b", 32, 4096, 32, 14336),
        h100_cluster(2),
        train(8192, 256, Precision::Bf16),
        s,
    )
}

/// Llama 3.1 405B: 126 layers on 16 stages (lighter end stages), FP8, partial recompute.
fn llama405b_uneven() -> Spec {
    let mut s = strategy("uneven_stages", 8, 8, 16);
    s.recompute = Recompute::Partial { full_layers: 2 };
    s.sequence_parallel = true;
    s.zero = 1;
    let mut model = llama("llama3_1_405b", 126, 16384, 128, 53248);
    model.max_seq_len = Some(131072);
    spec(
        model,
        h100_cluster(128),
        train(8192, 2048, Precision::Fp8),
        s,
    )
}

/// DeepSeek-style MoE with leading dense blocks and shared experts, ZeRO-2, context
/// parallelism, interleaved pipeline with explicit stages.
fn deepseek_like() -> Spec {
    let mut model = llama("deepseek_like", 28, 2048, 16, 10944);
    model.vocab = 102_400;
    model.moe = Some(MoeSpec {
        experts: 64,
        top_k: 6,
        every: 1,
        expert_ffn_hidden: 1408,
        shared_experts: 2,
        capacity_factor: 1.0,
        first_dense: 1,
    });
    let mut s = strategy("moe_cp_zero2", 16, 1, 2);
    s.cp = 2;
    s.ep = 8;
    s.interleave = 2;
    s.stages = Some(vec![12, 16]);
    s.zero = 2;
    s.microbatch = 2;
    spec(
        model,
        h100_cluster(8),
        train(16384, 512, Precision::Bf16),
        s,
    )
}

/// GPT-2 small on one node in fp16 with plain data parallelism and SGD.
fn gpt2_ddp() -> Spec {
    let model = ModelSpec {
        name: "gpt2".into(),
        layers: 12,
        hidden: 768,
        heads: 12,
        kv_heads: 12,
        head_dim: 64,
        ffn_hidden: 3072,
        vocab: 50257,
        mlp: MlpKind::Gelu,
        norm: NormKind::Layernorm,
        tie_embeddings: true,
        bias: true,
        max_seq_len: Some(1024),
        position: PositionKind::Learned,
        moe: None,
        encoders: Vec::new(),
    };
    let mut t = train(1024, 512, Precision::Fp16);
    t.optimizer = Optimizer::Sgd;
    t.flash_attention = false;
    let mut s = strategy("ddp", 8, 1, 1);
    s.microbatch = 16;
    spec(model, h100_cluster(1), t, s)
}

fn cases() -> Vec<(&'static str, Spec)> {
    vec![
        ("llama70b_dense", llama70b_dense()),
        ("mixtral_ep", mixtral_ep()),
        ("llama8b_zero3_offload", llama8b_zero3_offload()),
        ("llama405b_uneven", llama405b_uneven()),
        ("deepseek_like", deepseek_like()),
        ("gpt2_ddp", gpt2_ddp()),
    ]
}

fn run(spec: &Spec, target: ExportTarget) -> ExportOutput {
    export(spec, &spec.strategies[0], target)
}

/// The golden file holds the text, then the unsupported list and the notes, so that a change to
/// any of them shows up in review.
fn golden_text(out: &ExportOutput) -> String {
    let mut text = out.text.clone();
    text.push_str("\n----- file name\n");
    text.push_str(&out.file_name_hint);
    text.push_str("\n----- unsupported\n");
    for item in &out.unsupported {
        text.push_str(&format!("{item}\n"));
    }
    text.push_str("----- notes\n");
    for item in &out.notes {
        text.push_str(&format!("{item}\n"));
    }
    text
}

#[test]
fn golden_exports() {
    for (name, spec) in cases() {
        for target in ExportTarget::ALL {
            let out = run(&spec, target);
            check_golden(
                &format!("export/{name}.{}.golden", target.name()),
                &golden_text(&out),
            );
        }
    }
}

#[test]
fn exports_are_deterministic() {
    for (_, spec) in cases() {
        for target in ExportTarget::ALL {
            assert_eq!(run(&spec, target), run(&spec, target));
        }
    }
}

fn known(file: &str) -> BTreeSet<String> {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/known")
        .join(file);
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect()
}

/// The `--flag` names after `pretrain_gpt.py`, with their values.
fn megatron_flags(text: &str) -> Vec<(String, Option<String>)> {
    text.lines()
        .skip_while(|l| !l.trim_start().starts_with("pretrain_gpt.py"))
        .skip(1)
        .map(|l| {
            let l = l.trim().trim_end_matches('\\').trim();
            match l.split_once(' ') {
                Some((flag, value)) => (flag.to_string(), Some(value.to_string())),
                None => (l.to_string(), None),
            }
        })
        .collect()
}

#[test]
fn megatron_flags_are_megatron_lm_arguments() {
    let known = known("megatron_flags.txt");
    for (name, spec) in cases() {
        let out = run(&spec, ExportTarget::Megatron);
        let flags = megatron_flags(&out.text);
        assert!(flags.len() > 15, "{name}: too few flags");
        let mut seen = BTreeSet::new();
        for (flag, _) in &flags {
            assert!(
                known.contains(flag),
                "{name}: {flag} is not a Megatron-LM argument"
            );
            assert!(seen.insert(flag.clone()), "{name}: {flag} written twice");
        }
    }
}

#[test]
fn megatron_script_is_valid_bash() {
    for (name, spec) in cases() {
        let out = run(&spec, ExportTarget::Megatron);
        let status = std::process::Command::new("bash")
            .arg("-n")
            .arg("-c")
            .arg(&out.text)
            .status()
            .expect("bash runs");
        assert!(status.success(), "{name}: bash -n rejects the script");
        // One flag per line, every line of the command continued but the last.
        let command: Vec<&str> = out
            .text
            .lines()
            .skip_while(|l| !l.starts_with("torchrun"))
            .collect();
        let (last, rest) = command.split_last().unwrap();
        assert!(rest.iter().all(|l| l.ends_with(" \\")), "{name}");
        assert!(!last.ends_with('\\'), "{name}");
    }
}

#[test]
fn megatron_values_restate_the_strategy() {
    let spec = llama70b_dense();
    let flags = megatron_flags(&run(&spec, ExportTarget::Megatron).text);
    let value = |f: &str| {
        flags
            .iter()
            .find(|(flag, _)| flag == f)
            .and_then(|(_, v)| v.clone())
    };
    assert_eq!(value("--tensor-model-parallel-size").unwrap(), "8");
    assert_eq!(value("--pipeline-model-parallel-size").unwrap(), "4");
    // 80 layers / (4 stages · 5 virtual stages).
    assert_eq!(
        value("--num-layers-per-virtual-pipeline-stage").unwrap(),
        "4"
    );
    assert_eq!(value("--num-query-groups").unwrap(), "8");
    assert_eq!(value("--recompute-granularity").unwrap(), "selective");
    assert!(flags.iter().any(|(f, _)| f == "--sequence-parallel"));
    assert!(flags
        .iter()
        .any(|(f, _)| f == "--use-distributed-optimizer"));

    let flags = megatron_flags(&run(&llama405b_uneven(), ExportTarget::Megatron).text);
    let value = |f: &str| {
        flags
            .iter()
            .find(|(flag, _)| flag == f)
            .and_then(|(_, v)| v.clone())
    };
    // 126 = 7 + 14·8 + 7.
    assert_eq!(value("--decoder-first-pipeline-num-layers").unwrap(), "7");
    assert_eq!(value("--decoder-last-pipeline-num-layers").unwrap(), "7");
    assert_eq!(value("--fp8-format").unwrap(), "hybrid");
    assert_eq!(value("--recompute-method").unwrap(), "block");

    let flags = megatron_flags(&run(&deepseek_like(), ExportTarget::Megatron).text);
    let value = |f: &str| {
        flags
            .iter()
            .find(|(flag, _)| flag == f)
            .and_then(|(_, v)| v.clone())
    };
    assert_eq!(value("--moe-layer-freq").unwrap(), "'([0]*1+[1]*27)'");
    assert_eq!(
        value("--moe-shared-expert-intermediate-size").unwrap(),
        "2816"
    );
    assert_eq!(
        value("--num-virtual-stages-per-pipeline-rank").unwrap(),
        "2"
    );
    assert_eq!(value("--decoder-first-pipeline-num-layers").unwrap(), "12");
    assert_eq!(value("--decoder-last-pipeline-num-layers").unwrap(), "16");
}

#[test]
fn megatron_reports_zero3_as_unsupported() {
    let out = run(&llama8b_zero3_offload(), ExportTarget::Megatron);
    assert!(out.unsupported.iter().any(|u| u.starts_with("zero = 3:")));
    assert!(out
        .unsupported
        .iter()
        .any(|u| u.starts_with("offload.weights")));
    let flags = megatron_flags(&out.text);
    assert!(flags
        .iter()
        .any(|(f, v)| f == "--optimizer-offload-fraction" && v.as_deref() == Some("0.5")));
}

#[test]
fn megatron_names_the_attention_kernel_the_spec_chose() {
    let backend = |kernel: Option<AttentionKernel>| {
        let mut spec = llama70b_dense();
        spec.train.attention_kernel = kernel;
        let out = run(&spec, ExportTarget::Megatron);
        let flags = megatron_flags(&out.text);
        let value = flags
            .iter()
            .find(|(f, _)| f == "--attention-backend")
            .and_then(|(_, v)| v.clone());
        (value, out.unsupported)
    };
    assert_eq!(backend(None).0, None);
    assert_eq!(
        backend(Some(AttentionKernel::Cudnn)).0.as_deref(),
        Some("fused")
    );
    assert_eq!(
        backend(Some(AttentionKernel::Flash2)).0.as_deref(),
        Some("flash")
    );
    let (value, unsupported) = backend(Some(AttentionKernel::Flash1));
    assert_eq!(value, None);
    assert!(unsupported
        .iter()
        .any(|u| u.starts_with("attention_kernel = flash1:")));
}

#[test]
fn torchtitan_and_deepspeed_report_the_attention_kernel() {
    let report = |target: ExportTarget, kernel: AttentionKernel| {
        let mut spec = llama70b_dense();
        spec.train.attention_kernel = Some(kernel);
        let out = run(&spec, target);
        let name = |items: &[String]| items.iter().any(|u| u.starts_with("attention_kernel = "));
        (name(&out.unsupported), name(&out.notes))
    };
    use AttentionKernel::{Cudnn, Flash1, Flash2};
    // (unsupported, noted) per kernel.
    assert_eq!(report(ExportTarget::Torchtitan, Flash2), (false, false));
    assert_eq!(report(ExportTarget::Torchtitan, Flash1), (true, false));
    assert_eq!(report(ExportTarget::Torchtitan, Cudnn), (true, false));
    assert_eq!(report(ExportTarget::Deepspeed, Flash2), (false, true));
    assert_eq!(report(ExportTarget::Deepspeed, Flash1), (false, true));
    assert_eq!(report(ExportTarget::Deepspeed, Cudnn), (true, false));
}

#[test]
fn torchtitan_writes_overlapped_tp_as_async_tp_when_compiled() {
    let async_tp = |compile: bool| {
        let mut spec = llama70b_dense();
        spec.train.compile = compile;
        spec.train.overlap = Some(OverlapSpec {
            grad_reduce: None,
            param_gather: None,
            tp_comm: Some(true),
        });
        let out = run(&spec, ExportTarget::Torchtitan);
        let written = out.text.contains("enable_async_tensor_parallel = true");
        let refused = out
            .unsupported
            .iter()
            .any(|u| u.starts_with("overlap.tp_comm = true:"));
        (written, refused)
    };
    assert_eq!(async_tp(true), (true, false));
    assert_eq!(async_tp(false), (false, true));
}

#[test]
fn per_stage_recompute_is_reported_by_every_target() {
    let mut spec = llama70b_dense();
    let strategy = &mut spec.strategies[0];
    let mut stages = vec![Recompute::Full; strategy.pp as usize];
    stages[1] = Recompute::Selective;
    strategy.set_stage_options(stages, vec![Offload::default(); strategy.pp as usize]);
    for target in ExportTarget::ALL {
        let out = run(&spec, target);
        assert!(
            out.unsupported.iter().any(
                |u| u.starts_with("recompute differs by pipeline stage (full, selective, full")
            ),
            "{target}: {:?}",
            out.unsupported
        );
    }
}

/// Every `section.key` of a TOML document, parsed by toml_edit.
fn toml_keys(text: &str) -> Vec<String> {
    let doc: toml_edit::DocumentMut = text.parse().expect("valid TOML");
    let mut keys = Vec::new();
    for (section, item) in doc.iter() {
        let table = item.as_table().expect("only tables at the top level");
        for (key, _) in table.iter() {
            keys.push(format!("{section}.{key}"));
        }
    }
    keys
}

#[test]
fn torchtitan_keys_are_job_config_keys() {
    let known = known("torchtitan_keys.txt");
    for (name, spec) in cases() {
        let out = run(&spec, ExportTarget::Torchtitan);
        let keys = toml_keys(&out.text);
        assert!(keys.len() > 12, "{name}: too few keys");
        for key in keys {
            assert!(
                known.contains(&key),
                "{name}: {key} is not a torchtitan config key"
            );
        }
    }
}

#[test]
fn torchtitan_zero_mapping() {
    let get = |spec: &Spec, key: &str| -> String {
        let doc: toml_edit::DocumentMut = run(spec, ExportTarget::Torchtitan).text.parse().unwrap();
        doc["parallelism"][key].to_string().trim().to_string()
    };
    // ZeRO-3: everything sharded over dp, nothing replicated.
    let zero3 = llama8b_zero3_offload();
    assert_eq!(get(&zero3, "data_parallel_shard_degree"), "16");
    assert_eq!(get(&zero3, "data_parallel_replicate_degree"), "1");
    assert_eq!(get(&zero3, "fsdp_reshard_after_forward"), "\"always\"");
    // ZeRO-0 without other parallelism: DDP.
    let ddp = gpt2_ddp();
    assert_eq!(get(&ddp, "data_parallel_replicate_degree"), "8");
    assert_eq!(get(&ddp, "data_parallel_shard_degree"), "1");
    // Interleaved pipeline schedule.
    assert_eq!(
        get(&llama70b_dense(), "pipeline_parallel_schedule"),
        "\"Interleaved1F1B\""
    );
    assert_eq!(
        get(&llama70b_dense(), "pipeline_parallel_layers_per_stage"),
        "4"
    );
    // 126 layers: stages of 8 with one layer fewer at each end.
    let uneven = llama405b_uneven();
    assert_eq!(get(&uneven, "pipeline_parallel_layers_per_stage"), "8");
    assert_eq!(
        get(&uneven, "pipeline_parallel_first_stage_less_layers"),
        "1"
    );
    assert_eq!(
        get(&uneven, "pipeline_parallel_last_stage_less_layers"),
        "1"
    );
    let out = run(&llama70b_dense(), ExportTarget::Torchtitan);
    assert!(out.unsupported.iter().any(|u| u.starts_with("zero = 1:")));
}

#[test]
fn torchtitan_writes_any_split_module_by_module() {
    // Middle stages of unequal size, and an embedding-only first chunk: beyond the two
    // `*_less_layers` keys, so each virtual stage's modules are listed.
    let mut spec = llama405b_uneven();
    let mut stages = vec![0, 9];
    stages.extend([8; 13]);
    stages.push(13);
    assert_eq!(stages.iter().sum::<u64>(), 126);
    spec.strategies[0].stages = Some(stages);
    let out = run(&spec, ExportTarget::Torchtitan);
    assert!(
        !out.unsupported.iter().any(|u| u.contains("stages")),
        "{:?}",
        out.unsupported
    );
    let doc: toml_edit::DocumentMut = out.text.parse().unwrap();
    let parts = doc["parallelism"]["module_fqns_per_model_part"]
        .as_array()
        .expect("module_fqns_per_model_part is an array");
    let modules: Vec<Vec<&str>> = parts
        .iter()
        .map(|part| {
            let part = part.as_array().unwrap();
            part.iter().map(|m| m.as_str().unwrap()).collect()
        })
        .collect();
    assert_eq!(modules.len(), 16);
    assert_eq!(modules[0], ["tok_embeddings"]);
    assert_eq!(modules[1].first(), Some(&"layers.0"));
    assert_eq!(modules[1].len(), 9);
    assert_eq!(modules[15].len(), 13 + 2);
    assert_eq!(modules[15][12..], ["layers.125", "norm", "output"]);
    assert!(doc["parallelism"]
        .get("pipeline_parallel_layers_per_stage")
        .is_none());
}

/// Every dotted path to a leaf of a JSON value.
fn json_paths(value: &serde_json::Value, prefix: &str, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, child) in map {
                let path = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                json_paths(child, &path, out);
            }
        }
        _ => out.push(prefix.to_string()),
    }
}

#[test]
fn deepspeed_keys_are_ds_config_keys() {
    let known = known("deepspeed_keys.txt");
    for (name, spec) in cases() {
        let out = run(&spec, ExportTarget::Deepspeed);
        let value: serde_json::Value = serde_json::from_str(&out.text).expect("valid JSON");
        let mut paths = Vec::new();
        json_paths(&value, "", &mut paths);
        for path in paths {
            assert!(
                known.contains(&path),
                "{name}: {path} is not a ds_config key"
            );
        }
    }
}

#[test]
fn deepspeed_batch_arithmetic_holds() {
    for (name, spec) in cases() {
        let s = &spec.strategies[0];
        let value: serde_json::Value =
            serde_json::from_str(&run(&spec, ExportTarget::Deepspeed).text).unwrap();
        let n = |k: &str| value[k].as_u64().unwrap();
        // DeepSpeed's rule: train_batch_size = micro · accumulation · data-parallel size.
        assert_eq!(
            n("train_batch_size"),
            n("train_micro_batch_size_per_gpu") * n("gradient_accumulation_steps") * s.dp,
            "{name}"
        );
        assert_eq!(n("train_batch_size"), spec.train.global_batch, "{name}");
    }
    let value: serde_json::Value =
        serde_json::from_str(&run(&llama8b_zero3_offload(), ExportTarget::Deepspeed).text).unwrap();
    let zero = &value["zero_optimization"];
    assert_eq!(zero["stage"], 3);
    assert_eq!(zero["offload_optimizer"]["ratio"], 0.5);
    assert_eq!(zero["offload_param"]["device"], "cpu");
}

#[test]
fn deepspeed_notes_the_degrees_set_outside_ds_config() {
    // Megatron-DeepSpeed's flags and DeepSpeed's model code hold them: what the user sets, not
    // what DeepSpeed cannot run.
    let out = run(&mixtral_ep(), ExportTarget::Deepspeed);
    for prefix in ["tp = 2", "sequence_parallel", "pp = 4", "ep = 8"] {
        assert!(
            out.notes.iter().any(|u| u.starts_with(prefix)),
            "missing {prefix}: {:?}",
            out.notes
        );
        assert!(!out.unsupported.iter().any(|u| u.starts_with(prefix)));
    }
}

#[test]
fn inconsistent_strategies_are_reported_not_panicked() {
    let mut spec = llama70b_dense();
    let s = &mut spec.strategies[0];
    s.dp = 0;
    s.microbatch = 0;
    s.zero = 9;
    s.stages = Some(vec![1, 2]);
    s.ep = 4;
    for target in ExportTarget::ALL {
        let out = run(&spec, target);
        assert!(
            out.unsupported.iter().any(|u| u.starts_with("zero = 9")),
            "{target}"
        );
        assert!(out.notes.iter().any(|n| n.contains("GPUs")), "{target}");
    }
}

/// Strategies with extreme or inconsistent values: every target answers, none panics.
#[test]
fn hostile_strategies_never_panic() {
    let extremes = [0u64, 1, 3, 1 << 40, u64::MAX];
    for (_, base) in cases() {
        for field in 0..7 {
            for &x in &extremes {
                let mut spec = base.clone();
                let s = &mut spec.strategies[0];
                match field {
                    0 => s.dp = x,
                    1 => s.tp = x,
                    2 => s.pp = x,
                    3 => s.cp = x,
                    4 => s.ep = x,
                    5 => s.microbatch = x,
                    _ => s.interleave = x,
                }
                s.recompute = Recompute::Partial { full_layers: x };
                s.stages = Some(vec![x, x]);
                s.zero = (x % 256) as u8;
                s.offload = Offload {
                    optimizer: f64::NAN,
                    weights: -1.0,
                    gradients: 1e300,
                    activations: 0.5,
                };
                for target in ExportTarget::ALL {
                    let out = run(&spec, target);
                    assert!(!out.text.is_empty());
                }
            }
        }
    }
}

#[test]
fn a_norm_kernel_the_framework_cannot_run_is_reported() {
    let unsupported = |target: ExportTarget, kernel: NormKernel, compile: bool| {
        let mut spec = llama70b_dense();
        spec.train.norm_kernel = Some(kernel);
        spec.train.compile = compile;
        run(&spec, target)
            .unsupported
            .iter()
            .any(|u| u.starts_with("norm_kernel"))
    };
    // torchtitan's eager RMSNorm is composite and its compiled one fused; Megatron-LM's are
    // Transformer Engine's fused kernels.
    for (target, kernel, compile, reported) in [
        (ExportTarget::Torchtitan, NormKernel::Fused, false, true),
        (ExportTarget::Torchtitan, NormKernel::Fused, true, false),
        (
            ExportTarget::Torchtitan,
            NormKernel::Composite,
            false,
            false,
        ),
        (ExportTarget::Torchtitan, NormKernel::Composite, true, true),
        (ExportTarget::Megatron, NormKernel::Composite, false, true),
        (ExportTarget::Megatron, NormKernel::Fused, false, false),
    ] {
        assert_eq!(
            unsupported(target, kernel, compile),
            reported,
            "{target:?} {kernel:?} compile = {compile}"
        );
    }
}

#[test]
fn compile_is_written_for_torchtitan_and_reported_elsewhere() {
    let compiled = |fused: bool| {
        let mut spec = llama8b_zero3_offload();
        spec.train.compile = true;
        spec.train.fused_cross_entropy = Some(fused);
        spec
    };
    let section = |spec: &Spec| {
        let doc: toml_edit::DocumentMut = run(spec, ExportTarget::Torchtitan).text.parse().unwrap();
        (
            doc["compile"]["enable"].to_string().trim().to_string(),
            doc["compile"]["components"].to_string().trim().to_string(),
        )
    };
    // A compiled loss is a fused cross-entropy; PyTorch's eager one is not.
    assert_eq!(
        section(&compiled(false)),
        ("true".to_string(), "[\"model\"]".to_string())
    );
    assert_eq!(
        section(&compiled(true)),
        ("true".to_string(), "[\"model\", \"loss\"]".to_string())
    );
    let out = run(&compiled(true), ExportTarget::Torchtitan);
    assert!(!out
        .unsupported
        .iter()
        .any(|u| u.starts_with("fused_cross_entropy")));
    // Megatron-LM has no flag for it; DeepSpeed's engine compiles in the training script.
    for (target, listed) in [
        (
            ExportTarget::Megatron,
            run(&compiled(true), ExportTarget::Megatron).unsupported,
        ),
        (
            ExportTarget::Deepspeed,
            run(&compiled(true), ExportTarget::Deepspeed).notes,
        ),
    ] {
        assert!(
            listed.iter().any(|u| u.starts_with("compile = true:")),
            "{target}: {listed:?}"
        );
    }
}

#[test]
fn hybrid_sharding_is_written_in_each_framework_s_terms() {
    // dp 32 with state sharded over groups of 8 and replicated 4 times.
    let mut spec = llama70b_dense();
    spec.strategies[0].dp_shard = Some(8);
    let megatron = run(&spec, ExportTarget::Megatron);
    assert!(
        megatron.unsupported.is_empty(),
        "{:?}",
        megatron.unsupported
    );
    assert!(
        megatron
            .text
            .contains("--num-distributed-optimizer-instances 4"),
        "{}",
        megatron.text
    );
    spec.strategies[0].zero = 3;
    let titan: toml_edit::DocumentMut = run(&spec, ExportTarget::Torchtitan).text.parse().unwrap();
    assert_eq!(
        titan["parallelism"]["data_parallel_shard_degree"].as_integer(),
        Some(8)
    );
    assert_eq!(
        titan["parallelism"]["data_parallel_replicate_degree"].as_integer(),
        Some(4)
    );
    spec.strategies[0].pp = 1;
    spec.strategies[0].dp = 128;
    spec.strategies[0].interleave = 1;
    let deepspeed = run(&spec, ExportTarget::Deepspeed);
    let config: serde_json::Value = serde_json::from_str(&deepspeed.text).unwrap();
    assert_eq!(config["zero_optimization"]["mics_shard_size"], 8);
}

#[test]
fn a_checkpoint_interval_is_written_in_each_targets_terms() {
    let spec = llama70b_dense();
    let options = ExportOptions {
        checkpoint_every: Some(250),
    };
    let with = |target| export_with(&spec, &spec.strategies[0], target, &options);
    let megatron = with(ExportTarget::Megatron);
    let flags = megatron_flags(&megatron.text);
    assert!(flags.contains(&("--save-interval".to_string(), Some("250".to_string()))));
    let known_flags = known("megatron_flags.txt");
    assert!(flags.iter().all(|(flag, _)| known_flags.contains(flag)));
    let torchtitan = with(ExportTarget::Torchtitan);
    let keys = toml_keys(&torchtitan.text);
    let known_keys = known("torchtitan_keys.txt");
    for key in ["checkpoint.enable_checkpoint", "checkpoint.interval"] {
        assert!(keys.iter().any(|k| k == key), "{key}");
        assert!(known_keys.contains(key), "{key}");
    }
    assert!(torchtitan.text.contains("interval = 250"));
    let deepspeed = with(ExportTarget::Deepspeed);
    assert!(deepspeed
        .notes
        .iter()
        .any(|n| n.starts_with("save a checkpoint every 250 steps")));
    // Without an interval none of it is written.
    let plain = run(&spec, ExportTarget::Megatron);
    assert!(!plain.text.contains("--save-interval"));
}
