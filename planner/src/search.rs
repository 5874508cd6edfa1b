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
use crate::frontier::{drop_dominated, option_frontier, InnerProblem, OptionFrontier};
use crate::local_search::{improve_even_split, Split};
use crate::milp::{self, Incumbent, MilpSettings};
use crate::nothing_fits::{explain, least_need, ModelFactory};
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
    pub outer: OuterConfig,
    pub option: StageOption,
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
    probes: Vec<OptionProbe>,
    lower: Option<f64>,
    upper: Option<f64>,
    evaluations: u64,
}

/// Evaluates every option of `outer` at the even split, with its bounds. Options sharing a
/// recompute choice are first bounded together — time from the one without offload, memory
/// from the largest offload fractions among them — and skipped when that bound already exceeds
/// `threshold` (the top-`K+1` threshold of earlier rounds): none of them can enter the top.
fn refine(spec: &Spec, model: &dyn StageCostModel, outer: OuterConfig, threshold: f64) -> Refined {
    let options = stage_options(spec, &outer);
    let mut probe = OuterProbe::new(spec, model, outer);
    let lmin = min_stage_layers(spec.model.layers, &outer);
    let mut probes: Vec<Option<OptionProbe>> = options.iter().map(|_| None).collect();
    let mut groups: Vec<(Recompute, Vec<usize>)> = Vec::new();
    for (k, option) in options.iter().enumerate() {
        match groups.iter_mut().find(|(r, _)| *r == option.recompute) {
            Some((_, members)) => members.push(k),
            None => groups.push((option.recompute, vec![k])),
        }
    }
    for (recompute, members) in &groups {
        if members.len() > 1 && threshold.is_finite() {
            let group: Vec<StageOption> = members.iter().map(|&k| options[k]).collect();
            let fastest = StageOption {
                recompute: *recompute,
                offload: Offload::default(),
            };
            let leanest = StageOption {
                recompute: *recompute,
                offload: leanest_envelope(&group).offload,
            };
            let fast = probe.probe(&fastest);
            let lean = probe.probe_with(&leanest, false, false);
            for &k in members {
                if options[k] == fastest {
                    probes[k] = Some(fast.clone());
                }
            }
            let bound = fast.step_lower(
                &probe.shape,
                &lean.largest_fits,
                lean.minimum_fits,
                spec.model.layers,
                lmin,
            );
            if bound.is_none_or(|b| b > threshold + threshold.abs() * 1e-9) {
                continue;
            }
        }
        for &k in members {
            if probes[k].is_none() {
                probes[k] = Some(probe.probe(&options[k]));
            }
        }
    }
    let probes: Vec<OptionProbe> = probes
        .into_iter()
        .map(|p| p.unwrap_or_else(OptionProbe::skipped))
        .collect();
    let lower = probes.iter().filter_map(|p| p.lower).min_by(f64::total_cmp);
    let upper = probes
        .iter()
        .filter_map(|p| p.even_step)
        .min_by(f64::total_cmp);
    Refined {
        outer,
        options,
        probes,
        lower,
        upper,
        evaluations: probe.evaluations,
    }
}

struct InnerOutcome {
    solved: Option<Solved>,
    evaluations: u64,
    milp: bool,
}

fn total_order(a: &Solved, b: &Solved) -> std::cmp::Ordering {
    a.step_time_s
        .total_cmp(&b.step_time_s)
        .then_with(|| a.outer.cmp(&b.outer))
}

