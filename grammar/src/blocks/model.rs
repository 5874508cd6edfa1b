//! `model` blocks: decoder-only transformers, dense or mixture of experts, with the encoders
//! of other modalities (`encoder NAME { … }`) that feed them.

use crate::ast::ENCODER_PREFIX;
use crate::diagnostic::Problem;
use crate::fields::Fields;
use crate::spec::{
    CountShape, EncoderSpec, ItemCount, MlpKind, ModelSpec, MoeSpec, NormKind, PositionKind,
    ProjectorKind,
};
use crate::units::Dim;

pub const FIELDS: &[&str] = &[
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "head_dim",
    "ffn_hidden",
    "vocab",
    "mlp",
    "norm",
    "tie_embeddings",
    "bias",
    "max_seq_len",
    "position",
    "moe",
];

const MOE_FIELDS: &[&str] = &[
    "experts",
    "top_k",
    "every",
    "expert_ffn_hidden",
    "shared_experts",
    "capacity_factor",
    "first_dense",
];

pub const MLP_KINDS: &[(&str, MlpKind)] = &[("gelu", MlpKind::Gelu), ("swiglu", MlpKind::Swiglu)];
pub const NORM_KINDS: &[(&str, NormKind)] = &[
    ("layernorm", NormKind::Layernorm),
    ("rmsnorm", NormKind::Rmsnorm),
];
pub const POSITION_KINDS: &[(&str, PositionKind)] = &[
    ("rope", PositionKind::Rope),
    ("learned", PositionKind::Learned),
];

const ENCODER_FIELDS: &[&str] = &[
    "layers",
    "hidden",
    "heads",
    "ffn_hidden",
    "mlp",
    "norm",
    "tokens_per_item",
    "merge",
    "projector",
    "projector_hidden",
    "items_per_sample",
    "frozen",
];

const ITEM_COUNT_FIELDS: &[&str] = &["mean", "max", "shape"];

const PROJECTOR_KINDS: &[(&str, ProjectorKind)] = &[
    ("mlp2x", ProjectorKind::Mlp),
    ("linear", ProjectorKind::Linear),
];

pub fn lower(name: &str, f: &mut Fields) -> Option<ModelSpec> {
    let before = f.problems.len();
    let encoder_fields = f.take_encoders();
    f.reject_unknown(FIELDS);
    let mut encoders = Vec::with_capacity(encoder_fields.len());
    for field in &encoder_fields {
        let Some((encoder_name, mut record)) = Fields::part(
            field,
            ENCODER_PREFIX,
            &format!("model `{name}`"),
            "{ layers = 32, hidden = 1280, heads = 16, tokens_per_item = 1024, items_per_sample = { mean = 1 } }",
            f.problems,
        ) else {
            continue;
        };
        encoders.extend(encoder(encoder_name, &mut record));
    }
    let layers = f.required_count("layers", 1, "32");
    let hidden = f.required_count("hidden", 1, "4096");
    let heads = f.required_count("heads", 1, "32");
    let kv_heads = f.count("kv_heads", 1);
    let head_dim = f.count("head_dim", 1);
    let ffn_hidden = f.count("ffn_hidden", 1);
    let vocab = f.required_count("vocab", 1, "128256");
    let mlp = if f.has("mlp") {
        f.choice("mlp", MLP_KINDS)
    } else {
        f.missing("mlp", "swiglu");
        None
    };
    let norm = f.choice("norm", NORM_KINDS).unwrap_or(NormKind::Rmsnorm);
    let tie_embeddings = f.boolean("tie_embeddings").unwrap_or(false);
    let bias = f.boolean("bias").unwrap_or(false);
    let max_seq_len = f.count("max_seq_len", 1);
    let position = f
        .choice("position", POSITION_KINDS)
        .unwrap_or(PositionKind::Rope);
    let moe = match f.get("moe").cloned() {
        None => None,
        Some(value) => Fields::record(
            "moe",
            &value,
            "{ experts = 8, top_k = 2, expert_ffn_hidden = 14336 }",
            f.problems,
        )
        .and_then(|mut r| moe(&mut r, layers, ffn_hidden)),
    };

    let span = |f: &Fields, key: &str| f.get(key).map_or(f.anchor, |v| v.span);
    if let (Some(heads), Some(kv)) = (heads, kv_heads) {
        if kv > heads {
            let at = span(f, "kv_heads");
            f.problems.push(Problem::new(
                at,
                format!("`kv_heads` ({kv}) cannot exceed `heads` ({heads})"),
            ));
        } else if heads % kv != 0 {
            let at = span(f, "kv_heads");
            f.problems.push(
                Problem::new(at, format!("`kv_heads` ({kv}) must divide `heads` ({heads})"))
                    .with_help("in grouped-query attention each key/value head serves the same number of query heads"),
            );
        }
    }
    if let (Some(hidden), Some(heads), false) = (hidden, heads, f.has("head_dim")) {
        if hidden % heads != 0 {
            let at = span(f, "heads");
            f.problems.push(
                Problem::new(
                    at,
                    format!("`heads` ({heads}) must divide `hidden` ({hidden})"),
                )
                .with_help("or set `head_dim` explicitly"),
            );
        }
    }
    if position == PositionKind::Learned && max_seq_len.is_none() && !f.has("max_seq_len") {
        let at = span(f, "position");
        f.problems.push(
            Problem::new(at, "learned position embeddings need `max_seq_len`")
                .with_help("add `max_seq_len = 2048`, the length of the position table"),
        );
    }
    let all_blocks_moe = moe
        .as_ref()
        .is_some_and(|m: &MoeSpec| m.every == 1 && m.first_dense == 0);
    let ffn_hidden = match (ffn_hidden, &moe) {
        (Some(ffn), _) => Some(ffn),
        (None, Some(m)) if all_blocks_moe && !f.has("ffn_hidden") => Some(m.expert_ffn_hidden),
        (None, found) => {
            let moe_broken = f.has("moe") && found.is_none();
            if !f.has("ffn_hidden") && !moe_broken {
                f.missing("ffn_hidden", "4 * hidden");
            }
            None
        }
    };
    if let Some(n) = layers.filter(|&n| n > MAX_LAYERS) {
        let at = span(f, "layers");
        f.problems.push(Problem::new(
            at,
            format!("`layers` ({n}) is more than the {MAX_LAYERS} supported"),
        ));
    }
    if f.problems.len() > before {
        return None;
    }
    let (hidden, heads) = (hidden?, heads?);
    let model = ModelSpec {
        name: name.to_string(),
        layers: layers?,
        hidden,
        heads,
        kv_heads: kv_heads.unwrap_or(heads),
        head_dim: head_dim.unwrap_or(hidden / heads),
        ffn_hidden: ffn_hidden?,
        vocab: vocab?,
        mlp: mlp?,
        norm,
        tie_embeddings,
        bias,
        max_seq_len,
        position,
        moe,
        encoders,
    };
    let estimate = parameter_estimate(&model);
    if estimate > MAX_PARAMETERS {
        f.problems.push(Problem::new(
            f.anchor,
            format!(
                "{} has about {estimate:.1e} parameters, more than the {MAX_PARAMETERS:.0e} supported",
                f.owner
            ),
        ));
        return None;
    }
    Some(model)
}

