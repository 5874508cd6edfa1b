//! The `train` block: which model, on which cluster, with what batch and precision.

use crate::ast::Name;
use crate::diagnostic::Problem;
use crate::fields::Fields;
use crate::spec::{Fp8Scaling, Framework, Optimizer, OverlapSpec, Precision, TrainSpec};

pub const FIELDS: &[&str] = &[
    "model",
    "cluster",
    "seq_len",
    "global_batch",
    "precision",
    "optimizer",
    "flash_attention",
    "dropout",
    "framework",
    "fp8_scaling",
    "fused_cross_entropy",
    "compile",
    "overlap",
];

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

/// A train block before its references are looked up.
pub struct TrainDef {
    pub model: Option<Name>,
    pub cluster: Option<Name>,
    pub spec: Option<TrainSpec>,
}

pub fn lower(f: &mut Fields) -> TrainDef {
    let before = f.problems.len();
    f.reject_unknown(FIELDS);
    let model = if f.has("model") {
        f.reference("model", "a model")
    } else {
        f.missing("model", "llama3_70b");
        None
    };
    let cluster = if f.has("cluster") {
        f.reference("cluster", "a cluster")
    } else {
        f.missing("cluster", "dgx_h100");
        None
    };
    let seq_len = f.required_count("seq_len", 1, "8192");
    let global_batch = f.required_count("global_batch", 1, "512");
    let precision = f.choice("precision", PRECISIONS).unwrap_or(Precision::Bf16);
    let optimizer = f.choice("optimizer", OPTIMIZERS).unwrap_or(Optimizer::Adam);
    let flash_attention = f.boolean("flash_attention").unwrap_or(true);
    let dropout = f.fraction("dropout").unwrap_or(0.0);
    let frameworks = Framework::ALL.map(|framework| (framework.name(), framework));
    let framework = f.choice("framework", &frameworks).unwrap_or_default();
    let fp8_scaling = f.choice("fp8_scaling", FP8_SCALINGS);
    let fused_cross_entropy = f.boolean("fused_cross_entropy");
    let compile = f.boolean("compile").unwrap_or(false);
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
                dropout,
                framework,
                fp8_scaling,
                fused_cross_entropy,
                compile,
                overlap,
            })
    };
    TrainDef {
        model,
        cluster,
        spec,
    }
}
