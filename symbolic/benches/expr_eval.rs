//! Throughput of compiled cost expressions: `cargo bench -p tessel-symbolic --bench expr_eval`.
//!
//! Builds a step-time and memory model of the shape the cost model produces (a 70B-class dense
//! transformer with MoE and offload terms, twelve strategy symbols, about twenty outputs mixing
//! sums, products, quotients, max/min and ceil), compiles it, and evaluates it over a rotating
//! set of candidate strategies for a fixed wall-clock budget. Prints one JSON object: the
//! model's size, compile time, and evaluations per second of the compiled program one candidate
//! at a time, in batches, and, for comparison, of walking the trees.
//!
//! Before timing, it checks the compiled outputs of every candidate against tree evaluation
//! (relative 1e-12) and exits non-zero on a mismatch. Run by `cargo test --all-targets` (without
//! the `--bench` flag `cargo bench` passes) it keeps only that check and a brief timing.

use std::hint::black_box;
use std::time::{Duration, Instant};

use tessel_symbolic::{BatchScratch, Expr, Program, Symbol};

/// Strategy symbols, in input-slot order.
const SLOTS: [&str; 12] = [
    "b", "t", "p", "d", "c", "e", "m", "v", "r", "o_opt", "o_act", "z",
];

fn s(name: &str) -> Expr {
    Expr::symbol(name)
}

fn k(value: f64) -> Expr {
    Expr::constant(value)
}

/// Ring all-reduce volume factor 2(n-1)/n.
fn all_reduce_factor(n: Expr) -> Expr {
    k(2.0) * (n.clone() - 1u64) / n
}

/// A step-time and memory model over the strategy symbols. Model and cluster numbers are
/// folded in as constants, as the cost model does (Llama-3-70B-like shapes on H100s).
fn cost_model() -> Vec<Expr> {
    let (hidden, seq, layers, vocab, ffn, heads, kv_dim) =
        (8192.0, 8192.0, 80.0, 128_256.0, 28_672.0, 64.0, 1024.0);
    let params = 70.6e9;
    let (peak, hbm, nvlink, ib, pcie, gpu_mem) = (989e12, 3.35e12, 450e9, 50e9, 55e9, 80e9);
    let (experts, top_k) = (8.0, 2.0);

    let (b, t, p, d, c, e, m, v, r) = (
        s("b"),
        s("t"),
        s("p"),
        s("d"),
        s("c"),
        s("e"),
        s("m"),
        s("v"),
        s("r"),
    );
    let (o_opt, o_act, z) = (s("o_opt"), s("o_act"), s("z"));

    let tokens = b.clone() * seq / c.clone();
    let layers_per_stage = (k(layers) / p.clone()).ceil();
    // Matmul efficiency falls as tensor parallelism makes the shapes skinny.
    let efficiency = Expr::min([
        k(0.82),
        k(0.45) + k(0.4) * Expr::min([k(1.0), k(hidden) / (t.clone() * 2048u64)]),
    ]);
    let attn_flops = tokens.clone() * (k(4.0 * hidden * hidden) + k(4.0 * hidden * kv_dim))
        / t.clone()
        + tokens.clone() * seq * hidden * 2u64 / (t.clone() * c.clone());
    let moe_share = Expr::max([k(1.0), k(experts * top_k) / (e.clone() * experts)]);
    let mlp_flops = tokens.clone() * (6.0 * hidden * ffn) * moe_share / t.clone();
    let fwd = (attn_flops.clone() + mlp_flops.clone()) / (efficiency.clone() * peak);
    let bwd = fwd.clone() * 2u64;
    let recompute = r.clone() / layers_per_stage.clone() * fwd.clone();
    let act_bytes = tokens.clone() * hidden * 2u64;
    let tp_comm = all_reduce_factor(t.clone()) * act_bytes.clone() * 4u64 / nvlink
        + (t.clone() - 1u64) * 8e-6;
    let cp_comm = Expr::max([
        k(0.0),
        (c.clone() - 1u64) * tokens.clone() * kv_dim * 4u64 / ib - attn_flops / (peak * 0.6),
    ]);
    let ep_comm = (e.clone() - 1u64) / e.clone() * act_bytes.clone() * top_k * 4u64 / ib;
    let layer_time =
        fwd.clone() + bwd.clone() + tp_comm.clone() + cp_comm.clone() + ep_comm.clone();
    let stage_time = layers_per_stage.clone() * layer_time.clone() + recompute.clone();
    let p2p = act_bytes.clone() / ib * (k(1.0) + (v.clone() - 1u64) / v.clone());
    let bubble = (p.clone() - 1u64) / v.clone() * (stage_time.clone() + p2p.clone());
    let shard = k(params) / (t.clone() * p.clone());
    let dp_time = all_reduce_factor(d.clone()) * shard.clone() * 2u64 / ib;
    let exposed_dp = Expr::max([
        k(0.0),
        dp_time.clone() - bwd.clone() * layers_per_stage.clone() * m.clone() * 0.8,
    ]);
    let zero_factor = k(1.0) - z.clone() + z.clone() / d.clone();
    let optimizer_time = shard.clone() * 16u64 * zero_factor.clone() / hbm
        + o_opt.clone() * shard.clone() * 12u64 * zero_factor.clone() / pcie;
    let step = m.clone() * (stage_time.clone() + p2p.clone())
        + bubble.clone()
        + exposed_dp.clone()
        + optimizer_time.clone();

    let weights = shard.clone() * 2u64;
    let grads = shard.clone() * 2u64 * zero_factor.clone();
    let optimizer = shard.clone() * 12u64 * zero_factor.clone() * (k(1.0) - o_opt.clone());
    let in_flight = Expr::min([p.clone(), m.clone()]) * (k(1.0) + (p.clone() - 1u64) / (p * v));
    // Korthikanti et al.: s·b·h·(34 + 5·a·s/h) bytes per layer, sharded by t.
    let per_layer_act =
        tokens.clone() * hidden * (k(34.0) + k(5.0 * heads) * seq / (k(hidden) * c.clone()))
            / t.clone();
    let activations = ((layers_per_stage.clone() - r.clone()) * per_layer_act.clone()
        + r.clone() * tokens.clone() * hidden * 2u64)
        * in_flight.clone()
        * (k(1.0) - o_act.clone());
    let logits = tokens.clone() * vocab * 4u64 / t.clone();
    let buffers = Expr::max([act_bytes.clone() * 2u64, shard.clone() * 0.05]) + 2.5e9;
    let memory = weights.clone()
        + grads.clone()
        + optimizer.clone()
        + activations.clone()
        + logits.clone()
        + buffers.clone();
    let tokens_per_second = b * m * d.clone() * seq / step.clone();
    let mfu = tokens_per_second.clone() * (6.0 * params) / (t * s("p") * d * c * peak);

    vec![
        layers_per_stage,
        efficiency,
        fwd,
        bwd,
        recompute,
        tp_comm,
        cp_comm,
        ep_comm,
        layer_time,
        stage_time,
        p2p,
        bubble,
        exposed_dp,
        optimizer_time,
        step,
        weights,
        grads,
        optimizer,
        activations,
        logits,
        buffers,
        memory.clone(),
        k(gpu_mem) - memory,
        tokens_per_second,
        mfu,
    ]
}