/// Far beyond any model; bounds the exact `u64` parameter and FLOP counts of `model_stats`.
pub const MAX_PARAMETERS: f64 = 1e16;
pub const MAX_LAYERS: u64 = 1_000_000;

/// An upper bound of the parameter count, in floating point so that it cannot overflow.
fn parameter_estimate(m: &ModelSpec) -> f64 {
    let h = m.hidden as f64;
    let q = m.heads as f64 * m.head_dim as f64;
    let kv = m.kv_heads as f64 * m.head_dim as f64;
    let per_layer = 2.0 * h * (q + kv) + 3.0 * h * m.ffn_hidden as f64 + 4.0 * h + q + 2.0 * kv;
    let experts = m.moe.as_ref().map_or(0.0, |moe| {
        (moe.experts + moe.shared_experts) as f64
            * (3.0 * h * moe.expert_ffn_hidden as f64 + 2.0 * moe.expert_ffn_hidden as f64 + h)
            + h * moe.experts as f64
    });
    let embeddings = (2.0 * m.vocab as f64 + m.max_seq_len.unwrap_or(0) as f64 + 2.0) * h;
    m.layers as f64 * (per_layer + experts) + embeddings
}

/// One `encoder NAME { … }`: a bidirectional transformer with GELU and LayerNorm unless told
/// otherwise (ViTs and audio encoders are), `ffn_hidden` 4× its width, an MLP projector.
fn encoder(name: &str, r: &mut Fields) -> Option<EncoderSpec> {
    let before = r.problems.len();
    r.reject_unknown(ENCODER_FIELDS);
    let layers = r.required_count("layers", 1, "32");
    let hidden = r.required_count("hidden", 1, "1280");
    let heads = r.required_count("heads", 1, "16");
    let ffn_hidden = r.count("ffn_hidden", 1);
    let mlp = r.choice("mlp", MLP_KINDS).unwrap_or(MlpKind::Gelu);
    let norm = r.choice("norm", NORM_KINDS).unwrap_or(NormKind::Layernorm);
    let tokens_per_item = r.required_count("tokens_per_item", 1, "1024");
    let merge = r.count("merge", 1).unwrap_or(1);
    let projector = r
        .choice("projector", PROJECTOR_KINDS)
        .unwrap_or(ProjectorKind::Mlp);
    let projector_hidden = r.count("projector_hidden", 1);
    let frozen = r.boolean("frozen").unwrap_or(false);
    if projector == ProjectorKind::Linear {
        if let Some(value) = r.get("projector_hidden") {
            let at = value.span;
            r.problems.push(
                Problem::new(
                    at,
                    "`projector_hidden` is the middle width of an MLP projector",
                )
                .with_help("remove it, or choose `projector = mlp2x`"),
            );
        }
    }
    let items_per_sample = match r.get("items_per_sample").cloned() {
        None => {
            r.missing("items_per_sample", "{ mean = 1, max = 4, shape = poisson }");
            None
        }
        Some(value) => Fields::record(
            "items_per_sample",
            &value,
            "{ mean = 1, max = 4, shape = poisson }",
            r.problems,
        )
        .and_then(|mut c| item_count(&mut c)),
    };
    if let (Some(hidden), Some(heads)) = (hidden, heads) {
        if hidden % heads != 0 {
            let at = r.get("heads").map_or(r.anchor, |v| v.span);
            r.problems.push(Problem::new(
                at,
                format!("`heads` ({heads}) must divide the encoder's `hidden` ({hidden})"),
            ));
        }
    }
    if let (Some(tokens), Some(value)) = (tokens_per_item, r.get("merge")) {
        if merge > tokens {
            let at = value.span;
            r.problems.push(Problem::new(
                at,
                format!("`merge` ({merge}) is more than the {tokens} tokens of an item"),
            ));
        }
    }
    if r.problems.len() > before {
        return None;
    }
    let hidden = hidden?;
    Some(EncoderSpec {
        name: name.to_string(),
        layers: layers?,
        hidden,
        heads: heads?,
        ffn_hidden: ffn_hidden.unwrap_or(4 * hidden),
        mlp,
        norm,
        tokens_per_item: tokens_per_item?,
        merge,
        projector,
        projector_hidden,
        items_per_sample: items_per_sample?,
        frozen,
    })
}

