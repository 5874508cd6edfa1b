//! One inference instance under a stream of requests, iteration by iteration, as vLLM's
//! scheduler runs it: continuous batching with chunked prefill. Each iteration first gives a
//! token to every running sequence that is decoding, then continues prompts being prefilled,
//! then admits waiting requests first come, first served, within a budget of batched tokens,
//! a cap on sequences and the KV cache's free blocks. When the cache cannot take the next
//! decoded token the newest running request is preempted and later recomputed (vLLM's
//! default). An iteration lasts what the serving cost model says for its batch.

use std::collections::VecDeque;

use tessel_symbolic::serving::{IterationBatch, ServingCostModel};

/// The phases an instance runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Prefill and decode (a colocated deployment).
    Both,
    /// Prefill only: a request leaves when its first token is sampled.
    Prefill,
    /// Decode only: a request arrives with its prompt's KV cache and first token.
    Decode,
}

/// The engine's batch limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BatchLimits {
    /// Sequences in a batch (vLLM's `--max-num-seqs`).
    pub max_sequences: u64,
    /// Tokens in a batch (`--max-num-batched-tokens`): prefill chunks stop at it.
    pub max_batched_tokens: u64,
}

/// KV-cache blocks hold this many tokens (vLLM's default block size).
pub const BLOCK_TOKENS: u64 = 16;

/// One request as an instance sees it.
#[derive(Clone, Copy, Debug)]
pub struct Arrival {
    /// Index into the deployment's requests.
    pub id: usize,
    /// When it reaches this instance, seconds.
    pub at: f64,
    pub prompt: u64,
    pub output: u64,
}

/// When a request got its first token and its last, seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timing {
    /// When the engine first took it into a batch (a closed-loop client sends its next
    /// request then: with every request queued at 0 and the sequence cap at the clients'
    /// number, admission is when it was sent).
    pub admitted: f64,
    pub first_token: f64,
    pub finished: f64,
}

struct Running {
    arrival: Arrival,
    /// Tokens in the KV cache.
    cached: u64,
    /// Tokens that must be cached before it decodes: its prompt, and after a preemption what
    /// it had generated too (recomputed).
    target: u64,
    generated: u64,
}

impl Running {
    fn blocks(&self) -> u64 {
        self.cached.div_ceil(BLOCK_TOKENS)
    }

    fn decoding(&self) -> bool {
        self.cached >= self.target
    }
}

/// Preempts the newest running request: its blocks are freed and it waits at the front, to
/// recompute its prompt and what it generated (vLLM's recompute preemption).
fn preempt_newest(
    running: &mut Vec<Running>,
    waiting: &mut VecDeque<Running>,
    used_blocks: &mut u64,
) {
    if let Some(victim) = running.pop() {
        *used_blocks -= victim.blocks();
        waiting.push_front(Running {
            cached: 0,
            target: victim.arrival.prompt + victim.generated,
            ..victim
        });
    }
}

/// What a running request does in an iteration.
#[derive(Clone, Copy, PartialEq)]
enum Part {
    Idle,
    Decode,
    Prefill(u64),
}

