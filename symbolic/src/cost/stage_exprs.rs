//! The stage-cost expressions: every [`Output`] of one pipeline device as an `Expr` over the
//! [`Slot`] symbols, with the spec's numbers folded in. Built once per spec; the planner
//! evaluates them per candidate (tree walk now, a compiled program later).

use super::calibration::{Calibration, KernelEfficiency};
use super::communication::{
    choose_compression, cp_layer_forward, dp_step, ep_layer_one_way, pp_microbatch,
    tp_layer_passes, tp_overlapped, zero2_microbatch, zero3_microbatch,
};
use super::compute::{embedding_time, head_time, layer_times};
use super::context::{k, Ctx, Ring};
use super::memory::stage_memory;
use super::parameters::{stage_params, trainable_sharded_params, trainable_stage_params};
use super::slots::{Output, Slot};
use super::stragglers::straggler_factor;
use crate::primitives::HOST_ADAM_PARAMS_PER_S;
use crate::{Expr, Symbol};
use tessel_grammar::Spec;

/// The slot symbols (in [`Slot::ALL`] order) and one expression per [`Output`] (in
/// [`Output::ALL`] order), each over the slots only.
pub fn stage_cost_exprs(
    spec: &Spec,
    efficiency: KernelEfficiency,
    cal: Calibration,
) -> (Vec<Symbol>, Vec<Expr>) {
    let staged = StagedExprs::new(spec, efficiency, cal);
    let slots = Slot::ALL.iter().map(|s| s.symbol()).collect();
    (slots, staged.inlined())
}

/// The stage-cost expressions with their shared sub-expressions named: `bindings[k]` is the
/// intermediate `$k`, over the slots and `$0 … $k−1`; the outputs refer to both. Evaluating
/// each binding once is what makes tree evaluation affordable.
#[derive(Clone, Debug)]
pub struct StagedExprs {
    pub bindings: Vec<Expr>,
    pub outputs: Vec<Expr>,
}

impl StagedExprs {
    pub fn new(spec: &Spec, efficiency: KernelEfficiency, cal: Calibration) -> StagedExprs {
        let ctx = Ctx::new(spec, efficiency, cal);
        let outputs = build(&ctx);
        StagedExprs {
            bindings: ctx.take_bindings(),
            outputs,
        }
    }

    /// Evaluates every output from the slot values (in [`Slot::ALL`] order).
    pub fn eval(&self, slots: &[f64]) -> Vec<f64> {
        let mut bound = Vec::with_capacity(self.bindings.len());
        for binding in &self.bindings {
            let value = binding.eval(&|symbol: &Symbol| lookup(symbol, slots, &bound));
            bound.push(value);
        }
        let env = |symbol: &Symbol| lookup(symbol, slots, &bound);
        self.outputs.iter().map(|expr| expr.eval(&env)).collect()
    }

    /// The outputs with every intermediate substituted: expressions over the slots only.
    pub fn inlined(&self) -> Vec<Expr> {
        let mut expanded: Vec<Expr> = Vec::with_capacity(self.bindings.len());
        for binding in &self.bindings {
            let inlined = substitute(binding, &expanded);
            expanded.push(inlined);
        }
        self.outputs
            .iter()
            .map(|expr| substitute(expr, &expanded))
            .collect()
    }
}

/// The value of a slot or of an already evaluated intermediate; NaN for anything else.
fn lookup(symbol: &Symbol, slots: &[f64], bound: &[f64]) -> f64 {
    let name = symbol.name();
    let index = match name.strip_prefix('$') {
        Some(number) => {
            return number
                .parse::<usize>()
                .ok()
                .and_then(|k| bound.get(k))
                .copied()
                .unwrap_or(f64::NAN)
        }
        None => Slot::index_of(name),
    };
    index
        .and_then(|k| slots.get(k))
        .copied()
        .unwrap_or(f64::NAN)
}

/// Replaces every intermediate symbol `$k` in `expr` by `expanded[k]`.
fn substitute(expr: &Expr, expanded: &[Expr]) -> Expr {
    let all = |items: &[Expr]| items.iter().map(|e| substitute(e, expanded)).collect();
    match expr {
        Expr::Const(_) => expr.clone(),
        Expr::Sym(symbol) => symbol
            .name()
            .strip_prefix('$')
            .and_then(|number| number.parse::<usize>().ok())
            .and_then(|k| expanded.get(k))
            .cloned()
            .unwrap_or_else(|| expr.clone()),
        Expr::Sum(items) => Expr::Sum(all(items)),
        Expr::Product(items) => Expr::Product(all(items)),
        Expr::Max(items) => Expr::Max(all(items)),
        Expr::Min(items) => Expr::Min(all(items)),
        Expr::Div(a, b) => Expr::Div(
            Box::new(substitute(a, expanded)),
            Box::new(substitute(b, expanded)),
        ),
        Expr::Ceil(a) => Expr::Ceil(Box::new(substitute(a, expanded))),
    }
}