fn count_nodes(e: &Expr) -> usize {
    1 + match e {
        Expr::Const(_) | Expr::Sym(_) => 0,
        Expr::Sum(items) | Expr::Product(items) | Expr::Max(items) | Expr::Min(items) => {
            items.iter().map(count_nodes).sum()
        }
        Expr::Div(a, b) => count_nodes(a) + count_nodes(b),
        Expr::Ceil(a) => count_nodes(a),
    }
}

/// Candidate strategies to rotate through, in slot order.
fn candidates() -> Vec<[f64; 12]> {
    let mut out = Vec::new();
    for &t in &[1.0, 2.0, 4.0, 8.0] {
        for &p in &[1.0, 2.0, 4.0, 8.0] {
            for &m in &[4.0, 16.0] {
                for &r in &[0.0, 2.0] {
                    out.push([1.0, t, p, 8.0, 1.0, 1.0, m, 2.0, r, 0.25, 0.0, 1.0]);
                }
            }
        }
    }
    out
}

/// CPU time this thread has run, from `/proc/thread-self/stat` (user + system time in
/// USER_HZ ticks, which Linux fixes at 100 per second). The machine may be shared, so rates
/// per CPU second say more about the code than rates per wall-clock second. `None` off Linux.
fn thread_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// Evaluations per wall-clock second and per CPU second.
struct Rate {
    evaluations: u64,
    per_second: f64,
    per_cpu_second: Option<f64>,
}

