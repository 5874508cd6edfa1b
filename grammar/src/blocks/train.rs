//! The `train` block: which model, on which cluster, with what batch and precision.

use crate::ast::Name;
use crate::diagnostic::Problem;
use crate::eval::{Spanned, Value};
use crate::fields::Fields;
use crate::spec::{
    AttentionKernel, CheckpointTarget, CompressionMethod, EncoderPlacement, FailureSpec,
    FinetuneMethod, FinetuneSpec, Fp8Scaling, Framework, GradCompression, LoraTargets,
    MemorySavingKernels, Mtbf, MultimodalTraining, NormKernel, Optimizer, OverlapSpec, Precision,
    TrainSpec,
};
use crate::suggest;
use crate::units::Dim;

pub const FIELDS: &[&str] = &[
    "model",
    "cluster",
    "seq_len",
    "global_batch",
    "precision",
    "optimizer",
    "flash_attention",
    "attention_kernel",
    "norm_kernel",
    "dropout",
    "framework",
    "fp8_scaling",
    "fused_cross_entropy",
    "compile",
    "memory_saving_kernels",
    "overlap",
    "failures",
    "checkpoint",
    "finetune",
    "grad_compression",
    "multimodal",
];

const GRAD_COMPRESSION_FIELDS: &[&str] = &["method", "rank", "ratio"];

/// PowerSGD's rank and top-k's ratio when the spec does not say: PowerSGD's paper trains at
/// rank 2–4 (Vogels et al. 2019, table 3); top-k at 1 % is a common setting (Lin et al. 2018).
pub const DEFAULT_POWERSGD_RANK: u64 = 4;
pub const DEFAULT_TOPK_RATIO: f64 = 0.01;

const FINETUNE_FIELDS: &[&str] = &["method", "rank", "targets"];

/// LoRA's rank when the spec does not say (PEFT's examples use 8–16; the 16).
pub const DEFAULT_LORA_RANK: u64 = 16;

const FAILURE_FIELDS: &[&str] = &["mtbf_per_gpu", "mtbf", "restart"];
const CHECKPOINT_FIELDS: &[&str] = &["to", "bandwidth"];

/// Detection, rescheduling and start-up after a failure, when the spec does not say.
pub const DEFAULT_RESTART_S: f64 = 600.0;

const OVERLAP_FIELDS: &[&str] = &["grad_reduce", "param_gather", "tp_comm"];

/// Far beyond any training run; keeps token counts exact.
pub const MAX_TOKENS_PER_STEP: f64 = 1e15;

pub const PRECISIONS: &[(&str, Precision)] = &[
    ("bf16", Precision::Bf16),
    ("fp16", Precision::Fp16),
    ("fp8", Precision::Fp8),
    ("fp32", Precision::Fp32),
];

const OPTIMIZERS: &[(&str, Optimizer)] = &[("adam", Optimizer::Adam), ("sgd", Optimizer::Sgd)];

pub const FP8_SCALINGS: &[(&str, Fp8Scaling)] = &[
    ("delayed", Fp8Scaling::Delayed),
    ("tensorwise", Fp8Scaling::Tensorwise),
    ("rowwise", Fp8Scaling::Rowwise),
];

/// The `model` and `cluster` a job (`train`, `serve`) names, each required.
pub fn job_references(f: &mut Fields) -> (Option<Name>, Option<Name>) {
    let mut required = |key: &str, what: &str, example: &str| {
        if f.has(key) {
            f.reference(key, what)
        } else {
            f.missing(key, example);
            None
        }
    };
    let model = required("model", "a model", "llama3_70b");
    let cluster = required("cluster", "a cluster", "dgx_h100");
    (model, cluster)
}

/// A train block before its references are looked up.
pub struct TrainDef {
    pub model: Option<Name>,
    pub cluster: Option<Name>,
    pub spec: Option<TrainSpec>,
}

