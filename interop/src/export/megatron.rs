//! Megatron-LM: `torchrun … pretrain_gpt.py` with the flags of `megatron/training/arguments.py`.
//!
//! Megatron-LM infers the data-parallel size from the world size, takes the model's shape and
//! every parallel degree as flags, and has one sharding scheme of its own, the distributed
//! optimizer (ZeRO-1: optimizer state sharded over data-parallel ranks).

use tessel_grammar::{
    stage_chunks, stage_totals, AttentionKernel, Fp8Scaling, Framework, MlpKind, NormKernel,
    NormKind, PositionKind, Precision, Recompute, Spec, Strategy,
};

use super::batches::batches;
use super::stages::{stages, Stages};
use super::{zero_stage, ExportOptions, ExportOutput, Report};

/// One command-line flag and its value (`None` for switches).
struct Flag {
    name: &'static str,
    value: Option<String>,
}

struct Flags(Vec<Flag>);

impl Flags {
    fn switch(&mut self, name: &'static str) {
        self.0.push(Flag { name, value: None });
    }

    fn value(&mut self, name: &'static str, value: impl ToString) {
        self.0.push(Flag {
            name,
            value: Some(value.to_string()),
        });
    }
}

pub(crate) fn export(spec: &Spec, strategy: &Strategy, options: &ExportOptions) -> ExportOutput {
    let mut report = Report::new();
    report.check_common(spec, strategy);
    let model = &spec.model;
    let mut flags = Flags(Vec::new());

    // Parallelism.
    let tp = strategy.tp.max(1);
    let pp = strategy.pp.max(1);
    let cp = strategy.cp.max(1);
    flags.value("--tensor-model-parallel-size", tp);
    flags.value("--pipeline-model-parallel-size", pp);
    flags.value("--context-parallel-size", cp);
    if model.moe.is_some() {
        flags.value("--expert-model-parallel-size", strategy.ep.max(1));
        // Megatron-Core's MoE parallel folding; its default is tp.
        if strategy.expert_tp() != tp {
            flags.value("--expert-tensor-parallel-size", strategy.expert_tp());
        }
    }
    pipeline_flags(spec, strategy, &mut flags, &mut report);
    if strategy.sequence_parallel {
        if tp > 1 {
            flags.switch("--sequence-parallel");
        } else {
            report.note(
                "sequence_parallel with tp = 1: Megatron-LM switches it off, so it is not written",
            );
        }
    }

    // Batch and sequence.
    let batch = batches(spec, strategy, &mut report);
    flags.value("--micro-batch-size", batch.micro);
    flags.value("--global-batch-size", batch.global);
    let seq_len = spec.train.seq_len;
    flags.value("--seq-length", seq_len);
    let positions = match (model.position, model.max_seq_len) {
        (_, Some(max)) if max >= seq_len => max,
        (PositionKind::Learned, Some(max)) => {
            report.note(format!(
                "seq_len {seq_len} exceeds the model's {max} learned positions; Megatron-LM needs \
                 --max-position-embeddings >= --seq-length, so the table is written {seq_len} long"
            ));
            seq_len
        }
        _ => seq_len,
    };
    flags.value("--max-position-embeddings", positions);

    // Model shape.
    flags.value("--num-layers", model.layers);
    flags.value("--hidden-size", model.hidden);
    flags.value("--ffn-hidden-size", model.ffn_hidden);
    flags.value("--num-attention-heads", model.heads);
    if model.heads == 0
        || !model.hidden.is_multiple_of(model.heads)
        || model.head_dim != model.hidden / model.heads
    {
        flags.value("--kv-channels", model.head_dim);
    }
    if model.kv_heads != model.heads {
        flags.switch("--group-query-attention");
        flags.value("--num-query-groups", model.kv_heads);
        if !model.kv_heads.is_multiple_of(tp) {
            report.note(format!(
                "kv_heads {} is not a multiple of tp {tp}; Megatron-LM splits query groups over \
                 tensor-parallel ranks and rejects this",
                model.kv_heads
            ));
        }
    }
    if model.mlp == MlpKind::Swiglu {
        flags.switch("--swiglu");
    }
    flags.value(
        "--normalization",
        match model.norm {
            NormKind::Rmsnorm => "RMSNorm",
            NormKind::Layernorm => "LayerNorm",
        },
    );
    if !model.tie_embeddings {
        flags.switch("--untie-embeddings-and-output-weights");
    }
    if !model.bias {
        flags.switch("--disable-bias-linear");
    }
    flags.value(
        "--position-embedding-type",
        match model.position {
            PositionKind::Rope => "rope",
            PositionKind::Learned => "learned_absolute",
        },
    );
    let padded_vocab = model.vocab.div_ceil(tp).saturating_mul(tp);
    flags.value("--padded-vocab-size", padded_vocab);
    if padded_vocab != model.vocab {
        report.note(format!(
            "vocab {} is padded to {padded_vocab}, a multiple of tp = {tp}, as Megatron-LM \
             requires",
            model.vocab
        ));
    }
    moe_flags(spec, strategy, &mut flags, &mut report);

    recompute_flags(strategy, &mut flags, &mut report);

    // Precision, kernels, optimizer.
    match spec.train.precision {
        Precision::Bf16 => flags.switch("--bf16"),
        Precision::Fp16 => flags.switch("--fp16"),
        Precision::Fp8 => {
            flags.switch("--bf16");
            flags.value("--fp8-format", "hybrid");
            match spec.train.fp8_scaling() {
                Fp8Scaling::Delayed => flags.value("--fp8-recipe", "delayed"),
                Fp8Scaling::Tensorwise => flags.value("--fp8-recipe", "tensorwise"),
                Fp8Scaling::Rowwise => report.unsupported(
                    "fp8_scaling = rowwise: Megatron-LM has no row-wise FP8 recipe \
                     (Transformer Engine scales per tensor or per block)",
                ),
            }
        }
        Precision::Fp32 => {}
    }
    if spec.train.flash_attention {
        flags.switch("--use-flash-attn");
    }
    // Megatron-Core's `AttnBackend`: `flash` is the flash-attn package through Transformer
    // Engine, `fused` cuDNN's fused attention.
    match spec.train.attention_kernel {
        None => {}
        Some(AttentionKernel::Flash2) => flags.value("--attention-backend", "flash"),
        Some(AttentionKernel::Cudnn) => flags.value("--attention-backend", "fused"),
        Some(AttentionKernel::Flash1) => report.unsupported(
            "attention_kernel = flash1: Megatron-LM runs flash-attention 2 or later \
             (`--attention-backend flash`) or cuDNN's fused attention (`fused`)",
        ),
    }
    if spec.train.compile {
        report.unsupported(
            "compile = true: Megatron-LM has no switch to compile its transformer blocks; it \
             runs its own fused kernels",
        );
    }
    if spec.train.norm_kernel == Some(NormKernel::Composite) {
        report.unsupported(
            "norm_kernel = composite: Megatron-LM's norms are Transformer Engine's fused \
             kernels; no flag runs them as separate operators",
        );
    }
    flags.value(
        "--optimizer",
        match spec.train.optimizer {
            tessel_grammar::Optimizer::Adam => "adam",
            tessel_grammar::Optimizer::Sgd => "sgd",
        },
    );
    // What the spec overlaps (`train.overlap`, Megatron-Core's defaults unless written).
    let overlap = spec.train.overlap(zero_stage(strategy) == 3);
    if overlap.grad_reduce && strategy.dp.max(strategy.cp) > 1 {
        flags.switch("--overlap-grad-reduce");
    }
    if overlap.param_gather && zero_stage(strategy) >= 1 && strategy.dp.max(strategy.cp) > 1 {
        flags.switch("--overlap-param-gather");
    }
    if overlap.tp_comm && strategy.tp > 1 {
        flags.switch("--tp-comm-overlap");
    }
    if spec.train.framework == Framework::MegatronFsdp {
        // Megatron-FSDP's required flags (Megatron-LM's megatron_fsdp README): the sharding
        // strategy names ZeRO 0–3.
        flags.switch("--use-megatron-fsdp");
        flags.value(
            "--data-parallel-sharding-strategy",
            match zero_stage(strategy) {
                0 => "no_shard",
                1 => "optim",
                2 => "optim_grads",
                _ => "optim_grads_params",
            },
        );
        flags.switch("--no-gradient-accumulation-fusion");
        flags.switch("--use-distributed-optimizer");
        flags.value("--ckpt-format", "fsdp_dtensor");
        optimizer_instances(strategy, &mut flags);
    } else {
        match zero_stage(strategy) {
            0 => {}
            1 => {
                flags.switch("--use-distributed-optimizer");
                optimizer_instances(strategy, &mut flags);
            }
            stage => {
                flags.switch("--use-distributed-optimizer");
                report.unsupported(format!(
                    "zero = {stage}: Megatron-LM's distributed optimizer shards optimizer state \
                     only (ZeRO-1), so gradients{} stay replicated; written as \
                     --use-distributed-optimizer. Plan with framework = megatron_fsdp \
                     (--use-megatron-fsdp) for ZeRO-{stage}",
                    if stage == 3 { " and weights" } else { "" },
                ));
            }
        }
    }
    offload_flags(spec, strategy, &mut flags, &mut report);
    if let Some(every) = options.checkpoint_every {
        flags.value("--save-interval", every);
    }
    report.note(
        "add data, tokenizer, learning-rate schedule, iteration and checkpoint flags \
         (--data-path, --tokenizer-type, --lr, --train-iters, --save, ...)",
    );

    let text = render(spec, strategy, &flags, &report, tp, cp);
    ExportOutput {
        text,
        file_name_hint: format!("{}.megatron.sh", strategy.name),
        unsupported: report.unsupported,
        notes: report.notes,
    }
}

