//! What the stage-cost expressions are built from: the slot symbols as expressions, the
//! model's, cluster's and training job's numbers as constants, and small expression helpers
//! (indicators, GEMM time, memory-bound time, ring collectives).

use tessel_grammar::{
    Fp8Scaling, Framework, MlpKind, NormKind, Optimizer, PositionKind, Precision, Spec,
};

use std::cell::RefCell;
use std::collections::BTreeMap;

use super::calibration::{Calibration, KernelEfficiency};
use super::slots::Slot;
use crate::{Expr, Symbol};

pub(crate) fn k(value: f64) -> Expr {
    Expr::Const(value)
}

/// 1 when the integer-valued `x` exceeds `threshold`, else 0.
pub(crate) fn above(x: Expr, threshold: f64) -> Expr {
    Expr::min([Expr::max([x - threshold, k(0.0)]), k(1.0)])
}

/// A ring group: its size and its link's seconds per byte and per step.
pub(crate) struct Ring {
    pub n: Expr,
    pub per_byte: Expr,
    pub latency: Expr,
}

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

pub(crate) struct Ctx {
    pub b: Expr,
    pub t: Expr,
    pub p: Expr,
    pub d: Expr,
    pub c: Expr,
    pub e: Expr,
    pub m: Expr,
    pub v: Expr,
    pub stage: Expr,
    pub layers: Expr,
    pub full: Expr,
    pub selective: Expr,
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
    pub framework: Framework,
    pub moe: Option<MoeNumbers>,
    pub bytes: StateBytes,

    pub matmul_peak: f64,
    pub attention_peak: f64,
    pub hbm_bandwidth: f64,
    pub efficiency: KernelEfficiency,
    pub cal: Calibration,
    /// Named intermediate expressions (`$0`, `$1`, ...), each over the slots and earlier
    /// intermediates: shared sub-expressions are evaluated once.
    bindings: RefCell<Vec<Expr>>,
    shared: RefCell<BTreeMap<&'static str, Expr>>,
    pub gpus_per_node: f64,
    pub intra_bandwidth: f64,
    pub inter_bandwidth: f64,
    pub intra_latency: f64,
    pub inter_latency: f64,
    pub host_link: f64,
}

