//! The encoders of a multimodal model (`encoder NAME { … }`): what they cost beside the
//! language model's layers, where they run, and what uneven item counts cost.
//!
//! - An encoder layer is costed by the language model's own layer machinery (the GEMM
//!   primitive, the attention kernel, the memory-bound passes) on a model of the encoder's
//!   shape whose sequence is one item's tokens and whose micro-batch is the items one encoder
//!   replica takes; its attention is bidirectional (no masked half skipped). The projector is
//!   one or two GEMMs into the language model's width.
//! - `placement = first_stage`: each language-model replica's first-stage GPUs (its `tp · cp`)
//!   also run the encoders, split into replicas of the encoder's own tensor-parallel degree
//!   (the one of 1, 2, 4, 8 dividing `tp · cp` that is fastest), each taking a share of the
//!   micro-batch's items. Their gradients are the last the backward produces, so their
//!   all-reduce hides behind nothing.
//! - `placement = separate`: the encoders run on GPUs of their own, one more pipeline stage in
//!   front of the language model's first (MMScale, DistTrain), sending each micro-batch's
//!   embeddings forward and their gradients back over the network.
//! - Items per sample vary, so micro-batches carry uneven encoder work; a pipeline runs at the
//!   pace of its slowest stage at each step and data-parallel replicas wait for the slowest
//!   one. The cost is the mean over seeded draws of global batches of the slowest replica's
//!   pipeline time against the time at even loads, in data order or with samples reordered so
//!   that every micro-batch carries about as much encoder work (longest first, each to the
//!   least loaded micro-batch with room).

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use tessel_grammar::{
    CountShape, EncoderPlacement, EncoderSpec, ItemCount, ModelSpec, MultimodalTraining,
    PositionKind, Spec, Strategy,
};

use super::calibration::{Calibration, KernelEfficiency};
use super::compute::layer_times;
use super::context::{k, Ctx, StateBytes};
use super::memory::{in_flight_of, layer_activations};
use super::slots::Slot;
use super::stage_exprs::StagedExprs;
use super::types::{MemoryBreakdown, StageCost};
use crate::primitives::{collective_time, Collective, CollectiveParams, Group, Links};
use crate::{SplitMix64, GIB};

/// Tensor-parallel degrees an encoder replica may take.
const ENCODER_TPS: [u64; 4] = [1, 2, 4, 8];
/// Global batches drawn to cost the imbalance, and their seed: the same prediction each run.
const DRAWS: usize = 8;
const SEED: u64 = 0x5eed_1a6e;
/// The share of a first-stage GPU's memory the encoders may take before a slower but smaller
/// tensor-parallel degree is preferred: the stage's own layers need the rest.
const FIRST_STAGE_MEMORY_SHARE: f64 = 0.25;
/// Quantile of the items a first stage holds at its peak, in standard deviations (99 %).
const PEAK_QUANTILE_Z: f64 = 2.33;

/// The per-encoder expressions' outputs, in order.
const LAYER_FORWARD: usize = 0;
const LAYER_BACKWARD: usize = 1;
const LAYER_ACTIVATIONS: usize = 2;
const PROJECTOR_FORWARD: usize = 3;
const PROJECTOR_BACKWARD: usize = 4;

#[derive(Clone, Debug)]
struct EncoderExprs {
    spec: EncoderSpec,
    /// Over the slots `b` (items per replica) and `t` (the replica's tensor-parallel degree).
    staged: StagedExprs,
    parameters: f64,
    trained_parameters: f64,
}

/// The encoders of one spec, built once per cost model.
#[derive(Clone, Debug)]
pub struct Encoders {
    parts: Vec<EncoderExprs>,
    training: MultimodalTraining,
    bytes: StateBytes,
    llm_hidden: f64,
    hbm_rate: f64,
    links: Links,
    collectives: CollectiveParams,
    gpus_per_node: f64,
    nodes: f64,
    /// Bytes a GPU may use.
    capacity: f64,
    first_stage_costs: FirstStageCosts,
}

/// The first stage's encoder costs by the strategy values they depend on: the planner asks
/// for the same ones at every layer count, recompute and offload of the stage.
#[derive(Debug, Default)]
struct FirstStageCosts(Mutex<HashMap<[u64; 8], EncoderCost>>);

impl Clone for FirstStageCosts {
    /// A clone starts empty: what it holds is derived, and filled again on demand.
    fn clone(&self) -> Self {
        FirstStageCosts::default()
    }
}