/// The best even split of a refined configuration.
fn even_solution(refined: &Refined, spec: &Spec) -> Option<Solved> {
    let even = crate::layers::even_split(
        spec.model.layers,
        refined.outer.pp,
        refined.outer.interleave,
    );
    refined
        .probes
        .iter()
        .zip(&refined.options)
        .filter_map(|(probe, option)| {
            probe.even_step.map(|step| Solved {
                step_time_s: step,
                outer: refined.outer,
                option: *option,
                stages: even.clone(),
                costs: probe.even.clone(),
                status: SolverStatus::Enumerated,
            })
        })
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
    let alive = |cutoff: f64, k: usize| {
        refined.probes[k]
            .lower
            .is_some_and(|lower| lower <= cutoff + tolerance(cutoff))
    };
    let mut incumbent: Option<(usize, Split)> = None;
    for (k, option) in refined.options.iter().enumerate() {
        if !alive(cutoff, k) {
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
    let cutoff = incumbent
        .as_ref()
        .map_or(cutoff, |(_, split)| split.step.min(cutoff));
    let frontiers: Vec<OptionFrontier> = refined
        .options
        .iter()
        .enumerate()
        .filter(|(k, _)| alive(cutoff, *k))
        .filter_map(|(k, option)| {
            option_frontier(&mut probe, k, option, &refined.probes[k], cutoff)
        })
        .collect();
    let frontiers = drop_dominated(frontiers);
    if frontiers.is_empty() {
        return InnerOutcome {
            solved: None,
            evaluations: probe.evaluations,
            milp: false,
        };
    }
    let problem = InnerProblem {
        shape: probe.shape,
        layers: spec.model.layers,
        options: frontiers,
    };
    let seed = incumbent.as_ref().and_then(|(k, split)| {
        let option = problem.options.iter().position(|f| f.option == *k)?;
        Some(Incumbent {
            option,
            layers: split.layers.clone(),
        })
    });
    let solved = match milp::solve(&problem, settings, seed.as_ref()) {
        Ok(solution) => {
            let frontier = &problem.options[solution.option];
            let points: Vec<_> = frontier
                .stages
                .iter()
                .zip(&solution.points)
                .map(|(points, &index)| points[index])
                .collect();
            let costs: Vec<StageCost> = points.iter().map(|p| p.cost).collect();
            Some(Solved {
                step_time_s: problem.shape.step_time(&costs),
                outer: refined.outer,
                option: refined.options[frontier.option],
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
    InnerOutcome {
        solved: solved.filter(|s| s.step_time_s <= cutoff + tolerance(cutoff)),
        evaluations: probe.evaluations,
        milp: true,
    }
}

/// The `keep`-th smallest value, or infinity when there are fewer.
fn threshold(known: &BTreeMap<OuterConfig, f64>, keep: usize) -> f64 {
    let mut values: Vec<f64> = known.values().copied().collect();
    values.sort_by(f64::total_cmp);
    values.get(keep - 1).copied().unwrap_or(f64::INFINITY)
}

/// Searches the spec's space for the `keep` best configurations.
pub fn search(
    spec: &Spec,
    model: &dyn StageCostModel,
    keep: usize,
    settings: &MilpSettings,
    progress: Option<&(dyn Fn(&SearchProgress) + Sync)>,
    factory: Option<ModelFactory<'_>>,
) -> Result<SearchResult, PlanError> {
    let keep = keep.max(1);
    let (configs, counts) = outer_configs(spec);
    let mut stats = SearchStats {
        candidates_enumerated: counts.enumerated,
        rejected_divisibility: counts.rejected_divisibility,
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
        .filter_map(|s| s.lower.map(|lower| (lower, s.outer)))
        .collect();
    stats.pruned_memory = stats.screened - candidates.len() as u64;
    candidates.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));

    let mut known: BTreeMap<OuterConfig, f64> = BTreeMap::new();
    let mut solved: Vec<Solved> = Vec::new();
    let mut next = 0;
    while next < candidates.len() {
        let bound = threshold(&known, keep);
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
            .map(|(_, outer)| refine(spec, model, *outer, bound))
            .collect();
        next = end;
        stats.evaluated += refined.len() as u64;
        stats.stage_evaluations += refined.iter().map(|r| r.evaluations).sum::<u64>();
        for r in &refined {
            if let Some(upper) = r.upper {
                known.insert(r.outer, upper);
            }
        }
        let bound = threshold(&known, keep);
        let outcomes: Vec<Option<InnerOutcome>> = refined
            .par_iter()
            .map(|r| {
                let lower = r.lower?;
                if lower > bound {
                    return None;
                }
                let cutoff = r.upper.map_or(bound, |upper| upper.min(bound));
                Some(solve_inner(spec, model, r, cutoff, settings))
            })
            .collect();
        for (r, outcome) in refined.iter().zip(outcomes) {
            let Some(outcome) = outcome else {
                if r.lower.is_none() {
                    stats.pruned_memory += 1;
                } else {
                    stats.pruned_bound += 1;
                }
                continue;
            };
            stats.stage_evaluations += outcome.evaluations;
            stats.milps_solved += u64::from(outcome.milp);
            match outcome.solved {
                Some(s) => {
                    known.insert(r.outer, s.step_time_s);
                    solved.push(s);
                }
                None => stats.pruned_bound += 1,
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
    solved.truncate(keep);
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
