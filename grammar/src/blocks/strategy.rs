//! `strategy` blocks: one fixed parallel configuration, checked against the job it is for.

use crate::diagnostic::Problem;
use crate::eval::{Spanned, Value};
use crate::fields::{to_count, Fields};
use crate::source::Span;
use crate::spec::{
    ClusterSpec, Framework, ModelSpec, Offload, Recompute, RecomputeModules, Strategy, TrainSpec,
};
use crate::suggest;

pub const FIELDS: &[&str] = &[
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "etp",
    "dp_shard",
    "microbatch",
    "interleave",
    "recompute",
    "sequence_parallel",
    "zero",
    "offload",
    "stages",
];

const OFFLOAD_FIELDS: &[&str] = &["optimizer", "weights", "gradients", "activations"];

/// The job a strategy must fit.
pub struct Context<'a> {
    pub model: &'a ModelSpec,
    pub cluster: &'a ClusterSpec,
    pub train: &'a TrainSpec,
}

pub fn to_recompute(key: &str, v: &Spanned, problems: &mut Vec<Problem>) -> Option<Recompute> {
    const NAMES: [&str; 3] = ["none", "selective", "full"];
    match &v.value {
        Value::Ident(name) if name == "none" => Some(Recompute::None),
        Value::Ident(name) if name == "selective" => Some(Recompute::Selective),
        Value::Ident(name) if name == "full" => Some(Recompute::Full),
        Value::Record(_) => {
            let mut record = Fields::record(key, v, "{ full_layers = 4 }", problems)?;
            record.reject_unknown(&["full_layers", "modules"]);
            if let Some(modules) = record.get("modules").cloned() {
                if let Some(full) = record.get("full_layers") {
                    record.problems.push(
                        Problem::new(
                            full.span,
                            format!("`{key}` takes `full_layers` or `modules`, not both"),
                        )
                        .with_help("recompute whole layers or named modules of every layer"),
                    );
                    return None;
                }
                return to_modules(&modules, record.problems).map(Recompute::of_modules);
            }
            let layers = record.required_count("full_layers", 1, "4");
            Some(Recompute::Partial {
                full_layers: layers?,
            })
        }
        other => {
            let help = match other {
                Value::Ident(name) => suggest::did_you_mean(name, NAMES),
                _ => None,
            };
            problems.push(
                Problem::new(
                    v.span,
                    format!(
                        "`{key}` expects `none`, `selective`, `full`, `{{ full_layers = N }}` or \
                         `{{ modules = [layernorm, moe_act] }}`, found {}",
                        other.describe()
                    ),
                )
                .with_optional_help(help),
            );
            None
        }
    }
}

/// Megatron-LM recompute modules Tessel does not model yet, with what they re-run.
const UNMODELLED_MODULES: [&str; 6] = [
    "mlp",
    "moe",
    "experts",
    "router",
    "shared_experts",
    "mla_up_proj",
];

/// `modules = [core_attn, layernorm, moe_act]`: Megatron-LM's `--recompute-modules`.
fn to_modules(v: &Spanned, problems: &mut Vec<Problem>) -> Option<RecomputeModules> {
    let known = RecomputeModules::ALL;
    let Value::List(elements) = &v.value else {
        problems.push(Problem::new(
            v.span,
            format!(
                "`modules` expects a list such as `[layernorm, moe_act]`, found {}",
                v.value.describe()
            ),
        ));
        return None;
    };
    if elements.is_empty() {
        problems.push(
            Problem::new(v.span, "`modules` lists no module")
                .with_help("write `recompute = none` to recompute nothing"),
        );
        return None;
    }
    let before = problems.len();
    let mut set = RecomputeModules::NONE;
    for element in elements {
        let name = match &element.value {
            Value::Ident(name) => name.as_str(),
            other => {
                problems.push(Problem::new(
                    element.span,
                    format!(
                        "a recompute module is one of {}, found {}",
                        known,
                        other.describe()
                    ),
                ));
                continue;
            }
        };
        match RecomputeModules::by_name(name) {
            Some(module) => set = set.with(module),
            None if UNMODELLED_MODULES.contains(&name) => problems.push(
                Problem::new(
                    element.span,
                    format!("recompute of `{name}` is not modelled by Tessel yet"),
                )
                .with_help(format!(
                    "the modules Tessel models are {}; `full` re-runs whole layers",
                    known
                )),
            ),
            None => problems.push(
                Problem::new(
                    element.span,
                    format!("unknown recompute module `{name}`: Tessel models {}", known),
                )
                .with_optional_help(suggest::did_you_mean(name, known.names())),
            ),
        }
    }
    (problems.len() == before).then_some(set)
}

