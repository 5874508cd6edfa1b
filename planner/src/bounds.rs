//! Cheap bounds on an outer configuration's best step time, from a handful of stage costs.
//!
//! They rest on the monotonicity and convexity the [`StageCostModel`] documents. For a split of
//! `layers` over `pp` stages with at least `lmin` layers each, some stage holds at least
//! `lc = ⌈layers/pp⌉` layers; so the slowest stage is at least as slow as the fastest stage
//! would be with `lc` layers (`T_lb`). The sum of stage times is at least `T_lb` plus every other
//! stage's time with `lmin` layers, and at least the least sum of the stages' supporting lines
//! at `lc` (convexity). The step time is then at least
//! `sum_weight·Σ_lb + max_weight·T_lb + max tail_min`. When the stages run at different speeds
//! (pools of different GPUs), `T_lb` is also at least the balanced split's time on the stages'
//! supporting lines. The even split gives a feasible step time, an upper bound.

use tessel_grammar::{Framework, Offload, Recompute, RecomputeModules, Spec, Strategy};
use tessel_symbolic::cost::{PipelineShape, StageCost};

use crate::cost_model::StageCostModel;
use crate::layers::even_split;
use crate::space::{OuterConfig, StageOption};

/// Fewest layers a stage may hold: one per interleaved chunk (all layers when there is one stage).
pub fn min_stage_layers(layers: u64, outer: &OuterConfig) -> u64 {
    if outer.pp <= 1 {
        layers
    } else {
        outer.interleave.max(1)
    }
}

/// Costs of every stage at a few layer counts, for one option.
#[derive(Clone, Debug)]
pub struct OptionProbe {
    /// Stage costs at the even split.
    pub even: Vec<StageCost>,
    /// Step time of the even split when every stage fits, else `None`.
    pub even_step: Option<f64>,
    /// Lower bound on the step time of any feasible split with this option; `None` when no split
    /// can fit.
    pub lower: Option<f64>,
    /// Per stage: `microbatch_s` with the fewest layers.
    pub min_time: Vec<f64>,
    /// Per stage: `microbatch_s` with `⌈layers/pp⌉` layers, and whether that fits.
    pub largest_time: Vec<f64>,
    pub largest_fits: Vec<bool>,
    /// Per stage: a line below the stage's time at every layer count a split can give it, as
    /// its value at `⌈layers/pp⌉` and its slope (`None` when there is none): for one option
    /// the secant through `⌈layers/pp⌉ − 1` and `⌈layers/pp⌉` (convexity), equal to
    /// `largest_time` there.
    pub line_time: Vec<f64>,
    pub slopes: Vec<Option<f64>>,
    /// `⌈layers/pp⌉`, where `largest_time` and `slopes` were taken.
    pub largest: u64,
    /// Every stage fits with the fewest layers.
    pub minimum_fits: bool,
    /// Per stage: `tail_s` with the fewest layers.
    pub min_tail: Vec<f64>,
    /// `max tail_s` is at least this.
    pub tail_lower: f64,
}

/// Evaluates stage costs for an outer configuration, sharing the strategy and pipeline shape.
pub struct OuterProbe<'a> {
    pub model: &'a dyn StageCostModel,
    pub outer: OuterConfig,
    pub strategy: Strategy,
    pub shape: PipelineShape,
    /// Usable bytes per GPU of each stage.
    pub capacities: Vec<f64>,
    pub layers: u64,
    pub even: Vec<u64>,
    pub evaluations: u64,
    /// The spec's training software, whose limits a stage option must respect.
    pub framework: Framework,
}

impl<'a> OuterProbe<'a> {
    pub fn new(spec: &Spec, model: &'a dyn StageCostModel, outer: OuterConfig) -> Self {
        let strategy = outer.strategy("candidate", Recompute::None, Offload::default(), None);
        let shape = model.pipeline_shape(&strategy);
        let capacities = (0..outer.pp)
            .map(|stage| model.stage_memory_capacity(&strategy, stage))
            .collect();
        OuterProbe {
            model,
            outer,
            strategy,
            shape,
            capacities,
            layers: spec.model.layers,
            even: even_split(spec.model.layers, outer.pp, outer.interleave),
            evaluations: 0,
            framework: spec.train.framework,
        }
    }

    /// Whether the framework runs `option` on a stage of `layers` layers.
    pub fn runs(&self, layers: u64, option: &StageOption) -> bool {
        self.framework
            .stage_limits(&self.strategy, layers, option.recompute, &option.offload)
            .is_empty()
    }

    pub fn cost(&mut self, stage: u64, layers: u64, option: &StageOption) -> StageCost {
        self.evaluations += 1;
        self.model.stage_cost(
            &self.strategy,
            stage,
            layers,
            option.recompute,
            option.offload,
        )
    }

