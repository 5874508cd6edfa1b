//! torchtitan: a TOML job config (`--job.config_file`), in the layout of torchtitan's 2025
//! `JobConfig` (sections `[model]`, `[training]`, `[parallelism]`, `[activation_checkpoint]`,
//! `[compile]`).
//!
//! torchtitan shards data-parallel state with FSDP2 (`fully_shard`): weights, gradients and
//! optimizer state together, i.e. ZeRO-3, with `fsdp_reshard_after_forward` deciding whether
//! weights are re-gathered for backward. Replication (DDP) and the hybrid of both (HSDP) are the
//! other data-parallel modes. Model shapes come from flavors registered in code, not from the
//! job config.

use tessel_grammar::{
    AttentionKernel, Fp8Scaling, MlpKind, NormKernel, NormKind, PositionKind, Precision, Recompute,
    Spec, Strategy,
};

use super::batches::batches;
use super::stages::{stages, Stages};
use super::toml_writer::{TomlDoc, TomlValue};
use super::{zero_stage, ExportOptions, ExportOutput, Report};

/// torchtitan's registered Llama 3 flavors (torchtitan/models/llama3/__init__.py):
/// name, layers, dim, heads, KV heads, and the FFN width its `ffn_dim_multiplier` and
/// `multiple_of` produce.
const LLAMA3_FLAVORS: &[(&str, u64, u64, u64, u64, u64)] = &[
    ("8B", 32, 4096, 32, 8, 14336),
    ("70B", 80, 8192, 64, 8, 28672),
    ("405B", 126, 16384, 128, 8, 53248),
];

pub(crate) fn export(spec: &Spec, strategy: &Strategy, options: &ExportOptions) -> ExportOutput {
    let mut report = Report::new();
    report.check_common(spec, strategy);
    let mut doc = TomlDoc::with_sections(&[
        "job",
        "model",
        "training",
        "parallelism",
        "activation_checkpoint",
        "compile",
    ]);
    doc.str(
        "job",
        "description",
        format!(
            "strategy {} of model {}, written by tessel export",
            strategy.name, spec.model.name
        ),
    );
    model_section(spec, &mut doc, &mut report);
    let shard_degree = parallelism_section(spec, strategy, &mut doc, &mut report);
    training_section(spec, strategy, shard_degree, &mut doc, &mut report);
    checkpoint_section(spec, strategy, &mut doc, &mut report);
    if let Some(every) = options.checkpoint_every {
        doc.bool("checkpoint", "enable_checkpoint", true);
        doc.int("checkpoint", "interval", every);
    }
    compile_section(spec, &mut doc);

    let mut text = String::new();
    text.push_str(&format!(
        "# torchtitan job config for strategy `{}` of model `{}` on {},\n",
        strategy.name,
        spec.model.name,
        super::cluster_size(spec)
    ));
    text.push_str("# written by `tessel export`. Launch on every node with\n");
    text.push_str(&format!(
        "#   torchrun --nnodes {} --nproc_per_node {} -m torchtitan.train --job.config_file FILE\n",
        spec.cluster.nodes, spec.cluster.gpus_per_node
    ));
    report.note("add [optimizer], [lr_scheduler], dataset, tokenizer_path, steps and [checkpoint]");
    report.push_comments(&mut text, "#");
    text.push('\n');
    text.push_str(&doc.render());
    ExportOutput {
        text,
        file_name_hint: format!("{}.torchtitan.toml", strategy.name),
        unsupported: report.unsupported,
        notes: report.notes,
    }
}

