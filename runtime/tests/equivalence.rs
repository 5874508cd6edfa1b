//! Every parallel configuration must train the same global model as one rank: five steps of
//! a tiny model give the same losses and final parameters (relative error ≤ 1e-4).

mod common;

use common::{assert_same_run, comparison_options, gelu_layernorm, swiglu_rmsnorm};
use std::collections::BTreeMap;
use std::sync::OnceLock;
use tessel_grammar::{ModelSpec, MoeSpec, Offload, Recompute, Strategy};
use tessel_runtime::{launch_cpu, ExecutionPlan, LaunchOptions, LaunchReport};

const GLOBAL_BATCH: u64 = 8;
const SEQ: u64 = 8;
const STEPS: u64 = 5;
const TOL: f64 = 1e-4;

fn moe_swiglu() -> ModelSpec {
    ModelSpec {
        name: "tiny-moe".into(),
        moe: Some(MoeSpec {
            experts: 4,
            top_k: 2,
            every: 1,
            expert_ffn_hidden: 16,
            shared_experts: 1,
            capacity_factor: 1.0,
            first_dense: 1,
        }),
        ..swiglu_rmsnorm()
    }
}

fn moe_gelu() -> ModelSpec {
    ModelSpec {
        name: "tiny-moe-gelu".into(),
        moe: Some(MoeSpec {
            experts: 4,
            top_k: 1,
            every: 2,
            expert_ffn_hidden: 16,
            shared_experts: 0,
            capacity_factor: 1.0,
            first_dense: 0,
        }),
        ..gelu_layernorm()
    }
}

#[derive(Clone)]
struct S(Strategy);

fn base() -> S {
    S(Strategy {
        name: "test".into(),
        ..Strategy::default()
    })
}

impl S {
    fn dp(mut self, v: u64) -> Self {
        self.0.dp = v;
        self
    }
    fn tp(mut self, v: u64) -> Self {
        self.0.tp = v;
        self
    }
    fn pp(mut self, v: u64) -> Self {
        self.0.pp = v;
        self
    }
    fn cp(mut self, v: u64) -> Self {
        self.0.cp = v;
        self
    }
    fn ep(mut self, v: u64) -> Self {
        self.0.ep = v;
        self
    }
    fn mb(mut self, v: u64) -> Self {
        self.0.microbatch = v;
        self
    }
    fn vpp(mut self, v: u64) -> Self {
        self.0.interleave = v;
        self
    }
    fn sp(mut self) -> Self {
        self.0.sequence_parallel = true;
        self
    }
    fn zero(mut self, v: u8) -> Self {
        self.0.zero = v;
        self
    }
    fn recompute(mut self, r: Recompute) -> Self {
        self.0.recompute = r;
        self
    }
    fn offload(mut self, o: Offload) -> Self {
        self.0.offload = o;
        self
    }
}

fn options() -> LaunchOptions {
    comparison_options(STEPS)
}

fn run(model: &ModelSpec, s: &S) -> LaunchReport {
    let mut plan = ExecutionPlan::from_strategy(model, &s.0, GLOBAL_BATCH, SEQ).unwrap();
    plan.seed = 5;
    launch_cpu(model, &plan, &options()).unwrap()
}

fn reference(model: &ModelSpec) -> &'static LaunchReport {
    static CACHE: OnceLock<std::sync::Mutex<BTreeMap<String, &'static LaunchReport>>> =
        OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(r) = cache.lock().unwrap().get(&model.name) {
        return r;
    }
    let mut plan = ExecutionPlan::single_rank(model, GLOBAL_BATCH, SEQ).unwrap();
    plan.seed = 5;
    let report: &'static LaunchReport =
        Box::leak(Box::new(launch_cpu(model, &plan, &options()).unwrap()));
    cache.lock().unwrap().insert(model.name.clone(), report);
    report
}

fn assert_same_training(model: &ModelSpec, s: S) {
    let expect = reference(model);
    let got = run(model, &s);
    assert_eq!(got.losses.len(), STEPS as usize);
    assert!(
        expect.losses[STEPS as usize - 1] < expect.losses[0],
        "the reference must learn: {:?}",
        expect.losses
    );
    assert_same_run(&got, expect, TOL);
}

// Each dimension alone.

#[test]
fn tp2_dense_gelu() {
    assert_same_training(&gelu_layernorm(), base().tp(2));
}