    /// Whether `cost` fits the memory of stage `stage`'s GPUs.
    pub fn fits(&self, stage: u64, cost: &StageCost) -> bool {
        cost.memory.total() <= self.capacities[stage as usize]
    }

    /// Bounds for one option (see the module comment), with the even split's costs.
    pub fn probe(&mut self, option: &StageOption) -> OptionProbe {
        self.probe_with(option, true, true)
    }

    /// Bounds for one option; `with_even` and `with_slopes` say whether to evaluate the even
    /// split and the convexity slopes (without them `even` stays empty and the sum bound is
    /// monotone only).
    pub fn probe_with(
        &mut self,
        option: &StageOption,
        with_even: bool,
        with_slopes: bool,
    ) -> OptionProbe {
        let pp = self.outer.pp;
        let largest = self.layers.div_ceil(pp);
        let lmin = min_stage_layers(self.layers, &self.outer);
        let mut even = Vec::with_capacity(pp as usize);
        let mut min_time = Vec::with_capacity(pp as usize);
        let mut largest_time = Vec::with_capacity(pp as usize);
        let mut largest_fits = Vec::with_capacity(pp as usize);
        let mut slopes = Vec::with_capacity(pp as usize);
        let mut min_tail = Vec::with_capacity(pp as usize);
        let mut minimum_fits = true;
        for stage in 0..pp {
            let even_layers = self.even[stage as usize];
            let mut seen: Vec<(u64, StageCost)> = Vec::with_capacity(4);
            let mut cost_at = |probe: &mut Self, layers: u64| {
                if let Some((_, cost)) = seen.iter().find(|(l, _)| *l == layers) {
                    return *cost;
                }
                let cost = probe.cost(stage, layers, option);
                seen.push((layers, cost));
                cost
            };
            if with_even {
                even.push(cost_at(self, even_layers));
            }
            let least = cost_at(self, lmin);
            let at_largest = cost_at(self, largest);
            let slope = (with_slopes && largest > lmin)
                .then(|| at_largest.microbatch_s - cost_at(self, largest - 1).microbatch_s);
            minimum_fits &= self.fits(stage, &least);
            largest_time.push(at_largest.microbatch_s);
            largest_fits.push(self.fits(stage, &at_largest));
            slopes.push(slope);
            min_time.push(least.microbatch_s);
            min_tail.push(least.tail_s);
        }
        let even_step = (with_even && (0..).zip(&even).all(|(stage, cost)| self.fits(stage, cost)))
            .then(|| self.shape.step_time(&even));
        let mut result = OptionProbe {
            even,
            even_step,
            lower: None,
            min_time,
            line_time: largest_time.clone(),
            largest_time,
            largest_fits,
            slopes,
            largest,
            minimum_fits,
            tail_lower: min_tail.iter().copied().fold(0.0, f64::max),
            min_tail,
        };
        result.lower = result.step_lower(
            &self.shape,
            &result.largest_fits,
            result.minimum_fits,
            self.layers,
            lmin,
        );
        result
    }
}

impl OptionProbe {
    /// No stage evaluated: no bound, no split.
    fn empty() -> OptionProbe {
        OptionProbe {
            even: Vec::new(),
            even_step: None,
            lower: None,
            min_time: Vec::new(),
            largest_time: Vec::new(),
            largest_fits: Vec::new(),
            line_time: Vec::new(),
            slopes: Vec::new(),
            largest: 0,
            minimum_fits: false,
            min_tail: Vec::new(),
            tail_lower: 0.0,
        }
    }

