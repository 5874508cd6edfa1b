//! `tessel check SPEC`: parse and validate a spec, then summarize what it describes.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use tessel_grammar::{
    load_definitions, Choice, ClusterSpec, Definitions, Link, MemorySavingKernels, ModelSpec,
    Offload, Precision, Recompute, SearchSpace, ServingSpec, Spec, Strategy,
};

use super::{bytes, count, duration, grouped, si, EXIT_BAD_INPUT};

#[derive(clap::Args)]
pub struct Args {
    /// The spec file (`*.tsl`).
    pub spec: PathBuf,
}

pub fn run(args: &Args) -> ExitCode {
    match load_definitions(&args.spec) {
        Ok(definitions) if defines_nothing(&definitions) => {
            eprintln!(
                "error: `{}` defines no model, cluster, GPU or job to check",
                args.spec.display()
            );
            ExitCode::from(EXIT_BAD_INPUT)
        }
        Ok(definitions) => {
            print!("{}", report(&args.spec.display().to_string(), &definitions));
            ExitCode::SUCCESS
        }
        Err(diagnostics) => super::print_diagnostics(&args.spec, &diagnostics),
    }
}

fn defines_nothing(d: &Definitions) -> bool {
    d.spec.is_none()
        && d.serving.is_none()
        && d.models.is_empty()
        && d.clusters.is_empty()
        && d.gpus.is_empty()
}

/// The whole summary: the job when the file has a `train` block, else every definition.
fn report(file: &str, definitions: &Definitions) -> String {
    let mut out = format!("ok: {file}\n");
    match (&definitions.spec, &definitions.serving) {
        (Some(spec), _) => job(&mut out, spec),
        (None, Some(serving)) => serving_job(&mut out, serving),
        (None, None) => {
            for model in &definitions.models {
                out.push('\n');
                model_summary(&mut out, model, None);
            }
            for cluster in &definitions.clusters {
                out.push('\n');
                cluster_summary(&mut out, cluster, Precision::Bf16);
            }
            for gpu in &definitions.gpus {
                let _ = write!(
                    out,
                    "\ngpu {}\n  {:<16}{}, {} bf16, {} HBM\n",
                    gpu.name,
                    "memory",
                    bytes(gpu.memory),
                    si(gpu.peak.bf16, "FLOP/s"),
                    si(gpu.hbm_bandwidth, "B/s")
                );
            }
        }
    }
    out
}

fn serving_job(out: &mut String, spec: &ServingSpec) {
    let serve = &spec.serve;
    out.push('\n');
    model_summary(out, &spec.model, None);
    out.push('\n');
    cluster_summary(out, &spec.cluster, serve.precision);
    let w = &serve.workload;
    let _ = writeln!(out, "\nserve");
    let _ = writeln!(
        out,
        "  {:<16}{}, KV cache {}",
        "precision",
        precision_name(serve.precision),
        precision_name(serve.kv_precision)
    );
    let rate = w
        .rate
        .map_or("the trace's own".to_string(), |r| format!("{r} requests/s"));
    match &w.trace {
        Some(trace) => {
            let _ = writeln!(out, "  {:<16}trace {} at {rate}", "workload", trace.path);
        }
        None => {
            let lengths = |l: &tessel_grammar::LengthDistribution| {
                let max = l.max.map_or(String::new(), |m| format!(", at most {m}"));
                format!("{} mean {}{max}", l.shape.name(), l.mean)
            };
            let _ = writeln!(
                out,
                "  {:<16}{rate}; prompts {}; outputs {}",
                "workload",
                lengths(&w.prompt),
                lengths(&w.output)
            );
        }
    }
    let _ = writeln!(
        out,
        "  {:<16}ttft ≤ {} s, tpot ≤ {} s, for {}% of requests",
        "slo",
        serve.slo.ttft,
        serve.slo.tpot,
        serve.slo.attainment * 100.0
    );
    let _ = writeln!(
        out,
        "  {:<16}{} on {}; {} requests per simulation, seed {}",
        "deployment",
        serve.deployment.name(),
        serve.engine.name(),
        w.requests,
        w.seed
    );
}

