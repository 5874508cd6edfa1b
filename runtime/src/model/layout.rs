//! Which parameters a rank holds: their global names and shapes, how each is split over the
//! tensor- and expert-parallel groups, how it starts, and which process group holds its
//! replicas (whose gradients are summed and over which ZeRO shards).

use super::lora::{adapter_params, Adapters};
use crate::init::Init;
use crate::mesh::GroupKind;
use tessel_grammar::{MlpKind, ModelSpec, NormKind, PositionKind};

const WEIGHT_STD: f32 = 0.02;

/// How the global tensor is cut for this rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    Replicated,
    /// Contiguous column blocks over the tensor-parallel group (column-parallel linear).
    Cols {
        parts: u64,
        index: u64,
    },
    /// Contiguous row blocks over the tensor-parallel group (row-parallel linear).
    Rows {
        parts: u64,
        index: u64,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    /// Global name, the same under every plan.
    pub name: String,
    pub rows: u64,
    pub cols: u64,
    pub split: Split,
    pub init: Init,
    /// Under sequence parallelism this parameter sees only the rank's share of tokens, so its
    /// gradient is summed over the tensor-parallel group.
    pub sp_partial: bool,
    /// Tensor ranks holding the same block (key/value projections when the tensor group is
    /// wider than the key/value heads, as Megatron replicates them); their gradients are summed
    /// over those ranks. 1 = not replicated.
    pub tp_replicas: u64,
}

impl ParamSpec {
    pub(crate) fn new(name: String, rows: u64, cols: u64, split: Split, init: Init) -> Self {
        ParamSpec {
            name,
            rows,
            cols,
            split,
            init,
            sp_partial: false,
            tp_replicas: 1,
        }
    }

    fn sequence_partial(mut self) -> Self {
        self.sp_partial = true;
        self
    }

    pub fn row_range(&self) -> (u64, u64) {
        match self.split {
            Split::Rows { parts, index } => {
                let b = self.rows / parts;
                (index * b, (index + 1) * b)
            }
            _ => (0, self.rows),
        }
    }

    pub fn col_range(&self) -> (u64, u64) {
        match self.split {
            Split::Cols { parts, index } => {
                let b = self.cols / parts;
                (index * b, (index + 1) * b)
            }
            _ => (0, self.cols),
        }
    }

    pub fn local_shape(&self) -> (usize, usize) {
        let (r0, r1) = self.row_range();
        let (c0, c1) = self.col_range();
        ((r1 - r0) as usize, (c1 - c0) as usize)
    }

    pub fn local_len(&self) -> usize {
        let (r, c) = self.local_shape();
        r * c
    }
}

/// Parameters that share one replication group and one flat buffer for ZeRO.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupSpec {
    pub name: String,
    /// Sorted by name: the order of the flat buffer.
    pub params: Vec<ParamSpec>,
    /// `DataContext` for dense parameters, `ExpertData` for experts.
    pub replication: GroupKind,
    /// Takes no gradient and has no optimizer state (the model under adapter fine-tuning).
    pub frozen: bool,
}

/// The tensor-/expert-parallel coordinates the layout depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardCoords {
    pub tp: u64,
    pub tp_index: u64,
    pub ep: u64,
    pub ep_index: u64,
}

fn group(name: String, mut params: Vec<ParamSpec>, replication: GroupKind) -> GroupSpec {
    params.sort_by(|a, b| a.name.cmp(&b.name));
    GroupSpec {
        name,
        params,
        replication,
        frozen: false,
    }
}

fn norm_params(model: &ModelSpec, prefix: &str) -> Vec<ParamSpec> {
    let h = model.hidden;
    let mut v = vec![ParamSpec::new(
        format!("{prefix}.weight"),
        1,
        h,
        Split::Replicated,
        Init::Constant(1.0),
    )
    .sequence_partial()];
    if model.norm == NormKind::Layernorm {
        v.push(
            ParamSpec::new(
                format!("{prefix}.bias"),
                1,
                h,
                Split::Replicated,
                Init::Constant(0.0),
            )
            .sequence_partial(),
        );
    }
    v
}