    /// Bounds for splits that choose any of `probes`' options per stage: each stage at least
    /// its fastest option, fitting `⌈layers/pp⌉` layers when any option does. The least of the
    /// options' lines is concave, so the chord between the fewest and the most layers a stage
    /// can hold lies below it and serves as the stage's line. Whether every stage fits its
    /// fewest layers was settled by the screening, so the bound assumes it.
    pub fn mixed(probes: &[OptionProbe], shape: &PipelineShape, layers: u64, lmin: u64) -> Self {
        let stages = probes.iter().map(|p| p.min_time.len()).max().unwrap_or(0);
        let probes: Vec<&OptionProbe> = probes
            .iter()
            .filter(|p| p.min_time.len() == stages)
            .collect();
        let largest = probes.first().map_or(0, |p| p.largest);
        let lmax = layers.saturating_sub(stages.saturating_sub(1) as u64 * lmin);
        let least = |values: &mut dyn Iterator<Item = f64>| values.min_by(f64::total_cmp);
        let mut result = OptionProbe::empty();
        for s in 0..stages {
            let fitting = least(
                &mut probes
                    .iter()
                    .filter(|p| p.largest_fits[s])
                    .map(|p| p.largest_time[s]),
            );
            result
                .min_time
                .push(least(&mut probes.iter().map(|p| p.min_time[s])).unwrap_or(0.0));
            result
                .min_tail
                .push(least(&mut probes.iter().map(|p| p.min_tail[s])).unwrap_or(0.0));
            result.largest_fits.push(fitting.is_some());
            result.largest_time.push(fitting.unwrap_or(f64::INFINITY));
            let line_at = |l: u64| {
                probes
                    .iter()
                    .map(|p| {
                        let slope = p.slopes[s]?;
                        Some(p.line_time[s] + (l as f64 - largest as f64) * slope)
                    })
                    .try_fold(f64::INFINITY, |acc, v| v.map(|v| acc.min(v)))
            };
            let (low, high) = (line_at(lmin), line_at(lmax));
            let chord = low
                .zip(high)
                .filter(|(low, _)| low.is_finite())
                .map(|(low, high)| {
                    let slope = if lmax > lmin {
                        (high - low) / (lmax - lmin) as f64
                    } else {
                        0.0
                    };
                    (low + (largest as f64 - lmin as f64) * slope, slope)
                });
            result.line_time.push(chord.map_or(0.0, |(value, _)| value));
            result.slopes.push(chord.map(|(_, slope)| slope));
        }
        result.largest = largest;
        result.minimum_fits = stages > 0;
        result.tail_lower = result.min_tail.iter().copied().fold(0.0, f64::max);
        result.lower = result.step_lower(
            shape,
            &result.largest_fits,
            result.minimum_fits,
            layers,
            lmin,
        );
        result
    }

    /// Lower bound on the step time of any split, with `fits` telling which stages can hold
    /// `⌈layers/pp⌉` layers (see the module comment); `None` when no split can fit.
    pub fn step_lower(
        &self,
        shape: &PipelineShape,
        fits: &[bool],
        minimum_fits: bool,
        layers: u64,
        lmin: u64,
    ) -> Option<f64> {
        if !minimum_fits {
            return None;
        }
        let slowest = self
            .largest_time
            .iter()
            .zip(fits)
            .filter(|(_, fits)| **fits)
            .map(|(time, _)| *time)
            .min_by(f64::total_cmp)?;
        let slowest = slowest.max(self.balanced_lower(layers, lmin));
        let max_min = self.min_time.iter().copied().fold(0.0, f64::max);
        let sum = self.sum_lower(None, layers, lmin, slowest);
        Some(shape.sum_weight * sum + shape.max_weight * slowest.max(max_min) + self.tail_lower)
    }

    /// Lower bound on the slowest stage's time from the stages' supporting lines: the least
    /// `T` at which the counts each stage can hold within `T` on its line (at least `lmin`)
    /// make up `layers`. Stages of equal lines give about their time at `⌈layers/pp⌉`; stages
    /// of different speeds (pools of different GPUs) the time of the balanced split, where the
    /// fastest stage's time at `⌈layers/pp⌉` says far less. 0 when a line is missing or not
    /// rising.
    pub fn balanced_lower(&self, layers: u64, lmin: u64) -> f64 {
        let Some(slopes) = self.slopes.iter().copied().collect::<Option<Vec<f64>>>() else {
            return 0.0;
        };
        if slopes.is_empty() || slopes.iter().any(|&slope| slope <= 0.0) {
            return 0.0;
        }
        let line = |stage: usize, count: u64| {
            self.line_time[stage] + (count as f64 - self.largest as f64) * slopes[stage]
        };
        let stages = slopes.len();
        let most = layers.saturating_sub((stages as u64 - 1) * lmin);
        // Layers the stages can hold within `t`, each on its line (`None`: one cannot hold its
        // fewest).
        let held = |t: f64| -> Option<u64> {
            (0..stages).try_fold(0u64, |sum, stage| {
                let spare = (t - line(stage, lmin)) / slopes[stage];
                (spare >= -1e-9).then(|| sum + lmin + (spare + 1e-9).floor().max(0.0) as u64)
            })
        };
        let mut low = (0..stages).map(|s| line(s, lmin)).fold(0.0, f64::max);
        let mut high = (0..stages).map(|s| line(s, most)).fold(low, f64::max);
        if held(low).is_some_and(|count| count >= layers) {
            return low;
        }
        // `low` never holds them all, `high` always does: `low` stays below the least `T`.
        for _ in 0..60 {
            let mid = 0.5 * (low + high);
            if held(mid).is_some_and(|count| count >= layers) {
                high = mid;
            } else {
                low = mid;
            }
        }
        low
    }

