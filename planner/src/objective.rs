//! What the search ranks configurations by: the predicted step time (`expected`), or the high
//! end of its prediction interval (`pessimistic`), which holds a configuration in a regime the
//! published runs test thinly (host offload, ZeRO-3 at large data-parallel degree, MoE) to what
//! runs of its kind measured rather than to the model's most optimistic guess.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use tessel_grammar::{Offload, Recompute, Spec};
use tessel_symbolic::cost::Estimate;
use tessel_symbolic::uncertainty::{RunTraits, StepFactors};

use crate::space::OuterConfig;

/// Relative margin within which the pessimistic objective counts two plans as tied.
pub const NEAR_TIE: f64 = 0.01;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Objective {
    /// The predicted step time (what plan files before objectives were ranked by).
    #[default]
    Expected,
    /// The high end of the step time's 80 % interval.
    Pessimistic,
}

impl Objective {
    pub const ALL: [Objective; 2] = [Objective::Expected, Objective::Pessimistic];

    /// What a prediction is ranked by under this objective, in seconds.
    pub fn ranked_step_time(self, estimate: &Estimate) -> f64 {
        match (self, &estimate.interval) {
            (Objective::Pessimistic, Some(interval)) => interval.step_time_s[1],
            _ => estimate.step_time_s,
        }
    }

    /// How far above the best rank a plan counts as tied with it, as a fraction: under the
    /// pessimistic objective, plans whose interval's high ends lie within 1 % (the threshold
    /// `plan --check` holds a committed plan to) are told apart by their expected step time,
    /// which the interval's width does not blur. Nothing ties under the expected objective.
    pub fn near_tie(self) -> f64 {
        match self {
            Objective::Expected => 0.0,
            Objective::Pessimistic => NEAR_TIE,
        }
    }

    /// The highest rank that still ties with a best rank of `best` ([`Objective::near_tie`]).
    pub fn tie_limit(self, best: f64) -> f64 {
        best * (1.0 + self.near_tie())
    }

    /// The command line's word for it.
    pub fn name(self) -> &'static str {
        match self {
            Objective::Expected => "expected",
            Objective::Pessimistic => "pessimistic",
        }
    }
}

/// dp, cp, tp, pp, ZeRO-3, hybrid sharding, offload: what a factor depends on within one search.
type FactorKey = (u64, u64, u64, u64, bool, bool, bool);

/// The factor by which a configuration's predicted step time is ranked: 1 when ranking by
/// the expected time, else its interval's high end over the prediction. The factor depends
/// on the degrees, ZeRO-3 and whether anything is offloaded (the traits the interval reads
/// that a search varies), so it is kept per such key.
pub struct RankingFactor<'a> {
    spec: &'a Spec,
    objective: Objective,
    /// Rule out configurations with a mechanism no validated run near them shares.
    validated_only: bool,
    known: Mutex<BTreeMap<FactorKey, f64>>,
}

impl<'a> RankingFactor<'a> {
    pub fn new(spec: &'a Spec, objective: Objective, validated_only: bool) -> RankingFactor<'a> {
        RankingFactor {
            spec,
            objective,
            validated_only,
            known: Mutex::new(BTreeMap::new()),
        }
    }

    /// The factor of `outer` with or without host offload; infinite for a configuration
    /// outside the validated region when only that region is searched.
    pub fn of(&self, outer: &OuterConfig, offload: bool) -> f64 {
        if self.objective == Objective::Expected && !self.validated_only {
            return 1.0;
        }
        let key = (
            outer.dp,
            outer.cp,
            outer.tp,
            outer.pp,
            outer.zero >= 3,
            outer.dp_shard != outer.dp,
            offload,
        );
        if let Some(factor) = self.known.lock().ok().and_then(|k| k.get(&key).copied()) {
            return factor;
        }
        let offloaded = Offload {
            optimizer: f64::from(u8::from(offload)),
            ..Offload::default()
        };
        let strategy = outer.strategy("ranked", Recompute::None, offloaded, None);
        let factors = StepFactors::of(&RunTraits::of(self.spec, &strategy));
        let factor = if self.validated_only && !factors.unvalidated.is_empty() {
            f64::INFINITY
        } else if self.objective == Objective::Expected {
            1.0
        } else {
            factors.high
        };
        if let Ok(mut known) = self.known.lock() {
            known.insert(key, factor);
        }
        factor
    }

    /// The highest rank that still ties with `best` under this ranking ([`Objective::tie_limit`]).
    pub fn tie_limit(&self, best: f64) -> f64 {
        self.objective.tie_limit(best)
    }

    /// A factor no option of `outer` goes below, for bounds.
    pub fn least(&self, outer: &OuterConfig) -> f64 {
        self.of(outer, false).min(self.of(outer, true))
    }
}
