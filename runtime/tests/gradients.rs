//! The CPU backend's backward passes against central finite differences: each op alone, and
//! whole decoder blocks (dense gelu/layernorm, swiglu/rmsnorm with rotary positions, MoE, and
//! with LoRA and LoRA-FA adapters beside frozen weights).

use std::collections::BTreeSet;
use tessel_grammar::{LoraTargets, MlpKind, ModelSpec, MoeSpec, NormKind, PositionKind};
use tessel_runtime::backend::cpu::{CpuBackend, CpuTensor};
use tessel_runtime::backend::shared_memory::World;
use tessel_runtime::backend::{AttentionShape, Backend};
use tessel_runtime::init::{init_block, Init};
use tessel_runtime::mesh::Mesh;
use tessel_runtime::model::block::{self, Keep};
use tessel_runtime::model::layout::{layer_groups, with_adapters, ShardCoords};
use tessel_runtime::model::lora::Adapters;
use tessel_runtime::model::{Env, Grads, Values};

fn backend() -> CpuBackend {
    let mesh = Mesh {
        dp: 1,
        tp: 1,
        pp: 1,
        cp: 1,
        ep: 1,
    };
    CpuBackend::new(World::new(mesh), 0)
}

fn random(name: &str, rows: usize, cols: usize, std: f32) -> CpuTensor {
    let data = init_block(
        9,
        name,
        cols as u64,
        (0, rows as u64),
        (0, cols as u64),
        Init::Normal(std),
    );
    CpuTensor { rows, cols, data }
}

fn dot(a: &CpuTensor, b: &CpuTensor) -> f64 {
    a.data
        .iter()
        .zip(&b.data)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum()
}

/// Central differences of `f` at `x` for the listed entries.
fn numeric(f: &dyn Fn(&CpuTensor) -> f64, x: &CpuTensor, entries: &[usize]) -> Vec<f64> {
    let h = 1e-2f32;
    entries
        .iter()
        .map(|&i| {
            let mut p = x.clone();
            p.data[i] += h;
            let mut m = x.clone();
            m.data[i] -= h;
            (f(&p) - f(&m)) / (2.0 * f64::from(h))
        })
        .collect()
}

fn assert_close(analytic: &[f64], numeric: &[f64], what: &str) {
    // f32 central differences carry ~1e-4 of rounding noise; gradients below that are zero.
    let scale = numeric.iter().fold(1e-2f64, |m, x| m.max(x.abs()));
    for (i, (a, n)) in analytic.iter().zip(numeric).enumerate() {
        assert!(
            (a - n).abs() <= 2e-2 * scale,
            "{what}[{i}]: analytic {a} vs numeric {n}"
        );
    }
}

fn check(what: &str, f: &dyn Fn(&CpuTensor) -> f64, x: &CpuTensor, grad: &CpuTensor) {
    let entries: Vec<usize> = (0..x.data.len()).step_by(1 + x.data.len() / 40).collect();
    let analytic: Vec<f64> = entries.iter().map(|&i| f64::from(grad.data[i])).collect();
    assert_close(&analytic, &numeric(f, x, &entries), what);
}

#[test]
fn matmul_transposes_match_the_naive_product() {
    let b = backend();
    let a = random("a", 3, 5, 1.0);
    let c = random("c", 5, 4, 1.0);
    let naive = |i: usize, j: usize| {
        (0..5)
            .map(|k| a.data[i * 5 + k] * c.data[k * 4 + j])
            .sum::<f32>()
    };
    let plain = b.matmul(&a, &c, false, false);
    let at = b.tensor((0..15).map(|i| a.data[(i % 3) * 5 + i / 3]).collect(), 5, 3);
    let ct = b.tensor((0..20).map(|i| c.data[(i % 5) * 4 + i / 5]).collect(), 4, 5);
    let both = b.matmul(&at, &ct, true, true);
    for i in 0..3 {
        for j in 0..4 {
            assert!((plain.data[i * 4 + j] - naive(i, j)).abs() < 1e-5);
            assert!((both.data[i * 4 + j] - naive(i, j)).abs() < 1e-5);
        }
    }
}

