//! Fuzzing `load_str`: random text, random token soup, and mutations of the example specs (byte
//! flips, deletions, duplications, token swaps) must give a spec or diagnostics, never a panic.
//! `TESSEL_FUZZ_CASES=N` sets the number of cases per property (default 256).

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// The example specs, with their `use` lines replaced by the files they use so that each one is
/// complete on its own.
fn seeds() -> Vec<String> {
    let a100 = include_str!("../../specs/clusters/dgx-a100.tsl");
    let h100 = include_str!("../../specs/clusters/dgx-h100.tsl");
    let specs = [
        include_str!("../../specs/gpt3-175b.tsl"),
        include_str!("../../specs/llama3-8b.tsl"),
        include_str!("../../specs/llama3-70b.tsl"),
        include_str!("../../specs/llama3-405b.tsl"),
        include_str!("../../specs/mixtral-8x7b.tsl"),
        include_str!("../../specs/deepseek-moe.tsl"),
        include_str!("../../specs/megatron-1t.tsl"),
        include_str!("../catalog/gpus.tsl"),
    ];
    specs
        .iter()
        .map(|s| {
            s.replace("use \"clusters/dgx-a100.tsl\"", a100)
                .replace("use \"clusters/dgx-h100.tsl\"", h100)
        })
        .collect()
}

const TOKENS: &[&str] = &[
    "model",
    "cluster",
    "gpu",
    "train",
    "strategy",
    "search",
    "use",
    "let",
    "extends",
    "{",
    "}",
    "[",
    "]",
    "(",
    ")",
    "=",
    ",",
    ";",
    "\n",
    "..=",
    "+",
    "-",
    "*",
    "/",
    "%",
    "#",
    "\"",
    "0",
    "1",
    "8",
    "2.5",
    "1e3",
    "1e400",
    "-1",
    "GiB",
    "GB/s",
    "Gb/s",
    "TFLOPS",
    "us",
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "ffn_hidden",
    "vocab",
    "mlp",
    "swiglu",
    "moe",
    "experts",
    "top_k",
    "tp",
    "pp",
    "dp",
    "ep",
    "cp",
    "stages",
    "recompute",
    "full_layers",
    "offload",
    "none",
    "auto",
    "true",
    "H100_SXM",
    "nodes",
    "gpus_per_node",
    "intra_node",
    "bandwidth",
    "seq_len",
    "global_batch",
    "zero",
    "interleave",
    " ",
    "\t",
    "é",
    "\u{0}",
];

#[derive(Clone, Debug)]
enum Mutation {
    FlipByte { at: usize, bit: u8 },
    Delete { at: usize, len: usize },
    Duplicate { at: usize, len: usize, to: usize },
    SwapTokens { a: usize, b: usize },
    InsertToken { at: usize, token: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::FlipByte { at, bit }),
        (any::<usize>(), 1usize..64).prop_map(|(at, len)| Mutation::Delete { at, len }),
        (any::<usize>(), 1usize..64, any::<usize>())
            .prop_map(|(at, len, to)| Mutation::Duplicate { at, len, to }),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::SwapTokens { a, b }),
        (any::<usize>(), 0..TOKENS.len())
            .prop_map(|(at, token)| Mutation::InsertToken { at, token }),
    ]
}

fn apply(text: &str, m: &Mutation) -> String {
    let mut bytes = text.as_bytes().to_vec();
    if bytes.is_empty() {
        return String::new();
    }
    let n = bytes.len();
    match *m {
        Mutation::FlipByte { at, bit } => bytes[at % n] ^= 1 << bit,
        Mutation::Delete { at, len } => {
            let start = at % n;
            bytes.drain(start..(start + len).min(n));
        }
        Mutation::Duplicate { at, len, to } => {
            let start = at % n;
            let chunk = bytes[start..(start + len).min(n)].to_vec();
            let to = to % n;
            bytes.splice(to..to, chunk);
        }
        Mutation::SwapTokens { a, b } => {
            let mut tokens: Vec<&str> = text.split(' ').collect();
            let len = tokens.len();
            tokens.swap(a % len, b % len);
            return tokens.join(" ");
        }
        Mutation::InsertToken { at, token } => {
            let at = at % n;
            bytes.splice(at..at, TOKENS[token].bytes());
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Loads `text` and uses what comes back; a panic fails the property.
fn load_and_render(text: &str) {
    match tessel_grammar::load_str("fuzz.tsl", text) {
        Ok(spec) => {
            let count = spec.model.parameter_count();
            assert!(count.active <= count.total);
            let flops = spec.model.training_flops_per_token(spec.train.seq_len);
            assert!(flops.is_finite());
        }
        Err(diagnostics) => {
            let rendered = diagnostics.to_string();
            assert!(rendered.starts_with("error: "), "{rendered}");
        }
    }
}

fn cases() -> u32 {
    std::env::var("TESSEL_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    })
}

#[test]
fn seeds_load() {
    for (i, seed) in seeds().iter().take(7).enumerate() {
        if let Err(d) = tessel_grammar::load_str("seed.tsl", seed) {
            panic!("seed {i} does not load:\n{d}");
        }
    }
}

#[test]
fn mutated_examples_never_panic() {
    let seeds = seeds();
    let strategy = (0..seeds.len(), prop::collection::vec(mutation(), 1..6));
    runner()
        .run(&strategy, |(seed, mutations)| {
            let mut text = seeds[seed].clone();
            for m in &mutations {
                text = apply(&text, m);
            }
            load_and_render(&text);
            Ok(())
        })
        .unwrap();
}

#[test]
fn token_soup_never_panics() {
    let strategy = prop::collection::vec(0..TOKENS.len(), 0..200);
    runner()
        .run(&strategy, |tokens| {
            let text: Vec<&str> = tokens.iter().map(|&t| TOKENS[t]).collect();
            load_and_render(&text.join(" "));
            Ok(())
        })
        .unwrap();
}

#[test]
fn random_text_never_panics() {
    runner()
        .run(&any::<Vec<u8>>(), |bytes| {
            load_and_render(&String::from_utf8_lossy(&bytes));
            Ok(())
        })
        .unwrap();
}