fn model_section(spec: &Spec, doc: &mut TomlDoc, report: &mut Report) {
    let m = &spec.model;
    let llama_shaped = m.mlp == MlpKind::Swiglu
        && m.norm == NormKind::Rmsnorm
        && m.position == PositionKind::Rope
        && !m.bias;
    let name = if m.moe.is_some() {
        "deepseek_v3"
    } else {
        "llama3"
    };
    doc.str("model", "name", name);
    let known = LLAMA3_FLAVORS
        .iter()
        .find(|(_, l, d, h, kv, ffn)| {
            m.moe.is_none()
                && llama_shaped
                && (*l, *d, *h, *kv, *ffn)
                    == (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden)
                && m.head_dim.checked_mul(m.heads) == Some(m.hidden)
        })
        .map(|(flavor, ..)| *flavor);
    match known {
        Some(flavor) => {
            doc.str("model", "flavor", flavor);
            report.note(format!(
                "flavor {flavor} takes its vocabulary from the tokenizer; Tessel's model has {} \
                 entries",
                m.vocab
            ));
        }
        None => {
            doc.str("model", "flavor", m.name.clone());
            if m.moe.is_some() {
                report.note(format!(
                    "model shape: torchtitan builds models from flavors registered in code; its \
                     MoE model (deepseek_v3) uses multi-head latent attention, so `{}` needs a \
                     flavor (or model) registered with dim {}, {} layers, {} heads, {} experts of \
                     width {}, top-{}",
                    m.name,
                    m.hidden,
                    m.layers,
                    m.heads,
                    m.moe.as_ref().map_or(0, |e| e.experts),
                    m.moe.as_ref().map_or(0, |e| e.expert_ffn_hidden),
                    m.moe.as_ref().map_or(0, |e| e.top_k)
                ));
            } else if llama_shaped {
                report.note(format!(
                    "model shape: torchtitan builds models from flavors registered in code; \
                     register flavor `{}` in torchtitan/models/llama3 with dim {}, n_layers {}, \
                     n_heads {}, n_kv_heads {}, vocab_size {} and ffn_dim_multiplier/multiple_of \
                     giving an FFN width of {}",
                    m.name, m.hidden, m.layers, m.heads, m.kv_heads, m.vocab, m.ffn_hidden
                ));
            } else {
                report.note(format!(
                    "model shape: torchtitan's llama3 model is SwiGLU, RMSNorm, RoPE, without \
                     biases; `{}` ({}, {}, {} positions, bias = {}) needs a model definition of \
                     its own",
                    m.name,
                    match m.mlp {
                        MlpKind::Gelu => "gelu MLP",
                        MlpKind::Swiglu => "swiglu MLP",
                    },
                    match m.norm {
                        NormKind::Layernorm => "layernorm",
                        NormKind::Rmsnorm => "rmsnorm",
                    },
                    match m.position {
                        PositionKind::Learned => "learned",
                        PositionKind::Rope => "rotary",
                    },
                    m.bias
                ));
            }
        }
    }
    if m.tie_embeddings && llama_shaped && m.moe.is_none() {
        report.unsupported(
            "tie_embeddings = true: torchtitan's llama3 keeps separate input and output embeddings",
        );
    }
    // torchtitan calls `scaled_dot_product_attention`, whose flash backend is flash-attention
    // 2, and has no setting that picks another backend.
    match spec.train.attention_kernel {
        None | Some(AttentionKernel::Flash2) => {}
        Some(AttentionKernel::Flash1) => report.unsupported(
            "attention_kernel = flash1: torchtitan's scaled_dot_product_attention runs \
             flash-attention 2",
        ),
        Some(AttentionKernel::Cudnn) => report.unsupported(
            "attention_kernel = cudnn: torchtitan has no setting that picks \
             scaled_dot_product_attention's cuDNN backend",
        ),
    }
    // torchtitan's RMSNorm is PyTorch's operators, which compiled blocks fuse.
    match (spec.train.norm_kernel, spec.train.compile) {
        (Some(NormKernel::Fused), false) if spec.model.norm == NormKind::Rmsnorm => report
            .unsupported(
                "norm_kernel = fused: torchtitan runs its RMSNorm as PyTorch's float32 \
                 operators unless the blocks are compiled (compile = true)",
            ),
        (Some(NormKernel::Composite), true) => report.unsupported(
            "norm_kernel = composite: compiled blocks (compile = true) fuse torchtitan's norms",
        ),
        _ => {}
    }
    if spec.train.fused_cross_entropy == Some(true) && !spec.train.compile {
        report.unsupported(
            "fused_cross_entropy = true: torchtitan computes PyTorch's cross-entropy on fp32 \
             logits unless the loss is compiled (compile = true)",
        );
    }
    if spec.train.precision == Precision::Fp8 {
        doc.set(
            "model",
            "converters",
            TomlValue::StrList(vec!["float8".to_string()]),
        );
        report.note(
            "precision fp8 is written as the float8 converter (torchao); newer torchtitan \
             releases name it quantize.linear.float8",
        );
        let scaling = spec.train.fp8_scaling();
        if scaling == Fp8Scaling::Rowwise {
            doc.set(
                "float8",
                "recipe_name",
                TomlValue::Str("rowwise".to_string()),
            );
        } else {
            doc.set(
                "float8",
                "enable_fsdp_float8_all_gather",
                TomlValue::Bool(true),
            );
            doc.set(
                "float8",
                "precompute_float8_dynamic_scale_for_fsdp",
                TomlValue::Bool(true),
            );
        }
        if scaling == Fp8Scaling::Delayed {
            report.unsupported(
                "fp8_scaling = delayed: torchao scales dynamically; written as its tensor-wise \
                 recipe",
            );
        }
    }
}

