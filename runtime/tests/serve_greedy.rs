//! Greedy generation with a KV cache under tensor and pipeline parallelism, colocated and
//! disaggregated, against the single-rank run; and the single-rank run against generation
//! without a cache (the whole sequence recomputed for every token).

use tessel_grammar::{MlpKind, ModelSpec, MoeSpec, NormKind, PositionKind};
use tessel_runtime::serve::{generate_colocated, generate_disaggregated, ServeShape};

fn tiny(kv_heads: u64, moe: bool) -> ModelSpec {
    ModelSpec {
        name: "tiny".into(),
        layers: 4,
        hidden: 64,
        heads: 8,
        kv_heads,
        head_dim: 8,
        ffn_hidden: 128,
        vocab: 96,
        mlp: MlpKind::Swiglu,
        norm: NormKind::Rmsnorm,
        tie_embeddings: false,
        bias: false,
        max_seq_len: Some(64),
        position: PositionKind::Rope,
        moe: moe.then_some(MoeSpec {
            experts: 4,
            top_k: 2,
            every: 2,
            expert_ffn_hidden: 64,
            shared_experts: 0,
            capacity_factor: 4.0,
            first_dense: 0,
        }),
        encoders: Vec::new(),
    }
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![5, 17, 42, 3, 88, 9],
        vec![1, 2, 3],
        vec![60, 61, 62, 63, 64, 65, 66, 67, 68],
    ]
}

const NEW: usize = 12;
const SEED: u64 = 7;

fn shape(tp: u64, pp: u64) -> ServeShape {
    ServeShape { tp, pp }
}

#[test]
fn the_cache_gives_the_tokens_of_recomputing_everything() {
    let model = tiny(2, false);
    let cached = generate_colocated(&model, shape(1, 1), SEED, &prompts(), NEW).unwrap();
    for (prompt, tokens) in prompts().iter().zip(&cached.tokens) {
        let mut sequence = prompt.clone();
        for _ in 0..NEW {
            let next = generate_colocated(&model, shape(1, 1), SEED, &[sequence.clone()], 1)
                .unwrap()
                .tokens[0][0];
            sequence.push(next);
        }
        assert_eq!(&sequence[prompt.len()..], tokens.as_slice());
    }
    // Not a constant: the model says different things after different prompts.
    assert_ne!(cached.tokens[0], cached.tokens[1]);
}

#[test]
fn parallel_instances_generate_the_single_rank_tokens() {
    for (kv_heads, moe) in [(2, false), (8, true)] {
        let model = tiny(kv_heads, moe);
        let reference = generate_colocated(&model, shape(1, 1), SEED, &prompts(), NEW).unwrap();
        // tp 4 over 2 key/value heads shares each head between two ranks.
        for s in [shape(2, 1), shape(1, 2), shape(2, 2), shape(4, 1)] {
            let run = generate_colocated(&model, s, SEED, &prompts(), NEW).unwrap();
            assert_eq!(
                run.tokens, reference.tokens,
                "{s:?}, kv_heads {kv_heads}, moe {moe}"
            );
        }
        for (prefill, decode) in [(shape(2, 1), shape(1, 2)), (shape(4, 1), shape(2, 2))] {
            let run =
                generate_disaggregated(&model, prefill, decode, SEED, &prompts(), NEW).unwrap();
            assert_eq!(run.tokens, reference.tokens, "{prefill:?} → {decode:?}");
            // Every prompt token's keys and values of every layer, each head once, in f32.
            let tokens: usize = prompts().iter().map(Vec::len).sum();
            let per_token = 2 * model.layers * model.kv_heads * model.head_dim * 4;
            assert_eq!(run.kv_bytes_handed_over, tokens as u64 * per_token);
        }
    }
}

#[test]
fn bad_requests_are_refused() {
    let model = tiny(2, false);
    assert!(generate_colocated(&model, shape(1, 1), SEED, &[vec![200]], 2).is_err());
    assert!(generate_colocated(&model, shape(1, 1), SEED, &[vec![1; 60]], 10).is_err());
    assert!(generate_colocated(&model, shape(3, 1), SEED, &prompts(), 2).is_err());
}
