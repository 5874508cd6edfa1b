//! The language end to end through the public API: values and defaults that reach the typed
//! spec, `use` and `extends`, and every semantic check.

use std::path::PathBuf;

use tessel_grammar::{
    gpu_catalog, load_definitions_str, load_file, load_str, Choice, NormKernel, Offload, Precision,
    Recompute, Spec,
};

const MODEL: &str = "model tiny {
  layers = 4, hidden = 256, heads = 8, ffn_hidden = 1024, vocab = 32000, mlp = swiglu
}
";
const CLUSTER: &str = "cluster box {
  gpu = A100_80GB, nodes = 2, gpus_per_node = 8
  intra_node = { bandwidth = 300 GB/s }
  inter_node = { bandwidth = 200 Gb/s, latency = 10 us }
}
";
const TRAIN: &str = "train { model = tiny, cluster = box, seq_len = 2048, global_batch = 64 }\n";

fn base() -> String {
    format!("{MODEL}{CLUSTER}{TRAIN}")
}

fn spec(text: &str) -> Spec {
    match load_str("t.tsl", text) {
        Ok(spec) => spec,
        Err(d) => panic!("unexpected errors:\n{d}"),
    }
}

/// The messages of every error in `text`, in order.
fn errors(text: &str) -> Vec<String> {
    match load_definitions_str("t.tsl", text) {
        Ok(_) => Vec::new(),
        Err(d) => d.iter().map(|e| e.message.clone()).collect(),
    }
}

fn assert_error(text: &str, expected: &str) {
    let found = errors(text);
    assert!(
        found.iter().any(|m| m == expected),
        "expected {expected:?} among {found:#?}"
    );
}

#[test]
fn catalog_is_complete_and_dense() {
    let catalog = gpu_catalog();
    let names: Vec<&str> = catalog.iter().map(|g| g.name.as_str()).collect();
    for required in [
        "V100_32GB",
        "A100_40GB",
        "A100_80GB",
        "A800",
        "H100_SXM",
        "H100_PCIE",
        "H800",
        "H200",
        "B200",
        "L4",
        "L40S",
        "RTX_4090",
        "RTX_3090",
        "MI300X",
    ] {
        assert!(
            names.contains(&required),
            "{required} missing from {names:?}"
        );
    }
    let h100 = catalog.iter().find(|g| g.name == "H100_SXM").unwrap();
    // Dense, not the datasheet's sparse 1,979 TFLOPS.
    assert_eq!(h100.peak.bf16, 989e12);
    assert_eq!(h100.peak.fp8, 1979e12);
    assert_eq!(h100.memory, 80.0 * 1024f64.powi(3));
    assert_eq!(h100.hbm_bandwidth, 3.35e12);
    let a100 = catalog.iter().find(|g| g.name == "A100_80GB").unwrap();
    assert_eq!(a100.peak.fp8, 0.0);
    assert_eq!(a100.peak.tf32, 156e12);
    // `extends` inside the catalog: the H200 keeps the H100's tensor cores.
    let h200 = catalog.iter().find(|g| g.name == "H200").unwrap();
    assert_eq!(h200.peak, h100.peak);
    assert_eq!(h200.memory, 141e9);
}

#[test]
fn defaults_fill_the_typed_spec() {
    let s = spec(&base());
    assert_eq!(s.model.kv_heads, 8);
    assert_eq!(s.model.head_dim, 32);
    assert!(!s.model.tie_embeddings && !s.model.bias);
    assert_eq!(s.train.precision, Precision::Bf16);
    assert!(s.train.flash_attention);
    assert_eq!(s.cluster.intra_node.latency, 3e-6);
    assert_eq!(s.cluster.inter_node.latency, 10e-6);
    // 200 Gb/s is 25 GB/s; the A100's PCIe gen4 host link; 2x the node's GPU memory.
    assert_eq!(s.cluster.inter_node.bandwidth, 25e9);
    assert_eq!(s.cluster.host_link, 25e9);
    assert_eq!(s.cluster.host_memory, 2.0 * 8.0 * 80.0 * 1024f64.powi(3));
    assert_eq!(s.search, tessel_grammar::SearchSpace::default());
}