/// Writes `[compile]`: the transformer blocks, and the loss too when the spec's loss is
/// fused (a compiled cross-entropy does not materialise the fp32 logits).
fn compile_section(spec: &Spec, doc: &mut TomlDoc) {
    doc.bool("compile", "enable", spec.train.compile);
    if spec.train.compile {
        let mut components = vec!["model".to_string()];
        if spec.train.fused_cross_entropy() {
            components.push("loss".to_string());
        }
        doc.set("compile", "components", TomlValue::StrList(components));
    }
}

/// Writes `[parallelism]`; returns the FSDP shard degree (1 when not sharded).
fn parallelism_section(
    spec: &Spec,
    strategy: &Strategy,
    doc: &mut TomlDoc,
    report: &mut Report,
) -> u64 {
    let dp = strategy.dp.max(1);
    let tp = strategy.tp.max(1);
    let pp = strategy.pp.max(1);
    let cp = strategy.cp.max(1);
    let ep = if spec.model.moe.is_some() {
        strategy.ep.max(1)
    } else {
        1
    };
    let other_parallelism = tp > 1 || pp > 1 || cp > 1;

    // Data-parallel mode: replicate (DDP), shard (FSDP) or both (HSDP).
    let (replicate, shard, reshard) = match zero_stage(strategy) {
        0 if other_parallelism && dp > 1 => {
            report.unsupported(
                "zero = 0 with tensor, pipeline or context parallelism: torchtitan's DDP works \
                 only as the sole parallelism, so data parallelism is sharded with FSDP2 and \
                 weights are kept gathered from forward to backward (ZeRO-2-like: less memory, \
                 an extra weight all-gather per step)",
            );
            (1, dp, "never")
        }
        0 => {
            // Expert-parallel ranks come out of the FSDP shard dimension in torchtitan.
            let needed = ep.div_ceil(cp).max(1);
            if needed > 1 {
                if dp.is_multiple_of(needed) {
                    report.unsupported(format!(
                        "zero = 0 with ep = {ep}: torchtitan draws expert-parallel ranks from the \
                         FSDP shard dimension, so data parallelism is HSDP: {} replicas of \
                         {needed}-way sharded state",
                        dp / needed
                    ));
                    (dp / needed, needed, "never")
                } else {
                    report.unsupported(format!(
                        "zero = 0 with ep = {ep}: torchtitan draws expert-parallel ranks from the \
                         FSDP shard dimension; written as full sharding over dp = {dp}"
                    ));
                    (1, dp, "never")
                }
            } else {
                (dp, 1, "default")
            }
        }
        1 => {
            report.unsupported(
                "zero = 1: torchtitan cannot shard optimizer state alone; FSDP2 also shards \
                 gradients and weights. Written as FSDP with fsdp_reshard_after_forward = \
                 \"never\" (weights gathered once per step): no more memory than ZeRO-1 and the \
                 same reduce-scatter + all-gather volume",
            );
            (1, dp, "never")
        }
        2 => {
            // torchtitan's form of ZeRO-2 (`tessel_grammar::Capabilities`).
            report.note(
                "zero = 2: written as FSDP with fsdp_reshard_after_forward = \"never\": weights \
                 are gathered once per step and kept through backward like ZeRO-2, and sharded \
                 again between steps (less memory, the same communication volume)",
            );
            (1, dp, "never")
        }
        _ => (1, dp, "always"),
    };
    // Hybrid sharding (HSDP): FSDP over `dp_shard` ranks, replicated over the rest.
    let (replicate, shard) = match strategy.shard_degree() {
        hybrid if hybrid > 0 && hybrid < dp && dp.is_multiple_of(hybrid) && replicate == 1 => {
            (dp / hybrid, hybrid)
        }
        _ => (replicate, shard),
    };
    doc.int("parallelism", "data_parallel_replicate_degree", replicate);
    doc.int("parallelism", "data_parallel_shard_degree", shard);
    doc.str("parallelism", "fsdp_reshard_after_forward", reshard);
    doc.int("parallelism", "tensor_parallel_degree", tp);
    // Overlapped tensor-parallel collectives are torchtitan's async TP, a torch.compile pass:
    // torchtitan refuses it without compile.
    let overlap_tp = tp > 1 && spec.train.overlap(zero_stage(strategy) == 3).tp_comm;
    if overlap_tp && !spec.train.compile {
        report.unsupported(
            "overlap.tp_comm = true: torchtitan's async tensor parallelism \
             (enable_async_tensor_parallel) runs only with compile = true; written as false",
        );
    }
    doc.bool(
        "parallelism",
        "enable_async_tensor_parallel",
        overlap_tp && spec.train.compile,
    );
    if tp > 1 && !strategy.sequence_parallel {
        report.unsupported(
            "sequence_parallel = false: torchtitan's tensor parallelism always shards norms \
             along the sequence (sequence parallelism), which uses less activation memory",
        );
    }
    doc.int("parallelism", "pipeline_parallel_degree", pp);
    if pp > 1 {
        pipeline_keys(spec, strategy, doc, report);
    } else if strategy.interleave > 1 {
        report.note(format!(
            "interleave = {} without pipeline parallelism has no effect and is not written",
            strategy.interleave
        ));
    }
    doc.int("parallelism", "context_parallel_degree", cp);
    doc.int("parallelism", "expert_parallel_degree", ep);
    if ep > 1 && (ep < cp || ep > shard.saturating_mul(cp)) {
        report.note(format!(
            "torchtitan needs context_parallel_degree <= expert_parallel_degree <= \
             data_parallel_shard_degree·context_parallel_degree; ep = {ep}, cp = {cp}, shard = \
             {shard} does not satisfy it"
        ));
    }
    shard
}