/// `{ mean = 2.5, max = 8, shape = poisson }`: `max` defaults to 4× the mean (at least 1).
fn item_count(r: &mut Fields) -> Option<ItemCount> {
    let before = r.problems.len();
    r.reject_unknown(ITEM_COUNT_FIELDS);
    let mean = r.required_quantity("mean", Dim::NUMBER, true);
    let max = r.count("max", 1);
    let shapes = CountShape::ALL.map(|s| (s.name(), s));
    let shape = r.choice("shape", &shapes).unwrap_or(CountShape::Poisson);
    let mean = mean?;
    let max = max.unwrap_or_else(|| ((4.0 * mean).ceil() as u64).max(1));
    if mean > max as f64 {
        let at = r.get("mean").map_or(r.anchor, |v| v.span);
        r.problems.push(
            Problem::new(
                at,
                format!("`items_per_sample.mean` ({mean}) is more than its `max` ({max})"),
            )
            .with_help("the mean counts items (images, clips) per sample: `mean = 1.5, max = 8`"),
        );
    }
    if r.problems.len() > before {
        return None;
    }
    Some(ItemCount { mean, max, shape })
}

/// `expert_ffn_hidden` defaults to the model's `ffn_hidden` (Mixtral's layout: each expert is
/// the dense MLP it replaces).
fn moe(r: &mut Fields, layers: Option<u64>, ffn_hidden: Option<u64>) -> Option<MoeSpec> {
    let before = r.problems.len();
    r.reject_unknown(MOE_FIELDS);
    let experts = r.required_count("experts", 1, "8");
    let top_k = r.required_count("top_k", 1, "2");
    let every = r.count("every", 1).unwrap_or(1);
    let expert_ffn_hidden = match ffn_hidden {
        Some(ffn) if !r.has("expert_ffn_hidden") => Some(ffn),
        _ => r.required_count("expert_ffn_hidden", 1, "14336"),
    };
    let shared_experts = r.count("shared_experts", 0).unwrap_or(0);
    let capacity_factor = r
        .quantity("capacity_factor", Dim::NUMBER, true)
        .unwrap_or(1.0);
    let first_dense = r.count("first_dense", 0).unwrap_or(0);
    let span = |r: &Fields, key: &str| r.get(key).map_or(r.anchor, |v| v.span);
    if let (Some(experts), Some(top_k)) = (experts, top_k) {
        if top_k > experts {
            let at = span(r, "top_k");
            r.problems.push(Problem::new(
                at,
                format!("`top_k` ({top_k}) cannot exceed `experts` ({experts})"),
            ));
        }
    }
    if let Some(layers) = layers {
        if first_dense >= layers && r.has("first_dense") {
            let at = span(r, "first_dense");
            r.problems.push(Problem::new(
                at,
                format!(
                    "`first_dense` ({first_dense}) leaves none of the {layers} layers with experts"
                ),
            ));
        } else if first_dense < layers && every > layers - first_dense {
            let at = span(r, "every");
            r.problems.push(Problem::new(
                at,
                format!(
                    "with `every = {every}` none of the {} layers after the first {first_dense} gets experts",
                    layers - first_dense
                ),
            ));
        }
    }
    if r.problems.len() > before {
        return None;
    }
    Some(MoeSpec {
        experts: experts?,
        top_k: top_k?,
        every,
        expert_ffn_hidden: expert_ffn_hidden?,
        shared_experts,
        capacity_factor,
        first_dense,
    })
}