#[test]
fn activations_and_norms() {
    let b = backend();
    let x = random("x", 4, 6, 1.0);
    let r = random("r", 4, 6, 1.0);
    let f = |y: &CpuTensor| dot(y, &r);
    check("gelu", &|x| f(&b.gelu(x)), &x, &b.gelu_backward(&x, &r));
    check("silu", &|x| f(&b.silu(x)), &x, &b.silu_backward(&x, &r));
    let w = random("w", 1, 6, 1.0);
    let bias = random("bias", 1, 6, 1.0);
    for kind in [NormKind::Layernorm, NormKind::Rmsnorm] {
        let (_, stats) = b.norm(kind, &x, &w, Some(&bias));
        let (dx, dw, db) = b.norm_backward(kind, &x, &w, &stats, &r, true);
        check(
            "norm dx",
            &|x| f(&b.norm(kind, x, &w, Some(&bias)).0),
            &x,
            &dx,
        );
        check(
            "norm dw",
            &|w| f(&b.norm(kind, &x, w, Some(&bias)).0),
            &w,
            &dw,
        );
        check(
            "norm db",
            &|bb| f(&b.norm(kind, &x, &w, Some(bb)).0),
            &bias,
            &db.unwrap(),
        );
    }
}

/// Two key/value blocks merged with the online softmax give the one-call causal attention,
/// and the blocks' backward against the merged output gives its gradients.
#[test]
fn blockwise_attention_equals_one_call() {
    let b = backend();
    let full = AttentionShape {
        batch: 2,
        q_len: 3,
        kv_len: 6,
        q_offset: 3,
        heads: 4,
        kv_heads: 2,
        head_dim: 3,
    };
    let block = AttentionShape { kv_len: 3, ..full };
    let q = random("q", 6, 12, 1.0);
    let k = random("k", 12, 6, 1.0);
    let v = random("v", 12, 6, 1.0);
    let r = random("r", 6, 12, 1.0);
    // Keys of each sequence in two blocks of three: positions 0..3 (seen whole by queries at
    // 3..6) and 3..6 (seen causally).
    let half = |t: &CpuTensor, which: usize| {
        let parts: Vec<CpuTensor> = (0..2)
            .map(|seq| b.slice_rows(t, seq * 6 + which * 3, seq * 6 + which * 3 + 3))
            .collect();
        b.concat_rows(&parts.iter().collect::<Vec<_>>())
    };
    let (k0, v0, k1, v1) = (half(&k, 0), half(&v, 0), half(&k, 1), half(&v, 1));
    let (o0, p0, l0) = b.attention_block(block, &q, &k0, &v0);
    let own = AttentionShape {
        q_offset: 0,
        ..block
    };
    let (o1, p1, l1) = b.attention_block(own, &q, &k1, &v1);
    let (out, lse) = b.attention_merge(block, (&o1, &l1), (&o0, &l0));
    let (want, probs) = b.attention(full, &q, &k, &v);
    let close = |got: &CpuTensor, want: &CpuTensor, what: &str| {
        let err = got
            .data
            .iter()
            .zip(&want.data)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(err < 1e-5, "{what}: {err}");
    };
    close(&out, &want, "merged output");
    let p0 = b.attention_rescale(block, &p0, &l0, &lse);
    let p1 = b.attention_rescale(own, &p1, &l1, &lse);
    close(
        &b.attention_block_probs(own, &q, &k1, &lse),
        &p1,
        "recomputed probabilities",
    );
    let (dq, dk, dv) = b.attention_backward(full, &q, &k, &v, &probs, &r);
    let (dq0, dk0, dv0) = b.attention_block_backward(block, &q, &k0, &v0, &p0, &out, &r);
    let (dq1, dk1, dv1) = b.attention_block_backward(own, &q, &k1, &v1, &p1, &out, &r);
    close(&b.add(&dq0, &dq1), &dq, "dq");
    close(&dk0, &half(&dk, 0), "dk of the earlier block");
    close(&dk1, &half(&dk, 1), "dk of the own block");
    close(&dv0, &half(&dv, 0), "dv of the earlier block");
    close(&dv1, &half(&dv, 1), "dv of the own block");
}