fn pipeline_keys(spec: &Spec, strategy: &Strategy, doc: &mut TomlDoc, report: &mut Report) {
    let v = strategy.interleave.max(1);
    doc.str(
        "parallelism",
        "pipeline_parallel_schedule",
        if v > 1 { "Interleaved1F1B" } else { "1F1B" },
    );
    doc.int(
        "parallelism",
        "pipeline_parallel_microbatch_size",
        strategy.microbatch.max(1),
    );
    // torchtitan cuts ceil((layers + first_less + last_less) / layers_per_stage) virtual
    // stages, the two "less" keys making the end stages lighter; any other split is written
    // module by module (`module_fqns_per_model_part`, torchtitan since July 2025).
    let (per_stage, first_less, last_less) = match stages(spec, strategy, report) {
        Stages::Even { per_chunk } => (per_chunk, 0, 0),
        Stages::Uneven { chunks } => {
            let widest = chunks.iter().copied().max().unwrap_or(1);
            let last = chunks.len() - 1;
            if chunks[1..last].iter().all(|&n| n == widest) {
                (widest, widest - chunks[0], widest - chunks[last])
            } else {
                doc.set(
                    "parallelism",
                    "module_fqns_per_model_part",
                    TomlValue::StrLists(modules_per_model_part(&chunks)),
                );
                return;
            }
        }
    };
    doc.int(
        "parallelism",
        "pipeline_parallel_layers_per_stage",
        per_stage,
    );
    doc.int(
        "parallelism",
        "pipeline_parallel_first_stage_less_layers",
        first_less,
    );
    doc.int(
        "parallelism",
        "pipeline_parallel_last_stage_less_layers",
        last_less,
    );
}

/// The modules of each virtual stage, in model order, by torchtitan's names for a decoder:
/// `tok_embeddings` on the first, `layers.i`, and `norm` and `output` on the last.
fn modules_per_model_part(chunks: &[u64]) -> Vec<Vec<String>> {
    let mut next_layer = 0u64;
    let last = chunks.len() - 1;
    chunks
        .iter()
        .enumerate()
        .map(|(index, &layers)| {
            let mut modules = Vec::new();
            if index == 0 {
                modules.push("tok_embeddings".to_string());
            }
            modules.extend((next_layer..next_layer + layers).map(|i| format!("layers.{i}")));
            next_layer += layers;
            if index == last {
                modules.extend(["norm".to_string(), "output".to_string()]);
            }
            modules
        })
        .collect()
}