fn pipeline_flags(spec: &Spec, strategy: &Strategy, flags: &mut Flags, report: &mut Report) {
    let pp = strategy.pp.max(1);
    let v = strategy.interleave.max(1);
    if pp == 1 {
        if v > 1 {
            report.note(format!(
                "interleave = {v} without pipeline parallelism has no effect and is not written"
            ));
        }
        return;
    }
    match stages(spec, strategy, report) {
        Stages::Even { per_chunk } => {
            if v > 1 {
                flags.value("--num-layers-per-virtual-pipeline-stage", per_chunk);
            }
        }
        Stages::Uneven { chunks } => {
            let split = stage_totals(&chunks, pp);
            let first = split[0];
            let last = split[split.len() - 1];
            let middle = &split[1..split.len() - 1];
            let middle_size = middle.first().copied();
            let middle_equal = middle.iter().all(|&n| Some(n) == middle_size);
            let chunks_whole = [first, last]
                .iter()
                .chain(middle_size.iter())
                .all(|&n| n > 0 && n % v == 0);
            // Only the end stages may differ under --decoder-first/last-pipeline-num-layers,
            // by whole layers per chunk: anything else is a custom layout.
            if !middle_equal || !chunks_whole || chunks != stage_chunks(&split, v) {
                let layout = pipeline_layout(&chunks);
                flags.value("--pipeline-model-parallel-layout", format!("'{layout}'"));
                report.note(format!(
                    "layers per virtual stage {chunks:?} written as Megatron-Core's custom \
                     --pipeline-model-parallel-layout (experimental upstream), one segment per \
                     virtual stage in model order"
                ));
                return;
            }
            if v > 1 {
                flags.value("--num-virtual-stages-per-pipeline-rank", v);
            }
            if middle_size != Some(first) {
                flags.value("--decoder-first-pipeline-num-layers", first);
            }
            if middle_size != Some(last) {
                flags.value("--decoder-last-pipeline-num-layers", last);
            }
        }
    }
}