#[test]
fn tp2_dense_swiglu() {
    assert_same_training(&swiglu_rmsnorm(), base().tp(2));
}

#[test]
fn pp2_one_f_one_b() {
    assert_same_training(&gelu_layernorm(), base().pp(2).mb(2));
}

#[test]
fn pp2_interleaved() {
    assert_same_training(&swiglu_rmsnorm(), base().pp(2).vpp(2).mb(2));
}

#[test]
fn dp2_zero0() {
    assert_same_training(&gelu_layernorm(), base().dp(2).mb(2));
}

#[test]
fn dp2_zero2() {
    assert_same_training(&swiglu_rmsnorm(), base().dp(2).zero(2).mb(4));
}

#[test]
fn tp2_sequence_parallel() {
    assert_same_training(&gelu_layernorm(), base().tp(2).sp().mb(2));
}

#[test]
fn cp2() {
    assert_same_training(&swiglu_rmsnorm(), base().cp(2).mb(2));
}

#[test]
fn cp2_learned_positions() {
    assert_same_training(&gelu_layernorm(), base().cp(2).mb(4));
}

/// Ring attention over four context ranks: blocks pass three times, and each rank's queries
/// see a different number of earlier blocks.
#[test]
fn cp4_ring() {
    assert_same_training(&swiglu_rmsnorm(), base().cp(4).mb(2));
}

/// Selective recompute under ring attention rebuilds each block's probabilities from the
/// merged log-sum-exp.
#[test]
fn cp4_ring_selective_recompute_tp2() {
    assert_same_training(
        &gelu_layernorm(),
        base().cp(4).tp(2).mb(2).recompute(Recompute::Selective),
    );
}

#[test]
fn ep2_with_dp2() {
    assert_same_training(&moe_swiglu(), base().dp(2).ep(2).mb(2));
}

#[test]
fn moe_gelu_tp2() {
    assert_same_training(&moe_gelu(), base().tp(2).mb(4));
}

// Combinations.

#[test]
fn tp2_pp2_dp2() {
    assert_same_training(&gelu_layernorm(), base().tp(2).pp(2).dp(2).mb(2));
}

#[test]
fn tp2_sp_pp2_interleaved() {
    assert_same_training(&swiglu_rmsnorm(), base().tp(2).sp().pp(2).vpp(2).mb(2));
}

#[test]
fn cp2_tp2() {
    assert_same_training(&swiglu_rmsnorm(), base().cp(2).tp(2).mb(2));
}

#[test]
fn zero3_pp2() {
    assert_same_training(&gelu_layernorm(), base().zero(3).pp(2).dp(2).mb(1));
}

#[test]
fn zero1_dp4() {
    assert_same_training(&swiglu_rmsnorm(), base().zero(1).dp(4).mb(1));
}

#[test]
fn moe_swiglu_tp2_whole_batch() {
    assert_same_training(&moe_swiglu(), base().tp(2).mb(8));
}

#[test]
fn tp4() {
    let mha = ModelSpec {
        kv_heads: 4,
        name: "tiny-gelu-mha".into(),
        ..gelu_layernorm()
    };
    assert_same_training(&mha, base().tp(4).mb(2));
}

#[test]
fn pp4_interleaved_v2() {
    let m = ModelSpec {
        layers: 8,
        name: "tiny-gelu-8".into(),
        ..gelu_layernorm()
    };
    assert_same_training(
        &m,
        base().pp(4).vpp(2).mb(2).recompute(Recompute::Selective),
    );
}

#[test]
fn pp4_interleaved_v2_swiglu() {
    let m = ModelSpec {
        layers: 8,
        name: "tiny-swiglu-8".into(),
        ..swiglu_rmsnorm()
    };
    assert_same_training(&m, base().pp(4).vpp(2).mb(1));
}

#[test]
fn ep4_tp2_sp_zero2() {
    assert_same_training(&moe_swiglu(), base().dp(4).ep(4).tp(2).sp().zero(2).mb(2));
}

#[test]
fn ep2_cp2_pp2() {
    assert_same_training(&moe_swiglu(), base().cp(2).ep(2).pp(2).mb(2));
}

#[test]
fn moe_zero3_dp2_ep2_recompute_full() {
    assert_same_training(
        &moe_gelu(),
        base().dp(2).ep(2).zero(3).mb(2).recompute(Recompute::Full),
    );
}

