//! The MILP that picks the layers and the stage option of every stage of an outer
//! configuration. This is the only module that sees good_lp and HiGHS.
//!
//! Variables: `x_{s,p} ∈ {0,1}` per candidate point `p` (a layer count, an option and their
//! cost) of stage `s`; `T ≥ 0` the slowest stage's micro-batch time; `R ≥ 0` the largest tail.
//! Minimise `sum_weight · Σ t_{s,p}·x + max_weight · T + R` subject to `Σ_p x_{s,p} = 1` for
//! every stage; `Σ layers·x = L`; `T ≥ Σ_p t·x` and `R ≥ Σ_p tail·x` for every stage. Memory is
//! not a row: points that do not fit were never generated.

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
    /// Per stage, the index of the chosen point.
    pub points: Vec<usize>,
    pub status: SolverStatus,
    /// The solver's objective value (seconds).
    pub objective: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum MilpFailure {
    /// No split fits under the cutoff the points were generated with.
    Infeasible,
    Solver(String),
}

/// HiGHS keeps a scheduler per calling thread; solves are serialised so that no two run at once,
/// which keeps them independent of the thread pool (the problems are small).
static SOLVER_LOCK: Mutex<()> = Mutex::new(());

/// A known feasible choice that seeds the solver: per stage, the index of its point.
#[derive(Clone, Debug)]
pub struct Incumbent {
    pub points: Vec<usize>,
}

pub fn solve(
    problem: &InnerProblem,
    settings: &MilpSettings,
    incumbent: Option<&Incumbent>,
) -> Result<InnerSolution, MilpFailure> {
    if problem.stages.iter().any(Vec::is_empty) {
        return Err(MilpFailure::Infeasible);
    }
    let mut vars = ProblemVariables::new();
    let picks: Vec<Vec<Variable>> = problem
        .stages
        .iter()
        .map(|points| {
            points
                .iter()
                .map(|_| vars.add(variable().binary()))
                .collect()
        })
        .collect();
    let slowest = vars.add(variable().min(0.0));
    let tail = vars.add(variable().min(0.0));

    let mut objective = Expression::default();
    let mut layer_sum = Expression::default();
    let mut rows = Vec::new();
    for (points, stage_picks) in problem.stages.iter().zip(&picks) {
        let mut chosen = Expression::default();
        let mut stage_time = Expression::default();
        let mut stage_tail = Expression::default();
        for (point, &x) in points.iter().zip(stage_picks) {
            objective.add_mul(problem.shape.sum_weight * point.cost.microbatch_s, x);
            layer_sum.add_mul(point.layers as f64, x);
            stage_time.add_mul(point.cost.microbatch_s, x);
            stage_tail.add_mul(point.cost.tail_s, x);
            chosen += x;
        }
        rows.push(chosen.eq(1.0));
        rows.push(Expression::from(slowest).geq(stage_time));
        rows.push(Expression::from(tail).geq(stage_tail));
    }
    objective.add_mul(problem.shape.max_weight, slowest);
    objective += tail;
    rows.push(layer_sum.eq(problem.layers as f64));

    let start = incumbent.and_then(|inc| initial_values(problem, inc, &picks, slowest, tail));
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
    let mut points = Vec::with_capacity(picks.len());
    for stage_picks in &picks {
        let point = stage_picks
            .iter()
            .position(|&x| solution.value(x) > 0.5)
            .ok_or_else(|| MilpFailure::Solver("a stage has no layer count".to_string()))?;
        points.push(point);
    }
    Ok(InnerSolution {
        points,
        status,
        objective: solution.eval(&objective),
    })
}

/// Values of every variable for the incumbent; `None` when it does not name a point per stage.
fn initial_values(
    problem: &InnerProblem,
    incumbent: &Incumbent,
    picks: &[Vec<Variable>],
    slowest: Variable,
    tail: Variable,
) -> Option<Vec<(Variable, f64)>> {
    if incumbent.points.len() != problem.stages.len() {
        return None;
    }
    let mut values = Vec::new();
    let (mut max_time, mut max_tail) = (0.0f64, 0.0f64);
    for ((points, stage_picks), &chosen) in problem.stages.iter().zip(picks).zip(&incumbent.points)
    {
        let point = points.get(chosen)?;
        max_time = max_time.max(point.cost.microbatch_s);
        max_tail = max_tail.max(point.cost.tail_s);
        for (p, &x) in stage_picks.iter().enumerate() {
            values.push((x, f64::from(u8::from(p == chosen))));
        }
    }
    values.push((slowest, max_time));
    values.push((tail, max_tail));
    Some(values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontier::StagePoint;
    use tessel_symbolic::cost::{MemoryBreakdown, PipelineShape, StageCost};

    fn point(layers: u64, time: f64, tail: f64) -> StagePoint {
        StagePoint {
            layers,
            option: 0,
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
            stages: vec![first, last],
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
        let seed = Incumbent { points: vec![1, 1] };
        let solution = solve(&problem(), &MilpSettings::default(), Some(&seed)).expect("solved");
        assert_eq!(solution.points, vec![2, 0]);
    }

    #[test]
    fn the_larger_tail_counts_once() {
        let mut p = problem();
        // A long tail on the first stage's heavy points makes (2,2) best: 16 + 0 vs 14.5 + 2.
        p.stages[0][2].cost.tail_s = 2.0;
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
