//! Serving on CPU ranks: greedy generation with a KV cache under tensor and pipeline
//! parallelism, in one instance (prefill and decode on the same ranks, colocated) or two
//! (disaggregated: the prefill instance's ranks hand each prompt's KV cache to the decode
//! instance's ranks, resharded by layers and key/value heads when the two are shaped
//! differently).
//!
//! Requests are served one after another; each passes the pipeline stage by stage, the last
//! stage sampling the next token and sending it back to the first. Parameters are initialised
//! as training initialises them (same names, same seed), so a plan's instance holds exactly the
//! shards of the single-rank model, and greedy decoding must give the same tokens.

pub mod model;

use std::collections::BTreeMap;
use std::sync::Arc;

use tessel_grammar::{ModelSpec, Strategy};

use crate::backend::cpu::CpuBackend;
use crate::backend::shared_memory::World;
use crate::backend::Backend;
use crate::error::RuntimeError;
use crate::init::init_block;
use crate::launch::{run_ranks, validate_model};
use crate::mesh::Mesh;
use crate::model::layout::{layer_groups, rank_groups, ShardCoords};
use crate::plan::ExecutionPlan;

use model::LayerCache;

/// Tensor and pipeline degrees of one instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServeShape {
    pub tp: u64,
    pub pp: u64,
}

/// What generation produced: the tokens after each prompt, and for a disaggregated run the
/// KV-cache bytes handed from the prefill ranks to the decode ranks.
#[derive(Clone, Debug, PartialEq)]
pub struct Generated {
    pub tokens: Vec<Vec<u32>>,
    pub kv_bytes_handed_over: u64,
}

/// One request's cache on one rank: its layers, by global layer index.
type RankCache = BTreeMap<u64, LayerCache<Vec<f32>>>;

/// A request handed to the decode instance: its first token and its whole cache (every key
/// and value head) by layer.
type Handed = (u32, BTreeMap<u64, LayerCache<Vec<f32>>>);

/// What a rank of an instance returns.
struct RankResult {
    /// Generated tokens per request (the first stage's ranks know them all).
    tokens: Vec<Vec<u32>>,
    /// Per request, this rank's KV cache after the prefill (a prefill instance only).
    caches: Vec<RankCache>,
}

/// What an instance does with each request.
#[derive(Clone)]
enum Work {
    /// Prefill the prompt and decode `new_tokens − 1` more.
    Generate,
    /// Prefill only: sample the first token and keep the cache.
    Prefill,
    /// Decode from a handed-over cache and the first token.
    Decode { handed: Arc<Vec<Handed>> },
}

fn instance_plan(
    model: &ModelSpec,
    shape: ServeShape,
    seed: u64,
) -> Result<ExecutionPlan, RuntimeError> {
    let strategy = Strategy {
        name: "serve".into(),
        tp: shape.tp,
        pp: shape.pp,
        ..Strategy::default()
    };
    // Learned position tables have a row per position up to the model's context.
    let seq_len = model.max_seq_len.unwrap_or(1);
    let mut plan = ExecutionPlan::from_strategy(model, &strategy, 1, seq_len)?;
    plan.seed = seed;
    Ok(plan)
}

/// Message tags: a request's activations of step `step` between stages, and its sampled
/// token travelling back to the first stage.
fn tag(request: usize, step: usize, token: bool) -> u64 {
    ((request as u64) << 32) | ((step as u64) << 1) | u64::from(token)
}

/// The key/value columns `[start, end)` tensor rank `tp_index` of `tp` holds, and whether it
/// is the first of the ranks sharing them (with more ranks than key/value heads, consecutive
/// ranks hold one head each): the layout's split of the key projection.
fn kv_columns(model: &ModelSpec, tp: u64, tp_index: u64) -> (usize, usize, bool) {
    let shard = ShardCoords {
        tp,
        tp_index,
        ep: 1,
        ep_index: 0,
    };
    let wk = layer_groups(model, 0, shard)
        .into_iter()
        .flat_map(|g| g.params)
        .find(|p| p.name == "layers.0.attn.wk")
        .expect("every layer has a key projection");
    let (start, end) = wk.col_range();
    let first = tp_index.is_multiple_of(wk.tp_replicas);
    (start as usize, end as usize, first)
}

