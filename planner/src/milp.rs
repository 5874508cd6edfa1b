//! The MILP that picks the layers of every stage and the stage option of an outer configuration.
//! This is the only module that sees good_lp and HiGHS.
//!
//! Variables: `y_k ∈ {0,1}` per option `k`; `x_{s,p,k} ∈ {0,1}` per candidate point `p` (a layer
//! count and its cost) of stage `s` under option `k`; `T ≥ 0` the slowest stage's micro-batch
//! time; `R ≥ 0` the largest tail. Minimise
//! `sum_weight · Σ t_{s,p,k}·x + max_weight · T + R` subject to
//! `Σ_k y_k = 1`; `Σ_p x_{s,p,k} = y_k` for every stage and option; `Σ layers·x = L`;
//! `T ≥ Σ_{p,k} t·x` and `R ≥ Σ_{p,k} tail·x` for every stage. Memory is not a row: points that
//! do not fit were never generated.

use std::sync::Mutex;

use good_lp::solvers::highs::highs;
use good_lp::{
    variable, Expression, ProblemVariables, ResolutionError, Solution, SolutionStatus, SolverModel,
    Variable, WithInitialSolution,
};

use crate::frontier::InnerProblem;
use crate::plan::SolverStatus;

/// Solver settings. Solves are single-threaded with a fixed seed, so results do not depend on the
/// machine's load.
#[derive(Clone, Copy, Debug)]
pub struct MilpSettings {
    pub time_limit_s: f64,
    pub relative_gap: f64,
}

impl Default for MilpSettings {
    fn default() -> Self {
        MilpSettings {
            time_limit_s: 10.0,
            relative_gap: 1e-7,
        }
    }
}