fn training_section(
    spec: &Spec,
    strategy: &Strategy,
    shard_degree: u64,
    doc: &mut TomlDoc,
    report: &mut Report,
) {
    let batch = batches(spec, strategy, report);
    // With pipeline parallelism one step runs all micro-batches of a replica through the
    // schedule; without, the extra micro-batches are gradient accumulation.
    let local = if strategy.pp > 1 {
        batch.per_replica()
    } else {
        batch.micro
    };
    doc.int("training", "local_batch_size", local);
    doc.int("training", "global_batch_size", batch.global);
    doc.int("training", "seq_len", spec.train.seq_len);
    let param_dtype = match spec.train.precision {
        Precision::Fp32 => "float32",
        Precision::Bf16 | Precision::Fp8 => "bfloat16",
        Precision::Fp16 => {
            report.unsupported(
                "precision fp16: torchtitan's mixed_precision_param is bfloat16 or float32; \
                 written as bfloat16",
            );
            "bfloat16"
        }
    };
    doc.str("training", "mixed_precision_param", param_dtype);
    doc.str("training", "mixed_precision_reduce", "float32");

    let offload = strategy.offload;
    let state_offload = offload.optimizer > 0.0 || offload.weights > 0.0 || offload.gradients > 0.0;
    doc.bool("training", "enable_cpu_offload", state_offload);
    if state_offload {
        let all = offload.optimizer == 1.0 && offload.weights == 1.0 && offload.gradients == 1.0;
        if !all {
            report.unsupported(format!(
                "offload = {{ optimizer = {}, weights = {}, gradients = {} }}: torchtitan's \
                 enable_cpu_offload moves weights, gradients and optimizer state to the host \
                 together; written as enabled (all of them offloaded, more host traffic than \
                 planned)",
                offload.optimizer, offload.weights, offload.gradients
            ));
        }
        if zero_stage(strategy) != 3 {
            report.unsupported(format!(
                "offload with zero = {}: torchtitan's enable_cpu_offload is FSDP2's offload of \
                 fully sharded (ZeRO-3) state; written as enabled",
                strategy.zero
            ));
        }
        if shard_degree == 1 {
            report.note(
                "enable_cpu_offload acts through FSDP; with data_parallel_shard_degree = 1 it \
                 has no effect",
            );
        }
    }
    if offload.activations > 0.0 {
        report.unsupported(format!(
            "offload.activations = {}: torchtitan has no activation offload",
            offload.activations
        ));
    }
}

fn checkpoint_section(spec: &Spec, strategy: &Strategy, doc: &mut TomlDoc, report: &mut Report) {
    match strategy.recompute {
        Recompute::None => doc.str("activation_checkpoint", "mode", "none"),
        Recompute::Full => doc.str("activation_checkpoint", "mode", "full"),
        Recompute::Selective => {
            doc.str("activation_checkpoint", "mode", "selective");
            doc.str("activation_checkpoint", "selective_ac_option", "op");
            report.note(
                "recompute = selective is written as torchtitan's op-level selective \
                 checkpointing, which saves matmul outputs and recomputes the cheap ops around \
                 them: close to Megatron-LM's attention-core recompute, not the same",
            );
        }
        Recompute::Modules(modules) => {
            doc.str("activation_checkpoint", "mode", "none");
            report.unsupported(format!(
                "recompute = {}: torchtitan checkpoints whole blocks or ops, not the modules \
                 {modules}",
                strategy.recompute
            ));
        }
        Recompute::Partial { full_layers } => {
            let pp = strategy.pp.max(1);
            let per_stage = spec.model.layers.div_ceil(pp).max(1);
            let n = full_layers.clamp(1, per_stage);
            // torchtitan's integer option checkpoints every k-th block.
            let every = (per_stage as f64 / n as f64).round().max(1.0) as u64;
            doc.str("activation_checkpoint", "mode", "selective");
            doc.str(
                "activation_checkpoint",
                "selective_ac_option",
                every.to_string(),
            );
            if !per_stage.is_multiple_of(n) || every.saturating_mul(n) != per_stage {
                report.unsupported(format!(
                    "recompute = {{ full_layers = {full_layers} }}: torchtitan checkpoints every \
                     k-th block, not the first N of a stage; k = {every} recomputes about {} of \
                     {per_stage} layers per stage",
                    per_stage / every
                ));
            } else {
                report.note(format!(
                    "recompute = {{ full_layers = {full_layers} }} is written as full \
                     checkpointing of every {every}th block ({n} of {per_stage} per stage, spread \
                     out rather than the first {n})"
                ));
            }
        }
    }
}
