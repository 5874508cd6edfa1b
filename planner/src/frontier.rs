//! The inner problem of an outer configuration: for each stage option that can still win, the
//! candidate points of every stage — a layer count and what the stage costs with it.
//!
//! Points are generated from the fewest layers upward and stop at the first that does not fit
//! in memory or whose own bound exceeds the cutoff; by the cost model's monotonicity in layers no
//! larger count could do better. Layer counts no split can complete (the other stages' largest
//! counts cannot make up the rest) are dropped too.

use tessel_symbolic::cost::{PipelineShape, StageCost};

use crate::bounds::{min_stage_layers, OptionProbe, OuterProbe};
use crate::space::StageOption;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StagePoint {
    pub layers: u64,
    pub cost: StageCost,
}

/// Candidate points of every stage under one option.
#[derive(Clone, Debug)]
pub struct OptionFrontier {
    /// Index into the outer configuration's option list.
    pub option: usize,
    /// `stages[s]`: the points of stage `s`, by increasing layer count.
    pub stages: Vec<Vec<StagePoint>>,
}

/// What the MILP solves for one outer configuration.
#[derive(Clone, Debug)]
pub struct InnerProblem {
    pub shape: PipelineShape,
    pub layers: u64,
    pub options: Vec<OptionFrontier>,
}

/// Builds the frontier of one option; `None` when no split within `cutoff` exists.
pub fn option_frontier(
    probe: &mut OuterProbe<'_>,
    option_index: usize,
    option: &StageOption,
    bounds: &OptionProbe,
    cutoff: f64,
) -> Option<OptionFrontier> {
    let pp = probe.outer.pp;
    let layers = probe.layers;
    let lmin = min_stage_layers(layers, &probe.outer);
    let lmax = layers.checked_sub((pp - 1) * lmin)?;
    let shape = probe.shape;
    let slowest_lower = bounds
        .largest_time
        .iter()
        .zip(&bounds.largest_fits)
        .filter(|(_, fits)| **fits)
        .map(|(time, _)| *time)
        .min_by(f64::total_cmp)
        .unwrap_or(0.0);
    let tolerance = cutoff.abs() * 1e-9;
    let mut stages = Vec::with_capacity(pp as usize);
    for stage in 0..pp {
        let mut points = Vec::new();
        for count in lmin..=lmax {
            let others_min = bounds.sum_lower(Some(stage as usize), layers - count, lmin, 0.0);
            let cost = probe.cost(stage, count, option);
            if !probe.fits(&cost) {
                break;
            }
            let bound = shape.sum_weight * (cost.microbatch_s + others_min)
                + shape.max_weight * cost.microbatch_s.max(slowest_lower)
                + cost.tail_s.max(bounds.tail_lower);
            if bound > cutoff + tolerance {
                break;
            }
            points.push(StagePoint {
                layers: count,
                cost,
            });
        }
        if points.is_empty() {
            return None;
        }
        stages.push(points);
    }
    // Each stage must take at least what the others' largest counts leave over.
    let largest: Vec<u64> = stages
        .iter()
        .map(|points| points.last().map_or(0, |p| p.layers))
        .collect();
    let total_largest: u64 = largest.iter().sum();
    if total_largest < layers {
        return None;
    }
    for (stage, points) in stages.iter_mut().enumerate() {
        let others = total_largest - largest[stage];
        let least = layers.saturating_sub(others);
        points.retain(|p| p.layers >= least);
        if points.is_empty() {
            return None;
        }
    }
    Some(OptionFrontier {
        option: option_index,
        stages,
    })
}

/// Whether every point of `a` is matched by a point of `b` at the same stage and layer count
/// that is no slower and has no longer tail: any split under `a` is then at least as good
/// under `b`.
fn dominated_by(a: &OptionFrontier, b: &OptionFrontier) -> bool {
    a.stages.iter().zip(&b.stages).all(|(ours, theirs)| {
        ours.iter().all(|p| {
            theirs.iter().any(|q| {
                q.layers == p.layers
                    && q.cost.microbatch_s <= p.cost.microbatch_s
                    && q.cost.tail_s <= p.cost.tail_s
            })
        })
    })
}

/// Drops options another option dominates on every stage (the Pareto filter of the shared
/// stage option). Of options that dominate each other, the first in canonical order stays.
pub fn drop_dominated(frontiers: Vec<OptionFrontier>) -> Vec<OptionFrontier> {
    let keep: Vec<bool> = frontiers
        .iter()
        .enumerate()
        .map(|(i, a)| {
            !frontiers
                .iter()
                .enumerate()
                .any(|(j, b)| j != i && dominated_by(a, b) && (j < i || !dominated_by(b, a)))
        })
        .collect();
    frontiers
        .into_iter()
        .zip(keep)
        .filter_map(|(frontier, keep)| keep.then_some(frontier))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessel_symbolic::cost::MemoryBreakdown;

    fn frontier(option: usize, times: &[(u64, f64)]) -> OptionFrontier {
        let points = times
            .iter()
            .map(|&(layers, time)| StagePoint {
                layers,
                cost: StageCost {
                    microbatch_s: time,
                    tail_s: 0.0,
                    memory: MemoryBreakdown::default(),
                },
            })
            .collect::<Vec<_>>();
        OptionFrontier {
            option,
            stages: vec![points.clone(), points],
        }
    }

    #[test]
    fn slower_options_with_no_extra_reach_are_dropped() {
        let fast = frontier(0, &[(1, 1.0), (2, 2.0)]);
        let slow = frontier(1, &[(1, 1.5), (2, 2.5)]);
        // More layers fit under the slow option (it saves memory): it stays.
        let lean = frontier(2, &[(1, 1.5), (2, 2.5), (3, 3.5)]);
        let twin = frontier(3, &[(1, 1.0), (2, 2.0)]);
        let kept: Vec<usize> = drop_dominated(vec![fast, slow, lean, twin])
            .iter()
            .map(|f| f.option)
            .collect();
        assert_eq!(kept, vec![0, 2]);
    }
}