/// What the encoders cost one GPU that runs them, under one placement.
#[derive(Clone, Debug, PartialEq)]
pub struct EncoderCost {
    pub tp: u64,
    /// The encoders' layers recomputed in full in backward.
    pub recompute: bool,
    /// Encoder replicas in all (those that reduce gradients together).
    pub replicas: u64,
    /// Seconds of forward and backward of one micro-batch's mean items (with the embeddings'
    /// transfer when separate).
    pub microbatch_s: f64,
    /// The exposed gradient all-reduce and the optimizer step, once per step.
    pub tail_s: f64,
    /// Bytes per GPU.
    pub memory: MemoryBreakdown,
    /// Seconds of one item of each encoder on one replica.
    pub item_s: Vec<f64>,
    /// Of `microbatch_s`, the embeddings' transfer (separate encoders only).
    pub transfer_s: f64,
}

/// How the encoders are laid out: each replica's tensor-parallel degree and recompute, the
/// replicas that reduce gradients together, and the ZeRO stage that shards their states.
#[derive(Clone, Copy, Debug)]
struct Layout {
    tp: u64,
    recompute: bool,
    replicas: u64,
    zero: u8,
}

/// The samples of a micro-batch (one language-model replica's, or every replica's when the
/// encoders run apart) and the encoder replicas that share their items.
#[derive(Clone, Copy, Debug)]
struct Share {
    samples: f64,
    replicas: f64,
}

/// Items the busiest of `replicas` takes of `items`: an image is not split between replicas,
/// so a replica takes whole items while there are fewer than replicas (at most the items there
/// are, which for a mean below one is the expected load); below one replica, one serves
/// several micro-batches' items.
fn busiest_items(items: f64, replicas: f64) -> f64 {
    if replicas <= 1.0 {
        items / replicas.max(f64::MIN_POSITIVE)
    } else {
        (items / replicas).ceil().min(items)
    }
}

/// The encoders in a prediction.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MultimodalEstimate {
    pub placement: EncoderPlacement,
    pub encoder_tp: u64,
    /// The encoders' layers recomputed in full in backward.
    #[serde(default)]
    pub encoder_recompute: bool,
    /// Encoder replicas in all.
    pub encoder_replicas: u64,
    /// GPUs of their own (`separate`), else 0.
    pub encoder_gpus: u64,
    /// Items (images, clips) of every encoder per step, mean.
    pub items_per_step: f64,
    /// Seconds of one micro-batch's encoders at the mean load.
    pub encoder_microbatch_s: f64,
    /// GiB per GPU of the encoders' weights, gradients, optimizer states and activations (on
    /// the first stage, their share of it).
    #[serde(default)]
    pub encoder_memory_gib: f64,
    pub reorder: bool,
    /// Seconds the step loses to uneven items, in data order and reordered; the step time
    /// carries the one `reorder` names.
    pub imbalance_in_order_s: f64,
    pub imbalance_reordered_s: f64,
}

/// What the encoders add to a step: a stage of their own when separate, the imbalance, and
/// GPUs beside the language model's.
pub struct EncoderStep {
    pub extra_stage: Option<StageCost>,
    pub imbalance_s: f64,
    pub gpus: u64,
    pub estimate: MultimodalEstimate,
}

impl Encoders {
    /// `None` for a text-only model.
    pub fn new(spec: &Spec, efficiency: KernelEfficiency, cal: Calibration) -> Option<Encoders> {
        if spec.model.encoders.is_empty() {
            return None;
        }
        let parts = spec
            .model
            .encoders
            .iter()
            .map(|encoder| encoder_exprs(spec, encoder, efficiency, cal))
            .collect();
        let cluster = &spec.cluster;
        Some(Encoders {
            parts,
            training: spec.train.multimodal.unwrap_or_default(),
            bytes: StateBytes::of(&spec.train, &cal),
            llm_hidden: spec.model.hidden as f64,
            hbm_rate: cluster.gpu.hbm_bandwidth * efficiency.for_training(&spec.train, &cal).memory,
            links: Links::of(cluster),
            collectives: cal.collectives,
            gpus_per_node: cluster.gpus_per_node as f64,
            nodes: cluster.nodes as f64,
            capacity: cluster.gpu.memory * spec.search.memory_limit,
            first_stage_costs: FirstStageCosts::default(),
        })
    }

    /// The encoders' own GPUs, when they have them.
    pub fn separate_gpus(&self) -> Option<u64> {
        match self.training.placement {
            EncoderPlacement::Separate => self.training.encoder_gpus,
            _ => None,
        }
    }

