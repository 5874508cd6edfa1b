//! The search: screen every outer configuration with cheap bounds, then visit them best bound
//! first, evaluating their options at the even split and solving the inner MILP of those that can
//! still reach the top, until no remaining bound can.
//!
//! Determinism: candidates are visited in a fixed order (lower bound, then configuration key) in
//! fixed-size batches; the threshold used inside a batch depends only on earlier batches, and
//! every parallel map collects in input order. So the same spec gives the same plan on any number
//! of threads.

use std::collections::BTreeMap;

use rayon::prelude::*;
use tessel_grammar::{Offload, Recompute, Spec};
use tessel_symbolic::cost::StageCost;

use crate::bounds::{
    leanest_envelope, min_stage_layers, screen, OptionProbe, OuterProbe, Screening,
};
use crate::cost_model::StageCostModel;
use crate::error::PlanError;
use crate::frontier::{add_option_points, inner_problem, StagePoint};
use crate::local_search::{improve_even_split, Split};
use crate::milp::{self, Incumbent, MilpSettings};
use crate::nothing_fits::{explain, least_need, ModelFactory};
use crate::objective::RankingFactor;
use crate::plan::{SearchStats, SolverStatus};
use crate::space::{outer_configs, stage_options, OuterConfig, StageOption};

/// Outer configurations evaluated per round before the threshold is updated.
const BATCH: usize = 32;

/// Progress reported after each round of the search.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SearchProgress {
    pub screened: u64,
    pub evaluated: u64,
    pub milps_solved: u64,
    pub best_step_time_s: Option<f64>,
}

/// One outer configuration solved exactly (or as well as the solver managed).
#[derive(Clone, Debug, PartialEq)]
pub struct Solved {
    pub step_time_s: f64,
    /// What the search ranks it by: the step time times the objective's factor.
    pub ranked_s: f64,
    pub outer: OuterConfig,
    /// The recompute/offload option of every stage.
    pub options: Vec<StageOption>,
    /// Layers per stage.
    pub stages: Vec<u64>,
    pub costs: Vec<StageCost>,
    pub status: SolverStatus,
}

/// The best configurations found, best first, and what the search did.
#[derive(Clone, Debug)]
pub struct SearchResult {
    pub ranked: Vec<Solved>,
    pub stats: SearchStats,
}

struct Refined {
    outer: OuterConfig,
    options: Vec<StageOption>,
    /// Per option, its bounds and even split when every stage takes it.
    probes: Vec<OptionProbe>,
    /// Bounds when every stage takes its own option; its `lower` is the configuration's.
    mixed: OptionProbe,
    upper: Option<f64>,
    evaluations: u64,
}

/// Evaluates every option of `outer` at the even split, with its bounds, and the bounds of
/// splits that mix options across stages.
fn refine(spec: &Spec, model: &dyn StageCostModel, outer: OuterConfig) -> Refined {
    let options = stage_options(spec, &outer);
    let mut probe = OuterProbe::new(spec, model, outer);
    let lmin = min_stage_layers(spec.model.layers, &outer);
    let probes: Vec<OptionProbe> = options.iter().map(|option| probe.probe(option)).collect();
    let mixed = OptionProbe::mixed(&probes, &probe.shape, spec.model.layers, lmin);
    let upper = probes
        .iter()
        .filter_map(|p| p.even_step)
        .min_by(f64::total_cmp);
    Refined {
        outer,
        options,
        probes,
        mixed,
        upper,
        evaluations: probe.evaluations,
    }
}

struct InnerOutcome {
    solved: Option<Solved>,
    evaluations: u64,
    milp: bool,
}

impl Solved {
    /// The solution with its rank: its step time times the factor of what it offloads.
    fn ranked(mut self, ranking: &RankingFactor) -> Solved {
        self.ranked_s = self.step_time_s * ranking.of(&self.outer, offloads(&self.options));
        self
    }
}