fn job(out: &mut String, spec: &Spec) {
    let train = &spec.train;
    out.push('\n');
    model_summary(out, &spec.model, Some(train.seq_len));
    out.push('\n');
    cluster_summary(out, &spec.cluster, train.precision);
    let tokens = train.global_batch * train.seq_len;
    let _ = writeln!(out, "\ntrain");
    let _ = writeln!(
        out,
        "  {:<16}{} sequences of {} tokens = {} tokens",
        "batch",
        train.global_batch,
        train.seq_len,
        grouped(tokens)
    );
    let _ = writeln!(
        out,
        "  {:<16}{}, {}, flash attention {}{}",
        "precision",
        precision_name(train.precision),
        match train.optimizer {
            tessel_grammar::Optimizer::Adam => "adam",
            tessel_grammar::Optimizer::Sgd => "sgd",
        },
        match (train.flash_attention, train.attention_kernel) {
            (false, _) => "off".to_string(),
            (true, None) => "on".to_string(),
            (true, Some(kernel)) => format!("on ({})", kernel.name()),
        },
        if train.dropout > 0.0 {
            format!(", dropout {}", train.dropout)
        } else {
            String::new()
        }
    );
    if !train.framework.is_megatron() {
        let _ = writeln!(out, "  {:<16}{}", "framework", train.framework.name());
    }
    if train.precision == tessel_grammar::Precision::Fp8 {
        let _ = writeln!(out, "  {:<16}{}", "fp8 scaling", train.fp8_scaling().name());
    }
    if train.overlap.is_some() {
        let on = |flag: bool| if flag { "on" } else { "off" };
        let overlap = train.overlap(false);
        let _ = writeln!(
            out,
            "  {:<16}gradient reduction {}, parameter gather {}, tp collectives {}",
            "overlap",
            on(overlap.grad_reduce),
            on(overlap.param_gather),
            on(overlap.tp_comm)
        );
    }
    let kernels = match train.memory_saving_kernels {
        MemorySavingKernels::Off => None,
        MemorySavingKernels::On => Some("Tempo's in-place GELU and norms, dropout output rebuilt"),
        MemorySavingKernels::Auto => Some("Tempo's, where the planner finds them faster"),
    };
    if let Some(kernels) = kernels {
        let _ = writeln!(out, "  {:<16}{kernels}", "memory kernels");
    }
    if let Some(c) = &train.grad_compression {
        let _ = writeln!(
            out,
            "  {:<16}{}, with error feedback, where faster",
            "gradients",
            c.label()
        );
    }
    if train.compile {
        let _ = writeln!(out, "  {:<16}torch.compile of each block", "compile");
    }
    if let Some(finetune) = &train.finetune {
        let _ = if finetune.is_adapter() {
            writeln!(
                out,
                "  {:<16}{} rank {} on {}",
                "finetune",
                finetune.method.name(),
                finetune.rank,
                finetune.targets.names().join(", ")
            )
        } else {
            writeln!(out, "  {:<16}full", "finetune")
        };
    }
    if let Some(failures) = &train.failures {
        let gpus = spec.cluster.total_gpus();
        let per_gpu = match failures.mtbf {
            tessel_grammar::Mtbf::PerGpu(s) => format!("{:.0} h per GPU, ", s / 3600.0),
            tessel_grammar::Mtbf::Job(_) => String::new(),
        };
        let _ = writeln!(
            out,
            "  {:<16}MTBF {per_gpu}{:.2} h for the job's {gpus} GPUs; restart {:.0} s",
            "failures",
            failures.job_mtbf_s(gpus) / 3600.0,
            failures.restart_s
        );
        let target = match (failures.checkpoint_to, failures.disk_bandwidth) {
            (Some(to), _) => to.name().to_string(),
            (None, Some(_)) => "host or disk, the planner's choice".to_string(),
            (None, None) => "host".to_string(),
        };
        let disk = failures
            .disk_bandwidth
            .map(|b| format!(" (disk {} per GPU)", si(b, "B/s")))
            .unwrap_or_default();
        let _ = writeln!(out, "  {:<16}to {target}{disk}", "checkpoints");
    }
    if !spec.model.encoders.is_empty() {
        let training = train.multimodal.unwrap_or_default();
        let placement = match (training.placement, training.encoder_gpus) {
            (tessel_grammar::EncoderPlacement::Separate, Some(gpus)) => format!(
                "on {gpus} GPUs of their own, apart from the cluster's {} above",
                spec.cluster.total_gpus()
            ),
            (tessel_grammar::EncoderPlacement::FirstStage, _) => "on the first stage".to_string(),
            _ => "on the first stage or GPUs of their own, the planner's choice".to_string(),
        };
        let order = if training.reorder {
            "samples reordered"
        } else {
            "samples in data order"
        };
        let _ = writeln!(out, "  {:<16}{placement}; {order}", "encoders");
    }
    let step_flops = spec
        .model
        .job_flops_per_token(train.seq_len, train.finetune.as_ref())
        * tokens as f64;
    let _ = writeln!(out, "  {:<16}{}", "FLOPs per step", si(step_flops, "FLOP"));
    for strategy in &spec.strategies {
        let _ = writeln!(out, "\nstrategy {}", strategy.name);
        strategy_summary(out, strategy, train.global_batch);
    }
    let _ = writeln!(out, "\nsearch");
    search_summary(out, &spec.search);
}