    /// On the first stage of every language-model replica (`placement` `first_stage`, or
    /// `auto` before the planner resolves it): the fastest tensor-parallel degree whose
    /// encoders take at most [`FIRST_STAGE_MEMORY_SHARE`] of a GPU, else the smallest.
    pub fn first_stage(&self, strategy: &Strategy, microbatches: u64) -> EncoderCost {
        let key = [
            strategy.tp,
            strategy.cp,
            strategy.dp,
            strategy.pp,
            strategy.interleave,
            strategy.microbatch,
            u64::from(strategy.zero),
            microbatches,
        ];
        let costs = || {
            self.first_stage_costs
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
        };
        if let Some(cost) = costs().get(&key) {
            return cost.clone();
        }
        let cost = self.first_stage_uncached(strategy, microbatches);
        costs().insert(key, cost.clone());
        cost
    }

    fn first_stage_uncached(&self, strategy: &Strategy, microbatches: u64) -> EncoderCost {
        let group = strategy.tp.max(1) * strategy.cp.max(1);
        let in_flight = in_flight(strategy, microbatches);
        let costs = self
            .choices(|tp| group.is_multiple_of(tp))
            .map(|(tp, recompute)| {
                let replicas = group / tp;
                let share = Share {
                    samples: strategy.microbatch as f64,
                    replicas: replicas as f64,
                };
                let layout = Layout {
                    tp,
                    recompute,
                    replicas: replicas * strategy.dp.max(1),
                    zero: strategy.zero,
                };
                self.cost(layout, share, in_flight, 0.0)
            })
            .collect();
        fastest_within(costs, FIRST_STAGE_MEMORY_SHARE * self.capacity)
    }

    /// On `gpus` of their own, each micro-batch of every language-model replica spread over
    /// all encoder replicas: the fastest tensor-parallel degree (within a node) whose encoders
    /// fit in `budget` bytes per GPU, else the smallest.
    pub fn separate(
        &self,
        strategy: &Strategy,
        microbatches: u64,
        gpus: u64,
        budget: f64,
    ) -> EncoderCost {
        let in_flight = (in_flight(strategy, microbatches) + 1.0).min(microbatches as f64);
        // Language-model tokens the items of one sample become.
        let tokens: f64 = self
            .parts
            .iter()
            .map(|p| p.spec.items_per_sample.mean * p.spec.llm_tokens_per_item() as f64)
            .sum();
        let costs = self
            .choices(|tp| gpus.is_multiple_of(tp) && tp as f64 <= self.gpus_per_node)
            .map(|(tp, recompute)| {
                let replicas = gpus / tp;
                let share = Share {
                    samples: (strategy.dp.max(1) * strategy.microbatch) as f64,
                    replicas: replicas as f64,
                };
                // Each replica's tp GPUs send their part of the embeddings forward and take
                // the gradients back, on their own NICs.
                let embeddings = share.samples / share.replicas
                    * tokens
                    * self.llm_hidden
                    * self.bytes.activation;
                let transfer = 2.0 * embeddings / (tp as f64 * self.links.inter_bandwidth);
                let layout = Layout {
                    tp,
                    recompute,
                    replicas,
                    zero: strategy.zero,
                };
                self.cost(layout, share, in_flight, transfer)
            })
            .collect();
        fastest_within(costs, budget)
    }

    /// The tensor-parallel degrees `allowed`, each without and (for encoders that train) with
    /// full recompute.
    fn choices(&self, allowed: impl Fn(u64) -> bool) -> impl Iterator<Item = (u64, bool)> {
        let trains = self.parts.iter().any(|p| !p.spec.frozen);
        ENCODER_TPS
            .into_iter()
            .filter(move |&tp| allowed(tp))
            .flat_map(move |tp| {
                [(tp, false), (tp, true)]
                    .into_iter()
                    .filter(move |&(_, recompute)| trains || !recompute)
            })
    }

