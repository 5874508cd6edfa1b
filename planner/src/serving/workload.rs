//! The requests a simulation replays: Poisson arrivals at the workload's rate with lengths
//! drawn from its distributions, or a trace's requests with their arrivals rescaled to the
//! rate. Seeded, and drawn with an in-house generator so that a seed gives the same requests
//! on every machine.

use tessel_grammar::{LengthDistribution, LengthShape, ModelSpec, Request, Workload};

pub use tessel_symbolic::SplitMix64;

/// The longest context the model serves: its `max_seq_len`, else unbounded.
fn context_limit(model: &ModelSpec) -> u64 {
    model.max_seq_len.unwrap_or(u64::MAX)
}

fn draw(lengths: &LengthDistribution, rng: &mut SplitMix64) -> u64 {
    let n = match lengths.shape {
        LengthShape::Fixed => lengths.mean.round(),
        LengthShape::Uniform => 1.0 + (rng.unit() * (2.0 * lengths.mean - 1.0)).floor(),
        LengthShape::Exponential => (rng.exponential() * lengths.mean).ceil(),
    };
    (n.max(1.0) as u64).min(lengths.max.unwrap_or(u64::MAX))
}

/// Fits a request into the model's context: the prompt leaves room for one output token, the
/// output for the rest (an engine rejects longer prompts and stops at the context's end).
fn fit_context(prompt: u64, output: u64, limit: u64) -> (u64, u64) {
    let prompt = prompt.min(limit.saturating_sub(1)).max(1);
    let output = output.min(limit.saturating_sub(prompt)).max(1);
    (prompt, output)
}

/// The next arrival time of a Poisson process at `rate` per second, the first at 0, each gap
/// drawn from `rng`.
pub fn poisson_arrivals() -> impl FnMut(&mut SplitMix64, f64) -> f64 {
    let mut next: Option<f64> = None;
    move |rng, rate| {
        let now = next.map_or(0.0, |last| last + rng.exponential() / rate);
        next = Some(now);
        now
    }
}

/// `count` requests of the workload's distributions arriving as a Poisson process at `rate`.
pub fn synthetic_requests(
    workload: &Workload,
    model: &ModelSpec,
    rate: f64,
    count: u64,
) -> Vec<Request> {
    let mut rng = SplitMix64::new(workload.seed);
    let limit = context_limit(model);
    let mut arrival = poisson_arrivals();
    (0..count)
        .map(|_| {
            let now = arrival(&mut rng, rate);
            let (prompt, output) = fit_context(
                draw(&workload.prompt, &mut rng),
                draw(&workload.output, &mut rng),
                limit,
            );
            Request {
                arrival: now,
                prompt,
                output,
            }
        })
        .collect()
}

/// A trace's requests (sorted by arrival, first at 0) rescaled to arrive at `rate` on
/// average, at most `count` of them, cut to the model's context.
pub fn rescaled_trace(trace: &[Request], model: &ModelSpec, rate: f64, count: u64) -> Vec<Request> {
    let taken = &trace[..trace.len().min(count as usize)];
    let limit = context_limit(model);
    let span = taken.last().map_or(0.0, |r| r.arrival);
    // n requests over `span` seconds arrive at (n − 1)/span; a trace of simultaneous requests
    // keeps them simultaneous.
    let scale = if span > 0.0 && taken.len() > 1 {
        (taken.len() - 1) as f64 / span / rate
    } else {
        1.0
    };
    taken
        .iter()
        .map(|r| {
            let (prompt, output) = fit_context(r.prompt, r.output, limit);
            Request {
                arrival: r.arrival * scale,
                prompt,
                output,
            }
        })
        .collect()
}

/// The mean rate of a trace's arrivals, requests per second.
pub fn trace_rate(trace: &[Request]) -> Option<f64> {
    let span = trace.last()?.arrival;
    (span > 0.0 && trace.len() > 1).then(|| (trace.len() - 1) as f64 / span)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_the_reference_sequence() {
        // The first outputs for seed 1234567 from the paper's reference implementation.
        let mut rng = SplitMix64::new(1234567);
        assert_eq!(rng.next_u64(), 6457827717110365317);
        assert_eq!(rng.next_u64(), 3203168211198807973);
    }

    #[test]
    fn context_cuts_prompt_and_output() {
        assert_eq!(fit_context(9000, 100, 8192), (8191, 1));
        assert_eq!(fit_context(8000, 500, 8192), (8000, 192));
        assert_eq!(fit_context(100, 50, 8192), (100, 50));
    }
}
