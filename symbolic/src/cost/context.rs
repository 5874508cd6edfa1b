//! What the stage-cost expressions are built from: the slot symbols as expressions, the
//! model's, cluster's and training job's numbers as constants, and small expression helpers
//! (indicators, GEMM time, memory-bound time, ring collectives).

use tessel_grammar::{
    Fp8Scaling, Framework, MlpKind, NormKind, Optimizer, PositionKind, Precision, Spec, TrainSpec,
};

use std::cell::RefCell;
use std::collections::BTreeMap;

use super::calibration::{AttentionRate, Calibration, GpuGeneration, KernelEfficiency};
use super::slots::Slot;
use crate::primitives::{
    attention_forward_rate, collective_time, compute_units, gemm_tile, gemm_time,
    nccl_compute_share, Collective, CollectiveParams, GemmDevice, GemmParams, Group, Links,
    HBM_STREAM_FRACTION,
};
use crate::{Expr, Symbol};

pub(crate) fn k(value: f64) -> Expr {
    Expr::Const(value)
}

/// Causal masking halves the attention work when the kernel skips masked blocks.
const CAUSAL_FRACTION: f64 = 0.5;

/// 1 when the integer-valued `x` exceeds `threshold`, else 0.
pub(crate) fn above(x: Expr, threshold: f64) -> Expr {
    Expr::min([Expr::max([x - threshold, k(0.0)]), k(1.0)])
}

/// Seconds of a GEMM forward and of its backward (input and weight gradients).
pub(crate) struct Matmul {
    pub forward: Expr,
    pub backward: Expr,
}

/// A communication group of the strategy: its ranks and how many of them share a node.
pub(crate) type Ring = Group<Expr>;

/// The mixture-of-experts numbers of a model.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MoeNumbers {
    pub experts: f64,
    pub top_k: f64,
    pub expert_ffn: f64,
    pub shared: f64,
    pub capacity: f64,
    /// Dense blocks before the first expert block, and the period of expert blocks after it.
    pub first_dense: f64,
    pub every: f64,
    /// Parameters of one expert (matmuls and biases).
    pub expert_params: f64,
}

/// Bytes per parameter by role, from the training precision and optimizer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StateBytes {
    /// The compute copy of a weight.
    pub weight: f64,
    /// A gradient as accumulated and reduced: fp32 for bf16 (its 8-bit mantissa needs fp32
    /// accumulation, as Megatron's main grads and FSDP's fp32 reduce do), fp16 for fp16
    /// training with loss scaling, fp32 for fp32.
    pub gradient: f64,
    /// The fp32 master copy (0 when training in fp32: the weights are the master).
    pub master: f64,
    /// Optimizer moments: Adam 2 × fp32, SGD momentum 1 × fp32.
    pub moments: f64,
    /// Bytes of an activation element.
    pub activation: f64,
    /// HBM bytes the optimizer step touches per local parameter.
    pub optimizer_step: f64,
}

impl StateBytes {
    /// The bytes of each state under `train`'s precision and optimizer.
    pub fn of(train: &TrainSpec, cal: &Calibration) -> StateBytes {
        let half = match train.precision {
            Precision::Fp32 => false,
            Precision::Bf16 | Precision::Fp16 | Precision::Fp8 => true,
        };
        let moments = match train.optimizer {
            Optimizer::Adam => 8.0,
            Optimizer::Sgd => 4.0,
        };
        StateBytes {
            weight: if half { 2.0 } else { 4.0 },
            gradient: if train.precision == Precision::Fp16 {
                2.0
            } else {
                4.0
            },
            master: if half { 4.0 } else { 0.0 },
            moments,
            activation: if half { 2.0 } else { 4.0 },
            optimizer_step: match train.optimizer {
                Optimizer::Adam => cal.adam_bytes_per_param,
                Optimizer::Sgd => cal.sgd_bytes_per_param,
            },
        }
    }

    /// What a checkpoint keeps of each parameter: the fp32 master (the weight itself when
    /// training in fp32) and the optimizer's moments.
    pub fn checkpointed(&self) -> f64 {
        self.master.max(self.weight) + self.moments
    }
}