#[test]
fn strategy_values_and_dp_default() {
    let s = spec(&format!(
        "{}strategy a {{ tp = 2; pp = 2; microbatch = 2; recompute = {{ full_layers = 1 }}
           offload = {{ optimizer = 50%, activations = 0.25 }}; zero = 2; stages = [1, 3] }}
         strategy b {{ }}",
        // Only Tessel's runtime runs all of `a`.
        base().replace("global_batch = 64", "global_batch = 64, framework = tessel")
    ));
    let a = s.strategy("a").unwrap();
    assert_eq!((a.dp, a.tp, a.pp, a.cp, a.ep), (4, 2, 2, 1, 1));
    assert_eq!(a.recompute, Recompute::Partial { full_layers: 1 });
    assert_eq!(
        a.offload,
        Offload {
            optimizer: 0.5,
            weights: 0.0,
            gradients: 0.0,
            activations: 0.25
        }
    );
    assert_eq!(a.stages, Some(vec![1, 3]));
    let b = s.strategy("b").unwrap();
    assert_eq!((b.dp, b.microbatch, b.zero), (16, 1, 0));
    assert_eq!(b.recompute, Recompute::None);
}

#[test]
fn search_values_lists_ranges_and_auto() {
    let s = spec(&format!(
        "{}search {{ tp = [1, 2]; pp = 1..=4; cp = 2; ep = auto
           recompute = [none, {{ full_layers = 2 }}]; sequence_parallel = [true, false]
           zero = 0..=3; offload = [none, {{ optimizer = 1 }}]; memory_limit = 0.9
           time_limit = 2 min; top = 3 }}",
        base()
    ));
    let search = &s.search;
    assert_eq!(search.tp, Choice::Values(vec![1, 2]));
    assert_eq!(search.pp, Choice::Values(vec![1, 2, 3, 4]));
    assert_eq!(search.cp, Choice::Values(vec![2]));
    assert_eq!(search.ep, Choice::Auto);
    assert_eq!(search.dp, Choice::Auto);
    assert_eq!(
        search.recompute,
        Choice::Values(vec![Recompute::None, Recompute::Partial { full_layers: 2 }])
    );
    assert_eq!(search.zero, Choice::Values(vec![0, 1, 2, 3]));
    assert_eq!(search.memory_limit, 0.9);
    assert_eq!(search.time_limit, Some(120.0));
    assert_eq!(search.top, Some(3));
}

#[test]
fn lets_and_earlier_fields_in_arithmetic() {
    let s = spec(&format!(
        "let width = 128 * 2
         model tiny {{
           layers = 4; hidden = width; heads = hidden / 32; ffn_hidden = 4 * hidden
           vocab = 32000; mlp = gelu
         }}
         {CLUSTER}{TRAIN}"
    ));
    assert_eq!(
        (s.model.hidden, s.model.heads, s.model.ffn_hidden),
        (256, 8, 1024)
    );
}

#[test]
fn extends_inherits_and_overrides() {
    let s = spec(&format!(
        "{MODEL}{CLUSTER}
         cluster big extends box {{ nodes = 2 * gpus_per_node }}
         gpu fast extends H100_SXM {{ efficiency = {{ matmul = 0.7 }}, gemm_tile = 16 }}
         cluster fast_box extends big {{ gpu = fast }}
         train {{ model = tiny, cluster = fast_box, seq_len = 2048, global_batch = 64 }}"
    ));
    assert_eq!(s.cluster.nodes, 16);
    assert_eq!(s.cluster.gpu.name, "fast");
    assert_eq!(s.cluster.gpu.peak.bf16, 989e12);
    assert_eq!(s.cluster.gpu.efficiency.matmul, Some(0.7));
    assert_eq!(
        (s.cluster.gpu.gemm_tile, s.cluster.gpu.compute_units),
        (Some(16), None)
    );
    assert_eq!(s.cluster.inter_node.latency, 10e-6);
}

#[test]
fn moe_defaults_and_ffn_from_experts() {
    let s = spec(&format!(
        "model tiny {{ layers = 4, hidden = 256, heads = 8, vocab = 32000, mlp = swiglu
           moe = {{ experts = 8, top_k = 2, expert_ffn_hidden = 512 }} }}
         {CLUSTER}{TRAIN}"
    ));
    let moe = s.model.moe.as_ref().unwrap();
    assert_eq!((moe.every, moe.shared_experts, moe.first_dense), (1, 0, 0));
    assert_eq!(moe.capacity_factor, 1.0);
    assert_eq!(s.model.ffn_hidden, 512);
}