impl Ctx {
    pub fn new(spec: &Spec, efficiency: KernelEfficiency, cal: Calibration) -> Ctx {
        let model = &spec.model;
        let train = &spec.train;
        let cluster = &spec.cluster;
        let sym = |slot: Slot| Expr::Sym(slot.symbol());
        let half = match train.precision {
            Precision::Fp32 => false,
            Precision::Bf16 | Precision::Fp16 | Precision::Fp8 => true,
        };
        let moments = match train.optimizer {
            Optimizer::Adam => 8.0,
            Optimizer::Sgd => 4.0,
        };
        let bytes = StateBytes {
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
        };
        let peak = &cluster.gpu.peak;
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
            m: sym(Slot::Microbatches),
            v: sym(Slot::Interleave),
            stage: sym(Slot::Stage),
            layers: sym(Slot::Layers),
            full: sym(Slot::FullRecomputeLayers),
            selective: sym(Slot::Selective),
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
            framework: train.framework,
            moe,
            bytes,
            matmul_peak,
            attention_peak,
            hbm_bandwidth: cluster.gpu.hbm_bandwidth,
            efficiency: efficiency.for_framework(train.framework, &cal),
            cal,
            bindings: RefCell::new(Vec::new()),
            shared: RefCell::new(BTreeMap::new()),
            gpus_per_node: cluster.gpus_per_node as f64,
            intra_bandwidth: cluster.intra_node.bandwidth * cal.intra_node_comm_efficiency,
            inter_bandwidth: cluster.inter_node.bandwidth * cal.inter_node_comm_efficiency,
            intra_latency: cluster.intra_node.latency,
            inter_latency: cluster.inter_node.latency,
            host_link: cluster.host_link,
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

    /// Seconds of a GEMM of `flops` whose dimensions are `dims` (per GPU).
    pub fn gemm(&self, flops: Expr, dims: Vec<Expr>) -> Expr {
        let smallest = Expr::min(dims);
        let fraction = if self.is_fp8_with(Fp8Scaling::Rowwise) {
            self.efficiency.fp8_matmul * self.cal.fp8_rowwise_matmul
        } else if self.is_fp8() {
            self.efficiency.fp8_matmul
        } else {
            self.efficiency.matmul
        };
        let rate = self.matmul_peak * fraction;
        flops * (smallest.clone() + self.efficiency.matmul_half_dim) / (smallest * rate)
    }

    /// Seconds of a memory-bound kernel moving `bytes`.
    pub fn memory_bound(&self, bytes: Expr) -> Expr {
        bytes / (self.hbm_bandwidth * self.efficiency.memory)
    }

    /// Seconds per byte and per message of a ring over `n` ranks placed `stride` GPUs apart.
    /// Inside one node (`n · stride ≤ gpus_per_node`) it runs at the intra-node link. Across
    /// nodes NCCL runs one ring channel per GPU of the group in a node, each leaving through
    /// that GPU's own NIC, so the ring moves `members_per_node × inter-node bandwidth`
    /// (`members_per_node = min(n, gpus_per_node / stride)`), capped by the intra-node link.
    fn ring_link(&self, n: Expr, stride: Expr) -> (Expr, Expr) {
        let crosses = above(n.clone() * stride.clone(), self.gpus_per_node);
        let members = Expr::max([Expr::min([n, k(self.gpus_per_node) / stride]), k(1.0)]);
        let across = Expr::max([
            k(1.0 / self.intra_bandwidth),
            k(1.0 / self.inter_bandwidth) / members,
        ]);
        self.select_link(crosses, across)
    }

    /// Seconds per byte and per message between single GPUs `span` consecutive GPUs apart at
    /// most (point-to-point, all-to-all): one NIC per GPU across nodes.
    fn pair_link(&self, span: Expr) -> (Expr, Expr) {
        let crosses = above(span, self.gpus_per_node);
        self.select_link(crosses, k(1.0 / self.inter_bandwidth))
    }

    fn select_link(&self, crosses: Expr, across_per_byte: Expr) -> (Expr, Expr) {
        let per_byte = (k(1.0) - crosses.clone()) * (1.0 / self.intra_bandwidth)
            + crosses.clone() * across_per_byte;
        let latency =
            (k(1.0) - crosses.clone()) * self.intra_latency + crosses * self.inter_latency;
        (per_byte, latency)
    }

    /// The link of a ring group, named once per `key` so that every collective on the same
    /// group shares it.
    pub fn ring(&self, key: &'static str, n: Expr, stride: Expr) -> Ring {
        let per_byte_key: &'static str = match key {
            "tp" => "tp.per_byte",
            "dp" => "dp.per_byte",
            _ => "tied.per_byte",
        };
        let latency_key: &'static str = match key {
            "tp" => "tp.latency",
            "dp" => "dp.latency",
            _ => "tied.latency",
        };
        let (per_byte, latency) = self.ring_link(n.clone(), stride);
        Ring {
            n,
            per_byte: self.shared(per_byte_key, || per_byte),
            latency: self.shared(latency_key, || latency),
        }
    }

    /// Ring all-reduce of `bytes`: `2(n−1)/n` of the buffer per GPU plus `2(n−1)` latency
    /// steps.
    pub fn all_reduce(&self, bytes: Expr, ring: &Ring) -> Expr {
        let steps = ring.n.clone() - 1.0;
        k(2.0) * steps.clone() / ring.n.clone() * bytes * ring.per_byte.clone()
            + k(2.0) * steps * ring.latency.clone()
    }

    /// Ring all-gather or reduce-scatter: `(n−1)/n` of the (full) buffer plus `n−1` steps.
    pub fn gather(&self, bytes: Expr, ring: &Ring) -> Expr {
        let steps = ring.n.clone() - 1.0;
        steps.clone() / ring.n.clone() * bytes * ring.per_byte.clone()
            + steps * ring.latency.clone()
    }

    /// All-to-all of `bytes` per GPU over `n` ranks `stride` apart: `(n−1)/n` leaves the GPU.
    pub fn all_to_all(&self, bytes: Expr, n: Expr, stride: Expr) -> Expr {
        let (per_byte, latency) = self.pair_link(n.clone() * stride);
        let steps = n.clone() - 1.0;
        steps.clone() / n * bytes * per_byte + steps * latency
    }

    /// One point-to-point message of `bytes` between ranks `span` GPUs apart at most.
    pub fn p2p(&self, bytes: Expr, span: Expr) -> Expr {
        let (per_byte, latency) = self.pair_link(span);
        bytes * per_byte + latency
    }
}