    /// One replica laid out as `layout`, the busiest of those sharing the items of `share`'s
    /// samples per micro-batch, holding `in_flight` micro-batches at its peak.
    fn cost(&self, layout: Layout, share: Share, in_flight: f64, transfer_s: f64) -> EncoderCost {
        let Layout {
            tp,
            recompute,
            replicas,
            zero,
        } = layout;
        let t = tp as f64;
        let mut microbatch_s = transfer_s;
        let mut item_s = Vec::with_capacity(self.parts.len());
        let mut memory = MemoryBreakdown::default();
        let mut trained = 0.0;
        for part in &self.parts {
            let e = &part.spec;
            let count = &e.items_per_sample;
            let items = busiest_items(share.samples * count.mean, share.replicas);
            // Time and bytes scale with the items; cost them at the mean load (at least one
            // item, so that per-item figures stay finite).
            let at = items.max(1.0);
            let out = part.staged.eval(&slot_values(at, tp));
            let layers = e.layers as f64;
            // Full recompute runs each layer's forward again before its backward.
            let backward = match (e.frozen, recompute) {
                (true, _) => 0.0,
                (false, false) => layers * out[LAYER_BACKWARD],
                (false, true) => layers * (out[LAYER_BACKWARD] + out[LAYER_FORWARD]),
            };
            let per_batch = layers * out[LAYER_FORWARD]
                + backward
                + out[PROJECTOR_FORWARD]
                + out[PROJECTOR_BACKWARD];
            let per_item = per_batch / at;
            item_s.push(per_item);
            microbatch_s += per_item * items;
            let variance = share.samples / share.replicas.max(1.0) * count_variance(count);
            let peak_items = in_flight * items
                + if self.training.reorder {
                    0.0
                } else {
                    PEAK_QUANTILE_Z * (in_flight * variance).sqrt()
                };
            let layer_per_item = out[LAYER_ACTIVATIONS] / at;
            let projector_per_item = e.llm_tokens_per_item() as f64
                * (e.projector_input() as f64 + e.projector_middle(self.llm_hidden as u64) as f64)
                * self.bytes.activation;
            // A frozen encoder keeps nothing for a backward: one layer's working set of one
            // micro-batch at a time; under full recompute each layer keeps its input, and one
            // layer's working set is rebuilt at a time.
            let layer_input = e.tokens_per_item as f64 * e.hidden as f64 * self.bytes.activation;
            memory.activations += match (e.frozen, recompute) {
                (true, _) => items * layer_per_item,
                (false, false) => peak_items * layers * layer_per_item,
                (false, true) => peak_items * layers * layer_input + items * layer_per_item,
            } + peak_items * projector_per_item / t;
            memory.weights += part.parameters / t * self.bytes.weight;
            trained += part.trained_parameters / t;
        }
        let shards = replicas as f64;
        let sharded = |stage: u8| if zero >= stage { shards } else { 1.0 };
        memory.weights /= sharded(3);
        memory.gradients = trained * self.bytes.gradient / sharded(2);
        memory.optimizer = trained * (self.bytes.master + self.bytes.moments) / sharded(1);
        let group = Group::placed(
            shards,
            t,
            self.gpus_per_node,
            self.nodes.max(shards * t / self.gpus_per_node),
        );
        let reduce = if replicas > 1 {
            collective_time(
                Collective::AllReduce,
                trained * self.bytes.gradient,
                &group,
                &self.links,
                &self.collectives,
            )
        } else {
            0.0
        };
        let optimizer = trained / sharded(1) * self.bytes.optimizer_step / self.hbm_rate;
        EncoderCost {
            tp,
            recompute,
            replicas,
            microbatch_s,
            tail_s: reduce + optimizer,
            memory,
            item_s,
            transfer_s,
        }
    }

    /// What the encoders add to a step whose language-model stages cost `stages` (the first
    /// stage already carrying the encoders when they run there).
    pub fn step(
        &self,
        spec: &Spec,
        strategy: &Strategy,
        stages: &[StageCost],
        microbatches: u64,
    ) -> EncoderStep {
        let m = microbatches.max(1);
        let dp = strategy.dp.max(1);
        let (cost, placement, gpus) = match self.separate_gpus() {
            Some(gpus) => (
                // The encoders' GPUs keep the first stage's fixed overheads beside them.
                self.separate(strategy, m, gpus, self.capacity - stages[0].memory.buffers),
                EncoderPlacement::Separate,
                gpus,
            ),
            None => (
                self.first_stage(strategy, m),
                EncoderPlacement::FirstStage,
                0,
            ),
        };
        let pipeline = PipelineLoads {
            stages: stages.iter().map(|s| s.microbatch_s).collect(),
            encoder_mean_s: cost.microbatch_s,
            separate: placement == EncoderPlacement::Separate,
        };
        let encoding = Encoding {
            item_s: cost.item_s.clone(),
            // Encoder replicas one language-model replica's micro-batch is spread over.
            spread: cost.replicas as f64 / dp as f64,
            fixed_s: cost.transfer_s,
        };
        let counts: Vec<ItemCount> = self.parts.iter().map(|p| p.spec.items_per_sample).collect();
        let batch = Batch {
            replicas: dp,
            microbatches: m,
            samples: strategy.microbatch.max(1),
        };
        let (in_order, reordered) = imbalance(&pipeline, &batch, &counts, &encoding);
        let reorder = self.training.reorder;
        let items_per_step: f64 = counts
            .iter()
            .map(|c| c.mean * spec.train.global_batch as f64)
            .sum();
        EncoderStep {
            extra_stage: (placement == EncoderPlacement::Separate).then_some(StageCost {
                microbatch_s: cost.microbatch_s,
                tail_s: cost.tail_s,
                memory: cost.memory,
            }),
            imbalance_s: if reorder { reordered } else { in_order },
            gpus,
            estimate: MultimodalEstimate {
                placement,
                encoder_tp: cost.tp,
                encoder_recompute: cost.recompute,
                encoder_replicas: cost.replicas,
                encoder_gpus: gpus,
                items_per_step,
                encoder_microbatch_s: cost.microbatch_s,
                encoder_memory_gib: cost.memory.total() / GIB,
                reorder,
                imbalance_in_order_s: in_order,
                imbalance_reordered_s: reordered,
            },
        }
    }
}