fn model_summary(out: &mut String, m: &ModelSpec, seq_len: Option<u64>) {
    let params = m.parameter_count();
    let _ = writeln!(out, "model {}", m.name);
    if m.moe.is_some() {
        let _ = writeln!(
            out,
            "  {:<16}{} ({}) total, {} ({}) active per token",
            "parameters",
            grouped(params.total),
            count(params.total as f64),
            grouped(params.active),
            count(params.active as f64)
        );
    } else {
        let _ = writeln!(
            out,
            "  {:<16}{} ({})",
            "parameters",
            grouped(params.total),
            count(params.total as f64)
        );
    }
    let mlp = match m.mlp {
        tessel_grammar::MlpKind::Gelu => "gelu",
        tessel_grammar::MlpKind::Swiglu => "swiglu",
    };
    let _ = writeln!(
        out,
        "  {:<16}{} layers, hidden {}, {} heads ({} kv, head_dim {}), ffn {} {mlp}, vocab {}",
        "shape", m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim, m.ffn_hidden, m.vocab
    );
    if let Some(moe) = &m.moe {
        let _ = writeln!(
            out,
            "  {:<16}{} experts of ffn {}, top {}, {} shared; {} of {} layers have experts",
            "experts",
            moe.experts,
            moe.expert_ffn_hidden,
            moe.top_k,
            moe.shared_experts,
            m.moe_layers(),
            m.layers
        );
    }
    for e in &m.encoders {
        let items = &e.items_per_sample;
        let _ = writeln!(
            out,
            "  {:<16}{} layers, hidden {}, {} heads, ffn {}; {} tokens per item → {} model tokens; \
             {} items per sample ({}, max {}){}; {} ({} per item, training)",
            format!("encoder {}", e.name),
            e.layers,
            e.hidden,
            e.heads,
            e.ffn_hidden,
            e.tokens_per_item,
            e.llm_tokens_per_item(),
            items.mean,
            items.shape.name(),
            items.max,
            if e.frozen { ", frozen" } else { "" },
            count(e.parameters(m.hidden) as f64),
            si(e.training_flops_per_item(m.hidden), "FLOP"),
        );
    }
    if let Some(seq_len) = seq_len {
        let _ = writeln!(
            out,
            "  {:<16}{} per token (training, seq_len {seq_len})",
            "FLOPs",
            si(m.job_flops_per_token(seq_len, None), "FLOP")
        );
    }
}