pub(crate) struct Ctx {
    pub b: Expr,
    pub t: Expr,
    pub p: Expr,
    pub d: Expr,
    pub c: Expr,
    pub e: Expr,
    /// The experts' tensor-parallel degree.
    pub et: Expr,
    /// Data-parallel ranks ZeRO shards over: `d` unless hybrid sharding.
    pub ds: Expr,
    pub m: Expr,
    pub v: Expr,
    pub stage: Expr,
    pub layers: Expr,
    pub full: Expr,
    pub selective: Expr,
    /// 1 when the norms are recomputed (their outputs not kept), else 0.
    pub recompute_norms: Expr,
    /// 1 when the experts' activation is recomputed (its output not kept), else 0.
    pub recompute_moe_act: Expr,
    pub sp: Expr,
    pub zero: Expr,
    pub off_opt: Expr,
    pub off_w: Expr,
    pub off_g: Expr,
    pub off_act: Expr,

    pub seq: f64,
    pub hidden: f64,
    pub heads: f64,
    pub head_dim: f64,
    pub q_dim: f64,
    pub kv_dim: f64,
    pub ffn: f64,
    pub vocab: f64,
    pub mlp_matrices: f64,
    pub tied: bool,
    pub rope: bool,
    pub bias: bool,
    /// Parameters of one norm: layernorm has a weight and a bias, rmsnorm a weight.
    pub norm_params: f64,
    pub position_params: f64,
    pub flash: bool,
    /// 1 when the model trains with dropout (its masks are kept and written), else 0.
    pub dropout: f64,
    pub precision: Precision,
    pub fp8_scaling: Fp8Scaling,
    pub fused_cross_entropy: bool,
    /// Blocks compiled with `torch.compile`: pointwise results are recomputed in backward.
    pub compiled: bool,
    /// Tempo's activation-saving kernels (`train.memory_saving_kernels`).
    pub memory_saving_kernels: bool,
    /// Share of the `s × s` attention scores a fused kernel computes: ½ under the causal mask
    /// (masked blocks are skipped), 1 for a bidirectional encoder.
    pub attended_fraction: f64,
    pub framework: Framework,
    pub moe: Option<MoeNumbers>,
    pub bytes: StateBytes,

    pub matmul_peak: f64,
    /// Fraction of `matmul_peak` an FP8 GEMM with one scale per tensor sustains
    /// ([`KernelEfficiency::fp8_matmul`]).
    pub fp8_matmul: f64,
    pub attention_peak: f64,
    pub hbm_bandwidth: f64,
    pub efficiency: KernelEfficiency,
    /// The norms' fraction of HBM bandwidth ([`KernelEfficiency::norm_in_step`]).
    pub norm_memory: f64,
    /// The GEMM primitive's shape behaviour on this GPU's generation (microbenchmarks).
    pub gemm: GemmParams,
    pub sms: f64,
    /// The GPU's own GEMM tile side, where it is not cuBLAS's (the spec's `gemm_tile`).
    pub gemm_tile: Option<f64>,
    pub cal: Calibration,
    /// Named intermediate expressions (`$0`, `$1`, ...), each over the slots and earlier
    /// intermediates: shared sub-expressions are evaluated once.
    bindings: RefCell<Vec<Expr>>,
    shared: RefCell<BTreeMap<&'static str, Expr>>,
    pub gpus_per_node: f64,
    pub nodes: f64,
    pub links: Links,
    /// NCCL's behaviour on those links, calibrated on microbenchmarks.
    pub collectives: CollectiveParams,
    /// What the framework overlaps (`train.overlap` over the framework's defaults), below
    /// ZeRO-3 and under it.
    pub overlap: tessel_grammar::Overlap,
    pub overlap_zero3: tessel_grammar::Overlap,
    pub host_link: f64,
    /// LoRA or LoRA-FA fine-tuning: the model's weights are frozen and only adapters train;
    /// `None` when every weight trains.
    pub adapters: Option<Adapters>,
    /// How data-parallel gradients are compressed (`train.grad_compression`); `auto` is costed
    /// without (the planner tries each method beside), and adapters are sent whole.
    pub grad_compression: Option<tessel_grammar::GradCompression>,
}

/// What `train.finetune` trains: rank-`rank` adapters on the targeted projections.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Adapters {
    pub rank: f64,
    /// LoRA-FA: `A` frozen too, so only `B` trains and the projections' inputs are not kept.
    pub frozen_a: bool,
    pub targets: tessel_grammar::LoraTargets,
}