pub fn to_offload(key: &str, v: &Spanned, problems: &mut Vec<Problem>) -> Option<Offload> {
    match &v.value {
        Value::Ident(name) if name == "none" => Some(Offload::default()),
        Value::Record(_) => {
            let mut record = Fields::record(key, v, "{ optimizer = 1.0 }", problems)?;
            let before = record.problems.len();
            record.reject_unknown(OFFLOAD_FIELDS);
            let offload = Offload {
                optimizer: record.fraction("optimizer").unwrap_or(0.0),
                weights: record.fraction("weights").unwrap_or(0.0),
                gradients: record.fraction("gradients").unwrap_or(0.0),
                activations: record.fraction("activations").unwrap_or(0.0),
            };
            (record.problems.len() == before).then_some(offload)
        }
        other => {
            let help = match other {
                Value::Ident(name) => suggest::did_you_mean(name, ["none"]),
                _ => None,
            };
            problems.push(
                Problem::new(
                    v.span,
                    format!(
                        "`{key}` expects `none` or fractions such as `{{ optimizer = 1.0 }}`, \
                         found {}",
                        other.describe()
                    ),
                )
                .with_optional_help(help),
            );
            None
        }
    }
}

/// One value for every pipeline stage, or a list with one value per stage.
fn per_stage<T>(
    key: &str,
    v: &Spanned,
    problems: &mut Vec<Problem>,
    one: fn(&str, &Spanned, &mut Vec<Problem>) -> Option<T>,
) -> Option<Vec<T>> {
    match &v.value {
        Value::List(elements) if elements.is_empty() => {
            problems.push(
                Problem::new(v.span, format!("`{key}` lists no stages"))
                    .with_help("give one entry per pipeline stage, or a single value for all"),
            );
            None
        }
        Value::List(elements) => {
            let values: Vec<Option<T>> = elements.iter().map(|e| one(key, e, problems)).collect();
            values.into_iter().collect()
        }
        _ => one(key, v, problems).map(|value| vec![value]),
    }
}

pub fn to_zero(key: &str, v: &Spanned, problems: &mut Vec<Problem>) -> Option<u8> {
    let stage = to_count(key, v, 0, problems)?;
    if stage > 3 {
        problems.push(Problem::new(
            v.span,
            format!("`{key}` is a ZeRO stage from 0 to 3, found {stage}"),
        ));
        return None;
    }
    Some(stage as u8)
}

fn stages(key: &str, v: &Spanned, problems: &mut Vec<Problem>) -> Option<Vec<u64>> {
    match &v.value {
        Value::List(elements) => {
            let counts: Vec<Option<u64>> = elements
                .iter()
                .map(|e| to_count(key, e, 0, problems))
                .collect();
            let counts: Vec<u64> = counts.into_iter().collect::<Option<_>>()?;
            if let Some(reason) = crate::chunks::empty_chunk_error(&counts) {
                problems.push(
                    Problem::new(v.span, format!("`{key}`: {reason}"))
                        .with_help("give every chunk between the first and the last a layer"),
                );
                return None;
            }
            Some(counts)
        }
        other => {
            problems.push(Problem::new(
                v.span,
                format!(
                    "`{key}` expects a list of layer counts such as `[20, 20, 20, 20]`, found {}",
                    other.describe()
                ),
            ));
            None
        }
    }
}