fn run_rank(
    b: &CpuBackend,
    rank: usize,
    model: &ModelSpec,
    plan: &ExecutionPlan,
    prompts: &[Vec<u32>],
    new_tokens: usize,
    work: &Work,
) -> Result<RankResult, RuntimeError> {
    let mesh = Mesh::new(plan);
    let c = mesh.coords(rank as u64);
    let (tp, pp) = (plan.tp as usize, plan.pp);
    let mut values = BTreeMap::new();
    for group in rank_groups(model, plan, c) {
        for p in group.params {
            let (rows, cols) = p.local_shape();
            let data = init_block(
                plan.seed,
                &p.name,
                p.cols,
                p.row_range(),
                p.col_range(),
                p.init,
            );
            values.insert(p.name.clone(), b.tensor(data, rows, cols));
        }
    }
    let layers = plan.stage_layers(c.pp);
    let (first, last) = (c.pp == 0, c.pp == pp - 1);
    let peer = |stage: u64| mesh.rank_of(stage, 0, 0, c.tp) as usize;
    let (kv_lo, kv_hi, _) = kv_columns(model, plan.tp, c.tp);
    let mut result = RankResult {
        tokens: Vec::new(),
        caches: Vec::new(),
    };
    for (r, prompt) in prompts.iter().enumerate() {
        let mut cache: BTreeMap<u64, Option<LayerCache<_>>> =
            layers.iter().map(|&l| (l, None)).collect();
        let mut generated = Vec::new();
        let mut input: Vec<u32> = prompt.clone();
        let mut start = 0usize;
        let steps = match work {
            Work::Generate => new_tokens,
            Work::Prefill => 1,
            Work::Decode { handed } => {
                let (token, whole) = &handed[r];
                for (&layer, slot) in cache.iter_mut() {
                    let LayerCache { k, v } = &whole[&layer];
                    let width = (model.kv_heads * model.head_dim) as usize;
                    let n = k.len() / width;
                    let full_k = b.tensor(k.clone(), n, width);
                    let full_v = b.tensor(v.clone(), n, width);
                    *slot = Some(LayerCache {
                        k: b.slice_cols(&full_k, kv_lo, kv_hi),
                        v: b.slice_cols(&full_v, kv_lo, kv_hi),
                    });
                }
                generated.push(*token);
                input = vec![*token];
                start = prompt.len();
                new_tokens.saturating_sub(1)
            }
        };
        for step in 0..steps {
            let env = model::env(b, model, tp, c.tp as usize, rank, input.len());
            let mut x = if first {
                model::embed(&env, &values, &input, start)?
            } else {
                b.recv(peer(c.pp - 1), tag(r, step, false))?
            };
            for &layer in &layers {
                let slot = cache.get_mut(&layer).expect("a stage's layer");
                x = model::block(&env, &values, layer, &x, slot, start)?;
            }
            let token = if last {
                let token = model::greedy_token(&env, &values, &x)?;
                if !first {
                    b.send(
                        peer(0),
                        tag(r, step, true),
                        &b.tensor(vec![token as f32], 1, 1),
                    )?;
                }
                token
            } else {
                b.send(peer(c.pp + 1), tag(r, step, false), &x)?;
                if first {
                    b.to_vec(&b.recv(peer(pp - 1), tag(r, step, true))?)[0] as u32
                } else {
                    0
                }
            };
            generated.push(token);
            start += input.len();
            input = vec![token];
        }
        result.tokens.push(generated);
        if matches!(work, Work::Prefill) {
            result.caches.push(
                cache
                    .into_iter()
                    .filter_map(|(layer, c)| {
                        c.map(|c| {
                            (
                                layer,
                                LayerCache {
                                    k: b.to_vec(&c.k),
                                    v: b.to_vec(&c.v),
                                },
                            )
                        })
                    })
                    .collect(),
            );
        }
    }
    Ok(result)
}

/// Runs one instance over every request, one thread per rank.
fn run_instance(
    model: &ModelSpec,
    shape: ServeShape,
    seed: u64,
    prompts: &[Vec<u32>],
    new_tokens: usize,
    work: Work,
) -> Result<(ExecutionPlan, Vec<RankResult>), RuntimeError> {
    let plan = instance_plan(model, shape, seed)?;
    let world = World::new(Mesh::new(&plan));
    let outputs = run_ranks(&world, plan.world_size() as usize, |b, rank| {
        run_rank(b, rank, model, &plan, prompts, new_tokens, &work)
    })?;
    Ok((plan, outputs))
}