    /// Lower bound on `Σ t_s` over the stages other than `skip` when they hold `layers` layers
    /// together, each at least `lmin`. Two bounds, the larger wins: monotonicity (every stage at
    /// least its time with `lmin` layers, and the slowest at least `slowest`), and convexity in
    /// layers (each stage above the line through its times at `lc − 1` and `lc`, minimised over
    /// the ways to spread the layers).
    pub fn sum_lower(&self, skip: Option<usize>, layers: u64, lmin: u64, slowest: f64) -> f64 {
        let stages: Vec<usize> = (0..self.min_time.len())
            .filter(|&s| Some(s) != skip)
            .collect();
        if stages.is_empty() {
            return 0.0;
        }
        let sum_min: f64 = stages.iter().map(|&s| self.min_time[s]).sum();
        let max_min = stages.iter().map(|&s| self.min_time[s]).fold(0.0, f64::max);
        let monotone = if skip.is_none() {
            slowest.max(max_min) + sum_min - max_min
        } else {
            sum_min
        };
        let n = stages.len() as u64;
        let slopes: Option<Vec<f64>> = stages.iter().map(|&s| self.slopes[s]).collect();
        let (Some(slopes), Some(spare)) = (slopes, layers.checked_sub(n * lmin)) else {
            return monotone;
        };
        let base: f64 = stages.iter().map(|&s| self.line_time[s]).sum();
        let down = self.largest.saturating_sub(lmin) as f64;
        let flattest = slopes.iter().copied().fold(f64::INFINITY, f64::min);
        let convex = base - down * slopes.iter().sum::<f64>() + spare as f64 * flattest;
        monotone.max(convex)
    }
}

/// An option at least as fast as every option in `options`: no recompute, no offload.
pub fn fastest_envelope() -> StageOption {
    StageOption {
        recompute: Recompute::None,
        offload: Offload::default(),
    }
}

/// An option at least as lean as every option in `options`: the most recompute any of them does
/// and, per component, the largest offload fraction.
pub fn leanest_envelope(options: &[StageOption]) -> StageOption {
    let recompute = if options
        .iter()
        .any(|o| matches!(o.recompute, Recompute::Full | Recompute::Partial { .. }))
    {
        Recompute::Full
    } else {
        // Every module any option re-runs.
        Recompute::of_modules(options.iter().fold(RecomputeModules::NONE, |all, o| {
            all.with(o.recompute.modules())
        }))
    };
    let offload = options.iter().fold(Offload::default(), |acc, o| Offload {
        optimizer: acc.optimizer.max(o.offload.optimizer),
        weights: acc.weights.max(o.offload.weights),
        gradients: acc.gradients.max(o.offload.gradients),
        activations: acc.activations.max(o.offload.activations),
    });
    StageOption { recompute, offload }
}

/// The first screening of an outer configuration: a lower bound on its step time, `None` when
/// no split of any option can fit.
#[derive(Clone, Debug)]
pub struct Screening {
    pub outer: OuterConfig,
    pub lower: Option<f64>,
    pub evaluations: u64,
}

pub fn screen(
    spec: &Spec,
    model: &dyn StageCostModel,
    outer: OuterConfig,
    options: &[StageOption],
) -> Screening {
    let mut probe = OuterProbe::new(spec, model, outer);
    let lean = leanest_envelope(options);
    let lmin = min_stage_layers(probe.layers, &outer);
    let largest = probe.layers.div_ceil(outer.pp);
    let infeasible = |probe: OuterProbe<'_>| Screening {
        outer,
        lower: None,
        evaluations: probe.evaluations,
    };
    // Every stage must hold its fewest layers with the leanest option.
    let mut least_costs = Vec::with_capacity(outer.pp as usize);
    for stage in 0..outer.pp {
        let cost = probe.cost(stage, lmin, &lean);
        if !probe.fits(stage, &cost) {
            return infeasible(probe);
        }
        least_costs.push(cost);
    }
    let fast = probe.probe_with(&fastest_envelope(), false, true);
    // Time from the fastest envelope, feasibility from the leanest: the stage holding at least
    // ⌈layers/pp⌉ layers must fit there with some option, hence with the leanest, and is at
    // least as slow as the fastest envelope there. Stages are tried fastest first; the first
    // that fits gives the bound.
    let mut order: Vec<usize> = (0..outer.pp as usize).collect();
    order.sort_by(|&a, &b| {
        fast.largest_time[a]
            .total_cmp(&fast.largest_time[b])
            .then(a.cmp(&b))
    });
    let mut fits = vec![false; outer.pp as usize];
    for stage in order {
        let cost = if largest == lmin {
            least_costs[stage]
        } else {
            probe.cost(stage as u64, largest, &lean)
        };
        if probe.fits(stage as u64, &cost) {
            fits[stage] = true;
            break;
        }
    }
    let lower = fast.step_lower(&probe.shape, &fits, true, probe.layers, lmin);
    Screening {
        outer,
        lower,
        evaluations: probe.evaluations,
    }
}