pub fn lower(name: &str, f: &mut Fields, context: Option<&Context>) -> Option<Strategy> {
    let before = f.problems.len();
    f.reject_unknown(FIELDS);
    let tp = f.count("tp", 1);
    let pp = f.count("pp", 1);
    let cp = f.count("cp", 1);
    let ep = f.count("ep", 1);
    let etp = f.count("etp", 1);
    let dp = f.count("dp", 1);
    let dp_shard = f.count("dp_shard", 1);
    let microbatch = f.count("microbatch", 1);
    let interleave = f.count("interleave", 1);
    let recompute = match f.get("recompute").cloned() {
        Some(v) if v.value != Value::Invalid => {
            per_stage("recompute", &v, f.problems, to_recompute)
        }
        _ => Some(vec![Recompute::None]),
    };
    let sequence_parallel = f.boolean("sequence_parallel").unwrap_or(false);
    let zero = match f.get("zero").cloned() {
        Some(v) if v.value != Value::Invalid => to_zero("zero", &v, f.problems),
        _ => Some(0),
    };
    let offload = match f.get("offload").cloned() {
        Some(v) if v.value != Value::Invalid => per_stage("offload", &v, f.problems, to_offload),
        _ => Some(vec![Offload::default()]),
    };
    let stages = match f.get("stages").cloned() {
        Some(v) if v.value != Value::Invalid => stages("stages", &v, f.problems).map(Some),
        _ => Some(None),
    };
    if f.problems.len() > before {
        return None;
    }
    let written = |key: &str| f.has(key);
    let (tp, pp, cp, ep) = (
        tp.unwrap_or(1),
        pp.unwrap_or(1),
        cp.unwrap_or(1),
        ep.unwrap_or(1),
    );
    let mut strategy = Strategy {
        name: name.to_string(),
        dp: dp.unwrap_or(1),
        tp,
        pp,
        cp,
        ep,
        etp,
        dp_shard,
        microbatch: microbatch.unwrap_or(1),
        interleave: interleave.unwrap_or(1),
        sequence_parallel,
        zero: zero?,
        stages: stages?,
        ..Strategy::default()
    };
    let (recompute, offload) = (recompute?, offload?);
    let listed = (recompute.len(), offload.len());
    strategy.set_stage_options(recompute, offload);
    let Some(context) = context else {
        return Some(strategy);
    };
    let at = |key: &str| f.get(key).map_or(f.anchor, |v| v.span);
    let mut problems = Vec::new();
    check_degrees(&mut strategy, context, written("dp"), &at, &mut problems);
    // Sharding over every data-parallel rank is plain ZeRO: one way to write it.
    if strategy.dp_shard == Some(strategy.dp) {
        strategy.dp_shard = None;
    }
    for (key, count) in [("recompute", listed.0), ("offload", listed.1)] {
        if f.get(key)
            .is_some_and(|v| matches!(v.value, Value::List(_)))
            && count != strategy.pp as usize
        {
            problems.push(
                Problem::new(
                    at(key),
                    format!("`{key}` lists {count} stages, but pp = {}", strategy.pp),
                )
                .with_help("give one entry per pipeline stage, or a single value for all"),
            );
        }
    }
    if problems.is_empty() {
        check_fit(&strategy, context, &at, &mut problems);
    }
    if problems.is_empty() {
        check_framework(&strategy, context, &at, &mut problems);
    }
    let ok = problems.is_empty();
    f.problems.extend(problems);
    ok.then_some(strategy)
}

