//! The inner problem of an outer configuration: for every stage, the candidate points — a layer
//! count, a stage option, and what the stage costs with them — from which the MILP picks one per
//! stage. Each stage chooses its own option (the first stages of a 1F1B pipeline hold more
//! micro-batches in flight and may need recompute that later stages do not).
//!
//! Points are generated per option from the fewest layers upward and stop at the first that does
//! not fit in memory or whose own bound exceeds the cutoff; by the cost model's monotonicity in
//! layers no larger count could do better. Of the points of one stage and layer count, only those
//! no other option beats on both time and tail are kept (the per-stage Pareto frontier; memory
//! is a constraint already met by every point). Layer counts no split can complete (the other
//! stages' largest counts cannot make up the rest) are dropped too.

use tessel_symbolic::cost::{PipelineShape, StageCost};

use crate::bounds::{min_stage_layers, OptionProbe, OuterProbe};
use crate::space::StageOption;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StagePoint {
    pub layers: u64,
    /// Index into the outer configuration's option list.
    pub option: usize,
    pub cost: StageCost,
}

/// What the MILP solves for one outer configuration.
#[derive(Clone, Debug)]
pub struct InnerProblem {
    pub shape: PipelineShape,
    pub layers: u64,
    /// `stages[s]`: the points of stage `s`, by layer count then option.
    pub stages: Vec<Vec<StagePoint>>,
}

/// The points of every stage under one option (a stage may have none), appended to `stages`.
/// `bounds` must hold for any choice of options per stage ([`OptionProbe::mixed`]).
pub fn add_option_points(
    probe: &mut OuterProbe<'_>,
    option_index: usize,
    option: &StageOption,
    bounds: &OptionProbe,
    cutoff: f64,
    stages: &mut [Vec<StagePoint>],
) {
    let pp = probe.outer.pp;
    let layers = probe.layers;
    let lmin = min_stage_layers(layers, &probe.outer);
    let Some(lmax) = layers.checked_sub((pp - 1) * lmin) else {
        return;
    };
    let shape = probe.shape;
    let slowest_lower = bounds
        .largest_time
        .iter()
        .zip(&bounds.largest_fits)
        .filter(|(_, fits)| **fits)
        .map(|(time, _)| *time)
        .min_by(f64::total_cmp)
        .unwrap_or(0.0)
        .max(bounds.balanced_lower(layers, lmin));
    let tolerance = cutoff.abs() * 1e-9;
    for (stage, points) in stages.iter_mut().enumerate() {
        for count in lmin..=lmax {
            // Not `fits` below: that ends the sweep, and a larger count may run where this
            // one does not.
            if !probe.runs(count, option) {
                continue;
            }
            let others_min = bounds.sum_lower(Some(stage), layers - count, lmin, 0.0);
            let cost = probe.cost(stage as u64, count, option);
            if !probe.fits(stage as u64, &cost) {
                break;
            }
            // What the stage's own time bounds grows with its layers and ends the sweep; the
            // other stages' part shrinks as this stage takes more of the layers (faster when
            // they are slower per layer, as on another pool's GPUs), so it only skips a count.
            let own = shape.sum_weight * cost.microbatch_s
                + shape.max_weight * cost.microbatch_s.max(slowest_lower)
                + cost.tail_s.max(bounds.tail_lower);
            if own > cutoff + tolerance {
                break;
            }
            if own + shape.sum_weight * others_min > cutoff + tolerance {
                continue;
            }
            points.push(StagePoint {
                layers: count,
                option: option_index,
                cost,
            });
        }
    }
}

/// Keeps, per stage and layer count, the points no other point beats on both time and tail (of
/// equal points, the first option), then drops layer counts no split can complete; `None` when
/// some stage is left without a point or the stages cannot hold every layer.
pub fn inner_problem(
    shape: PipelineShape,
    layers: u64,
    stages: Vec<Vec<StagePoint>>,
) -> Option<InnerProblem> {
    let mut stages: Vec<Vec<StagePoint>> = stages.into_iter().map(pareto_points).collect();
    let largest: Vec<u64> = stages
        .iter()
        .map(|points| points.iter().map(|p| p.layers).max().unwrap_or(0))
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
    Some(InnerProblem {
        shape,
        layers,
        stages,
    })
}

/// Whether `q` is at least as good as `p` for any split: no slower and no longer tail.
fn no_worse(q: &StagePoint, p: &StagePoint) -> bool {
    q.cost.microbatch_s <= p.cost.microbatch_s && q.cost.tail_s <= p.cost.tail_s
}

fn pareto_points(mut points: Vec<StagePoint>) -> Vec<StagePoint> {
    points.sort_by(|a, b| a.layers.cmp(&b.layers).then(a.option.cmp(&b.option)));
    let keep: Vec<bool> = points
        .iter()
        .enumerate()
        .map(|(i, p)| {
            !points.iter().enumerate().any(|(j, q)| {
                j != i && q.layers == p.layers && no_worse(q, p) && (j < i || !no_worse(p, q))
            })
        })
        .collect();
    points
        .into_iter()
        .zip(keep)
        .filter_map(|(point, keep)| keep.then_some(point))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessel_symbolic::cost::MemoryBreakdown;

    fn point(layers: u64, option: usize, time: f64, tail: f64) -> StagePoint {
        StagePoint {
            layers,
            option,
            cost: StageCost {
                microbatch_s: time,
                tail_s: tail,
                memory: MemoryBreakdown::default(),
            },
        }
    }

    #[test]
    fn per_layer_count_only_the_pareto_points_stay() {
        let points = vec![
            point(1, 0, 1.0, 0.0),
            point(1, 1, 1.5, 0.0),
            // Slower, but a shorter tail: it stays.
            point(1, 2, 1.5, -1.0),
            // A twin of option 0: the first option stays.
            point(1, 3, 1.0, 0.0),
            // Only option 1 fits two layers: it stays.
            point(2, 1, 2.5, 0.0),
        ];
        let kept: Vec<(u64, usize)> = pareto_points(points)
            .iter()
            .map(|p| (p.layers, p.option))
            .collect();
        assert_eq!(kept, vec![(1, 0), (1, 2), (2, 1)]);
    }

    #[test]
    fn counts_no_split_completes_are_dropped() {
        let shape = PipelineShape {
            sum_weight: 1.0,
            max_weight: 1.0,
        };
        let first = vec![point(1, 0, 1.0, 0.0), point(2, 0, 2.0, 0.0)];
        let second = vec![
            point(1, 1, 1.0, 0.0),
            point(2, 1, 2.0, 0.0),
            point(3, 1, 3.0, 0.0),
        ];
        let problem = inner_problem(shape, 5, vec![first.clone(), second.clone()]).unwrap();
        // Five layers: the first stage's 2 needs the second's 3, and the reverse.
        let counts: Vec<Vec<u64>> = problem
            .stages
            .iter()
            .map(|points| points.iter().map(|p| p.layers).collect())
            .collect();
        assert_eq!(counts, vec![vec![2], vec![3]]);
        assert!(inner_problem(shape, 6, vec![first, second]).is_none());
    }
}