#[test]
fn expert_ffn_hidden_defaults_to_ffn_hidden() {
    let s = spec(&format!(
        "model tiny {{ layers = 4, hidden = 256, heads = 8, vocab = 32000, mlp = swiglu
           ffn_hidden = 704, moe = {{ experts = 8, top_k = 2, every = 1 }} }}
         {CLUSTER}{TRAIN}"
    ));
    let moe = s.model.moe.as_ref().unwrap();
    assert_eq!((moe.expert_ffn_hidden, s.model.ffn_hidden), (704, 704));
    // Without either width there is nothing to default to.
    let found = errors(
        "model tiny { layers = 4, hidden = 256, heads = 8, vocab = 32000, mlp = swiglu
           moe = { experts = 8, top_k = 2 } }",
    );
    assert!(
        found
            .iter()
            .any(|m| m.ends_with("is missing the field `expert_ffn_hidden`")),
        "{found:#?}"
    );
}

/// A directory of spec files for `use` tests, removed when dropped.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str, files: &[(&str, &str)]) -> Dir {
        let dir = std::env::temp_dir().join(format!("tessel-{name}-{}", std::process::id()));
        for (path, text) in files {
            let path = dir.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        Dir(dir)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn use_is_relative_to_the_including_file_and_reads_each_file_once() {
    let dir = Dir::new(
        "use",
        &[
            ("main.tsl", "use \"lib/a.tsl\"\nuse \"lib/b.tsl\"\ntrain { model = tiny, cluster = box, seq_len = 2048, global_batch = 64 }\n"),
            ("lib/a.tsl", &format!("use \"common.tsl\"\n{MODEL}")),
            ("lib/b.tsl", "use \"common.tsl\"\n"),
            ("lib/common.tsl", CLUSTER),
        ],
    );
    let s = load_file(&dir.0.join("main.tsl")).unwrap();
    assert_eq!(s.cluster.name, "box");
}

#[test]
fn use_cycles_name_the_chain() {
    let dir = Dir::new(
        "cycle",
        &[
            ("a.tsl", "use \"b.tsl\"\n"),
            ("b.tsl", "use \"c.tsl\"\n"),
            ("c.tsl", "use \"a.tsl\"\n"),
        ],
    );
    let d = load_file(&dir.0.join("a.tsl")).unwrap_err();
    let message = &d.iter().next().unwrap().message;
    assert!(
        message.starts_with("`use` cycle: `") && message.matches(" uses ").count() == 3,
        "{message}"
    );
    assert!(message.ends_with("a.tsl`"), "{message}");
}

#[test]
fn extends_cycles_and_unknown_parents() {
    assert_error(
        "model a extends b { layers = 1 }\nmodel b extends a { layers = 2 }",
        "`extends` cycle: `a` extends `b` extends `a`",
    );
    assert_error(
        "cluster x extends dgx { nodes = 1 }",
        "unknown cluster `dgx` in `extends`",
    );
}

#[test]
fn reference_checks() {
    assert_error(
        &format!("{MODEL}{CLUSTER}train {{ model = tinny, cluster = box, seq_len = 1, global_batch = 1 }}"),
        "unknown model `tinny`",
    );
    assert_error(
        &format!(
            "{MODEL}{CLUSTER}train {{ model = tiny, cluster = bx, seq_len = 1, global_batch = 1 }}"
        ),
        "unknown cluster `bx`",
    );
    let d = load_definitions_str("t.tsl", &CLUSTER.replace("A100_80GB", "H100-SXM")).unwrap_err();
    let e = d.iter().next().unwrap();
    assert_eq!(e.message, "unknown GPU `H100-SXM`");
    assert_eq!(e.help.as_deref(), Some("did you mean `H100_SXM`?"));
    assert_eq!((e.line, e.column), (2, 9));
}

#[test]
fn dimension_checks() {
    let gpu = |memory: &str| {
        format!(
            "gpu g {{ memory = {memory}, bf16 = 1 TFLOPS, fp16 = 1 TFLOPS, fp32 = 1 TFLOPS, \
             hbm_bandwidth = 1 TB/s }}"
        )
    };
    assert_error(
        &gpu("80 GB/s"),
        "`memory` expects a size such as `80 GiB`, found a bandwidth",
    );
    assert_error(
        &gpu("80"),
        "`memory` expects a size such as `80 GiB`, found a number without a unit",
    );
    assert_error(
        &gpu("80 GiB * 2 s"),
        "`memory` expects a size such as `80 GiB`, found a quantity in B·s",
    );
    assert!(errors(&gpu("8 * 10 GiB")).is_empty());
    assert_error(&gpu("80 Gibs"), "unknown unit `Gibs`");
}

#[test]
fn range_checks() {
    let model = |field: &str| MODEL.replace("layers = 4", field);
    assert_error(&model("layers = 0"), "`layers` must be at least 1, found 0");
    assert_error(
        &model("layers = -4"),
        "`layers` must be at least 1, found -4",
    );
    assert_error(
        &model("layers = 4.5"),
        "`layers` expects a whole number, found 4.5",
    );
    assert_error(
        &model("layers = 2e6"),
        "`layers` (2000000) is more than the 1000000 supported",
    );
    assert_error(
        &format!("{}strategy s {{ zero = 4 }}", base()),
        "`zero` is a ZeRO stage from 0 to 3, found 4",
    );
    assert_error(
        &format!("{}strategy s {{ offload = {{ weights = 1.5 }} }}", base()),
        "`weights` must be between 0 and 1, found 1.5",
    );
    assert_error(
        &format!("{}search {{ memory_limit = 0% }}", base()),
        "`memory_limit` must be above 0",
    );
    assert_error(
        &format!("{}search {{ tp = 1..=100000 }}", base()),
        "`tp` ranges over 100000 values; at most 4096 are searched",
    );
}

#[test]
fn missing_and_duplicate_checks() {
    assert_error(
        "model m { layers = 1 }",
        "model `m` is missing the field `hidden`",
    );
    assert_error(&format!("{MODEL}{MODEL}"), "model `tiny` is defined twice");
    assert_error(
        "model m { layers = 1; layers = 2 }",
        "field `layers` is set twice in model `m`",
    );
    assert_error(
        &format!("{}train {{ }}", base()),
        "a spec has one `train` block; this is another",
    );
    assert_error(
        &MODEL.replace("vocab", "vocabulary"),
        "unknown field `vocabulary` in model `tiny`",
    );
}

#[test]
fn model_shape_checks() {
    assert_error(
        &MODEL.replace("heads = 8", "heads = 6"),
        "`heads` (6) must divide `hidden` (256)",
    );
    assert!(errors(&MODEL.replace("heads = 8", "heads = 6, head_dim = 64")).is_empty());
    assert_error(
        &MODEL.replace("heads = 8", "heads = 8, kv_heads = 3"),
        "`kv_heads` (3) must divide `heads` (8)",
    );
    assert_error(
        &MODEL.replace(
            "mlp = swiglu",
            "mlp = swiglu, moe = { experts = 2, top_k = 3, expert_ffn_hidden = 8 }",
        ),
        "`top_k` (3) cannot exceed `experts` (2)",
    );
    assert_error(
        &MODEL.replace("mlp = swiglu", "mlp = gelu, position = learned"),
        "learned position embeddings need `max_seq_len`",
    );
    assert_error(
        &MODEL
            .replace("hidden = 256", "hidden = 1e9")
            .replace("heads = 8", "heads = 1"),
        "model `tiny` has about 1.6e19 parameters, more than the 1e16 supported",
    );
}

#[test]
fn strategy_checks() {
    let with = |s: &str| format!("{}strategy s {{ {s} }}", base());
    assert_error(
        &with("tp = 8; pp = 2; dp = 2"),
        "dp·tp·pp·cp = 2·8·2·1 = 32 GPUs, but cluster `box` has 16",
    );
    assert_error(
        &with("tp = 3"),
        "tp·pp·cp = 3·1·1 = 3 does not divide the 16 GPUs of cluster `box`",
    );
    assert_error(&with("ep = 2"), "`ep` is 2 but model `tiny` has no experts");
    assert_error(
        &with("pp = 2; stages = [1, 1, 1]"),
        "`stages` lists 3 stages, but pp = 2",
    );
    assert_error(
        &with("pp = 2; stages = [1, 1]"),
        "`stages` places 2 layers, but model `tiny` has 4",
    );
    assert_error(
        &with("microbatch = 3"),
        "`global_batch` (64) is not divisible by dp·microbatch = 16·3 = 48",
    );
    assert_error(
        &with("interleave = 2"),
        "`interleave` needs pipeline parallelism (`pp` above 1)",
    );
    assert_error(
        &with("tp = 1e15; pp = 1e15; dp = 1e15"),
        "dp·tp·pp·cp = 1000000000000000·1000000000000000·1000000000000000·1 = 18446744073709551615 GPUs, but cluster `box` has 16",
    );
    let moe = MODEL.replace(
        "mlp = swiglu",
        "mlp = swiglu, moe = { experts = 8, top_k = 2, expert_ffn_hidden = 8 }",
    );
    assert_error(
        &format!("{moe}{CLUSTER}{TRAIN}strategy s {{ tp = 2; pp = 2; ep = 8 }}"),
        "`ep` (8) must divide dp·cp = 4·1 = 4",
    );
    assert!(errors(&format!(
        "{moe}{CLUSTER}{TRAIN}strategy s {{ tp = 2; ep = 8 }}"
    ))
    .is_empty());
}

#[test]
fn train_checks() {
    assert_error(
        &format!("{MODEL}{CLUSTER}train {{ model = tiny, cluster = box, seq_len = 2048, global_batch = 64, precision = fp8 }}"),
        "GPU `A100_80GB` of cluster `box` has no FP8 tensor cores (its `fp8` is 0)",
    );
    assert_error(
        &format!(
            "{}{CLUSTER}{TRAIN}",
            MODEL.replace("mlp = swiglu", "mlp = swiglu, max_seq_len = 1024")
        ),
        "`seq_len` (2048) exceeds the `max_seq_len` (1024) of model `tiny`",
    );
    let train = |fields: &str| {
        format!("{MODEL}{CLUSTER}train {{ model = tiny, cluster = box, seq_len = 2048, global_batch = 64, {fields} }}")
    };
    assert_error(
        &train("framework = fsdp, compile = true, norm_kernel = composite"),
        "`norm_kernel = composite`, but `compile = true` fuses the norm's operators",
    );
    assert_eq!(spec(&base()).train.norm_kernel, None);
    assert_eq!(
        spec(&train("framework = fsdp, norm_kernel = fused"))
            .train
            .norm_kernel,
        Some(NormKernel::Fused)
    );
}

#[test]
fn overlap_defaults_by_framework_and_as_written() {
    let with = |extra: &str| {
        spec(&format!(
            "{MODEL}{CLUSTER}train {{ model = tiny, cluster = box, seq_len = 2048, global_batch = 64{extra} }}"
        ))
        .train
    };
    let megatron = with("");
    assert!(megatron.overlap(false).grad_reduce && megatron.overlap(false).param_gather);
    assert!(!megatron.overlap(false).tp_comm);
    let deepspeed = with(", framework = deepspeed");
    assert!(!deepspeed.overlap(false).grad_reduce && deepspeed.overlap(true).grad_reduce);
    assert!(deepspeed.overlap(false).param_gather && !deepspeed.overlap(true).param_gather);
    let written = with(", overlap = { grad_reduce = false, tp_comm = true }");
    let overlap = written.overlap(false);
    assert!(!overlap.grad_reduce && overlap.param_gather && overlap.tp_comm);
    assert_error(
        &format!(
            "{MODEL}{CLUSTER}train {{ model = tiny, cluster = box, seq_len = 2048, global_batch = 64, overlap = {{ grad_reduc = true }} }}"
        ),
        "unknown field `grad_reduc` in `overlap`",
    );
}

#[test]
fn all_errors_of_a_file_are_reported() {
    let text = "model a {\n  layers = = 1\n}\nmodel b { layers = 0 }\ncluster c { gpu = A10 }\n";
    let found = errors(text);
    assert!(found.len() >= 4, "{found:#?}");
    assert!(found[0].starts_with("expected a value"));
}

#[test]
fn diagnostics_render_like_a_compiler() {
    let d = load_str("job.tsl", &MODEL.replace("layers = 4", "layers = 0")).unwrap_err();
    let text = d.to_string();
    assert!(
        text.starts_with(
            "error: `layers` must be at least 1, found 0\n --> job.tsl:2:12\n  |\n\
             2 |   layers = 0, hidden = 256, heads = 8, ffn_hidden = 1024, vocab = 32000, mlp = swiglu\n  \
             |            ^\n"
        ),
        "{text}"
    );
}

#[test]
fn the_language_page_example_loads() {
    // The whole example of shared/design/LANGUAGE.md, with its `use` inlined.
    let cluster = include_str!("../../specs/clusters/dgx-h100.tsl");
    let example = r#"
model llama3_70b {
  layers     = 80
  hidden     = 8192
  heads      = 64
  kv_heads   = 8                     # grouped-query attention; default = heads
  ffn_hidden = 28672
  vocab      = 128256
  mlp        = swiglu                # gelu | swiglu
  norm       = rmsnorm               # layernorm | rmsnorm
  tie_embeddings = false
}

cluster h100_1024 extends dgx_h100 {  # inherit every field, override some
  nodes = 128
}

train {
  model        = llama3_70b
  cluster      = h100_1024
  seq_len      = 8192
  global_batch = 512                  # sequences per optimizer step
  precision    = bf16                 # bf16 | fp16 | fp8 | fp32
  optimizer    = adam                 # adam | sgd
}

search {
  tp         = [1, 2, 4, 8]
  pp         = auto
  cp         = 1
  microbatch = [1, 2, 4]
  recompute  = [none, selective, full]
  zero       = [0, 1]
  offload    = none
  objective  = throughput
  memory_limit = 95%                  # of each GPU's memory the plan may use
}

strategy megatron_reference {         # a fixed configuration, for `tessel estimate`
  tp = 8; pp = 4; dp = 32
  microbatch = 1
  interleave = 5
  recompute = selective
  sequence_parallel = true
  zero = 1
}
"#;
    let s = spec(&format!("{cluster}{example}"));
    assert_eq!(s.cluster.total_gpus(), 1024);
    assert_eq!(s.cluster.intra_node.bandwidth, 450e9);
    assert_eq!(s.cluster.inter_node.bandwidth, 50e9);
    assert_eq!(s.search.offload, Choice::Values(vec![Offload::default()]));
    let reference = s.strategy("megatron_reference").unwrap();
    assert_eq!(
        (
            reference.dp,
            reference.tp,
            reference.pp,
            reference.interleave
        ),
        (32, 8, 4, 5)
    );
    assert_eq!(reference.recompute, Recompute::Selective);
}

#[test]
fn recompute_of_named_modules() {
    let moe = MODEL.replace(
        "mlp = swiglu",
        "mlp = swiglu, moe = { experts = 8, top_k = 2, expert_ffn_hidden = 8 }",
    );
    let strategy = |model: &str, s: &str| format!("{model}{CLUSTER}{TRAIN}strategy s {{ {s} }}");
    let modules = spec(&strategy(
        &moe,
        "recompute = { modules = [moe_act, layernorm] }",
    ));
    let recompute = modules.strategies[0].recompute;
    assert_eq!(recompute.to_string(), "{ modules = [layernorm, moe_act] }");
    assert!(matches!(recompute, Recompute::Modules(_)));
    // The attention core alone is `selective`: one spelling for one choice.
    let core = spec(&strategy(MODEL, "recompute = { modules = [core_attn] }"));
    assert_eq!(core.strategies[0].recompute, Recompute::Selective);
    assert_error(
        &strategy(MODEL, "recompute = { modules = [moe_act] }"),
        "`moe_act` recomputes the experts' activation, but model `tiny` has no experts",
    );
    assert_error(
        &strategy(MODEL, "recompute = { modules = [mlp] }"),
        "recompute of `mlp` is not modelled by Tessel yet",
    );
    assert_error(
        &strategy(MODEL, "recompute = { modules = [layernrm] }"),
        "unknown recompute module `layernrm`: Tessel models core_attn, layernorm, moe_act",
    );
    assert_error(
        &strategy(
            MODEL,
            "recompute = { modules = [layernorm], full_layers = 1 }",
        ),
        "`recompute` takes `full_layers` or `modules`, not both",
    );
    // Only Megatron-Core recomputes modules other than the attention core.
    let mut fsdp = modules.strategies[0].clone();
    fsdp.zero = 3;
    let reasons: Vec<String> = tessel_grammar::Framework::Fsdp
        .limits(&fsdp, 4)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        reasons,
        vec![
            "recompute = { modules = [layernorm, moe_act] }: torchtitan recomputes the attention \
             core alone (selective) among modules, not layernorm, moe_act"
                .to_string()
        ]
    );
    assert!(tessel_grammar::Framework::Megatron
        .limits(&modules.strategies[0], 4)
        .is_empty());
}