#[test]
fn dp2_tp2_cp2_zero1_partial_recompute() {
    assert_same_training(
        &gelu_layernorm(),
        base()
            .dp(2)
            .tp(2)
            .cp(2)
            .zero(1)
            .mb(2)
            .recompute(Recompute::Partial { full_layers: 1 }),
    );
}

#[test]
fn offload_trains_the_same_and_moves_state_to_host() {
    let model = gelu_layernorm();
    let o = Offload {
        optimizer: 1.0,
        weights: 0.0,
        gradients: 0.0,
        activations: 0.5,
    };
    assert_same_training(&model, base().dp(2).zero(1).mb(2).offload(o));
    let plain = run(&model, &base().dp(2).zero(1).mb(2));
    let off = run(&model, &base().dp(2).zero(1).mb(2).offload(o));
    assert!(plain.peak_memory[0].device.optimizer > 0);
    assert_eq!(off.peak_memory[0].device.optimizer, 0);
    assert_eq!(
        off.peak_memory[0].host.optimizer,
        plain.peak_memory[0].device.optimizer
    );
}

// Recompute: identical numbers, not just close.

fn assert_bit_identical(model: &ModelSpec, a: S, b: S) {
    let x = run(model, &a);
    let y = run(model, &b);
    assert_eq!(x.losses, y.losses);
    assert_eq!(x.parameters, y.parameters);
}

#[test]
fn recompute_is_bit_identical() {
    let m = moe_swiglu();
    let plain = base().tp(2).pp(2).mb(2);
    for r in [
        Recompute::Selective,
        Recompute::Full,
        Recompute::Partial { full_layers: 1 },
    ] {
        assert_bit_identical(&m, plain.clone(), plain.clone().recompute(r));
    }
    // Each pipeline stage its own recompute, as the planner chooses them.
    let mut per_stage = plain.clone();
    per_stage.0.set_stage_options(
        vec![Recompute::Full, Recompute::Selective],
        vec![Offload::default(); 2],
    );
    assert_bit_identical(&m, plain.clone(), per_stage);
    let g = gelu_layernorm();
    assert_bit_identical(
        &g,
        base().dp(2).mb(2),
        base().dp(2).mb(2).recompute(Recompute::Full),
    );
}

#[test]
fn recompute_lowers_activation_memory() {
    let m = gelu_layernorm();
    let act = |r| {
        run(&m, &base().mb(8).recompute(r)).peak_memory[0]
            .device
            .activations
    };
    let (none, sel, full) = (
        act(Recompute::None),
        act(Recompute::Selective),
        act(Recompute::Full),
    );
    assert!(sel < none && full < sel, "{none} {sel} {full}");
}

#[test]
fn zero_stages_shrink_per_rank_state() {
    let m = swiglu_rmsnorm();
    let mem = |z| run(&m, &base().dp(4).zero(z).mb(2)).peak_memory[0];
    let (z0, z1, z3) = (mem(0), mem(1), mem(3));
    assert!(z1.device.optimizer * 3 < z0.device.optimizer);
    assert_eq!(z1.device.weights, z0.device.weights);
    assert!(z3.device.weights < z0.device.weights);
}

#[test]
fn results_do_not_depend_on_thread_timing() {
    let m = moe_swiglu();
    let s = base().dp(2).ep(2).tp(2).sp().zero(2).mb(2);
    assert_bit_identical(&m, s.clone(), s);
}

#[test]
fn fewer_microbatches_than_stages() {
    assert_same_training(&gelu_layernorm(), base().pp(4).mb(4));
}

#[test]
fn tied_tp2_sp_pp2_cp2_zero3() {
    assert_same_training(
        &gelu_layernorm(),
        base().tp(2).sp().pp(2).cp(2).zero(3).mb(2),
    );
}

#[test]
fn moe_gelu_tp2_sp_pp2_interleaved_ep2_dp2_selective() {
    assert_same_training(
        &moe_gelu(),
        base()
            .tp(2)
            .sp()
            .pp(2)
            .vpp(2)
            .ep(2)
            .dp(2)
            .mb(1)
            .recompute(Recompute::Selective),
    );
}

#[test]
fn tp4_wider_than_the_key_value_heads() {
    // Two key/value heads over four tensor ranks: each head is held by two ranks.
    assert_same_training(&swiglu_rmsnorm(), base().tp(4).sp().mb(2));
    assert_same_training(&gelu_layernorm(), base().tp(4).pp(2).mb(2));
}