impl Ctx {
    pub fn new(spec: &Spec, efficiency: KernelEfficiency, cal: Calibration) -> Ctx {
        let model = &spec.model;
        let train = &spec.train;
        let cluster = &spec.cluster;
        let sym = |slot: Slot| Expr::Sym(slot.symbol());
        let bytes = StateBytes::of(train, &cal);
        let peak = &cluster.gpu.peak;
        let in_step = efficiency.for_training(train, &cal);
        let matmul_peak = match train.precision {
            Precision::Fp32 => peak.tf32.max(peak.fp32),
            other => peak.for_precision(other),
        };
        let attention_peak = match train.precision {
            Precision::Fp8 => peak.bf16,
            Precision::Fp32 => peak.tf32.max(peak.fp32),
            other => peak.for_precision(other),
        };
        let moe = model.moe.as_ref().map(|moe| {
            let expert_matmul = model.mlp_matmul_params(moe.expert_ffn_hidden) as f64;
            let expert_bias = if model.bias {
                (moe.expert_ffn_hidden + model.hidden) as f64
            } else {
                0.0
            };
            MoeNumbers {
                experts: moe.experts as f64,
                top_k: moe.top_k as f64,
                expert_ffn: moe.expert_ffn_hidden as f64,
                shared: moe.shared_experts as f64,
                capacity: moe.capacity_factor.max(1.0),
                first_dense: moe.first_dense as f64,
                every: moe.every.max(1) as f64,
                expert_params: expert_matmul + expert_bias,
            }
        });
        Ctx {
            b: sym(Slot::Microbatch),
            t: sym(Slot::Tp),
            p: sym(Slot::Pp),
            d: sym(Slot::Dp),
            c: sym(Slot::Cp),
            e: sym(Slot::Ep),
            et: sym(Slot::ExpertTp),
            ds: sym(Slot::DpShard),
            m: sym(Slot::Microbatches),
            v: sym(Slot::Interleave),
            stage: sym(Slot::Stage),
            layers: sym(Slot::Layers),
            full: sym(Slot::FullRecomputeLayers),
            selective: sym(Slot::Selective),
            recompute_norms: sym(Slot::RecomputeNorms),
            recompute_moe_act: sym(Slot::RecomputeMoeAct),
            sp: sym(Slot::SequenceParallel),
            zero: sym(Slot::Zero),
            off_opt: sym(Slot::OffloadOptimizer),
            off_w: sym(Slot::OffloadWeights),
            off_g: sym(Slot::OffloadGradients),
            off_act: sym(Slot::OffloadActivations),
            seq: train.seq_len as f64,
            hidden: model.hidden as f64,
            heads: model.heads as f64,
            head_dim: model.head_dim as f64,
            q_dim: model.q_dim() as f64,
            kv_dim: model.kv_dim() as f64,
            ffn: model.ffn_hidden as f64,
            vocab: model.vocab as f64,
            mlp_matrices: match model.mlp {
                MlpKind::Gelu => 2.0,
                MlpKind::Swiglu => 3.0,
            },
            tied: model.tie_embeddings,
            rope: model.position == PositionKind::Rope,
            bias: model.bias,
            norm_params: match model.norm {
                NormKind::Layernorm => 2.0 * model.hidden as f64,
                NormKind::Rmsnorm => model.hidden as f64,
            },
            position_params: match model.position {
                PositionKind::Rope => 0.0,
                PositionKind::Learned => (model.max_seq_len.unwrap_or(0) * model.hidden) as f64,
            },
            flash: train.flash_attention,
            dropout: if train.dropout > 0.0 { 1.0 } else { 0.0 },
            precision: train.precision,
            fp8_scaling: train.fp8_scaling(),
            fused_cross_entropy: train.fused_cross_entropy(),
            compiled: train.compile,
            // `auto` is costed without them; the planner tries them beside.
            memory_saving_kernels: train.memory_saving_kernels.is_on(),
            attended_fraction: CAUSAL_FRACTION,
            framework: train.framework,
            moe,
            bytes,
            matmul_peak,
            fp8_matmul: in_step.fp8_matmul(peak),
            attention_peak,
            hbm_bandwidth: cluster.gpu.hbm_bandwidth,
            norm_memory: efficiency.norm_in_step(train, model.norm, &in_step),
            efficiency: in_step,
            gemm: cal.gemm_for(GpuGeneration::from_name(&cluster.gpu.name)),
            sms: compute_units(&cluster.gpu),
            gemm_tile: gemm_tile(&cluster.gpu),
            cal,
            bindings: RefCell::new(Vec::new()),
            shared: RefCell::new(BTreeMap::new()),
            gpus_per_node: cluster.gpus_per_node as f64,
            nodes: cluster.nodes as f64,
            links: Links::of(cluster),
            collectives: cal.collectives,
            overlap: train.overlap(false),
            overlap_zero3: train.overlap(true),
            host_link: cluster.host_link,
            grad_compression: train.grad_compression.filter(|c| {
                c.method != tessel_grammar::CompressionMethod::Auto
                    && !train.finetune.is_some_and(|f| f.is_adapter())
            }),
            adapters: train.finetune.filter(|f| f.is_adapter()).map(|f| Adapters {
                rank: f.rank as f64,
                // `auto` is costed as LoRA; the planner tries LoRA-FA beside it.
                frozen_a: f.method == tessel_grammar::FinetuneMethod::LoraFa,
                targets: f.targets,
            }),
        }
    }