/// The fastest of `costs` within `budget` bytes per GPU, else the smallest.
fn fastest_within(costs: Vec<EncoderCost>, budget: f64) -> EncoderCost {
    let fits = costs.iter().filter(|c| c.memory.total() <= budget);
    let chosen = fits
        .min_by(|a, b| a.microbatch_s.total_cmp(&b.microbatch_s))
        .or_else(|| {
            costs
                .iter()
                .min_by(|a, b| a.memory.total().total_cmp(&b.memory.total()))
        });
    chosen
        .cloned()
        .expect("at least one tensor-parallel degree divides")
}

/// The encoder as a model of its own shape for the language model's cost machinery, and its
/// projector's GEMMs, over the slots `b` (items) and `t`.
fn encoder_exprs(
    spec: &Spec,
    encoder: &EncoderSpec,
    efficiency: KernelEfficiency,
    cal: Calibration,
) -> EncoderExprs {
    let mut shaped = spec.clone();
    shaped.model = ModelSpec {
        name: encoder.name.clone(),
        layers: encoder.layers,
        hidden: encoder.hidden,
        heads: encoder.heads,
        kv_heads: encoder.heads,
        head_dim: encoder.hidden / encoder.heads.max(1),
        ffn_hidden: encoder.ffn_hidden,
        vocab: 1,
        mlp: encoder.mlp,
        norm: encoder.norm,
        tie_embeddings: true,
        bias: true,
        max_seq_len: None,
        position: PositionKind::Rope,
        moe: None,
        encoders: Vec::new(),
    };
    shaped.train.seq_len = encoder.tokens_per_item;
    shaped.train.finetune = None;
    shaped.train.grad_compression = None;
    shaped.strategies.clear();
    let mut ctx = Ctx::new(&shaped, efficiency, cal);
    ctx.attended_fraction = 1.0;
    let layer = layer_times(&ctx);
    let forward = ctx.bind(layer.forward());
    let backward = ctx.bind(layer.backward());
    let activations = layer_activations(&ctx).total;
    let hidden = spec.model.hidden as f64;
    let tokens = ctx.b.clone() * encoder.llm_tokens_per_item() as f64;
    let linear = encoder.projector == tessel_grammar::ProjectorKind::Linear;
    let middle = if linear {
        hidden
    } else {
        encoder.projector_middle(spec.model.hidden) as f64
    };
    let first = ctx.matmul(
        tokens.clone(),
        k(middle) / ctx.t.clone(),
        k(encoder.projector_input() as f64),
        k(1.0),
    );
    let (projector_forward, projector_backward) = match encoder.projector {
        tessel_grammar::ProjectorKind::Linear => (first.forward, first.backward),
        tessel_grammar::ProjectorKind::Mlp => {
            let second = ctx.matmul(tokens, k(hidden), k(middle) / ctx.t.clone(), k(1.0));
            (
                first.forward + second.forward,
                first.backward + second.backward,
            )
        }
    };
    let mut outputs = vec![k(0.0); 5];
    outputs[LAYER_FORWARD] = forward;
    outputs[LAYER_BACKWARD] = backward;
    outputs[LAYER_ACTIVATIONS] = activations;
    outputs[PROJECTOR_FORWARD] = projector_forward;
    outputs[PROJECTOR_BACKWARD] = projector_backward;
    let llm_hidden = spec.model.hidden;
    let parameters = encoder.parameters(llm_hidden) as f64;
    let projector = encoder.projector_matmul_params(llm_hidden) as f64;
    EncoderExprs {
        spec: encoder.clone(),
        staged: StagedExprs {
            bindings: ctx.take_bindings(),
            outputs,
        },
        parameters,
        trained_parameters: if encoder.frozen {
            projector
        } else {
            parameters
        },
    }
}