/// Hybrid sharding: the distributed optimizer (Megatron-FSDP: its sharded state) split into
/// `dp / dp_shard` instances, each sharded over `dp_shard` ranks.
fn optimizer_instances(strategy: &Strategy, flags: &mut Flags) {
    let shard = strategy.shard_degree();
    if shard > 0 && shard < strategy.dp && strategy.dp.is_multiple_of(shard) {
        flags.value("--num-distributed-optimizer-instances", strategy.dp / shard);
    }
}

/// Megatron-Core's layout string for decoder layers per virtual stage in model order: stages
/// split by `|`, `t*n` for n decoder layers, `E` (the embedding) opening the first and `L`
/// (the loss) closing the last; commas are cosmetic (Megatron-LM
/// `docs/api-guide/pipeline_parallel_layout.md`).
fn pipeline_layout(chunks: &[u64]) -> String {
    let last = chunks.len().saturating_sub(1);
    let segments: Vec<String> = chunks
        .iter()
        .enumerate()
        .map(|(index, &layers)| {
            let mut parts = Vec::new();
            if index == 0 {
                parts.push("E".to_string());
            }
            match layers {
                0 => {}
                1 => parts.push("t".to_string()),
                n => parts.push(format!("t*{n}")),
            }
            if index == last {
                parts.push("L".to_string());
            }
            parts.join(",")
        })
        .collect();
    segments.join("|")
}