pub fn lower(f: &mut Fields) -> TrainDef {
    let before = f.problems.len();
    f.reject_unknown(FIELDS);
    let (model, cluster) = job_references(f);
    let seq_len = f.required_count("seq_len", 1, "8192");
    let global_batch = f.required_count("global_batch", 1, "512");
    let precision = f.choice("precision", PRECISIONS).unwrap_or(Precision::Bf16);
    let optimizer = f.choice("optimizer", OPTIMIZERS).unwrap_or(Optimizer::Adam);
    let flash_attention = f.boolean("flash_attention").unwrap_or(true);
    let kernels = AttentionKernel::ALL.map(|kernel| (kernel.name(), kernel));
    let attention_kernel = f.choice("attention_kernel", &kernels);
    if attention_kernel.is_some() && !flash_attention {
        let at = f.get("attention_kernel").map_or(f.anchor, |v| v.span);
        f.problems.push(
            Problem::new(
                at,
                "`attention_kernel` names a fused kernel, but `flash_attention = false`",
            )
            .with_help("set `flash_attention = true`, or remove `attention_kernel`"),
        );
    }
    let norm_kernels = NormKernel::ALL.map(|kernel| (kernel.name(), kernel));
    let norm_kernel = f.choice("norm_kernel", &norm_kernels);
    let dropout = f.fraction("dropout").unwrap_or(0.0);
    let frameworks = Framework::ALL.map(|framework| (framework.name(), framework));
    let framework = f.choice("framework", &frameworks).unwrap_or_default();
    let fp8_scaling = f.choice("fp8_scaling", FP8_SCALINGS);
    let fused_cross_entropy = f.boolean("fused_cross_entropy");
    let compile = f.boolean("compile").unwrap_or(false);
    if compile && norm_kernel == Some(NormKernel::Composite) {
        let at = f.get("norm_kernel").map_or(f.anchor, |v| v.span);
        f.problems.push(
            Problem::new(
                at,
                "`norm_kernel = composite`, but `compile = true` fuses the norm's operators",
            )
            .with_help("remove `norm_kernel`, or set `compile = false`"),
        );
    }
    let memory_saving_kernels = memory_saving_kernels(f);
    let overlap = match f.get("overlap").cloned() {
        None => None,
        Some(value) => Fields::record(
            "overlap",
            &value,
            "{ grad_reduce = true, param_gather = true, tp_comm = false }",
            f.problems,
        )
        .map(|mut r| {
            r.reject_unknown(OVERLAP_FIELDS);
            OverlapSpec {
                grad_reduce: r.boolean("grad_reduce"),
                param_gather: r.boolean("param_gather"),
                tp_comm: r.boolean("tp_comm"),
            }
        }),
    };
    let failures = failures(f);
    let finetune = finetune(f);
    let grad_compression = grad_compression(f);
    let multimodal = multimodal(f);
    if fp8_scaling.is_some() && precision != Precision::Fp8 {
        let at = f.get("fp8_scaling").map_or(f.anchor, |v| v.span);
        f.problems.push(
            Problem::new(at, "`fp8_scaling` applies only to FP8 training")
                .with_help("set `precision = fp8`, or remove `fp8_scaling`"),
        );
    }
    if dropout >= 1.0 {
        let at = f.get("dropout").map_or(f.anchor, |v| v.span);
        f.problems.push(
            Problem::new(at, "`dropout` is a probability below 1, found 1")
                .with_help("Megatron-LM's GPT default is `dropout = 0.1`; 0 disables it"),
        );
    }
    if let (Some(s), Some(b)) = (seq_len, global_batch) {
        if s as f64 * b as f64 > MAX_TOKENS_PER_STEP {
            let at = f.get("global_batch").map_or(f.anchor, |v| v.span);
            f.problems.push(Problem::new(
                at,
                format!(
                    "global_batch·seq_len = {b}·{s} tokens per step is more than the \
                     {MAX_TOKENS_PER_STEP:.0e} supported"
                ),
            ));
        }
    }
    let spec = if f.problems.len() > before {
        None
    } else {
        seq_len
            .zip(global_batch)
            .map(|(seq_len, global_batch)| TrainSpec {
                seq_len,
                global_batch,
                precision,
                optimizer,
                flash_attention,
                attention_kernel,
                norm_kernel,
                dropout,
                framework,
                fp8_scaling,
                fused_cross_entropy,
                compile,
                memory_saving_kernels,
                overlap,
                failures,
                finetune,
                grad_compression,
                multimodal,
            })
    };
    TrainDef {
        model,
        cluster,
        spec,
    }
}

const MULTIMODAL_FIELDS: &[&str] = &["placement", "encoder_gpus", "reorder"];

/// `multimodal = { placement = auto | first_stage | separate, encoder_gpus = 16, reorder =
/// true }`.
fn multimodal(f: &mut Fields) -> Option<MultimodalTraining> {
    let value = f.get("multimodal").cloned()?;
    let before = f.problems.len();
    let mut r = Fields::record(
        "multimodal",
        &value,
        "{ placement = separate, encoder_gpus = 16 }",
        f.problems,
    )?;
    r.reject_unknown(MULTIMODAL_FIELDS);
    let placements = EncoderPlacement::ALL.map(|p| (p.name(), p));
    let placement = r
        .choice("placement", &placements)
        .unwrap_or(EncoderPlacement::Auto);
    let encoder_gpus = r.count("encoder_gpus", 1);
    let reorder = r.boolean("reorder").unwrap_or(true);
    if encoder_gpus.is_some()
        && ![EncoderPlacement::Separate, EncoderPlacement::Auto].contains(&placement)
    {
        let at = r.get("encoder_gpus").map_or(value.span, |v| v.span);
        r.problems.push(
            Problem::new(
                at,
                "`encoder_gpus` sizes the encoders' own GPUs, which `placement = first_stage` has none of",
            )
            .with_help("remove `encoder_gpus`, or choose `placement = separate`"),
        );
    }
    if f.problems.len() > before {
        return None;
    }
    Some(MultimodalTraining {
        placement,
        encoder_gpus,
        reorder,
    })
}