#[test]
fn experts_fold_over_tensor_and_data_parallel_ranks() {
    let moe = MODEL.replace(
        "mlp = swiglu",
        "mlp = swiglu, moe = { experts = 8, top_k = 2, expert_ffn_hidden = 8 }",
    );
    let strategy = |s: &str| format!("{moe}{CLUSTER}{TRAIN}strategy s {{ {s} }}");
    // tp 2 × dp 4 (pp 2): unfolded, ep 8 does not divide dp; folded, etp 1 × ep 8 divides 8.
    let folded = spec(&strategy(
        "tp = 2; pp = 2; ep = 8; etp = 1; sequence_parallel = true",
    ));
    assert_eq!(folded.strategies[0].expert_tp(), 1);
    assert_error(
        &strategy("tp = 4; pp = 2; ep = 2; etp = 3; sequence_parallel = true"),
        "etp = 3 must divide tp = 4 (model `tiny`)",
    );
    assert_error(
        &strategy("tp = 2; pp = 2; ep = 8; etp = 1"),
        "folded experts (etp below tp) need sequence parallelism, as Megatron-Core's MoE layers \
         do (model `tiny`)",
    );
}

#[test]
fn only_end_chunks_may_hold_no_layer() {
    let with = |s: &str| format!("{}strategy s {{ {s} }}", base());
    let embedding_only = spec(&with("pp = 2; stages = [0, 4]"));
    assert_eq!(embedding_only.strategies[0].stages, Some(vec![0, 4]));
    assert_error(
        &with("pp = 2; interleave = 2; stages = [1, 0, 2, 1]"),
        "`stages`: chunk 1 holds no layer; only the first chunk (the embedding alone) or the last \
         (the loss alone) may",
    );
}