/// Slot values of one encoder replica: `items` as the micro-batch, `tp` its tensor
/// parallelism, one layer, nothing else split.
fn slot_values(items: f64, tp: u64) -> Vec<f64> {
    let mut values = vec![0.0; Slot::ALL.len()];
    for (slot, value) in [
        (Slot::Microbatch, items),
        (Slot::Tp, tp as f64),
        (Slot::ExpertTp, tp as f64),
        (Slot::Pp, 1.0),
        (Slot::Dp, 1.0),
        (Slot::DpShard, 1.0),
        (Slot::Cp, 1.0),
        (Slot::Ep, 1.0),
        (Slot::Microbatches, 1.0),
        (Slot::Interleave, 1.0),
        (Slot::Layers, 1.0),
    ] {
        values[slot.index()] = value;
    }
    values
}

/// Micro-batches the first pipeline device holds at its peak.
fn in_flight(strategy: &Strategy, microbatches: u64) -> f64 {
    in_flight_of(
        strategy.pp.max(1) as f64,
        0.0,
        strategy.interleave.max(1) as f64,
        microbatches.max(1) as f64,
    )
}

/// Variance of a sample's item count.
fn count_variance(count: &ItemCount) -> f64 {
    match count.shape {
        CountShape::Fixed => 0.0,
        CountShape::Uniform => {
            let n = (2.0 * count.mean).round() + 1.0;
            (n * n - 1.0) / 12.0
        }
        CountShape::Poisson => count.mean,
    }
}

/// One draw of a sample's item count.
fn draw(count: &ItemCount, rng: &mut SplitMix64) -> u64 {
    let drawn = match count.shape {
        CountShape::Fixed => count.mean.round() as u64,
        CountShape::Uniform => {
            let top = (2.0 * count.mean).round();
            ((rng.unit() * (top + 1.0)).ceil() - 1.0).max(0.0) as u64
        }
        CountShape::Poisson if count.mean <= 64.0 => {
            // Knuth's product of uniforms.
            let limit = (-count.mean).exp();
            let mut product = rng.unit();
            let mut n = 0;
            while product > limit {
                product *= rng.unit();
                n += 1;
            }
            n
        }
        CountShape::Poisson => {
            // Normal beyond: Box–Muller.
            let z = (-2.0 * rng.unit().ln()).sqrt() * (std::f64::consts::TAU * rng.unit()).cos();
            (count.mean + count.mean.sqrt() * z).round().max(0.0) as u64
        }
    };
    drawn.min(count.max)
}

/// The language model's stage times per micro-batch and the encoders' mean share.
struct PipelineLoads {
    /// Seconds per micro-batch of each language-model stage, the first carrying the encoders'
    /// mean time unless they are separate.
    stages: Vec<f64>,
    encoder_mean_s: f64,
    separate: bool,
}

/// How a global batch is split: replicas × micro-batches × samples.
struct Batch {
    replicas: u64,
    microbatches: u64,
    samples: u64,
}

impl PipelineLoads {
    /// Seconds of one replica's pipeline whose micro-batches carry `encoder` seconds of encoder
    /// work each: every stage once (fill and drain), then each further micro-batch at the pace
    /// of its slowest stage.
    fn replica_time(&self, encoder: &[f64]) -> f64 {
        let (first, rest): (Box<dyn Fn(f64) -> f64>, &[f64]) = if self.separate {
            (Box::new(|e: f64| e), &self.stages[..])
        } else {
            let base = self.stages[0] - self.encoder_mean_s;
            (Box::new(move |e: f64| base + e), &self.stages[1..])
        };
        let others_sum: f64 = rest.iter().sum();
        let others_max = rest.iter().copied().fold(0.0, f64::max);
        let mut time = others_sum;
        for (i, &e) in encoder.iter().enumerate() {
            let stage = first(e);
            time += if i == 0 { stage } else { stage.max(others_max) };
        }
        time
    }
}

/// How long a micro-batch's encoders take from its item counts.
struct Encoding {
    /// Seconds of one item of each encoder on one replica.
    item_s: Vec<f64>,
    /// Encoder replicas sharing one micro-batch's items (below 1: one replica serves several
    /// language-model replicas).
    spread: f64,
    /// Seconds every micro-batch pays whatever its items (the embeddings' transfer).
    fixed_s: f64,
}

impl Encoding {
    /// The busiest replica's seconds for a micro-batch of `counts` items of each encoder.
    fn time(&self, counts: &[u64]) -> f64 {
        self.fixed_s
            + counts
                .iter()
                .zip(&self.item_s)
                .map(|(&n, s)| s * busiest_items(n as f64, self.spread))
                .sum::<f64>()
    }

    /// A sample's weight when balancing: its items' seconds.
    fn load(&self, counts: &[u64]) -> f64 {
        counts
            .iter()
            .zip(&self.item_s)
            .map(|(&n, s)| n as f64 * s)
            .sum()
    }
}