/// The MILP's choice.
#[derive(Clone, Debug, PartialEq)]
pub struct InnerSolution {
    /// Index into `InnerProblem::options`.
    pub option: usize,
    /// Per stage, the index of the chosen point.
    pub points: Vec<usize>,
    pub status: SolverStatus,
    /// The solver's objective value (seconds).
    pub objective: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum MilpFailure {
    /// No split fits under the cutoff the frontier was built with.
    Infeasible,
    Solver(String),
}

/// HiGHS keeps a scheduler per calling thread; solves are serialised so that no two run at once,
/// which keeps them independent of the thread pool (the problems are small).
static SOLVER_LOCK: Mutex<()> = Mutex::new(());

/// A known feasible choice that seeds the solver.
#[derive(Clone, Debug)]
pub struct Incumbent {
    /// Index into `InnerProblem::options`.
    pub option: usize,
    /// Layers per stage.
    pub layers: Vec<u64>,
}

pub fn solve(
    problem: &InnerProblem,
    settings: &MilpSettings,
    incumbent: Option<&Incumbent>,
) -> Result<InnerSolution, MilpFailure> {
    if problem.options.is_empty() {
        return Err(MilpFailure::Infeasible);
    }
    let mut vars = ProblemVariables::new();
    let choose: Vec<Variable> = problem
        .options
        .iter()
        .map(|_| vars.add(variable().binary()))
        .collect();
    let picks: Vec<Vec<Vec<Variable>>> = problem
        .options
        .iter()
        .map(|option| {
            option
                .stages
                .iter()
                .map(|points| {
                    points
                        .iter()
                        .map(|_| vars.add(variable().binary()))
                        .collect()
                })
                .collect()
        })
        .collect();
    let slowest = vars.add(variable().min(0.0));
    let tail = vars.add(variable().min(0.0));
    let stage_count = problem.options[0].stages.len();

    let mut objective = Expression::default();
    let mut layer_sum = Expression::default();
    let mut stage_time = vec![Expression::default(); stage_count];
    let mut stage_tail = vec![Expression::default(); stage_count];
    let mut rows = Vec::new();
    for (k, option) in problem.options.iter().enumerate() {
        for (s, points) in option.stages.iter().enumerate() {
            let mut chosen = Expression::default();
            for (p, point) in points.iter().enumerate() {
                let x = picks[k][s][p];
                objective.add_mul(problem.shape.sum_weight * point.cost.microbatch_s, x);
                layer_sum.add_mul(point.layers as f64, x);
                stage_time[s].add_mul(point.cost.microbatch_s, x);
                stage_tail[s].add_mul(point.cost.tail_s, x);
                chosen += x;
            }
            rows.push(chosen.eq(choose[k]));
        }
    }
    objective.add_mul(problem.shape.max_weight, slowest);
    objective += tail;
    let one_option: Expression = choose.iter().copied().sum();
    rows.push(one_option.eq(1.0));
    rows.push(layer_sum.eq(problem.layers as f64));
    for s in 0..stage_count {
        rows.push(Expression::from(slowest).geq(stage_time[s].clone()));
        rows.push(Expression::from(tail).geq(stage_tail[s].clone()));
    }

    let start =
        incumbent.and_then(|inc| initial_values(problem, inc, &choose, &picks, slowest, tail));
    let mut model = vars
        .minimise(objective.clone())
        .using(highs)
        .set_threads(1)
        .set_option("random_seed", 0)
        .set_option("output_flag", false)
        .set_time_limit(settings.time_limit_s)
        .set_mip_rel_gap(settings.relative_gap as f32)
        .map_err(|e| MilpFailure::Solver(e.to_string()))?;
    for row in rows {
        model = model.with(row);
    }
    if let Some(start) = start {
        model = model.with_initial_solution(start);
    }
    let solution = {
        let _guard = SOLVER_LOCK
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        model.solve()
    };
    let solution = match solution {
        Ok(solution) => solution,
        Err(ResolutionError::Infeasible) => return Err(MilpFailure::Infeasible),
        Err(other) => return Err(MilpFailure::Solver(other.to_string())),
    };
    let status = match solution.status() {
        SolutionStatus::Optimal => SolverStatus::Optimal,
        SolutionStatus::GapLimit => SolverStatus::GapLimit,
        SolutionStatus::TimeLimit => SolverStatus::TimeLimit,
    };
    let option = choose
        .iter()
        .position(|&y| solution.value(y) > 0.5)
        .ok_or_else(|| MilpFailure::Solver("no stage option chosen".to_string()))?;
    let mut points = Vec::with_capacity(stage_count);
    for stage_picks in &picks[option] {
        let point = stage_picks
            .iter()
            .position(|&x| solution.value(x) > 0.5)
            .ok_or_else(|| MilpFailure::Solver("a stage has no layer count".to_string()))?;
        points.push(point);
    }
    Ok(InnerSolution {
        option,
        points,
        status,
        objective: solution.eval(&objective),
    })
}

/// Values of every variable for the incumbent; `None` when one of its points is not in the
/// problem.
fn initial_values(
    problem: &InnerProblem,
    incumbent: &Incumbent,
    choose: &[Variable],
    picks: &[Vec<Vec<Variable>>],
    slowest: Variable,
    tail: Variable,
) -> Option<Vec<(Variable, f64)>> {
    let frontier = problem.options.get(incumbent.option)?;
    let mut chosen = Vec::with_capacity(frontier.stages.len());
    for (points, layers) in frontier.stages.iter().zip(&incumbent.layers) {
        chosen.push(points.iter().position(|p| p.layers == *layers)?);
    }
    let mut values = Vec::new();
    for (k, &y) in choose.iter().enumerate() {
        values.push((y, f64::from(u8::from(k == incumbent.option))));
        for (s, stage_picks) in picks[k].iter().enumerate() {
            for (p, &x) in stage_picks.iter().enumerate() {
                let on = k == incumbent.option && chosen[s] == p;
                values.push((x, f64::from(u8::from(on))));
            }
        }
    }
    let points = frontier
        .stages
        .iter()
        .zip(&chosen)
        .map(|(points, &p)| points[p]);
    let (max_time, max_tail) = points.fold((0.0f64, 0.0f64), |(t, r), point| {
        (t.max(point.cost.microbatch_s), r.max(point.cost.tail_s))
    });
    values.push((slowest, max_time));
    values.push((tail, max_tail));
    Some(values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontier::{OptionFrontier, StagePoint};
    use tessel_symbolic::cost::{MemoryBreakdown, PipelineShape, StageCost};

    fn point(layers: u64, time: f64, tail: f64) -> StagePoint {
        StagePoint {
            layers,
            cost: StageCost {
                microbatch_s: time,
                tail_s: tail,
                memory: MemoryBreakdown::default(),
            },
        }
    }

    /// Two stages, 4 layers, the second stage carries a fixed 1.5 s (the logits). With 1F1B over
    /// 4 micro-batches the step is `Σ t + 3·max t + max tail`.
    fn problem() -> InnerProblem {
        let first: Vec<StagePoint> = (1..=3).map(|l| point(l, l as f64, 0.0)).collect();
        let last: Vec<StagePoint> = (1..=3).map(|l| point(l, l as f64 + 1.5, 0.0)).collect();
        InnerProblem {
            shape: PipelineShape {
                sum_weight: 1.0,
                max_weight: 3.0,
            },
            layers: 4,
            options: vec![OptionFrontier {
                option: 0,
                stages: vec![first, last],
            }],
        }
    }

    #[test]
    fn balances_a_heavier_last_stage() {
        let solution = solve(&problem(), &MilpSettings::default(), None).expect("solved");
        // Splits: (1,3) → 1 + 4.5 + 3·4.5 = 19; (2,2) → 2 + 3.5 + 3·3.5 = 16; (3,1) → 3 + 2.5 + 3·3 = 14.5.
        assert_eq!(solution.points, vec![2, 0]);
        assert_eq!(solution.status, SolverStatus::Optimal);
        assert!(
            (solution.objective - 14.5).abs() < 1e-5,
            "{}",
            solution.objective
        );
    }

    #[test]
    fn a_seed_does_not_change_the_optimum() {
        let seed = Incumbent {
            option: 0,
            layers: vec![2, 2],
        };
        let solution = solve(&problem(), &MilpSettings::default(), Some(&seed)).expect("solved");
        assert_eq!(solution.points, vec![2, 0]);
    }

    #[test]
    fn the_larger_tail_counts_once() {
        let mut p = problem();
        // A long tail on the first stage's heavy points makes (2,2) best: 16 + 0 vs 14.5 + 2.
        p.options[0].stages[0][2].cost.tail_s = 2.0;
        let solution = solve(&p, &MilpSettings::default(), None).expect("solved");
        assert_eq!(solution.points, vec![1, 1]);
        assert!(
            (solution.objective - 16.0).abs() < 1e-5,
            "{}",
            solution.objective
        );
    }

    #[test]
    fn no_split_is_infeasible() {
        let mut p = problem();
        p.layers = 7;
        assert_eq!(
            solve(&p, &MilpSettings::default(), None),
            Err(MilpFailure::Infeasible)
        );
    }
}