/// `memory_saving_kernels = true | false | auto`.
fn memory_saving_kernels(f: &mut Fields) -> MemorySavingKernels {
    let Some(value) = f.get("memory_saving_kernels").cloned() else {
        return MemorySavingKernels::Off;
    };
    match &value.value {
        Value::Bool(true) => MemorySavingKernels::On,
        Value::Bool(false) | Value::Invalid => MemorySavingKernels::Off,
        Value::Ident(name) if name == "auto" => MemorySavingKernels::Auto,
        other => {
            let help = match other {
                Value::Ident(name) => suggest::did_you_mean(name, ["true", "false", "auto"]),
                _ => None,
            };
            f.problems.push(
                Problem::new(
                    value.span,
                    format!(
                        "`memory_saving_kernels` expects `true`, `false` or `auto`, found {}",
                        other.describe()
                    ),
                )
                .with_optional_help(help),
            );
            MemorySavingKernels::Off
        }
    }
}

/// `grad_compression = { method = powersgd, rank = 4 }` (or `topk` with `ratio`, `fp8`, `auto`).
fn grad_compression(f: &mut Fields) -> Option<GradCompression> {
    let value = f.get("grad_compression").cloned()?;
    let before = f.problems.len();
    let mut r = Fields::record(
        "grad_compression",
        &value,
        "{ method = powersgd, rank = 4 }",
        f.problems,
    )?;
    r.reject_unknown(GRAD_COMPRESSION_FIELDS);
    let methods = CompressionMethod::ALL.map(|m| (m.name(), m));
    let method = if r.has("method") {
        r.choice("method", &methods)
    } else {
        r.missing("method", "powersgd");
        None
    };
    let rank = r.count("rank", 1).unwrap_or(DEFAULT_POWERSGD_RANK);
    let ratio = r.fraction("ratio").unwrap_or(DEFAULT_TOPK_RATIO);
    // `rank` is PowerSGD's, `ratio` top-k's; `auto` may use either.
    for (field, owner) in [
        ("rank", CompressionMethod::Powersgd),
        ("ratio", CompressionMethod::Topk),
    ] {
        let Some(method) =
            method.filter(|m| r.has(field) && ![owner, CompressionMethod::Auto].contains(m))
        else {
            continue;
        };
        let at = r.get(field).map_or(value.span, |v| v.span);
        r.problems.push(
            Problem::new(
                at,
                format!(
                    "`{field}` belongs to `{}`, not `{}`",
                    owner.name(),
                    method.name()
                ),
            )
            .with_help(format!(
                "remove `{field}`, or choose `method = {}`",
                owner.name()
            )),
        );
    }
    if r.has("ratio") && !(ratio > 0.0 && ratio < 1.0) {
        let at = r.get("ratio").map_or(value.span, |v| v.span);
        r.problems.push(
            Problem::new(at, "top-k's `ratio` is a share above 0 and below 1")
                .with_help("ratio = 1%"),
        );
    }
    if f.problems.len() > before {
        return None;
    }
    Some(GradCompression {
        method: method?,
        rank,
        ratio,
    })
}

/// `finetune = { method = lora, rank = 16, targets = [qkv, o, mlp] }`.
fn finetune(f: &mut Fields) -> Option<FinetuneSpec> {
    let value = f.get("finetune").cloned()?;
    let example = "{ method = lora, rank = 16, targets = [qkv, o, mlp] }";
    let before = f.problems.len();
    let mut r = Fields::record("finetune", &value, example, f.problems)?;
    r.reject_unknown(FINETUNE_FIELDS);
    let methods = FinetuneMethod::ALL.map(|m| (m.name(), m));
    let method = if r.has("method") {
        r.choice("method", &methods)
    } else {
        r.missing("method", "lora");
        None
    };
    let rank = r.count("rank", 1).unwrap_or(DEFAULT_LORA_RANK);
    let targets = match r.get("targets").cloned() {
        None => LoraTargets::ALL,
        Some(v) => lora_targets(&v, r.problems),
    };
    if method == Some(FinetuneMethod::Full) && (r.has("rank") || r.has("targets")) {
        let at = r
            .get("rank")
            .or(r.get("targets"))
            .map_or(value.span, |v| v.span);
        r.problems.push(
            Problem::new(
                at,
                "full fine-tuning trains every weight: it has no adapters",
            )
            .with_help("choose `method = lora`, or remove `rank` and `targets`"),
        );
    }
    if targets == LoraTargets::default() {
        let at = r.get("targets").map_or(value.span, |v| v.span);
        r.problems.push(
            Problem::new(at, "`targets` names no projection").with_help("targets = [qkv, o, mlp]"),
        );
    }
    if f.problems.len() > before {
        return None;
    }
    Some(FinetuneSpec {
        method: method?,
        rank,
        targets,
    })
}