fn precision_name(p: Precision) -> &'static str {
    match p {
        Precision::Bf16 => "bf16",
        Precision::Fp16 => "fp16",
        Precision::Fp8 => "fp8",
        Precision::Fp32 => "fp32",
    }
}

fn link(l: &Link) -> String {
    format!(
        "{} per GPU per direction, {} latency",
        si(l.bandwidth, "B/s"),
        duration(l.latency)
    )
}

fn cluster_summary(out: &mut String, c: &ClusterSpec, precision: Precision) {
    let _ = writeln!(out, "cluster {}", c.name);
    if c.pools.is_empty() {
        hardware_summary(out, c, precision, "  ");
        return;
    }
    let gpus = c.pooled_gpus();
    let peak: f64 = c
        .pools
        .iter()
        .map(|p| p.gpu.peak.for_precision(precision) * p.total_gpus() as f64)
        .sum();
    let _ = writeln!(
        out,
        "  {:<16}{gpus} in {} pools, {} {} peak",
        "GPUs",
        c.pools.len(),
        si(peak, "FLOP/s"),
        precision_name(precision)
    );
    if let Some(between) = &c.between_pools {
        let _ = writeln!(out, "  {:<16}{}", "between pools", link(between));
    }
    for pool in &c.pools {
        let _ = writeln!(out, "  pool {}", pool.name);
        hardware_summary(out, pool, precision, "    ");
    }
}

/// The GPUs, memory, peak, links and host of a cluster of one GPU type, each line indented.
fn hardware_summary(out: &mut String, c: &ClusterSpec, precision: Precision, indent: &str) {
    let gpus = c.total_gpus() as f64;
    let peak = c.gpu.peak.for_precision(precision);
    let _ = writeln!(
        out,
        "{indent}{:<16}{} × {} ({} node{} × {})",
        "GPUs",
        c.total_gpus(),
        c.gpu.name,
        c.nodes,
        if c.nodes == 1 { "" } else { "s" },
        c.gpus_per_node
    );
    let _ = writeln!(
        out,
        "{indent}{:<16}{} per GPU, {} total",
        "memory",
        bytes(c.gpu.memory),
        bytes(c.gpu.memory * gpus)
    );
    let _ = writeln!(
        out,
        "{indent}{:<16}{} per GPU, {} total",
        format!("peak {}", precision_name(precision)),
        si(peak, "FLOP/s"),
        si(peak * gpus, "FLOP/s")
    );
    let _ = writeln!(
        out,
        "{indent}{:<16}{} per GPU",
        "HBM",
        si(c.gpu.hbm_bandwidth, "B/s")
    );
    if c.gpus_per_node > 1 {
        let _ = writeln!(out, "{indent}{:<16}{}", "intra-node", link(&c.intra_node));
    }
    if c.nodes > 1 {
        let _ = writeln!(out, "{indent}{:<16}{}", "inter-node", link(&c.inter_node));
    }
    let _ = writeln!(
        out,
        "{indent}{:<16}{} per GPU to host, {} host memory per node",
        "host",
        si(c.host_link, "B/s"),
        bytes(c.host_memory)
    );
}

fn offload_name(o: &Offload) -> String {
    if o.is_none() {
        return "none".into();
    }
    format!(
        "{{ optimizer = {}, weights = {}, gradients = {}, activations = {} }}",
        o.optimizer, o.weights, o.gradients, o.activations
    )
}