#[test]
fn a_strategy_the_framework_cannot_run_is_an_error_at_its_field() {
    let strategy = |train: &str, s: &str| format!("{MODEL}{CLUSTER}{train}strategy s {{ {s} }}");
    let megatron = strategy(TRAIN, "pp = 2; zero = 3");
    let err = load_str("t.tsl", &megatron).unwrap_err();
    let d = &err.0[0];
    assert_eq!(
        d.message,
        "zero = 3: Megatron-LM runs ZeRO stages [0, 1] with pp > 1; for ZeRO-2/3 use framework = \
         megatron_fsdp (Megatron-FSDP), fsdp or deepspeed"
    );
    // At the field that asks for it, with the frameworks that run the whole strategy.
    let line = megatron.lines().count();
    assert_eq!((d.line, d.column), (line, 29));
    assert_eq!(
        d.help.as_deref(),
        Some(
            "change the strategy, or set train.framework to `fsdp` (torchtitan) or `tessel` \
             (Tessel's runtime), which run all of it"
        )
    );
    let fsdp = TRAIN.replace("global_batch = 64", "global_batch = 64, framework = fsdp");
    spec(&strategy(&fsdp, "pp = 2; zero = 3"));
    // Options that differ by stage run only on Tessel's runtime.
    assert_error(
        &strategy(TRAIN, "pp = 2; zero = 1; recompute = [full, selective]"),
        "recompute = [full, selective]: Megatron-LM applies one recompute to every pipeline stage",
    );
    let tessel = TRAIN.replace("global_batch = 64", "global_batch = 64, framework = tessel");
    spec(&strategy(
        &tessel,
        "pp = 2; zero = 3; recompute = [full, selective]",
    ));
}