/// `[qkv, o, mlp]`: a list of distinct projection names.
fn lora_targets(value: &Spanned, problems: &mut Vec<Problem>) -> LoraTargets {
    let mut targets = LoraTargets::default();
    let Value::List(items) = &value.value else {
        problems.push(Problem::new(
            value.span,
            format!(
                "`targets` expects a list such as `[qkv, o, mlp]`, found {}",
                value.value.describe()
            ),
        ));
        return targets;
    };
    for item in items {
        let names = [("qkv", 0usize), ("o", 1), ("mlp", 2)];
        let Some(which) = crate::fields::to_choice("targets", item, &names, problems) else {
            continue;
        };
        let slot = match which {
            0 => &mut targets.qkv,
            1 => &mut targets.o,
            _ => &mut targets.mlp,
        };
        if *slot {
            problems.push(
                Problem::new(item.span, "this projection is named twice in `targets`")
                    .with_help("name each of `qkv`, `o` and `mlp` once"),
            );
        }
        *slot = true;
    }
    targets
}

/// `failures = { mtbf_per_gpu = 50000 h, restart = 10 min }` and `checkpoint = { to = disk,
/// bandwidth = 2 GB/s }`: exactly one of the two MTBFs; a disk needs its bandwidth; a
/// checkpoint target means nothing without failures to plan against.
fn failures(f: &mut Fields) -> Option<FailureSpec> {
    let written = f.get("failures").cloned();
    let checkpoint = f.get("checkpoint").cloned();
    let (mut to, mut disk_bandwidth) = (None, None);
    if let Some(value) = &checkpoint {
        let example = "{ to = disk, bandwidth = 2 GB/s }";
        if let Some(mut r) = Fields::record("checkpoint", value, example, f.problems) {
            r.reject_unknown(CHECKPOINT_FIELDS);
            let targets = CheckpointTarget::ALL.map(|t| (t.name(), t));
            to = r.choice("to", &targets);
            disk_bandwidth = r.quantity("bandwidth", Dim::BANDWIDTH, true);
            if to == Some(CheckpointTarget::Disk) && !r.has("bandwidth") {
                r.missing("bandwidth", "2 GB/s");
            }
        }
    }
    let Some(value) = written else {
        if let Some(value) = checkpoint {
            f.problems.push(
                Problem::new(
                    value.span,
                    "`checkpoint` says where planned checkpoints go, but the spec plans none",
                )
                .with_help("add `failures = { mtbf_per_gpu = 50000 h }` beside it"),
            );
        }
        return None;
    };
    let example = "{ mtbf_per_gpu = 50000 h }";
    let mut r = Fields::record("failures", &value, example, f.problems)?;
    r.reject_unknown(FAILURE_FIELDS);
    let per_gpu = r.quantity("mtbf_per_gpu", Dim::TIME, true);
    let job = r.quantity("mtbf", Dim::TIME, true);
    let restart_s = r
        .quantity("restart", Dim::TIME, false)
        .unwrap_or(DEFAULT_RESTART_S);
    let mtbf = match (per_gpu, job) {
        (Some(s), None) => Mtbf::PerGpu(s),
        (None, Some(s)) => Mtbf::Job(s),
        (Some(_), Some(_)) => {
            let at = r.get("mtbf").map_or(value.span, |v| v.span);
            r.problems.push(
                Problem::new(at, "`failures` gives both `mtbf_per_gpu` and `mtbf`")
                    .with_help("keep one: `mtbf` is the whole job's, `mtbf_per_gpu` one GPU's"),
            );
            return None;
        }
        (None, None) => {
            if !r.has("mtbf_per_gpu") && !r.has("mtbf") {
                r.missing("mtbf_per_gpu", "50000 h");
            }
            return None;
        }
    };
    Some(FailureSpec {
        mtbf,
        restart_s,
        checkpoint_to: to,
        disk_bandwidth,
    })
}