/// dp·tp·pp·cp against the cluster (every pool of it), filling in `dp` when it is not written.
fn check_degrees(
    s: &mut Strategy,
    c: &Context,
    dp_written: bool,
    at: &dyn Fn(&str) -> Span,
    problems: &mut Vec<Problem>,
) {
    let gpus = c.cluster.pooled_gpus();
    let model_parallel = s.tp.saturating_mul(s.pp).saturating_mul(s.cp);
    let cluster = &c.cluster.name;
    if !dp_written {
        if !gpus.is_multiple_of(model_parallel) {
            problems.push(Problem::new(
                at("tp"),
                format!(
                    "tp·pp·cp = {}·{}·{} = {model_parallel} does not divide the {gpus} GPUs of \
                     cluster `{cluster}`",
                    s.tp, s.pp, s.cp
                ),
            ));
            return;
        }
        s.dp = gpus / model_parallel;
    } else if s.dp.saturating_mul(model_parallel) != gpus {
        let help = if gpus.is_multiple_of(model_parallel) {
            format!(
                "with tp = {}, pp = {} and cp = {}, dp must be {}",
                s.tp,
                s.pp,
                s.cp,
                gpus / model_parallel
            )
        } else {
            "leave `dp` out to use every GPU".to_string()
        };
        problems.push(
            Problem::new(
                at("dp"),
                format!(
                    "dp·tp·pp·cp = {}·{}·{}·{} = {} GPUs, but cluster `{cluster}` has {gpus}",
                    s.dp,
                    s.tp,
                    s.pp,
                    s.cp,
                    s.dp.saturating_mul(model_parallel)
                ),
            )
            .with_help(help),
        );
    }
}