/// Megatron-LM's `--moe-layer-freq` pattern (a Python list expression, 1 = expert block) for
/// the model's expert blocks, or `None` when every block has experts (the default, `1`).
fn moe_layer_pattern(spec: &Spec) -> Option<String> {
    let model = &spec.model;
    let moe = model.moe.as_ref()?;
    if moe.every <= 1 && moe.first_dense == 0 {
        return None;
    }
    // Tessel's pattern: `first_dense` dense blocks, then units of `every - 1` dense blocks and
    // one expert block, then dense blocks that do not fill a unit.
    let first_dense = moe.first_dense.min(model.layers);
    let every = moe.every.max(1);
    let units = (model.layers - first_dense) / every;
    let rest = (model.layers - first_dense) % every;
    let mut terms = Vec::new();
    if first_dense > 0 {
        terms.push(format!("[0]*{first_dense}"));
    }
    if units > 0 {
        terms.push(if every == 1 {
            format!("[1]*{units}")
        } else {
            format!("([0]*{}+[1])*{units}", every - 1)
        });
    }
    if rest > 0 {
        terms.push(format!("[0]*{rest}"));
    }
    Some(format!("({})", terms.join("+")))
}

fn moe_flags(spec: &Spec, strategy: &Strategy, flags: &mut Flags, report: &mut Report) {
    let Some(moe) = &spec.model.moe else {
        return;
    };
    flags.value("--num-experts", moe.experts);
    flags.value("--moe-router-topk", moe.top_k);
    flags.value("--moe-ffn-hidden-size", moe.expert_ffn_hidden);
    if moe.shared_experts > 0 {
        flags.value(
            "--moe-shared-expert-intermediate-size",
            moe.shared_experts * moe.expert_ffn_hidden,
        );
    }
    if let Some(pattern) = moe_layer_pattern(spec) {
        flags.value("--moe-layer-freq", format!("'{pattern}'"));
    }
    if strategy.ep > 1 {
        flags.value("--moe-token-dispatcher-type", "alltoall");
        if strategy.tp > 1 && !strategy.sequence_parallel {
            report.note(
                "Megatron-LM requires --sequence-parallel when expert and tensor parallelism \
                 are combined; the strategy has sequence_parallel = false",
            );
        }
        if moe.experts % strategy.ep != 0 {
            report.note(format!(
                "{} experts do not divide over ep = {}; Megatron-LM rejects this",
                moe.experts, strategy.ep
            ));
        }
    }
    // Megatron-LM's grouped GEMM for experts supports bf16 only.
    if matches!(spec.train.precision, Precision::Bf16 | Precision::Fp8) {
        flags.switch("--moe-grouped-gemm");
    }
    if strategy.ep > 1 && spec.train.precision == Precision::Fp16 {
        report.note("Megatron-LM rejects expert parallelism with fp16 training; use bf16");
    }
    if moe.capacity_factor > 1.0 {
        flags.value("--moe-expert-capacity-factor", moe.capacity_factor);
        flags.switch("--moe-pad-expert-input-to-capacity");
    } else if moe.capacity_factor < 1.0 {
        flags.value("--moe-expert-capacity-factor", moe.capacity_factor);
        report.note(format!(
            "capacity_factor {} < 1 drops tokens that overflow an expert",
            moe.capacity_factor
        ));
    } else {
        report.note(
            "capacity_factor 1.0 is written as Megatron-LM's dropless default (no \
             --moe-expert-capacity-factor)",
        );
    }
}