/// Calls `batch` (which evaluates `per_call` candidates) until `budget` has passed.
fn measure(budget: Duration, per_call: u64, mut batch: impl FnMut()) -> Rate {
    let cpu_start = thread_cpu_seconds();
    let start = Instant::now();
    let mut evaluations = 0u64;
    while start.elapsed() < budget {
        batch();
        evaluations += per_call;
    }
    let wall = start.elapsed().as_secs_f64();
    let per_cpu_second = match (cpu_start, thread_cpu_seconds()) {
        (Some(a), Some(b)) if b > a => Some(evaluations as f64 / (b - a)),
        _ => None,
    };
    Rate {
        evaluations,
        per_second: evaluations as f64 / wall,
        per_cpu_second,
    }
}

/// Compares the compiled program with tree evaluation on every candidate.
fn check_against_tree(
    program: &Program,
    outputs: &[Expr],
    candidates: &[[f64; 12]],
) -> Result<(), String> {
    let mut values = vec![0.0; program.num_outputs()];
    for candidate in candidates {
        program.eval(candidate, &mut values);
        let env = |sym: &Symbol| {
            let i = SLOTS.iter().position(|n| *n == sym.name()).unwrap_or(0);
            candidate[i]
        };
        for (i, (e, &compiled)) in outputs.iter().zip(&values).enumerate() {
            let tree = e.eval(&env);
            if (tree - compiled).abs() > 1e-12 * tree.abs().max(compiled.abs()) {
                return Err(format!(
                    "output {i} at {candidate:?}: tree {tree}, compiled {compiled}"
                ));
            }
        }
    }
    Ok(())
}

fn json_number(value: Option<f64>) -> String {
    value.map_or("null".to_string(), |v| format!("{v:.0}"))
}

fn main() {
    let outputs = cost_model();
    let slots: Vec<Symbol> = SLOTS.iter().map(|n| Symbol::new(n)).collect();
    let tree_nodes: usize = outputs.iter().map(count_nodes).sum();
    let simplified_nodes: usize = outputs.iter().map(|e| count_nodes(&e.simplify())).sum();

    let compile_start = Instant::now();
    let program = match Program::compile(&outputs, &slots) {
        Ok(program) => program,
        Err(e) => {
            eprintln!("expr_eval: {e}");
            std::process::exit(1);
        }
    };
    let compile_ms = compile_start.elapsed().as_secs_f64() * 1e3;

    let candidates = candidates();
    if let Err(message) = check_against_tree(&program, &outputs, &candidates) {
        eprintln!("expr_eval: {message}");
        std::process::exit(1);
    }
    let benchmarking = std::env::args().any(|arg| arg == "--bench");
    let budget = Duration::from_millis(if benchmarking { 1500 } else { 30 });
    let per_call = candidates.len() as u64;

    let mut scratch = Vec::new();
    let mut values = vec![0.0; program.num_outputs()];
    let single = measure(budget, per_call, || {
        for candidate in &candidates {
            program.eval_into(black_box(candidate), &mut scratch, &mut values);
            black_box(&values);
        }
    });

    let flat_inputs: Vec<f64> = candidates.iter().flatten().copied().collect();
    let mut batch_scratch = BatchScratch::new();
    let mut batch_values = vec![0.0; candidates.len() * program.num_outputs()];
    let batch = measure(budget, per_call, || {
        program.eval_batch(
            black_box(&flat_inputs),
            &mut batch_scratch,
            &mut batch_values,
        );
        black_box(&batch_values);
    });

    let tree = measure(budget / 3, per_call, || {
        for candidate in &candidates {
            let env = |sym: &Symbol| {
                let i = SLOTS.iter().position(|n| *n == sym.name()).unwrap_or(0);
                candidate[i]
            };
            for e in &outputs {
                black_box(e.eval(&env));
            }
        }
    });

    println!(
        "{{\"bench\":\"expr_eval\",\"outputs\":{},\"symbols\":{},\"tree_nodes\":{},\
         \"simplified_nodes\":{},\"instructions\":{},\"registers\":{},\"compile_ms\":{:.3},\
         \"evaluations\":{},\"evaluations_per_second\":{:.0},\"ns_per_evaluation\":{:.1},\
         \"evaluations_per_cpu_second\":{},\"batch_evaluations_per_second\":{:.0},\
         \"batch_evaluations_per_cpu_second\":{},\"tree_walk_evaluations_per_second\":{:.0},\
         \"tree_walk_evaluations_per_cpu_second\":{}}}",
        program.num_outputs(),
        program.num_inputs(),
        tree_nodes,
        simplified_nodes,
        program.num_instructions(),
        program.num_registers(),
        compile_ms,
        single.evaluations,
        single.per_second,
        1e9 / single.per_second,
        json_number(single.per_cpu_second),
        batch.per_second,
        json_number(batch.per_cpu_second),
        tree.per_second,
        json_number(tree.per_cpu_second),
    );
}