/// A column-then-row parallel MLP `rows → width → rows` under `prefix`.
pub fn mlp_params(
    kind: MlpKind,
    prefix: &str,
    hidden: u64,
    width: u64,
    bias: bool,
    s: ShardCoords,
) -> Vec<ParamSpec> {
    let col = Split::Cols {
        parts: s.tp,
        index: s.tp_index,
    };
    let row = Split::Rows {
        parts: s.tp,
        index: s.tp_index,
    };
    let w = Init::Normal(WEIGHT_STD);
    let ins: &[&str] = match kind {
        MlpKind::Gelu => &["1"],
        MlpKind::Swiglu => &["g", "u"],
    };
    let mut v = Vec::new();
    for i in ins {
        v.push(ParamSpec::new(
            format!("{prefix}.w{i}"),
            hidden,
            width,
            col,
            w,
        ));
        if bias {
            v.push(ParamSpec::new(format!("{prefix}.b{i}"), 1, width, col, w));
        }
    }
    let out = match kind {
        MlpKind::Gelu => "w2",
        MlpKind::Swiglu => "wd",
    };
    v.push(ParamSpec::new(
        format!("{prefix}.{out}"),
        width,
        hidden,
        row,
        w,
    ));
    v
}

/// The groups of one decoder block: its dense parameters and, for expert blocks, the
/// experts this rank holds.
pub fn layer_groups(model: &ModelSpec, layer: u64, s: ShardCoords) -> Vec<GroupSpec> {
    let p = format!("layers.{layer}");
    let h = model.hidden;
    let col = Split::Cols {
        parts: s.tp,
        index: s.tp_index,
    };
    let row = Split::Rows {
        parts: s.tp,
        index: s.tp_index,
    };
    let w = Init::Normal(WEIGHT_STD);
    let q = model.heads * model.head_dim;
    let kv = model.kv_heads * model.head_dim;
    let mut dense = norm_params(model, &format!("{p}.norm1"));
    // With more tensor ranks than key/value heads, each rank holds the one head its query
    // heads read, shared by `kv_replicas` consecutive ranks.
    let kv_replicas = (s.tp / model.kv_heads).max(1);
    let kv_split = Split::Cols {
        parts: s.tp / kv_replicas,
        index: s.tp_index / kv_replicas,
    };
    for (name, width, split) in [("q", q, col), ("k", kv, kv_split), ("v", kv, kv_split)] {
        let replicas = if name == "q" { 1 } else { kv_replicas };
        let mut weight = ParamSpec::new(format!("{p}.attn.w{name}"), h, width, split, w);
        weight.tp_replicas = replicas;
        dense.push(weight);
        if model.bias {
            let mut bias = ParamSpec::new(format!("{p}.attn.b{name}"), 1, width, split, w);
            bias.tp_replicas = replicas;
            dense.push(bias);
        }
    }
    dense.push(ParamSpec::new(format!("{p}.attn.wo"), q, h, row, w));
    if model.bias {
        dense.push(
            ParamSpec::new(format!("{p}.attn.bo"), 1, h, Split::Replicated, w).sequence_partial(),
        );
    }
    dense.extend(norm_params(model, &format!("{p}.norm2")));
    let mut groups = Vec::new();
    match &model.moe {
        Some(moe) if model.is_moe_layer(layer) => {
            dense.push(ParamSpec::new(
                format!("{p}.moe.router"),
                h,
                moe.experts,
                Split::Replicated,
                w,
            ));
            if moe.shared_experts > 0 {
                dense.extend(mlp_params(
                    model.mlp,
                    &format!("{p}.moe.shared"),
                    h,
                    moe.shared_experts * moe.expert_ffn_hidden,
                    false,
                    s,
                ));
            }
            let per_rank = moe.experts / s.ep;
            let experts = (s.ep_index * per_rank..(s.ep_index + 1) * per_rank)
                .flat_map(|e| {
                    mlp_params(
                        model.mlp,
                        &format!("{p}.moe.experts.{e}"),
                        h,
                        moe.expert_ffn_hidden,
                        false,
                        s,
                    )
                })
                .collect();
            groups.push(group(
                format!("{p}.experts"),
                experts,
                GroupKind::ExpertData,
            ));
        }
        _ => {
            dense.extend(mlp_params(
                model.mlp,
                &format!("{p}.mlp"),
                h,
                model.ffn_hidden,
                model.bias,
                s,
            ));
            if model.bias {
                dense.push(
                    ParamSpec::new(format!("{p}.mlp.bo"), 1, h, Split::Replicated, w)
                        .sequence_partial(),
                );
            }
        }
    }
    groups.insert(0, group(p, dense, GroupKind::DataContext));
    groups
}

/// Token (and learned position) embeddings of the first virtual stage. The token table is
/// vocab-parallel: row blocks over the tensor group.
pub fn embedding_group(model: &ModelSpec, seq_len: u64, s: ShardCoords) -> GroupSpec {
    let w = Init::Normal(WEIGHT_STD);
    let mut params = vec![vocab_parallel("embedding.weight", model, s)];
    if model.position == PositionKind::Learned {
        let rows = model.max_seq_len.unwrap_or(seq_len);
        params.push(
            ParamSpec::new(
                "embedding.position".into(),
                rows,
                model.hidden,
                Split::Replicated,
                w,
            )
            .sequence_partial(),
        );
    }
    group("embedding".into(), params, GroupKind::DataContext)
}