fn total_order(a: &Solved, b: &Solved) -> std::cmp::Ordering {
    a.ranked_s
        .total_cmp(&b.ranked_s)
        .then_with(|| a.outer.cmp(&b.outer))
}

/// The configuration with only its options that offload nothing, when it has both kinds.
fn without_offload(refined: &Refined, spec: &Spec, model: &dyn StageCostModel) -> Option<Refined> {
    let keep: Vec<usize> = (0..refined.options.len())
        .filter(|&k| refined.options[k].offload.is_none())
        .collect();
    if keep.is_empty() || keep.len() == refined.options.len() {
        return None;
    }
    let probes: Vec<OptionProbe> = keep.iter().map(|&k| refined.probes[k].clone()).collect();
    let shape = OuterProbe::new(spec, model, refined.outer).shape;
    let lmin = min_stage_layers(spec.model.layers, &refined.outer);
    let mixed = OptionProbe::mixed(&probes, &shape, spec.model.layers, lmin);
    let upper = probes
        .iter()
        .filter_map(|p| p.even_step)
        .min_by(f64::total_cmp);
    Some(Refined {
        outer: refined.outer,
        options: keep.iter().map(|&k| refined.options[k]).collect(),
        probes,
        mixed,
        upper,
        evaluations: 0,
    })
}

/// Every option's even split of a refined configuration, ranked by its predicted step time.
fn even_solutions<'a>(refined: &'a Refined, spec: &Spec) -> impl Iterator<Item = Solved> + 'a {
    let even = crate::layers::even_split(
        spec.model.layers,
        refined.outer.pp,
        refined.outer.interleave,
    );
    refined
        .probes
        .iter()
        .zip(&refined.options)
        .filter_map(move |(probe, option)| {
            probe.even_step.map(|step| Solved {
                step_time_s: step,
                ranked_s: step,
                outer: refined.outer,
                options: vec![*option; even.len()],
                stages: even.clone(),
                costs: probe.even.clone(),
                status: SolverStatus::Enumerated,
            })
        })
}

/// The best even split of a refined configuration with one option on every stage (the optimum
/// when there is one stage).
fn even_solution(refined: &Refined, spec: &Spec) -> Option<Solved> {
    even_solutions(refined, spec).min_by(total_order)
}

/// The even split that ranks best by `ranking`: its rank is the configuration's ranked upper
/// bound, so what the search counts as known is always achieved.
fn even_solution_ranked(refined: &Refined, spec: &Spec, ranking: &RankingFactor) -> Option<Solved> {
    even_solutions(refined, spec)
        .map(|s| s.ranked(ranking))
        .min_by(total_order)
}

