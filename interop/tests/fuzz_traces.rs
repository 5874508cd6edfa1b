//! Fuzzing the trace parsers (nccl-tests, PyTorch profiler, Tessel, GEMM CSV): mutations of the cited
//! samples (line deletions, duplications, byte flips, truncation) and random text give rows or
//! an error, never a panic.
//! `TESSEL_FUZZ_CASES=N` sets the number of cases per property (default 256).

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tessel_interop::traces::{
    parse_gemm_csv, parse_kineto_trace, parse_nccl_tests, parse_tessel_trace,
};

fn seeds() -> Vec<&'static str> {
    vec![
        include_str!("../../tests/traces/nccl-tests/a3mega-all-reduce-2x8.txt"),
        include_str!("../../tests/traces/nccl-tests/rtx5090-all-reduce-tagged-1x2.txt"),
        include_str!("../../tests/traces/nccl-tests/h800-alltoall-4x8.txt"),
        include_str!("../../tests/traces/kineto/hta-nccl-a100-2ranks.json"),
        include_str!("../../tests/traces/kineto/tracelens-qwen1.5-0.5b-h100-gemms.json"),
        include_str!("../../tests/traces/gemm/h100-cublas-fp16.csv"),
        include_str!("../../tests/traces/tessel/dense8-pp2-2steps.json"),
    ]
}

/// Every parser on the same text: each gives its rows or an error.
fn parse_with_each(text: &str) {
    let _ = parse_nccl_tests(text);
    let _ = parse_kineto_trace(text);
    let _ = parse_gemm_csv(text);
    let _ = parse_tessel_trace(text);
}

fn runner() -> TestRunner {
    let cases = std::env::var("TESSEL_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(256);
    TestRunner::new(Config {
        cases,
        ..Config::default()
    })
}

#[test]
fn mutated_samples_never_panic() {
    let seeds = seeds();
    let strategy = (
        0..seeds.len(),
        prop::collection::vec((0usize..4, any::<usize>(), any::<u8>()), 1..8),
    );
    runner()
        .run(&strategy, |(seed, edits)| {
            let mut lines: Vec<String> = seeds[seed].lines().map(str::to_string).collect();
            for (kind, at, byte) in edits {
                if lines.is_empty() {
                    break;
                }
                let i = at % lines.len();
                match kind {
                    0 => {
                        lines.remove(i);
                    }
                    1 => {
                        let line = lines[i].clone();
                        lines.insert(i, line);
                    }
                    2 => {
                        let mut bytes = lines[i].clone().into_bytes();
                        if !bytes.is_empty() {
                            let j = at % bytes.len();
                            bytes[j] = byte;
                        }
                        lines[i] = String::from_utf8_lossy(&bytes).into_owned();
                    }
                    _ => {
                        let cut = at % (lines[i].len() + 1);
                        let cut = (0..=cut).rev().find(|&c| lines[i].is_char_boundary(c));
                        lines[i].truncate(cut.unwrap_or(0));
                    }
                }
            }
            parse_with_each(&lines.join("\n"));
            Ok(())
        })
        .unwrap();
}

#[test]
fn random_text_never_panics() {
    runner()
        .run(&"(#|[ 0-9a-z.:\\[\\]<>,-]{0,40}\n){0,30}", |text| {
            parse_with_each(&text);
            Ok(())
        })
        .unwrap();
}