    /// FP8 training: fp8 GEMMs and their casts.
    pub fn is_fp8(&self) -> bool {
        self.precision == Precision::Fp8
    }

    /// FP8 training with `scaling`.
    pub fn is_fp8_with(&self, scaling: Fp8Scaling) -> bool {
        self.is_fp8() && self.fp8_scaling == scaling
    }

    /// Whether FP8 runs through torchao (row-wise scaling, which only torchao offers, and
    /// tensor-wise scaling where the framework's FP8 library is torchao) rather than
    /// Transformer Engine: torchao keeps the bf16 GEMM inputs for backward, where Transformer
    /// Engine keeps their fp8 casts.
    pub fn fp8_through_torchao(&self) -> bool {
        self.is_fp8_with(Fp8Scaling::Rowwise)
            || (self.is_fp8_with(Fp8Scaling::Tensorwise) && self.framework.fp8_through_torchao())
    }

    /// Whether weights and sequence-parallel inputs are cast before they are gathered, so
    /// the gathers move fp8: torchao's tensor-wise recipe does (FSDP's float8 all-gather,
    /// float8 tensor-parallel plans); Transformer Engine gathers bf16.
    pub fn gathers_fp8(&self) -> bool {
        self.fp8_through_torchao() && self.fp8_scaling == Fp8Scaling::Tensorwise
    }

    /// Names `expr` as the next intermediate and returns its symbol.
    pub fn bind(&self, expr: Expr) -> Expr {
        let mut bindings = self.bindings.borrow_mut();
        let symbol = Symbol::new(&format!("${}", bindings.len()));
        bindings.push(expr);
        Expr::Sym(symbol)
    }

    /// The intermediate named `key`, built by `make` the first time it is asked for.
    pub fn shared(&self, key: &'static str, make: impl FnOnce() -> Expr) -> Expr {
        if let Some(expr) = self.shared.borrow().get(key) {
            return expr.clone();
        }
        let bound = self.bind(make());
        self.shared.borrow_mut().insert(key, bound.clone());
        bound
    }

    /// The intermediates in binding order.
    pub fn take_bindings(&self) -> Vec<Expr> {
        self.bindings.take()
    }

    /// The fused attention kernel's forward and backward rates, FLOP/s: the attention
    /// primitive at the query block each rank runs (its sequence shard under context
    /// parallelism) and the model's head width, or the spec's flat fraction of peak.
    pub fn attention_rates(&self) -> (Expr, Expr) {
        match self.efficiency.attention {
            AttentionRate::Kernel(params) => {
                let causal = self.attended_fraction < 1.0;
                let forward = self.bind(attention_forward_rate(
                    self.attention_peak,
                    self.local_seq(),
                    self.head_dim,
                    causal,
                    &params,
                ));
                (forward.clone(), forward * params.backward)
            }
            AttentionRate::Flat(fraction) => {
                let rate = k(self.attention_peak * fraction);
                (rate.clone(), rate)
            }
        }
    }

    /// Sequence positions each GPU holds: `s / c`.
    pub fn local_seq(&self) -> Expr {
        k(self.seq) / self.c.clone()
    }

    /// Tokens each GPU processes per micro-batch: `b · s / c`.
    pub fn tokens(&self) -> Expr {
        self.b.clone() * self.local_seq()
    }

    /// Divisor of the work outside tensor-parallel regions (norms, dropout, residuals):
    /// replicated over the tp group unless sequence parallelism shards it (`1 + sp·(t − 1)`).
    pub fn replicated_divisor(&self) -> Expr {
        k(1.0) + self.sp.clone() * (self.t.clone() - 1.0)
    }