fn solve_inner(
    spec: &Spec,
    model: &dyn StageCostModel,
    refined: &Refined,
    cutoff: f64,
    settings: &MilpSettings,
) -> InnerOutcome {
    if refined.outer.pp == 1 {
        return InnerOutcome {
            solved: even_solution(refined, spec).filter(|s| s.step_time_s <= cutoff),
            evaluations: 0,
            milp: false,
        };
    }
    let mut probe = OuterProbe::new(spec, model, refined.outer);
    let tolerance = |cutoff: f64| cutoff.abs() * 1e-9;
    // Whether option `k` on every stage can still beat `cutoff` by its own bound.
    let alive = |k: usize, cutoff: f64| {
        refined.probes[k]
            .lower
            .is_some_and(|lower| lower <= cutoff + tolerance(cutoff))
    };
    // The best split with one option everywhere seeds the solver and tightens the cutoff; only
    // options whose own bound can beat the cutoff are worth the local search.
    let mut incumbent: Option<(usize, Split)> = None;
    for (k, option) in refined.options.iter().enumerate() {
        if !alive(k, cutoff) {
            continue;
        }
        if let Some(split) = improve_even_split(&mut probe, option, &refined.probes[k].even) {
            if incumbent
                .as_ref()
                .is_none_or(|(_, best)| split.step < best.step)
            {
                incumbent = Some((k, split));
            }
        }
    }
    let mut cutoff = incumbent
        .as_ref()
        .map_or(cutoff, |(_, split)| split.step.min(cutoff));
    // A framework that applies one recompute and offload to every stage gets one MILP per
    // option (only the split is free); Tessel's runtime gets one over every option per stage.
    let groups: Vec<Vec<usize>> = if spec.train.framework.capabilities().per_stage_options {
        vec![(0..refined.options.len()).collect()]
    } else {
        (0..refined.options.len())
            .filter(|&k| alive(k, cutoff))
            .map(|k| vec![k])
            .collect()
    };
    let mut best: Option<Solved> = None;
    let mut milp_solved = false;
    for group in groups {
        let mut points = vec![Vec::new(); refined.outer.pp as usize];
        for &k in &group {
            let bounds = match group.len() {
                1 => &refined.probes[k],
                _ => &refined.mixed,
            };
            add_option_points(
                &mut probe,
                k,
                &refined.options[k],
                bounds,
                cutoff,
                &mut points,
            );
        }
        let Some(problem) = inner_problem(probe.shape, spec.model.layers, points) else {
            continue;
        };
        milp_solved = true;
        let seed = incumbent
            .as_ref()
            .filter(|(k, _)| group.contains(k))
            .and_then(|(k, split)| {
                let points = problem
                    .stages
                    .iter()
                    .zip(&split.layers)
                    .map(|(points, &layers)| seed_point(points, layers, *k))
                    .collect::<Option<Vec<usize>>>()?;
                Some(Incumbent { points })
            });
        let solved = match milp::solve(&problem, settings, seed.as_ref()) {
            Ok(solution) => {
                let points: Vec<StagePoint> = problem
                    .stages
                    .iter()
                    .zip(&solution.points)
                    .map(|(points, &index)| points[index])
                    .collect();
                let costs: Vec<StageCost> = points.iter().map(|p| p.cost).collect();
                let step_time_s = problem.shape.step_time(&costs);
                Some(Solved {
                    step_time_s,
                    ranked_s: step_time_s,
                    outer: refined.outer,
                    options: points.iter().map(|p| refined.options[p.option]).collect(),
                    stages: points.iter().map(|p| p.layers).collect(),
                    costs,
                    status: solution.status,
                })
            }
            Err(milp::MilpFailure::Infeasible) => None,
            Err(milp::MilpFailure::Solver(_)) => even_solution(refined, spec).map(|s| Solved {
                status: SolverStatus::EvenSplit,
                ..s
            }),
        };
        if let Some(solved) = solved.filter(|s| s.step_time_s <= cutoff + tolerance(cutoff)) {
            cutoff = cutoff.min(solved.step_time_s);
            if best
                .as_ref()
                .is_none_or(|b| total_order(&solved, b).is_lt())
            {
                best = Some(solved);
            }
        }
    }
    InnerOutcome {
        solved: best,
        evaluations: probe.evaluations,
        milp: milp_solved,
    }
}

/// The point of a stage that stands in for the incumbent's `layers` under option `option`: that
/// point, or the one that beat it on the per-stage frontier.
fn seed_point(points: &[StagePoint], layers: u64, option: usize) -> Option<usize> {
    let same_layers = || {
        points
            .iter()
            .enumerate()
            .filter(|(_, p)| p.layers == layers)
    };
    same_layers()
        .find(|(_, p)| p.option == option)
        .or_else(|| {
            same_layers().min_by(|(_, a), (_, b)| {
                (a.cost.microbatch_s + a.cost.tail_s)
                    .total_cmp(&(b.cost.microbatch_s + b.cost.tail_s))
            })
        })
        .map(|(index, _)| index)
}

/// Relative slack of a bound against the threshold it is compared with.
const BOUND_TOLERANCE: f64 = 1e-9;