/// A `vocab × hidden` table split by vocabulary rows over the tensor group. Each rank sees
/// every token for its rows, so its gradient is never partial over the tensor group.
fn vocab_parallel(name: &str, model: &ModelSpec, s: ShardCoords) -> ParamSpec {
    ParamSpec::new(
        name.into(),
        model.vocab,
        model.hidden,
        Split::Rows {
            parts: s.tp,
            index: s.tp_index,
        },
        Init::Normal(WEIGHT_STD),
    )
}

/// Final norm and vocab-parallel output projection of the last virtual stage. With tied
/// embeddings the projection is the embedding table: a copy when the first stage lives on
/// another rank, nothing here when it lives on this one.
pub fn head_group(model: &ModelSpec, embedding_on_this_rank: bool, s: ShardCoords) -> GroupSpec {
    let mut params = norm_params(model, "final_norm");
    if !model.tie_embeddings {
        params.push(vocab_parallel("head.weight", model, s));
    } else if !embedding_on_this_rank {
        params.push(vocab_parallel("embedding.weight", model, s));
    }
    group("head".into(), params, GroupKind::DataContext)
}

/// Name of the output projection's weight.
pub fn head_weight_name(model: &ModelSpec) -> &'static str {
    if model.tie_embeddings {
        "embedding.weight"
    } else {
        "head.weight"
    }
}

/// The parameter groups rank `coords` of `plan` holds: the embedding on the first stage, its
/// stage's layers, the head on the stage of the last virtual stage.
pub fn rank_groups(
    model: &ModelSpec,
    plan: &crate::plan::ExecutionPlan,
    coords: crate::mesh::Coords,
) -> Vec<GroupSpec> {
    let shard = ShardCoords {
        tp: plan.tp,
        tp_index: coords.tp,
        ep: plan.ep,
        ep_index: coords.ep,
    };
    let vs_last = plan.pp * plan.interleave - 1;
    let mut specs = Vec::new();
    if coords.pp == 0 {
        specs.push(embedding_group(model, plan.seq_len, shard));
    }
    for layer in plan.stage_layers(coords.pp) {
        specs.extend(layer_groups(model, layer, shard));
    }
    if coords.pp == vs_last % plan.pp {
        specs.push(head_group(model, coords.pp == 0, shard));
    }
    match &plan.adapters {
        None => specs,
        Some(adapters) => with_adapters(specs, adapters, plan.tp),
    }
}

/// Name of layer `layer`'s group of trained adapters.
pub fn adapter_group_name(layer: u64) -> String {
    format!("layers.{layer}.lora")
}

/// Adapter fine-tuning: every group of the model frozen, and beside each layer's dense group
/// a group of the adapters that train (LoRA-FA's frozen `A`s join the frozen group).
pub fn with_adapters(groups: Vec<GroupSpec>, adapters: &Adapters, tp: u64) -> Vec<GroupSpec> {
    let mut out = Vec::with_capacity(2 * groups.len());
    for mut g in groups {
        g.frozen = true;
        let (mut trained, mut frozen) = (Vec::new(), Vec::new());
        for p in g.params.iter().filter(|p| adapters.targets(&p.name)) {
            let (a, b) = adapter_params(p, adapters.rank, tp);
            if adapters.frozen_a {
                frozen.push(a);
            } else {
                trained.push(a);
            }
            trained.push(b);
        }
        let layer = g
            .name
            .strip_prefix("layers.")
            .and_then(|l| l.parse::<u64>().ok());
        g.params.extend(frozen);
        g.params.sort_by(|a, b| a.name.cmp(&b.name));
        out.push(g);
        if let (Some(layer), false) = (layer, trained.is_empty()) {
            out.push(group(
                adapter_group_name(layer),
                trained,
                GroupKind::DataContext,
            ));
        }
    }
    out
}

/// Every parameter of the model as whole tensors (no tensor or expert split), as one rank of
/// a one-stage plan holds them.
pub fn whole_model_params(model: &ModelSpec, seq_len: u64) -> Vec<ParamSpec> {
    let whole = ShardCoords {
        tp: 1,
        tp_index: 0,
        ep: 1,
        ep_index: 0,
    };
    let mut groups = vec![embedding_group(model, seq_len, whole)];
    groups.extend((0..model.layers).flat_map(|layer| layer_groups(model, layer, whole)));
    groups.push(head_group(model, true, whole));
    groups.into_iter().flat_map(|g| g.params).collect()
}