#[test]
fn causal_grouped_query_attention() {
    let b = backend();
    // Two sequences, queries at positions 2..5 of a 6-long key sequence (a context shard),
    // four query heads sharing two key/value heads.
    let shape = AttentionShape {
        batch: 2,
        q_len: 3,
        kv_len: 6,
        q_offset: 2,
        heads: 4,
        kv_heads: 2,
        head_dim: 3,
    };
    let q = random("q", 6, 12, 1.0);
    let k = random("k", 12, 6, 1.0);
    let v = random("v", 12, 6, 1.0);
    let r = random("r", 6, 12, 1.0);
    let (_, probs) = b.attention(shape, &q, &k, &v);
    // Causality: query at position 2 sees keys 0..=2 only.
    assert_eq!(probs.data[3..6], [0.0, 0.0, 0.0]);
    let (dq, dk, dv) = b.attention_backward(shape, &q, &k, &v, &probs, &r);
    check(
        "dq",
        &|q| dot(&b.attention(shape, q, &k, &v).0, &r),
        &q,
        &dq,
    );
    check(
        "dk",
        &|k| dot(&b.attention(shape, &q, k, &v).0, &r),
        &k,
        &dk,
    );
    check(
        "dv",
        &|v| dot(&b.attention(shape, &q, &k, v).0, &r),
        &v,
        &dv,
    );
}

#[test]
fn rope_backward_is_its_transpose_and_relative() {
    let b = backend();
    let x = random("x", 8, 8, 1.0);
    let y = random("y", 8, 8, 1.0);
    let fwd = b.rope(&x, 4, 4, 3, false);
    let back = b.rope(&y, 4, 4, 3, true);
    assert!((dot(&fwd, &y) - dot(&x, &back)).abs() < 1e-4);
    // Rotations preserve norms.
    assert!((dot(&fwd, &fwd) - dot(&x, &x)).abs() < 1e-3);
}

#[test]
fn cross_entropy_gradient_and_value() {
    let b = backend();
    let logits = random("l", 3, 5, 1.0);
    let targets = [1u32, 4, 0];
    let (loss, grad) = b.cross_entropy(&logits, &targets, 0.5);
    let mut expect = 0.0;
    for (r, &t) in targets.iter().enumerate() {
        let row = &logits.data[r * 5..r * 5 + 5];
        let lse = row.iter().map(|&v| f64::from(v).exp()).sum::<f64>().ln();
        expect += 0.5 * (lse - f64::from(row[t as usize]));
    }
    assert!((loss - expect).abs() < 1e-5);
    check(
        "dlogits",
        &|l| b.cross_entropy(l, &targets, 0.5).0,
        &logits,
        &grad,
    );
}

fn tiny(mlp: MlpKind, norm: NormKind, position: PositionKind, moe: Option<MoeSpec>) -> ModelSpec {
    ModelSpec {
        name: "tiny".into(),
        layers: 2,
        hidden: 8,
        heads: 4,
        kv_heads: 2,
        head_dim: 2,
        ffn_hidden: 12,
        vocab: 16,
        mlp,
        norm,
        tie_embeddings: false,
        bias: true,
        max_seq_len: Some(8),
        position,
        moe,
        encoders: Vec::new(),
    }
}

fn check_block(model: &ModelSpec, layer: u64) {
    check_block_with(model, layer, None, false);
}