/// The rank a configuration must reach to stay in the search: the `keep`-th best known, or,
/// when higher, the best known raised by the ranking's near-tie margin, so that every
/// configuration tied with the best is found whatever `keep` is.
fn threshold(known: &BTreeMap<OuterConfig, f64>, keep: usize, ranking: &RankingFactor) -> f64 {
    let mut values: Vec<f64> = known.values().copied().collect();
    values.sort_by(f64::total_cmp);
    let kept = values.get(keep - 1).copied().unwrap_or(f64::INFINITY);
    values
        .first()
        .map_or(kept, |&best| kept.max(ranking.tie_limit(best)))
}

/// Whether any stage offloads to the host, which decides a configuration's ranking factor.
fn offloads(options: &[StageOption]) -> bool {
    options.iter().any(|o| !o.offload.is_none())
}

/// Searches the spec's space for the `keep` best configurations by the objective `ranking`
/// stands for, and every configuration tied with the best within its near-tie margin. Bounds
/// and thresholds are in ranked seconds (a configuration's bound times the least factor any of
/// its options can have); each configuration's own split and options are solved in predicted
/// seconds, and ranked by the factor of what it chose.
pub fn search(
    spec: &Spec,
    model: &dyn StageCostModel,
    ranking: &RankingFactor,
    keep: usize,
    settings: &MilpSettings,
    progress: Option<&(dyn Fn(&SearchProgress) + Sync)>,
    factory: Option<ModelFactory<'_>>,
) -> Result<SearchResult, PlanError> {
    let keep = keep.max(1);
    let (mut configs, counts) = outer_configs(spec);
    let unplaced = configs.len();
    configs.retain(|outer| {
        model.places(&outer.strategy("candidate", Recompute::None, Offload::default(), None))
    });
    let unplaced = (unplaced - configs.len()) as u64;
    let mut stats = SearchStats {
        candidates_enumerated: counts.enumerated,
        rejected_divisibility: counts.rejected_divisibility + unplaced,
        rejected_framework: counts.rejected_framework,
        ..SearchStats::default()
    };
    if configs.is_empty() {
        return Err(PlanError::EmptySearchSpace {
            reason: format!(
                "no combination of the candidate degrees divides {} GPUs, {} layers and a global batch of {}",
                spec.cluster.total_gpus(),
                spec.model.layers,
                spec.train.global_batch
            ),
        });
    }
    let screenings: Vec<Screening> = configs
        .par_iter()
        .map(|outer| screen(spec, model, *outer, &stage_options(spec, outer)))
        .collect();
    stats.screened = screenings.len() as u64;
    stats.stage_evaluations = screenings.iter().map(|s| s.evaluations).sum();
    let mut candidates: Vec<(f64, OuterConfig)> = screenings
        .iter()
        .filter_map(|s| {
            s.lower
                .map(|lower| (lower * ranking.least(&s.outer), s.outer))
        })
        .collect();
    stats.pruned_memory = stats.screened - candidates.len() as u64;
    candidates.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));

    let mut known: BTreeMap<OuterConfig, f64> = BTreeMap::new();
    let mut solved: Vec<Solved> = Vec::new();
    let mut next = 0;
    while next < candidates.len() {
        let bound = threshold(&known, keep, ranking);
        let end = candidates[next..]
            .iter()
            .take(BATCH)
            .take_while(|(lower, _)| *lower <= bound)
            .count()
            + next;
        if end == next {
            break;
        }
        let refined: Vec<Refined> = candidates[next..end]
            .par_iter()
            .map(|(_, outer)| refine(spec, model, *outer))
            .collect();
        next = end;
        stats.evaluated += refined.len() as u64;
        stats.stage_evaluations += refined.iter().map(|r| r.evaluations).sum::<u64>();
        // Each configuration's best-ranked even split: its ranked upper bound now, and its
        // fallback once solved.
        let evens: Vec<Option<Solved>> = refined
            .iter()
            .map(|r| even_solution_ranked(r, spec, ranking))
            .collect();
        for even in evens.iter().flatten() {
            known.insert(even.outer, even.ranked_s);
        }
        let bound = threshold(&known, keep, ranking);
        let outcomes: Vec<Option<InnerOutcome>> = refined
            .par_iter()
            .map(|r| {
                let least = ranking.least(&r.outer);
                let lower = r.mixed.lower?;
                // A one-stage configuration's bound is its step time, so it may equal the
                // threshold it sets, up to rounding: only a bound clearly above it prunes.
                if lower * least > bound * (1.0 + BOUND_TOLERANCE) {
                    return None;
                }
                let cutoff = r
                    .upper
                    .map_or(bound / least, |upper| upper.min(bound / least));
                let mut outcome = solve_inner(spec, model, r, cutoff, settings);
                // The split is solved in predicted seconds: when offloading ranks worse than
                // not, the best split that offloads nothing is solved too.
                let plain_factor = ranking.of(&r.outer, false);
                let offload_ranks_worse = ranking.of(&r.outer, true) > plain_factor;
                let offloads_now = outcome
                    .solved
                    .as_ref()
                    .is_some_and(|s| offloads(&s.options));
                if let (true, true, Some(plain)) = (
                    offload_ranks_worse,
                    offloads_now,
                    without_offload(r, spec, model),
                ) {
                    let limit = bound / plain_factor;
                    let cutoff = plain.upper.map_or(limit, |upper| upper.min(limit));
                    let other = solve_inner(spec, model, &plain, cutoff, settings);
                    outcome.evaluations += other.evaluations;
                    outcome.milp |= other.milp;
                    if let Some(found) = other.solved.map(|s| s.ranked(ranking)) {
                        let current = outcome.solved.take().map(|s| s.ranked(ranking));
                        outcome.solved = Some(match current {
                            Some(s) if s.ranked_s <= found.ranked_s => s,
                            _ => found,
                        });
                    }
                }
                Some(outcome)
            })
            .collect();
        for ((r, outcome), even) in refined.iter().zip(outcomes).zip(evens) {
            let Some(outcome) = outcome else {
                if r.mixed.lower.is_none() {
                    stats.pruned_memory += 1;
                } else {
                    stats.pruned_bound += 1;
                }
                continue;
            };
            stats.stage_evaluations += outcome.evaluations;
            stats.milps_solved += u64::from(outcome.milp);
            // The split is solved in predicted seconds; an even split with another option may
            // rank better, and stands in when the solver finds nothing under its cutoff, so
            // that every upper bound counted in `known` belongs to a solution kept here.
            let best = match outcome.solved.map(|s| s.ranked(ranking)) {
                Some(s) => Some(match even {
                    Some(e) if e.ranked_s < s.ranked_s => e,
                    _ => s,
                }),
                None => even.filter(|e| e.ranked_s <= bound),
            };
            match best.filter(|s| s.ranked_s.is_finite()) {
                Some(s) => {
                    known.insert(r.outer, s.ranked_s);
                    solved.push(s);
                }
                None => {
                    known.remove(&r.outer);
                    stats.pruned_bound += 1;
                }
            }
        }
        if let Some(report) = progress {
            report(&SearchProgress {
                screened: stats.screened,
                evaluated: stats.evaluated,
                milps_solved: stats.milps_solved,
                best_step_time_s: solved.iter().map(|s| s.step_time_s).min_by(f64::total_cmp),
            });
        }
    }
    stats.pruned_bound += (candidates.len() - next) as u64;
    solved.sort_by(total_order);
    let tied = solved.first().map_or(0, |best| {
        let limit = ranking.tie_limit(best.ranked_s);
        solved.iter().take_while(|s| s.ranked_s <= limit).count()
    });
    solved.truncate(keep.max(tied));
    if solved.is_empty() {
        let least = least_need(spec, model).ok_or_else(|| PlanError::EmptySearchSpace {
            reason: "no configuration to screen".to_string(),
        })?;
        let lean = leanest_envelope(&stage_options(spec, &least.outer));
        return Err(PlanError::NothingFits {
            explanation: Box::new(explain(spec, model, &least, &lean, factory)),
        });
    }
    Ok(SearchResult {
        ranked: solved,
        stats,
    })
}