/// Runs the instance over `arrivals` (sorted by time) until every request is done, writing
/// each request's timing at its `id`; `None` when a request can never fit the KV cache.
pub fn simulate_instance(
    cost: &ServingCostModel,
    role: Role,
    limits: BatchLimits,
    kv_capacity_tokens: u64,
    arrivals: &[Arrival],
    timings: &mut [Timing],
) -> Option<()> {
    let capacity_blocks = kv_capacity_tokens / BLOCK_TOKENS;
    if arrivals
        .iter()
        .any(|a| (a.prompt + a.output).div_ceil(BLOCK_TOKENS) > capacity_blocks)
    {
        return None;
    }
    let mut now = 0.0f64;
    let mut next = 0usize;
    let mut waiting: VecDeque<Running> = VecDeque::new();
    let mut running: Vec<Running> = Vec::new();
    let mut parts: Vec<Part> = Vec::new();
    let mut used_blocks = 0u64;
    let fresh = |a: Arrival| Running {
        arrival: a,
        cached: 0,
        target: a.prompt,
        // A decode instance receives the prompt's cache and its first token.
        generated: u64::from(role == Role::Decode),
    };
    loop {
        while next < arrivals.len() && arrivals[next].at <= now {
            waiting.push_back(fresh(arrivals[next]));
            next += 1;
        }
        if running.is_empty() && waiting.is_empty() {
            if next == arrivals.len() {
                return Some(());
            }
            now = arrivals[next].at;
            continue;
        }
        // Every decoding sequence needs room for one more token: preempt the newest until
        // they all have it.
        loop {
            let needed: u64 = running
                .iter()
                .filter(|r| r.decoding() && r.cached.is_multiple_of(BLOCK_TOKENS))
                .count() as u64;
            if used_blocks + needed <= capacity_blocks || running.len() <= 1 {
                break;
            }
            preempt_newest(&mut running, &mut waiting, &mut used_blocks);
        }
        let mut batch = IterationBatch::default();
        let mut budget = limits.max_batched_tokens;
        parts.clear();
        for r in &running {
            let part = if budget == 0 {
                Part::Idle
            } else if r.decoding() {
                if r.cached.is_multiple_of(BLOCK_TOKENS) {
                    used_blocks += 1;
                }
                batch.add_decode(r.cached);
                budget -= 1;
                Part::Decode
            } else {
                let n = (r.target - r.cached).min(budget);
                let blocks = (r.cached + n).div_ceil(BLOCK_TOKENS) - r.blocks();
                if used_blocks + blocks > capacity_blocks {
                    Part::Idle
                } else {
                    used_blocks += blocks;
                    batch.add_chunk(n, r.cached, r.cached + n == r.target);
                    budget -= n;
                    Part::Prefill(n)
                }
            };
            parts.push(part);
        }
        // Admit waiting requests while the budget, the sequence cap and the cache allow. A
        // decode instance's requests bring their cache whole and decode from the next
        // iteration.
        while budget > 0 && (running.len() as u64) < limits.max_sequences {
            let Some(front) = waiting.front() else { break };
            let (n, cached) = if role == Role::Decode
                && front.cached == 0
                && front.target == front.arrival.prompt
            {
                (0, front.arrival.prompt)
            } else {
                ((front.target - front.cached).min(budget), front.cached)
            };
            let blocks = (cached + n).div_ceil(BLOCK_TOKENS);
            if used_blocks + blocks > capacity_blocks {
                break;
            }
            let mut r = waiting.pop_front().expect("front exists");
            if r.cached == 0 && r.generated == u64::from(role == Role::Decode) {
                timings[r.arrival.id].admitted = now;
            }
            used_blocks += blocks;
            r.cached = cached;
            if n > 0 {
                batch.add_chunk(n, r.cached, r.cached + n == r.target);
                budget -= n;
                parts.push(Part::Prefill(n));
            } else {
                parts.push(Part::Idle);
            }
            running.push(r);
        }
        if batch.is_empty() {
            if running.iter().any(|r| r.decoding()) {
                // Requests admitted whole start decoding now.
                continue;
            }
            // Prompts part-prefilled fill the cache: the newest gives its blocks back. A lone
            // request that cannot go on cannot fit at all.
            if running.len() <= 1 {
                return None;
            }
            preempt_newest(&mut running, &mut waiting, &mut used_blocks);
            continue;
        }
        now += cost.iteration_time(&batch);
        let mut index = 0;
        running.retain_mut(|r| {
            let part = parts[index];
            index += 1;
            match part {
                Part::Idle => return true,
                Part::Decode => {
                    r.cached += 1;
                    r.generated += 1;
                }
                Part::Prefill(n) => {
                    r.cached += n;
                    if r.decoding() {
                        if r.generated == 0 {
                            timings[r.arrival.id].first_token = now;
                        }
                        r.generated += 1;
                    }
                }
            }
            let done =
                r.generated >= r.arrival.output || (role == Role::Prefill && r.generated >= 1);
            if done {
                timings[r.arrival.id].finished = now;
                used_blocks -= r.blocks();
            }
            !done
        });
    }
}