fn recompute_flags(strategy: &Strategy, flags: &mut Flags, report: &mut Report) {
    match strategy.recompute {
        Recompute::None => {}
        Recompute::Selective => flags.value("--recompute-granularity", "selective"),
        Recompute::Modules(modules) => {
            flags.value("--recompute-granularity", "selective");
            flags.value(
                "--recompute-modules",
                modules.names().collect::<Vec<_>>().join(" "),
            );
        }
        Recompute::Full => {
            flags.value("--recompute-granularity", "full");
            flags.value("--recompute-method", "uniform");
            flags.value("--recompute-num-layers", 1);
        }
        Recompute::Partial { full_layers } => {
            flags.value("--recompute-granularity", "full");
            flags.value("--recompute-method", "block");
            // With interleaving, Megatron-LM's block method counts layers per virtual stage.
            let v = if strategy.pp > 1 {
                strategy.interleave.max(1)
            } else {
                1
            };
            let per_chunk = full_layers.div_ceil(v);
            if per_chunk.saturating_mul(v) != full_layers {
                report.unsupported(format!(
                    "recompute = {{ full_layers = {full_layers} }} with interleave = {v}: \
                     Megatron-LM recomputes the first N layers of each of the {v} virtual stages, \
                     so {} layers per stage are recomputed",
                    per_chunk.saturating_mul(v)
                ));
            }
            flags.value("--recompute-num-layers", per_chunk);
        }
    }
}

fn offload_flags(spec: &Spec, strategy: &Strategy, flags: &mut Flags, report: &mut Report) {
    let offload = strategy.offload;
    if offload.optimizer > 0.0 && spec.train.framework == Framework::MegatronFsdp {
        report.unsupported(format!(
            "offload.optimizer = {}: Megatron-FSDP keeps optimizer state on the GPU",
            offload.optimizer
        ));
    } else if offload.optimizer > 0.0 {
        if strategy.zero == 0 {
            report.unsupported(format!(
                "offload.optimizer = {} with zero = 0: Megatron-LM offloads optimizer state only \
                 with its distributed optimizer; written with --use-distributed-optimizer",
                offload.optimizer
            ));
            flags.switch("--use-distributed-optimizer");
        }
        flags.switch("--optimizer-cpu-offload");
        flags.value("--optimizer-offload-fraction", offload.optimizer);
        // Megatron-LM runs the CPU optimizer through the precision-aware optimizer path.
        flags.switch("--use-precision-aware-optimizer");
    }
    if offload.weights > 0.0 {
        report.unsupported(format!(
            "offload.weights = {}: Megatron-LM has no flag to keep weights in host memory",
            offload.weights
        ));
    }
    if offload.gradients > 0.0 {
        report.unsupported(format!(
            "offload.gradients = {}: Megatron-LM keeps gradient buffers on the GPU (the CPU \
             optimizer copies them over for its step)",
            offload.gradients
        ));
    }
    if offload.activations > 0.0 {
        let layers = spec.model.layers;
        if strategy.pp > 1 || strategy.recompute != Recompute::None {
            report.unsupported(format!(
                "offload.activations = {}: Megatron-LM's activation offload \
                 (--cpu-offloading-num-layers) works only without pipeline parallelism and \
                 without recompute",
                offload.activations
            ));
        } else if layers < 2 {
            report.unsupported("offload.activations: Megatron-LM offloads at most layers - 1 layers, none for a one-layer model");
        } else {
            let n = ((offload.activations * layers as f64).round() as u64).clamp(1, layers - 1);
            flags.value("--cpu-offloading-num-layers", n);
            report.note(format!(
                "offload.activations = {} is written as the activations of {n} of {layers} layers \
                 (--cpu-offloading-num-layers)",
                offload.activations
            ));
        }
    }
}