/// The block's input and parameter gradients against central differences; with adapters,
/// those of the adapters that train, and none of the frozen weights; with the memory-saving
/// kernels, GELU's and the norms' backward from their outputs.
fn check_block_with(
    model: &ModelSpec,
    layer: u64,
    adapters: Option<Adapters>,
    memory_saving_kernels: bool,
) {
    let b = backend();
    let shard = ShardCoords {
        tp: 1,
        tp_index: 0,
        ep: 1,
        ep_index: 0,
    };
    let mut values: Values<CpuTensor> = Values::new();
    let groups = match &adapters {
        None => layer_groups(model, layer, shard),
        Some(a) => with_adapters(layer_groups(model, layer, shard), a, 1),
    };
    let frozen: BTreeSet<String> = groups
        .iter()
        .filter(|g| g.frozen)
        .flat_map(|g| g.params.iter().map(|p| p.name.clone()))
        .collect();
    for g in groups {
        for p in g.params {
            let (rows, cols) = p.local_shape();
            // Spread the weights so that the check exercises every path with sizeable values.
            let data = init_block(
                1,
                &p.name,
                p.cols,
                p.row_range(),
                p.col_range(),
                Init::Normal(0.5),
            );
            let data = match p.init {
                Init::Constant(c) => data.iter().map(|v| v * 0.2 + c).collect(),
                Init::Normal(_) => data,
            };
            values.insert(p.name.clone(), b.tensor(data, rows, cols));
        }
    }
    let env = Env {
        b: &b,
        model,
        tp: 1,
        tp_index: 0,
        sequence_parallel: false,
        cp: 1,
        cp_index: 0,
        batch: 2,
        seq_chunk: 3,
        chunk_len: 3,
        cp_next_rank: 0,
        cp_prev_rank: 0,
        adapters,
        memory_saving_kernels,
    };
    let x = random("x", 6, 8, 1.0);
    let r = random("r", 6, 8, 1.0);
    let loss = |values: &Values<CpuTensor>, x: &CpuTensor| {
        let (y, _) = block::forward(&env, values, layer, x, Keep::Everything).unwrap();
        dot(&y, &r)
    };
    let (_, ctx) = block::forward(&env, &values, layer, &x, Keep::Everything).unwrap();
    let mut grads = Grads::new(frozen.clone());
    let dx = block::backward(&env, &values, &mut grads, layer, ctx, &r).unwrap();
    check("block dx", &|x| loss(&values, x), &x, &dx);
    for (name, g) in &grads.map {
        let f = |p: &CpuTensor| {
            let mut v = values.clone();
            v.insert(name.clone(), p.clone());
            loss(&v, &x)
        };
        check(name, &f, &values[name], g);
    }
    let trained: Vec<&String> = values.keys().filter(|n| !frozen.contains(*n)).collect();
    assert_eq!(
        grads.map.keys().collect::<Vec<_>>(),
        trained,
        "every parameter that trains gets a gradient, and only those"
    );
}

#[test]
fn lora_block_gelu_biases() {
    let adapters = Adapters {
        rank: 3,
        targets: LoraTargets::ALL,
        frozen_a: false,
    };
    let model = tiny(
        MlpKind::Gelu,
        NormKind::Layernorm,
        PositionKind::Learned,
        None,
    );
    check_block_with(&model, 0, Some(adapters), false);
}

#[test]
fn lora_fa_block_swiglu_rope() {
    let adapters = Adapters {
        rank: 2,
        targets: LoraTargets::ALL,
        frozen_a: true,
    };
    let model = tiny(MlpKind::Swiglu, NormKind::Rmsnorm, PositionKind::Rope, None);
    check_block_with(&model, 1, Some(adapters), false);
}

#[test]
fn memory_saving_kernels_gelu_layernorm_block() {
    let model = tiny(
        MlpKind::Gelu,
        NormKind::Layernorm,
        PositionKind::Learned,
        None,
    );
    check_block_with(&model, 0, None, true);
}

#[test]
fn memory_saving_kernels_swiglu_rmsnorm_block() {
    let model = tiny(MlpKind::Swiglu, NormKind::Rmsnorm, PositionKind::Rope, None);
    check_block_with(&model, 1, None, true);
}

/// Under LoRA-FA the GEMMs keep no inputs, so the in-place norms keep their outputs themselves
/// and GELU keeps its input.
#[test]
fn memory_saving_kernels_with_lora_fa() {
    let adapters = Adapters {
        rank: 2,
        targets: LoraTargets::ALL,
        frozen_a: true,
    };
    let model = tiny(
        MlpKind::Gelu,
        NormKind::Layernorm,
        PositionKind::Learned,
        None,
    );
    check_block_with(&model, 0, Some(adapters), true);
}

#[test]
fn dense_gelu_layernorm_block() {
    check_block(
        &tiny(
            MlpKind::Gelu,
            NormKind::Layernorm,
            PositionKind::Learned,
            None,
        ),
        0,
    );
}

#[test]
fn swiglu_rmsnorm_rope_block() {
    check_block(
        &tiny(MlpKind::Swiglu, NormKind::Rmsnorm, PositionKind::Rope, None),
        1,
    );
}

#[test]
fn moe_block() {
    let moe = MoeSpec {
        experts: 4,
        top_k: 2,
        every: 1,
        expert_ffn_hidden: 6,
        shared_experts: 1,
        capacity_factor: 1.0,
        first_dense: 0,
    };
    check_block(
        &tiny(
            MlpKind::Swiglu,
            NormKind::Rmsnorm,
            PositionKind::Rope,
            Some(moe),
        ),
        1,
    );
}
