//! Published configurations against the planner: for each fully specified published run, the
//! plan the search finds for the same model, GPUs and batch, and whether it is predicted at least
//! as fast as what was published.

use tessel_grammar::{SearchSpace, Spec, Strategy};
use tessel_symbolic::cost::CostModel;

use crate::{plan, PlanOptions};

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
}

impl PublishedVsPlanned {
    /// The plan is predicted at least as fast as the published configuration (within the plan
    /// file's six significant digits), or the published one does not fit by the model.
    pub fn planned_is_no_slower(&self) -> bool {
        !self.published_fits || self.planned_step_s <= self.published_step_s * (1.0 + 1e-6)
    }
}

/// Plans `spec` over the full space and compares with `published`. `None` when the cost model
/// rejects the published configuration or nothing fits.
pub fn compare_with_published(
    source: &str,
    spec: &Spec,
    published: &Strategy,
) -> Option<PublishedVsPlanned> {
    let mut spec = spec.clone();
    spec.search = SearchSpace::default();
    let model = CostModel::new(&spec).ok()?;
    let estimate = model.estimate(published).ok()?;
    let outcome = plan(&spec, &model, &PlanOptions::default()).ok()?;
    Some(PublishedVsPlanned {
        source: source.to_string(),
        model: spec.model.name.clone(),
        gpus: spec.cluster.total_gpus(),
        published: published.clone(),
        published_step_s: estimate.step_time_s,
        published_fits: estimate.fits,
        planned: outcome.plan.strategy(),
        planned_step_s: outcome.plan.prediction.step_time_s,
    })
}

/// `tp8 pp8 dp16 cp1 ep1 v3 mb1 zero1 sp selective` for a table cell.
pub fn describe_strategy(s: &Strategy) -> String {
    let recompute = match s.recompute {
        tessel_grammar::Recompute::None => "none".to_string(),
        tessel_grammar::Recompute::Selective => "selective".to_string(),
        tessel_grammar::Recompute::Full => "full".to_string(),
        tessel_grammar::Recompute::Partial { full_layers } => format!("full×{full_layers}"),
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
