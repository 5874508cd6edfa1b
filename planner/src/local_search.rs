//! A quick feasible split better than the even one: starting from the even split, repeatedly
//! move one layer off the slowest stage (or the one with the longest tail) to whichever stage
//! improves the step time most, until no move helps. Its step time tightens the cutoff of the
//! inner problem and seeds the MILP with an incumbent.

use tessel_symbolic::cost::StageCost;

use crate::bounds::{min_stage_layers, OuterProbe};
use crate::space::StageOption;

/// A feasible split and its step time.
#[derive(Clone, Debug)]
pub struct Split {
    pub layers: Vec<u64>,
    pub step: f64,
}

/// Improves the even split of `option`; `None` when the even split does not fit.
pub fn improve_even_split(
    probe: &mut OuterProbe<'_>,
    option: &StageOption,
    even_costs: &[StageCost],
) -> Option<Split> {
    if !(0..).zip(even_costs).all(|(stage, c)| probe.fits(stage, c)) {
        return None;
    }
    let pp = probe.outer.pp as usize;
    let lmin = min_stage_layers(probe.layers, &probe.outer);
    let mut layers = probe.even.clone();
    let mut costs = even_costs.to_vec();
    let mut step = probe.shape.step_time(&costs);
    // Each move lowers the step time strictly, and a split has finitely many layouts; the cap
    // only guards against cost models that are not deterministic.
    for _ in 0..probe.layers * pp as u64 {
        let slowest = argmax(&costs, |c| c.microbatch_s);
        let longest_tail = argmax(&costs, |c| c.tail_s);
        let mut best: Option<(f64, usize, usize, StageCost, StageCost)> = None;
        for from in [slowest, longest_tail] {
            if layers[from] <= lmin {
                continue;
            }
            let lighter = probe.cost(from as u64, layers[from] - 1, option);
            for to in 0..pp {
                if to == from {
                    continue;
                }
                let heavier = probe.cost(to as u64, layers[to] + 1, option);
                if !probe.fits(to as u64, &heavier) {
                    continue;
                }
                let mut trial = costs.clone();
                trial[from] = lighter;
                trial[to] = heavier;
                let candidate = probe.shape.step_time(&trial);
                if candidate < step && best.as_ref().is_none_or(|b| candidate < b.0) {
                    best = Some((candidate, from, to, lighter, heavier));
                }
            }
            if longest_tail == slowest {
                break;
            }
        }
        let Some((candidate, from, to, lighter, heavier)) = best else {
            break;
        };
        step = candidate;
        layers[from] -= 1;
        layers[to] += 1;
        costs[from] = lighter;
        costs[to] = heavier;
    }
    Some(Split { layers, step })
}

/// Index of the largest value, the first on ties.
fn argmax(costs: &[StageCost], key: impl Fn(&StageCost) -> f64) -> usize {
    let mut best = 0;
    for (i, cost) in costs.iter().enumerate() {
        if key(cost) > key(&costs[best]) {
            best = i;
        }
    }
    best
}