    /// Ranks the key/value heads are split over: `min(t, kv_heads)`. With more tensor-parallel
    /// ranks than key/value heads each head is replicated (Megatron-LM's GQA), so its weights,
    /// projections and activations are divided by fewer than `t`.
    pub fn kv_split(&self) -> Expr {
        Expr::min([self.t.clone(), k((self.kv_dim / self.head_dim).max(1.0))])
    }

    /// 1 when the experts are folded: their tensor-parallel degree is below `tp`, and their
    /// expert-parallel ranks are drawn from the tensor-parallel ranks too.
    pub fn folded(&self) -> Expr {
        above(self.t.clone() - self.et.clone(), 0.0)
    }

    /// Fraction of this device's layers that carry experts. The first device holds the model's
    /// first layers, so its `first_dense` dense blocks are its own: `⌊max(L − d, 0)/every⌋ / L`
    /// of its `L` layers. Later devices hold one expert block in `every`.
    pub fn moe_fraction(&self) -> Expr {
        let Some(moe) = &self.moe else {
            return k(0.0);
        };
        self.shared("moe_fraction", || {
            let layers = Expr::max([self.layers.clone(), k(1.0)]);
            let after_dense = Expr::max([layers.clone() - moe.first_dense, k(0.0)]);
            // ⌊x/e⌋ = ⌈(x + 1)/e⌉ − 1 for whole x ≥ 0.
            let first_device = (Expr::ceil((after_dense + 1.0) / moe.every) - 1.0) / layers;
            self.is_first() * first_device + (k(1.0) - self.is_first()) * (1.0 / moe.every)
        })
    }

    /// 1 for the first pipeline device.
    pub fn is_first(&self) -> Expr {
        above(k(1.0) - self.stage.clone(), 0.0)
    }

    /// 1 for the last pipeline device.
    pub fn is_last(&self) -> Expr {
        above(self.stage.clone() - self.p.clone() + 2.0, 0.0)
    }

    /// Indicators of the ZeRO stage: (≥ 1, ≥ 2, = 3).
    pub fn zero_flags(&self) -> (Expr, Expr, Expr) {
        let z = self.zero.clone();
        (
            Expr::min([z.clone(), k(1.0)]),
            above(z.clone(), 1.0),
            above(z, 2.0),
        )
    }

    /// Seconds of `batch` GEMMs of `m × k` by `k × n` per GPU, forward, and of their two
    /// backward GEMMs (the input gradient `m × n` by `n × k`, the weight gradient `k × m` by
    /// `m × n`). Shapes cost what the GEMM primitive says they cost on this GPU (tiles, waves,
    /// `k`), at the fraction of peak a large GEMM sustains in training: the generation's
    /// calibrated `matmul` (for FP8 `fp8_matmul`, that level at the measured FP8 speedup,
    /// and row-scaled GEMMs at the measured `fp8_rowwise_matmul` of it).
    pub fn matmul(&self, m: Expr, n: Expr, kk: Expr, batch: Expr) -> Matmul {
        let fraction = if self.is_fp8_with(Fp8Scaling::Rowwise) {
            self.fp8_matmul * self.cal.fp8_rowwise_matmul
        } else if self.is_fp8() {
            self.fp8_matmul
        } else {
            self.efficiency.matmul
        };
        let params = GemmParams {
            efficiency: fraction,
            ..self.gemm
        };
        let device = GemmDevice {
            peak_flops: self.matmul_peak,
            memory_bandwidth: self.hbm_bandwidth * HBM_STREAM_FRACTION,
            sms: self.sms,
            tile: self.gemm_tile,
        };
        let bytes = if self.is_fp8() {
            1.0
        } else {
            self.bytes.activation
        };
        let time = |m: Expr, n: Expr, kk: Expr| {
            gemm_time(m, n, kk, batch.clone(), bytes, &device, &params)
        };
        Matmul {
            forward: time(m.clone(), n.clone(), kk.clone()),
            backward: time(m.clone(), kk.clone(), n.clone()) + time(kk, n, m),
        }
    }

    /// [`Ctx::matmul`] of a model weight: under adapter fine-tuning the weight is frozen, so
    /// its backward computes the input gradient only.
    pub fn weight_matmul(&self, m: Expr, n: Expr, kk: Expr, batch: Expr) -> Matmul {
        if self.adapters.is_none() {
            return self.matmul(m, n, kk, batch);
        }
        let input_grad = self
            .matmul(m.clone(), kk.clone(), n.clone(), batch.clone())
            .forward;
        Matmul {
            forward: self.matmul(m, n, kk, batch).forward,
            backward: input_grad,
        }
    }