/// Everything else a strategy must satisfy to run the model on the cluster.
fn check_fit(s: &Strategy, c: &Context, at: &dyn Fn(&str) -> Span, problems: &mut Vec<Problem>) {
    let m = c.model;
    let model = &m.name;
    if !m.heads.is_multiple_of(s.tp) {
        problems.push(Problem::new(
            at("tp"),
            format!(
                "`tp` ({}) must divide the {} attention heads of model `{model}`",
                s.tp, m.heads
            ),
        ));
    }
    match &m.moe {
        None if s.ep > 1 => problems.push(Problem::new(
            at("ep"),
            format!("`ep` is {} but model `{model}` has no experts", s.ep),
        )),
        Some(moe) if moe.experts % s.ep != 0 => problems.push(Problem::new(
            at("ep"),
            format!(
                "`ep` ({}) must divide the {} experts of model `{model}`",
                s.ep, moe.experts
            ),
        )),
        _ => {}
    }
    let data_ranks = s.dp.saturating_mul(s.cp);
    if s.etp.is_none() && !data_ranks.is_multiple_of(s.ep) {
        problems.push(
            Problem::new(
                at("ep"),
                format!(
                    "`ep` ({}) must divide dp·cp = {}·{} = {}",
                    s.ep, s.dp, s.cp, data_ranks
                ),
            )
            .with_help(
                "expert-parallel ranks are drawn from the data- and context-parallel ranks; \
                 `etp = 1` folds them over the tensor-parallel ranks too",
            ),
        );
    } else if s.etp.is_some() && problems.is_empty() {
        if let Some(reason) = s.expert_layout_error(m) {
            problems.push(Problem::new(
                at("etp"),
                format!("{reason} (model `{model}`)"),
            ));
        }
    }
    if let Some(reason) = s.hybrid_sharding_error() {
        problems.push(Problem::new(at("dp_shard"), reason).with_help(format!(
            "dp_shard takes a divisor of dp = {}, with zero = 1, 2 or 3",
            s.dp
        )));
    }
    if s.pp > m.layers {
        problems.push(Problem::new(
            at("pp"),
            format!(
                "`pp` ({}) exceeds the {} layers of model `{model}`",
                s.pp, m.layers
            ),
        ));
    }
    if s.interleave > 1 && s.pp == 1 {
        problems.push(Problem::new(
            at("interleave"),
            "`interleave` needs pipeline parallelism (`pp` above 1)",
        ));
    }
    let chunks = s.pp.saturating_mul(s.interleave);
    match &s.stages {
        Some(stages) => {
            if stages.len() as u64 != chunks {
                let what = if s.interleave > 1 {
                    format!("pp·interleave = {}·{} = {chunks}", s.pp, s.interleave)
                } else {
                    format!("pp = {}", s.pp)
                };
                problems.push(Problem::new(
                    at("stages"),
                    format!("`stages` lists {} stages, but {what}", stages.len()),
                ));
            }
            let sum = stages.iter().fold(0u64, |a, &b| a.saturating_add(b));
            if sum != m.layers {
                problems.push(Problem::new(
                    at("stages"),
                    format!(
                        "`stages` places {sum} layers, but model `{model}` has {}",
                        m.layers
                    ),
                ));
            }
        }
        None if s.interleave > 1 && !m.layers.is_multiple_of(chunks) => problems.push(
            Problem::new(
                at("interleave"),
                format!(
                    "the {} layers of model `{model}` do not split evenly into pp·interleave = \
                     {}·{} = {chunks} chunks",
                    m.layers, s.pp, s.interleave
                ),
            )
            .with_help("list the layers of each chunk with `stages`"),
        ),
        None => {}
    }
    let per_stage = m.layers.div_ceil(s.pp);
    let most_partial = (0..s.pp)
        .filter_map(|stage| match s.recompute_of(stage) {
            Recompute::Partial { full_layers } => Some(full_layers),
            _ => None,
        })
        .max();
    if let Some(full_layers) = most_partial.filter(|&n| n > per_stage) {
        problems.push(Problem::new(
            at("recompute"),
            format!(
                "`full_layers` ({full_layers}) exceeds the {per_stage} layers of a pipeline stage"
            ),
        ));
    }
    let moe_act = (0..s.pp).any(|stage| {
        s.recompute_of(stage)
            .modules()
            .contains(RecomputeModules::MOE_ACT)
    });
    if moe_act && m.moe.is_none() {
        problems.push(
            Problem::new(
                at("recompute"),
                format!("`moe_act` recomputes the experts' activation, but model `{model}` has no experts"),
            )
            .with_help("drop `moe_act`; a dense MLP's activation output is kept"),
        );
    }
    let t = c.train;
    let per_step = s.dp.saturating_mul(s.microbatch);
    if !t.global_batch.is_multiple_of(per_step) {
        problems.push(Problem::new(
            at("microbatch"),
            format!(
                "`global_batch` ({}) is not divisible by dp·microbatch = {}·{} = {per_step}",
                t.global_batch, s.dp, s.microbatch
            ),
        ));
    }
    if !t.seq_len.is_multiple_of(s.cp) {
        problems.push(Problem::new(
            at("cp"),
            format!("`cp` ({}) must divide `seq_len` ({})", s.cp, t.seq_len),
        ));
    }
}

/// What `train.framework` cannot run, each at the field that asks for it, with the frameworks
/// that run the whole strategy.
fn check_framework(
    s: &Strategy,
    c: &Context,
    at: &dyn Fn(&str) -> Span,
    problems: &mut Vec<Problem>,
) {
    let framework = c.train.framework;
    let limits = framework.limits(s, c.model.layers);
    if limits.is_empty() {
        return;
    }
    let others: Vec<String> = Framework::ALL
        .into_iter()
        .filter(|&f| f != framework && f.limits(s, c.model.layers).is_empty())
        .map(|f| format!("`{}` ({})", f.name(), f.software()))
        .collect();
    let help = if others.is_empty() {
        format!(
            "change the strategy; no framework runs all of it (train.framework is `{}`)",
            framework.name()
        )
    } else {
        format!(
            "change the strategy, or set train.framework to {}, which run{} all of it",
            others.join(" or "),
            if others.len() == 1 { "s" } else { "" }
        )
    };
    for limit in limits {
        problems.push(Problem::new(at(limit.field), limit.reason).with_help(help.clone()));
    }
}