fn build(ctx: &Ctx) -> Vec<Expr> {
    let layer = layer_times(ctx);
    let forward = ctx.bind(layer.forward());
    let backward = ctx.bind(layer.backward());
    let layers = ctx.layers.clone();
    let full = ctx.full.clone();
    let partial = layers.clone() - full.clone();

    // Every synchronisation waits for the slowest rank: a measured jitter slows the compute.
    let straggler = straggler_factor(ctx).map(|factor| ctx.bind(factor));
    let waited = |time: Expr| match &straggler {
        Some(factor) => time * factor.clone(),
        None => time,
    };
    let compute = ctx.bind(waited(
        layers.clone() * (forward.clone() + backward.clone())
            + ctx.is_first() * embedding_time(ctx)
            + ctx.is_last() * head_time(ctx),
    ));

    let ep_one_way = ep_layer_one_way(ctx);
    let cp_forward = ctx.bind(cp_layer_forward(ctx));
    let cp_fwd_exposed = ctx.bind(Expr::max([
        cp_forward.clone() - layer.attention_core_fwd.clone(),
        k(0.0),
    ]));
    let cp_bwd_exposed = Expr::max([
        k(2.0) * cp_forward - layer.attention_core_bwd.clone(),
        k(0.0),
    ]);

    // Layers not recomputed in full re-run the modules the recompute names.
    let modules_forward = ctx.selective.clone() * layer.attention_core_fwd.clone()
        + ctx.recompute_norms.clone() * layer.norms_fwd.clone()
        + ctx.recompute_moe_act.clone() * layer.moe_act_fwd.clone();
    let recompute = ctx.bind(waited(
        full.clone() * forward.clone() + partial * modules_forward,
    ));
    let passes = k(2.0) * layers.clone() + full.clone();
    let tp = tp_layer_passes(ctx, layers.clone() + full.clone(), layers.clone());
    // Overlapped tp collectives are split and pipelined with the GEMMs around them: what
    // exceeds those GEMMs, the reduce-scatters' last chunk and the SMs they take stay exposed.
    let tp = if ctx.overlap.tp_comm {
        let gemms = (layers.clone() + full.clone())
            * (layer.attention_gemm_fwd.clone() + layer.mlp_gemm_fwd.clone())
            + layers.clone() * (layer.attention_gemm_bwd.clone() + layer.mlp_gemm_bwd.clone());
        let row_parallel = (layers.clone() + full.clone()) * layer.row_parallel_fwd.clone();
        tp_overlapped(ctx, tp, gemms, row_parallel)
    } else {
        tp
    };
    let ep = passes * ep_one_way;
    let cp =
        layers.clone() * (cp_fwd_exposed.clone() + cp_bwd_exposed) + full.clone() * cp_fwd_exposed;
    let pp = pp_microbatch(ctx);

    let busy = ctx.bind(compute.clone() + recompute.clone());
    let layer_backward =
        backward.clone() + full.clone() / Expr::max([layers.clone(), k(1.0)]) * forward.clone();
    let zero3 = zero3_microbatch(ctx, forward.clone(), layer_backward);

    let memory = stage_memory(ctx);
    let host = ctx.host_link;
    // Offloaded weights stream in for forward and again for backward, offloaded activations
    // go out in forward and come back in backward, both behind the micro-batch's compute.
    let streamed = k(2.0) * ctx.off_w.clone() * stage_params(ctx) * ctx.bytes.weight
        + k(2.0) * ctx.off_act.clone() * memory_activations_before_offload(ctx);
    let offload_microbatch = Expr::max([streamed / host - busy, k(0.0)]);

    let (z1, z2, z3) = ctx.zero_flags();
    let local_optimizer_params = trainable_sharded_params(ctx, z1);
    // The gradient reduction runs bucket by bucket behind the last micro-batch's backward,
    // all but the last bucket; the updated weights' all-gather behind the next step's first
    // forward. Without overlap each runs after (or before) the compute it could hide behind.
    // Hidden, a transfer still slows the backward it runs beside by the SMs NCCL holds.
    let dp = dp_step(ctx);
    let exposed = |traffic: Expr, calls: Expr, window: Expr, overlapped: bool, ring: &Ring| {
        if overlapped {
            let traffic = ctx.bind(traffic);
            let left = ctx.bind(Expr::max([
                traffic.clone() - window,
                traffic.clone() / calls,
            ]));
            left.clone() + (traffic - left) * ctx.nccl_compute_share(ring)
        } else {
            traffic
        }
    };
    // Hybrid sharding's all-reduce across replicas follows each bucket's (or unit's)
    // reduce-scatter, behind the backward as that is.
    let replica_tail = exposed(
        dp.replica_reduce,
        dp.reduce_calls.clone(),
        ctx.layers.clone() * backward.clone(),
        ctx.overlap.grad_reduce,
        &ctx.replica_ring(),
    );
    let reduce_window = ctx.layers.clone() * backward.clone();
    let reduce_calls = dp.reduce_calls.clone();
    let exposed_reduce = |reduce: Expr| {
        exposed(
            reduce,
            reduce_calls.clone(),
            reduce_window.clone(),
            ctx.overlap.grad_reduce,
            &ctx.dp_ring(),
        )
    };
    let (reduce_tail, compression) = match &dp.compression {
        None => (exposed_reduce(dp.reduce.clone()), None),
        Some(classes) => {
            let (tail, cost) = choose_compression(classes, &exposed_reduce);
            (tail, Some(cost))
        }
    };
    // A framework that reduces ZeRO-2's gradients every micro-batch has none left to reduce
    // at the step's end.
    let reduced_at_the_end = if ctx.framework.zero_through_flat_buffers() {
        k(1.0) - z2
    } else {
        k(1.0) - z3.clone()
    };
    let dp_tail = reduced_at_the_end * reduce_tail
        + (k(1.0) - z3)
            * exposed(
                dp.gather,
                dp.gather_calls,
                ctx.layers.clone() * forward,
                ctx.overlap.param_gather,
                &ctx.shard_ring(),
            )
        + replica_tail;
    let optimizer_tail = (k(1.0) - ctx.off_opt.clone())
        * ctx.memory_bound(local_optimizer_params.clone() * ctx.bytes.optimizer_step);
    // Offloaded optimizer states: gradients go down (fp32) and updated weights come back up,
    // and the host updates them, its rate shared by the node's GPUs and scaled from Adam's by
    // the bytes per parameter the optimizer moves; gradient offload moves the fp32 gradients
    // once per step.
    let host_step = ctx.off_opt.clone() * local_optimizer_params.clone() * ctx.gpus_per_node
        / HOST_ADAM_PARAMS_PER_S
        * (ctx.bytes.optimizer_step / ctx.cal.adam_bytes_per_param);
    let offload_tail = (ctx.off_opt.clone() * local_optimizer_params * (4.0 + ctx.bytes.weight)
        + ctx.off_g.clone() * trainable_stage_params(ctx) * ctx.bytes.gradient)
        / host
        + host_step;

    let mut outputs = vec![k(0.0); Output::ALL.len()];
    let mut set = |output: Output, expr: Expr| outputs[output.index()] = expr;
    set(Output::Compute, compute);
    set(Output::Recompute, recompute);
    set(Output::TpComm, tp);
    set(Output::CpComm, cp);
    set(Output::EpComm, ep);
    set(Output::PpComm, pp);
    set(Output::DpCommPerMicrobatch, zero3 + zero2_microbatch(ctx));
    set(Output::OffloadPerMicrobatch, offload_microbatch);
    set(Output::DpCommTail, dp_tail);
    set(Output::OptimizerTail, optimizer_tail);
    set(Output::OffloadTail, offload_tail);
    set(Output::Weights, memory.weights);
    match compression {
        None => set(Output::Gradients, memory.gradients),
        Some(c) => {
            let state = (k(1.0) - ctx.off_g.clone()) * c.state_bytes;
            set(Output::Gradients, memory.gradients + state);
            set(Output::CompressedLayerBuckets, c.layers);
            set(Output::CompressedEdgeBuckets, c.edges);
        }
    }
    set(Output::OptimizerStates, memory.optimizer);
    set(Output::Activations, memory.activations);
    set(Output::Buffers, memory.buffers);
    outputs
}

/// Activation bytes of one micro-batch on the device (what activation offload moves).
fn memory_activations_before_offload(ctx: &Ctx) -> Expr {
    ctx.layers.clone() * super::memory::layer_activations(ctx).kept(ctx)
}