    /// Seconds of a memory-bound kernel moving `bytes`.
    pub fn memory_bound(&self, bytes: Expr) -> Expr {
        bytes / (self.hbm_bandwidth * self.efficiency.memory)
    }

    /// Seconds of the norms' passes over `bytes` (counted as [`crate::primitives::NORM_BYTES`] counts them).
    pub fn norm_bound(&self, bytes: Expr) -> Expr {
        bytes / (self.hbm_bandwidth * self.norm_memory)
    }

    /// The group of `n` ranks placed `stride` GPUs apart, its ranks per node named once per
    /// `key` so that every collective on the same group shares it.
    pub fn ring(&self, key: &'static str, n: Expr, stride: Expr) -> Ring {
        let per_node_key: &'static str = match key {
            "tp" => "tp.per_node",
            "dp" => "dp.per_node",
            "shard" => "shard.per_node",
            "replicas" => "replicas.per_node",
            "ep" => "ep.per_node",
            _ => "tied.per_node",
        };
        // The tied-embedding pair spans at most two nodes. Tensor-parallel groups stay in a
        // node or span a few (the planner keeps them in one): their tree depth is counted up
        // to two nodes, which keeps the expression short. Data and expert groups may span
        // the cluster.
        let max_nodes = match key {
            "tied" | "tp" => 2.0,
            _ => self.nodes,
        };
        let placed = Group::placed(n.clone(), stride, self.gpus_per_node, max_nodes);
        Group {
            ranks: n,
            per_node: self.shared(per_node_key, || placed.per_node),
            max_nodes,
        }
    }

    /// The data-parallel ranks: `d·cp`, stride `tp`.
    pub fn dp_ring(&self) -> Ring {
        self.ring("dp", self.d.clone() * self.c.clone(), self.t.clone())
    }

    /// The ranks ZeRO shards over: `ds·cp`, consecutive data-parallel ranks (stride `tp`).
    pub fn shard_ring(&self) -> Ring {
        self.ring("shard", self.ds.clone() * self.c.clone(), self.t.clone())
    }

    /// The replicas of hybrid sharding: `d/ds` groups holding the same shard, `tp·cp·ds`
    /// ranks apart; one rank when every data-parallel rank shards.
    pub fn replica_ring(&self) -> Ring {
        let stride = self.t.clone() * self.c.clone() * self.ds.clone();
        self.ring("replicas", self.d.clone() / self.ds.clone(), stride)
    }

    fn collective(&self, kind: Collective, bytes: Expr, group: &Ring) -> Expr {
        collective_time(kind, bytes, group, &self.links, &self.collectives)
    }

    /// How much longer compute takes while NCCL runs over `group` beside it.
    pub fn nccl_compute_share(&self, group: &Ring) -> Expr {
        nccl_compute_share(group, &self.links, &self.collectives, self.sms)
    }

    /// One all-reduce of `bytes` over `group` (NCCL's ring or tree, whichever is faster).
    pub fn all_reduce(&self, bytes: Expr, group: &Ring) -> Expr {
        self.collective(Collective::AllReduce, bytes, group)
    }

    /// One ring all-gather of a buffer of `bytes` (whole), or a reduce-scatter of one.
    pub fn gather(&self, bytes: Expr, group: &Ring) -> Expr {
        self.collective(Collective::AllGather, bytes, group)
    }

    /// All-to-all of `bytes` per GPU over `n` ranks `stride` apart.
    pub fn all_to_all(&self, bytes: Expr, n: Expr, stride: Expr) -> Expr {
        let group = self.ring("ep", n, stride);
        self.collective(Collective::AllToAll, bytes, &group)
    }

    /// One point-to-point message of `bytes` between ranks `span` consecutive GPUs apart at
    /// most: over NVLink inside a node, through the NIC across nodes.
    pub fn p2p(&self, bytes: Expr, span: Expr) -> Expr {
        let same_node = k(1.0) - above(span, self.gpus_per_node);
        let pair = Group {
            ranks: k(2.0),
            per_node: k(1.0) + same_node,
            max_nodes: 2.0,
        };
        self.collective(Collective::SendRecv, bytes, &pair)
    }
}
