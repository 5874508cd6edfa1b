//! Published configurations against the planner: for each fully specified published run, the
//! plan the search finds for the same model, GPUs and batch (ranked as `tessel plan` ranks, by
//! the pessimistic end of each prediction's interval), whether it is at least as good by that
//! measure as what was published, and how much faster than the published run's measured step it
//! is expected to be, with the interval of that speed-up.

use tessel_grammar::{SearchSpace, Spec, Strategy};
use tessel_symbolic::cost::CostModel;

use crate::space::{outer_configs, OuterConfig};
use crate::{plan, Objective, PlanOptions};

/// One published configuration and the planner's answer for the same job.
#[derive(Clone, Debug)]
pub struct PublishedVsPlanned {
    pub source: String,
    pub model: String,
    pub gpus: u64,
    pub published: Strategy,
    /// Predicted step time of the published configuration, and whether it fits by the model.
    pub published_step_s: f64,
    pub published_fits: bool,
    /// The plan found over the full search space (every key `auto`).
    pub planned: Strategy,
    pub planned_step_s: f64,
    /// Where the plan's measured step time is expected to fall (80 %).
    pub planned_interval: [f64; 2],
    /// The published run's measured step time, when the source gives its throughput.
    pub measured_step_s: Option<f64>,
    /// Each configuration's step time as the search ranks it (the interval's high end).
    pub published_ranked_s: f64,
    pub planned_ranked_s: f64,
    /// The published degrees are among the configurations the default search space holds.
    pub published_in_space: bool,
}

impl PublishedVsPlanned {
    /// The plan is at least as good as the published configuration by the measure the search
    /// ranks by, up to the margin within which that measure counts plans as tied (which the
    /// expected step time then decides, [`Objective::near_tie`]) and the plan file's six
    /// significant digits, or the published one does not fit by the model.
    pub fn planned_is_no_slower(&self) -> bool {
        let tie = Objective::Pessimistic.near_tie() + 1e-6;
        !self.published_fits || self.planned_ranked_s <= self.published_ranked_s * (1.0 + tie)
    }

    /// The plan's expected speed-up over the published run as measured, and its 80 % interval
    /// (from the plan's step-time interval): `(expected, [low, high])`, as fractions.
    pub fn speedup_over_measured(&self) -> Option<(f64, [f64; 2])> {
        let measured = self.measured_step_s?;
        let [low, high] = self.planned_interval;
        Some((
            measured / self.planned_step_s - 1.0,
            [measured / high - 1.0, measured / low - 1.0],
        ))
    }
}

/// Plans `spec` over the full space and compares with `published`. `None` when the cost model
/// rejects the published configuration or nothing fits.
pub fn compare_with_published(
    source: &str,
    spec: &Spec,
    published: &Strategy,
    measured_step_s: Option<f64>,
) -> Option<PublishedVsPlanned> {
    let mut spec = spec.clone();
    spec.search = SearchSpace::default();
    let model = CostModel::new(&spec).ok()?;
    let estimate = model.estimate(published).ok()?;
    let objective = Objective::Pessimistic;
    let options = PlanOptions {
        objective,
        ..PlanOptions::default()
    };
    let outcome = plan(&spec, &model, &options).ok()?;
    let prediction = &outcome.plan.prediction;
    Some(PublishedVsPlanned {
        source: source.to_string(),
        model: spec.model.name.clone(),
        gpus: spec.cluster.total_gpus(),
        published: published.clone(),
        published_step_s: estimate.step_time_s,
        published_fits: estimate.fits,
        planned: outcome.plan.strategy(),
        planned_step_s: prediction.step_time_s,
        planned_interval: prediction
            .interval
            .as_ref()
            .map_or([prediction.step_time_s; 2], |i| i.step_time_s),
        measured_step_s,
        published_ranked_s: objective.ranked_step_time(&estimate),
        planned_ranked_s: objective.ranked_step_time(prediction),
        published_in_space: outer_configs(&spec)
            .0
            .iter()
            .any(|o| *o == OuterConfig::of_strategy(published, spec.train.global_batch)),
    })
}

/// `tp8 pp8 dp16 cp1 ep1 v3 mb1 zero1 sp selective` for a table cell.
pub fn describe_strategy(s: &Strategy) -> String {
    let recompute = match s.recompute {
        tessel_grammar::Recompute::None => "none".to_string(),
        tessel_grammar::Recompute::Selective => "selective".to_string(),
        tessel_grammar::Recompute::Full => "full".to_string(),
        tessel_grammar::Recompute::Partial { full_layers } => format!("full×{full_layers}"),
        tessel_grammar::Recompute::Modules(modules) => format!("modules({modules})"),
    };
    format!(
        "tp{} pp{} dp{} cp{} ep{} v{} mb{} zero{}{} {recompute}",
        s.tp,
        s.pp,
        s.dp,
        s.cp,
        s.ep,
        s.interleave,
        s.microbatch,
        s.zero,
        if s.sequence_parallel { " sp" } else { "" }
    )
}