fn strategy_summary(out: &mut String, s: &Strategy, global_batch: u64) {
    let experts = match s.etp {
        Some(etp) if etp != s.tp => {
            format!("ep {} × etp {} (experts folded over tp·dp·cp)", s.ep, etp)
        }
        _ => format!("ep {}", s.ep),
    };
    let _ = writeln!(
        out,
        "  {:<16}dp {} × tp {} × pp {} × cp {} = {} GPUs, {experts}",
        "degrees",
        s.dp,
        s.tp,
        s.pp,
        s.cp,
        s.dp * s.tp * s.pp * s.cp,
    );
    let _ = writeln!(
        out,
        "  {:<16}{} sequence{}, {} per step per data-parallel rank",
        "microbatch",
        s.microbatch,
        if s.microbatch == 1 { "" } else { "s" },
        global_batch / (s.dp * s.microbatch)
    );
    let stages = s.stages.as_ref().map_or("even".to_string(), |st| {
        let list: Vec<String> = st.iter().map(u64::to_string).collect();
        format!("[{}]", list.join(", "))
    });
    let _ = writeln!(
        out,
        "  {:<16}interleave {}, stages {stages}",
        "pipeline", s.interleave
    );
    let recompute = per_stage(&s.recompute, &s.stage_recompute, Recompute::to_string);
    let offload = per_stage(&s.offload, &s.stage_offload, offload_name);
    let _ = writeln!(
        out,
        "  {:<16}recompute {recompute}, sequence parallel {}, ZeRO {}, offload {offload}",
        "memory",
        if s.sequence_parallel { "on" } else { "off" },
        s.zero_label(),
    );
}

/// One value for every stage, or the list of each stage's as the spec writes it.
fn per_stage<T>(all: &T, stages: &Option<Vec<T>>, show: impl Fn(&T) -> String) -> String {
    match stages {
        None => show(all),
        Some(stages) => {
            let each: Vec<String> = stages.iter().map(show).collect();
            format!("[{}]", each.join(", "))
        }
    }
}

fn choice<T>(c: &Choice<T>, show: impl Fn(&T) -> String) -> String {
    match c {
        Choice::Auto => "auto".into(),
        Choice::Values(values) if values.len() == 1 => show(&values[0]),
        Choice::Values(values) => {
            let shown: Vec<String> = values.iter().map(show).collect();
            format!("[{}]", shown.join(", "))
        }
    }
}

fn search_summary(out: &mut String, s: &SearchSpace) {
    let n = |v: &u64| v.to_string();
    let rows = [
        ("dp", choice(&s.dp, n)),
        ("tp", choice(&s.tp, n)),
        ("pp", choice(&s.pp, n)),
        ("cp", choice(&s.cp, n)),
        ("ep", choice(&s.ep, n)),
        ("microbatch", choice(&s.microbatch, n)),
        ("interleave", choice(&s.interleave, n)),
        ("recompute", choice(&s.recompute, Recompute::to_string)),
        (
            "sequence_parallel",
            choice(&s.sequence_parallel, bool::to_string),
        ),
        ("zero", choice(&s.zero, u8::to_string)),
        ("offload", choice(&s.offload, offload_name)),
    ];
    // Shown when set: `auto` here is the planner's own rule, as for the other keys.
    let optional = [("etp", &s.etp), ("dp_shard", &s.dp_shard)]
        .into_iter()
        .filter(|(_, c)| !c.is_auto())
        .map(|(key, c)| (key, choice(c, n)));
    for (key, value) in rows.into_iter().chain(optional) {
        let _ = writeln!(out, "  {key:<18}{value}");
    }
    let _ = writeln!(out, "  {:<18}throughput", "objective");
    let _ = writeln!(
        out,
        "  {:<18}{}% of GPU memory",
        "memory_limit",
        super::short_decimal(s.memory_limit * 100.0)
    );
    if let Some(t) = s.time_limit {
        let _ = writeln!(out, "  {:<18}{}", "time_limit", duration(t));
    }
    if let Some(top) = s.top {
        let _ = writeln!(out, "  {:<18}{top}", "top");
    }
}