fn render(
    spec: &Spec,
    strategy: &Strategy,
    flags: &Flags,
    report: &Report,
    tp: u64,
    cp: u64,
) -> String {
    let cluster = &spec.cluster;
    let mut out = String::from("#!/usr/bin/env bash\n");
    out.push_str(&format!(
        "# Megatron-LM launch for strategy `{}` of model `{}` on {},\n",
        strategy.name,
        spec.model.name,
        super::cluster_size(spec)
    ));
    out.push_str("# written by `tessel export`. Run it on every node.\n");
    report.push_comments(&mut out, "#");
    out.push_str("set -euo pipefail\n");
    if tp > 1 || cp > 1 {
        out.push_str(
            "# Megatron-LM requires this with tensor or context parallelism: kernels then run in\n\
             # issue order, so communication overlaps compute as scheduled.\n",
        );
        out.push_str("export CUDA_DEVICE_MAX_CONNECTIONS=1\n");
    }
    out.push_str("torchrun \\\n");
    out.push_str(&format!("  --nnodes {} \\\n", cluster.nodes));
    out.push_str(&format!(
        "  --nproc_per_node {} \\\n",
        cluster.gpus_per_node
    ));
    out.push_str("  --node_rank \"${NODE_RANK:-0}\" \\\n");
    out.push_str("  --master_addr \"${MASTER_ADDR:-localhost}\" \\\n");
    out.push_str("  --master_port \"${MASTER_PORT:-6000}\" \\\n");
    out.push_str("  pretrain_gpt.py");
    for flag in &flags.0 {
        out.push_str(" \\\n  ");
        out.push_str(flag.name);
        if let Some(value) = &flag.value {
            out.push(' ');
            out.push_str(value);
        }
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moe_layer_patterns() {
        use tessel_grammar::*;
        let mut spec = crate::export::test_spec::llama_like(8);
        spec.model.moe = Some(MoeSpec {
            experts: 8,
            top_k: 2,
            every: 1,
            expert_ffn_hidden: 64,
            shared_experts: 0,
            capacity_factor: 1.0,
            first_dense: 0,
        });
        assert_eq!(moe_layer_pattern(&spec), None);
        spec.model.moe.as_mut().unwrap().first_dense = 3;
        assert_eq!(moe_layer_pattern(&spec).unwrap(), "([0]*3+[1]*5)");
        spec.model.moe.as_mut().unwrap().first_dense = 0;
        spec.model.moe.as_mut().unwrap().every = 2;
        assert_eq!(moe_layer_pattern(&spec).unwrap(), "(([0]*1+[1])*4)");
        spec.model.moe.as_mut().unwrap().first_dense = 1;
        spec.model.moe.as_mut().unwrap().every = 3;
        assert_eq!(
            moe_layer_pattern(&spec).unwrap(),
            "([0]*1+([0]*2+[1])*2+[0]*1)"
        );
    }

    /// Expands a pattern the way Python would, to check it against `is_moe_layer`.
    fn expand(pattern: &str) -> Vec<u8> {
        fn parse(s: &[u8], i: &mut usize) -> Vec<u8> {
            let mut out = Vec::new();
            loop {
                let mut item = match s[*i] {
                    b'(' => {
                        *i += 1;
                        let inner = parse(s, i);
                        *i += 1; // ')'
                        inner
                    }
                    b'[' => {
                        let v = s[*i + 1] - b'0';
                        *i += 3;
                        vec![v]
                    }
                    c => panic!("unexpected {}", c as char),
                };
                if *i < s.len() && s[*i] == b'*' {
                    *i += 1;
                    let start = *i;
                    while *i < s.len() && s[*i].is_ascii_digit() {
                        *i += 1;
                    }
                    let n: usize = std::str::from_utf8(&s[start..*i]).unwrap().parse().unwrap();
                    item = item.repeat(n);
                }
                out.extend(item);
                if *i < s.len() && s[*i] == b'+' {
                    *i += 1;
                } else {
                    return out;
                }
            }
        }
        parse(pattern.as_bytes(), &mut 0)
    }

    #[test]
    fn patterns_expand_to_the_expert_blocks() {
        use tessel_grammar::*;
        for layers in 1..=13u64 {
            for every in 1..=4u64 {
                for first_dense in 0..4u64 {
                    let mut spec = crate::export::test_spec::llama_like(layers);
                    spec.model.moe = Some(MoeSpec {
                        experts: 4,
                        top_k: 1,
                        every,
                        expert_ffn_hidden: 64,
                        shared_experts: 0,
                        capacity_factor: 1.0,
                        first_dense,
                    });
                    let want: Vec<u8> = (0..layers)
                        .map(|l| u8::from(spec.model.is_moe_layer(l)))
                        .collect();
                    let got = match moe_layer_pattern(&spec) {
                        None => vec![1; layers as usize],
                        Some(p) => expand(&p),
                    };
                    assert_eq!(
                        got, want,
                        "layers {layers} every {every} first {first_dense}"
                    );
                }
            }
        }
    }
}