/// Seconds the slowest replica loses to uneven items against even loads, in data order and
/// reordered: the mean over [`DRAWS`] seeded global batches.
fn imbalance(
    pipeline: &PipelineLoads,
    batch: &Batch,
    counts: &[ItemCount],
    encoding: &Encoding,
) -> (f64, f64) {
    let m = batch.microbatches as usize;
    let per_bin = batch.samples as usize;
    let encoders = counts.len();
    let samples = batch.replicas as usize * m * per_bin;
    let even = pipeline.replica_time(&vec![pipeline.encoder_mean_s; m]);
    let mut rng = SplitMix64::new(SEED);
    let (mut in_order, mut reordered) = (0.0, 0.0);
    let bin_time = |drawn: &[u64], members: &[usize]| {
        let mut total = vec![0u64; encoders];
        for &sample in members {
            for (t, n) in total.iter_mut().zip(&drawn[sample * encoders..]) {
                *t += n;
            }
        }
        encoding.time(&total)
    };
    for _ in 0..DRAWS {
        let drawn: Vec<u64> = (0..samples * encoders)
            .map(|i| draw(&counts[i % encoders], &mut rng))
            .collect();
        let ordered: Vec<f64> = (0..samples)
            .collect::<Vec<_>>()
            .chunks(per_bin)
            .map(|members| bin_time(&drawn, members))
            .collect();
        in_order += slowest(pipeline, &ordered, m);
        let loads: Vec<f64> = drawn
            .chunks(encoders)
            .map(|sample| encoding.load(sample))
            .collect();
        let mut balanced_bins = Vec::with_capacity(samples / per_bin);
        for replica in balanced(&loads, batch.replicas as usize, m, per_bin) {
            let mut times: Vec<f64> = replica
                .iter()
                .map(|members| bin_time(&drawn, members))
                .collect();
            times.sort_by(f64::total_cmp);
            balanced_bins.extend(times);
        }
        reordered += slowest(pipeline, &balanced_bins, m);
    }
    let draws = DRAWS as f64;
    // Averaging identical draws (every sample the same) leaves round-off, not imbalance.
    let excess = |total: f64| {
        let excess = total / draws - even;
        if excess > 1e-12 * even {
            excess
        } else {
            0.0
        }
    };
    (excess(in_order), excess(reordered))
}

/// The slowest replica's pipeline time; `bins` lists each replica's micro-batches in turn.
fn slowest(pipeline: &PipelineLoads, bins: &[f64], microbatches: usize) -> f64 {
    bins.chunks(microbatches)
        .map(|replica| pipeline.replica_time(replica))
        .fold(0.0, f64::max)
}

/// Samples reordered as a data loader that balances them would: across replicas first, each
/// taking `microbatches · per_bin` samples, then within each replica across its micro-batches
/// of `per_bin` samples. Each level places the heaviest sample first, to the lightest group
/// with room (ties to the lower index). Returns each replica's micro-batches' samples.
fn balanced(
    loads: &[f64],
    replicas: usize,
    microbatches: usize,
    per_bin: usize,
) -> Vec<Vec<Vec<usize>>> {
    let order: Vec<usize> = (0..loads.len()).collect();
    spread(loads, &order, replicas, microbatches * per_bin)
        .iter()
        .map(|replica| spread(loads, replica, microbatches, per_bin))
        .collect()
}

/// The samples `items` (indices into `loads`) spread over `groups` of `capacity`, heaviest
/// first, each to the lightest group with room.
fn spread(loads: &[f64], items: &[usize], groups: usize, capacity: usize) -> Vec<Vec<usize>> {
    let mut order = items.to_vec();
    order.sort_by(|&a, &b| loads[b].total_cmp(&loads[a]).then(a.cmp(&b)));
    let mut members = vec![Vec::with_capacity(capacity); groups];
    let mut totals = vec![0.0; groups];
    let mut heap: std::collections::BinaryHeap<std::cmp::Reverse<(OrderedLoad, usize)>> = (0
        ..groups)
        .map(|group| std::cmp::Reverse((OrderedLoad(0.0), group)))
        .collect();
    for index in order {
        let Some(std::cmp::Reverse((_, group))) = heap.pop() else {
            break;
        };
        totals[group] += loads[index];
        members[group].push(index);
        if members[group].len() < capacity {
            heap.push(std::cmp::Reverse((OrderedLoad(totals[group]), group)));
        }
    }
    members
}

/// A load with the total order of `f64::total_cmp`, for the heap.
#[derive(Clone, Copy, PartialEq)]
struct OrderedLoad(f64);