fn check(model: &ModelSpec, prompts: &[Vec<u32>], new_tokens: usize) -> Result<(), RuntimeError> {
    validate_model(model)?;
    // Token ids travel between stages as f32: exact below 2^24.
    if model.vocab > 1 << 24 {
        return Err(RuntimeError::unsupported(format!(
            "serving a vocabulary of {} (the runtime sends token ids as f32, exact up to 2^24)",
            model.vocab
        )));
    }
    if new_tokens == 0 || prompts.iter().any(|p| p.is_empty()) {
        return Err(RuntimeError::invalid_plan(
            "every prompt needs a token, and at least one token is generated",
        ));
    }
    if let Some(t) = prompts
        .iter()
        .flatten()
        .find(|&&t| u64::from(t) >= model.vocab)
    {
        return Err(RuntimeError::invalid_plan(format!(
            "token {t} is outside the vocabulary of {}",
            model.vocab
        )));
    }
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0) + new_tokens;
    if let Some(max) = model.max_seq_len {
        if longest as u64 > max {
            return Err(RuntimeError::invalid_plan(format!(
                "a prompt and its {new_tokens} new tokens reach {longest} positions, beyond the \
                 model's {max}"
            )));
        }
    }
    Ok(())
}

/// Greedy generation of `new_tokens` after each prompt on one instance of `shape`.
pub fn generate_colocated(
    model: &ModelSpec,
    shape: ServeShape,
    seed: u64,
    prompts: &[Vec<u32>],
    new_tokens: usize,
) -> Result<Generated, RuntimeError> {
    check(model, prompts, new_tokens)?;
    let (_, outputs) = run_instance(model, shape, seed, prompts, new_tokens, Work::Generate)?;
    Ok(Generated {
        tokens: outputs[0].tokens.clone(),
        kv_bytes_handed_over: 0,
    })
}

/// Greedy generation with prefill on an instance of `prefill` and decode on one of `decode`:
/// each prompt's KV cache is handed from the prefill ranks to the decode ranks.
pub fn generate_disaggregated(
    model: &ModelSpec,
    prefill: ServeShape,
    decode: ServeShape,
    seed: u64,
    prompts: &[Vec<u32>],
    new_tokens: usize,
) -> Result<Generated, RuntimeError> {
    check(model, prompts, new_tokens)?;
    let (plan, outputs) = run_instance(model, prefill, seed, prompts, 1, Work::Prefill)?;
    let mesh = Mesh::new(&plan);
    let width = (model.kv_heads * model.head_dim) as usize;
    let mut handed = Vec::with_capacity(prompts.len());
    let mut bytes = 0u64;
    let columns: Vec<(usize, usize, bool)> = (0..outputs.len())
        .map(|rank| kv_columns(model, plan.tp, mesh.coords(rank as u64).tp))
        .collect();
    for (r, prompt) in prompts.iter().enumerate() {
        let n = prompt.len();
        let mut whole: BTreeMap<u64, LayerCache<Vec<f32>>> = BTreeMap::new();
        for (output, &(lo, hi, first)) in outputs.iter().zip(&columns) {
            // Ranks that share a key/value head hold the same copy: the first one sends it.
            if !first {
                continue;
            }
            for (&layer, cache) in &output.caches[r] {
                let LayerCache { k, v } = whole.entry(layer).or_insert_with(|| LayerCache {
                    k: vec![0.0; n * width],
                    v: vec![0.0; n * width],
                });
                for row in 0..n {
                    let part = hi - lo;
                    k[row * width + lo..row * width + hi]
                        .copy_from_slice(&cache.k[row * part..(row + 1) * part]);
                    v[row * width + lo..row * width + hi]
                        .copy_from_slice(&cache.v[row * part..(row + 1) * part]);
                }
                bytes += 2 * (n * (hi - lo) * std::mem::size_of::<f32>()) as u64;
            }
        }
        handed.push((outputs[0].tokens[r][0], whole));
    }
    let work = Work::Decode {
        handed: Arc::new(handed),
    };
    let (_, decoded) = run_instance(model, decode, seed, prompts, new_tokens, work)?;
    Ok(Generated {
        tokens: decoded[0].tokens.clone(),
        kv_bytes_handed_over: bytes,
    })
}
