//! `tessel launch SERVING_PLAN --backend cpu [--scale F] [--steps N] [--seed S]`: run one
//! instance of the plan's deployment (prefill and decode instances for a disaggregated plan)
//! on CPU ranks with the model scaled down, generate `--steps` tokens greedily after a few
//! synthetic prompts, and check them against a single rank's tokens.

use std::process::ExitCode;

use serde_json::json;
use tessel_planner::serving::plan::ServingPlan;
use tessel_runtime::serve::{generate_colocated, generate_disaggregated, ServeShape};
use tessel_runtime::{auto_scale, scale_model};

use super::launch::{Args, Backend, EXIT_RUNTIME_FAILURE};
use super::{TableOrJson as Format, EXIT_BAD_INPUT};

/// Prompts generated for the run, and the longest one's tokens.
const PROMPTS: usize = 4;
const LONGEST_PROMPT: usize = 24;

/// Prompts of 3 to `LONGEST_PROMPT` tokens drawn from the seed (SplitMix64 steps).
fn prompts(seed: u64, vocab: u64) -> Vec<Vec<u32>> {
    let mut state = seed;
    let mut next = || {
        state = tessel_runtime::init::splitmix64(state);
        state
    };
    (0..PROMPTS)
        .map(|_| {
            let len = 3 + (next() % (LONGEST_PROMPT as u64 - 2)) as usize;
            (0..len).map(|_| (next() % vocab) as u32).collect()
        })
        .collect()
}

fn bad_input(message: String) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(EXIT_BAD_INPUT)
}

pub fn run(args: &Args, text: &str) -> ExitCode {
    let path = args.plan.display();
    let plan = match ServingPlan::from_json(text) {
        Ok(plan) => plan,
        Err(error) => return bad_input(format!("`{path}` is not a serving plan: {error}")),
    };
    if !matches!(args.backend, Backend::Cpu) {
        return bad_input(
            "serving plans run on the CPU backend only (`--backend cpu`); the CUDA backend \
             trains"
                .into(),
        );
    }
    if args.steps == 0 {
        return bad_input("--steps (tokens to generate) must be at least 1".into());
    }
    let shape = |role: &str| {
        plan.chosen
            .phases
            .iter()
            .find(|p| p.role == role)
            .map(|p| ServeShape { tp: p.tp, pp: p.pp })
    };
    let deepest = plan.chosen.phases.iter().map(|p| p.pp).max().unwrap_or(1);
    let factor = args
        .scale
        .unwrap_or_else(|| auto_scale(&plan.spec.model, deepest));
    let model = scale_model(&plan.spec.model, factor, deepest);
    let prompts = prompts(args.seed, model.vocab);
    let new_tokens = args.steps as usize;
    let seed = args.seed;
    let (label, run) = match (shape("both"), shape("prefill"), shape("decode")) {
        (Some(s), _, _) => (
            format!("colocated tp{} pp{}", s.tp, s.pp),
            generate_colocated(&model, s, seed, &prompts, new_tokens),
        ),
        (None, Some(p), Some(d)) => (
            format!(
                "disaggregated: prefill tp{} pp{} → decode tp{} pp{}",
                p.tp, p.pp, d.tp, d.pp
            ),
            generate_disaggregated(&model, p, d, seed, &prompts, new_tokens),
        ),
        _ => return bad_input(format!("`{path}` has no instance to run")),
    };
    let single = ServeShape { tp: 1, pp: 1 };
    let reference = generate_colocated(&model, single, seed, &prompts, new_tokens);
    let (run, reference) = match (run, reference) {
        (Ok(run), Ok(reference)) => (run, reference),
        (Err(error), _) | (_, Err(error)) => {
            eprintln!("error: {error}");
            return ExitCode::from(EXIT_RUNTIME_FAILURE);
        }
    };
    let matches = run.tokens == reference.tokens;
    match args.format {
        Format::Json => {
            let report = json!({
                "deployment": label,
                "scale": factor,
                "parameters": model.parameter_count().total,
                "prompts": prompts,
                "tokens": run.tokens,
                "single_rank_tokens": reference.tokens,
                "matches_single_rank": matches,
                "kv_bytes_handed_over": run.kv_bytes_handed_over,
            });
            println!("{report:#}");
        }
        Format::Table => {
            println!(
                "serving {} at scale {factor} ({} parameters): {label}",
                plan.model,
                model.parameter_count().total
            );
            for (i, (prompt, tokens)) in prompts.iter().zip(&run.tokens).enumerate() {
                println!(
                    "  prompt {i} ({} tokens) → {}",
                    prompt.len(),
                    tokens
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(" ")
                );
            }
            if run.kv_bytes_handed_over > 0 {
                println!(
                    "  KV cache handed from prefill to decode ranks: {} bytes",
                    run.kv_bytes_handed_over
                );
            }
            println!(
                "greedy tokens {} the single-rank run's",
                if matches { "equal" } else { "DIFFER FROM" }
            );
        }
    }
    if matches {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_RUNTIME_FAILURE)
    }
}