impl Eq for OrderedLoad {}

impl PartialOrd for OrderedLoad {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OrderedLoad {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipeline(stages: Vec<f64>, encoder: f64) -> PipelineLoads {
        PipelineLoads {
            stages,
            encoder_mean_s: encoder,
            separate: false,
        }
    }

    #[test]
    fn even_loads_give_the_pipeline_formula() {
        // 1F1B: every stage once, then m − 1 micro-batches at the slowest stage.
        let p = pipeline(vec![3.0, 2.0, 2.5], 1.0);
        let time = p.replica_time(&[1.0; 4]);
        assert!((time - (3.0 + 2.0 + 2.5 + 3.0 * 3.0)).abs() < 1e-12);
    }

    #[test]
    fn a_light_first_stage_hides_uneven_encoder_work_behind_the_slowest_stage() {
        // First stage 1 s without the encoders, the others 3 s: up to 2 s of encoder work per
        // micro-batch costs nothing beyond the first.
        let p = pipeline(vec![2.0, 3.0], 1.0);
        let even = p.replica_time(&[1.0; 4]);
        let uneven = p.replica_time(&[1.0, 2.0, 0.0, 1.5]);
        assert!((uneven - even).abs() < 1e-12);
        // On one stage every second of encoder work counts.
        let alone = pipeline(vec![2.0], 1.0);
        assert!((alone.replica_time(&[1.0, 2.0, 0.0, 1.5]) - (4.0 + 4.5)).abs() < 1e-12);
    }

    #[test]
    fn reordering_evens_the_replicas_then_their_microbatches() {
        // Two replicas of two micro-batches of two samples.
        let loads = [8.0, 1.0, 4.0, 2.0, 3.0, 3.0, 7.0, 0.0];
        let totals: Vec<Vec<f64>> = balanced(&loads, 2, 2, 2)
            .iter()
            .map(|replica| {
                replica
                    .iter()
                    .map(|bin| bin.iter().map(|&i| loads[i]).sum())
                    .collect()
            })
            .collect();
        // Replicas {8, 3, 3, 0} and {7, 4, 2, 1}, 14 each; micro-batches {8, 0} and {3, 3},
        // {7, 1} and {4, 2}.
        assert_eq!(totals, vec![vec![8.0, 6.0], vec![8.0, 6.0]]);
    }

    #[test]
    fn an_image_is_not_split_between_replicas() {
        assert_eq!(busiest_items(1.0, 4.0), 1.0);
        assert_eq!(busiest_items(5.0, 4.0), 2.0);
        assert_eq!(busiest_items(0.3, 4.0), 0.3);
        assert_eq!(busiest_items(6.0, 0.5), 12.0);
    }

    #[test]
    fn reordering_never_costs_more_than_data_order() {
        let counts = [ItemCount {
            mean: 7.0,
            max: 13,
            shape: CountShape::Uniform,
        }];
        for separate in [false, true] {
            for samples in [1, 4] {
                let p = PipelineLoads {
                    stages: vec![1.0, 1.2, 1.2],
                    encoder_mean_s: 0.7 * samples as f64,
                    separate,
                };
                let batch = Batch {
                    replicas: 8,
                    microbatches: 32,
                    samples,
                };
                let encoding = Encoding {
                    item_s: vec![0.1],
                    spread: 1.0,
                    fixed_s: 0.0,
                };
                let (in_order, reordered) = imbalance(&p, &batch, &counts, &encoding);
                assert!(
                    reordered < in_order,
                    "{separate} {samples}: {reordered} {in_order}"
                );
            }
        }
    }

    #[test]
    fn draws_follow_their_distribution() {
        let mut rng = SplitMix64::new(7);
        for (shape, mean, variance) in [
            (CountShape::Poisson, 2.5, 2.5),
            (CountShape::Uniform, 2.0, 2.0),
            (CountShape::Fixed, 3.0, 0.0),
        ] {
            let count = ItemCount {
                mean,
                max: 1000,
                shape,
            };
            let n = 40_000;
            let draws: Vec<f64> = (0..n).map(|_| draw(&count, &mut rng) as f64).collect();
            let m = draws.iter().sum::<f64>() / n as f64;
            let v = draws.iter().map(|x| (x - m).powi(2)).sum::<f64>() / n as f64;
            assert!((m - mean).abs() < 0.03 * mean, "{shape:?} mean {m}");
            assert!(
                (v - variance).abs() < 0.05 * variance.max(0.1),
                "{shape:?} var {v}"
            );
            assert!((count_variance(&count) - variance).abs() < 1e-12);
        }
    }
}
