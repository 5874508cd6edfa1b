//! Why nothing fits, and what would: the configuration that needs the least memory, the
//! component that dominates it, the shortfall, and changes tried against the cost model.

use std::fmt;

use tessel_grammar::{Offload, Recompute, Spec};
use tessel_symbolic::cost::{Estimate, MemoryBreakdown};

use rayon::prelude::*;

use crate::bounds::{leanest_envelope, OuterProbe};
use crate::cost_model::StageCostModel;
use crate::space::{outer_configs, stage_options, OuterConfig, StageOption};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// A change that was tried, and the memory it leads to.
#[derive(Clone, Debug, PartialEq)]
pub struct Suggestion {
    pub change: String,
    /// GiB the fullest stage then needs (an estimate where `estimated`).
    pub need_gib: f64,
    pub fits: bool,
    /// True when the number comes from arithmetic on the breakdown rather than the cost model.
    pub estimated: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct NothingFits {
    pub capacity_gib: f64,
    /// Least memory any configuration needs on its fullest stage (even split, leanest options).
    pub least_need_gib: f64,
    /// That configuration.
    pub config: String,
    pub stage: u64,
    /// Its fullest stage's breakdown, GiB.
    pub memory: MemoryBreakdown,
    pub dominant: String,
    pub short_by_gib: f64,
    pub suggestions: Vec<Suggestion>,
}

impl fmt::Display for NothingFits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "no configuration fits in {:.1} GiB per GPU.",
            self.capacity_gib
        )?;
        writeln!(
            f,
            "the least memory any configuration needs is {:.1} GiB (stage {} of {}), {:.1} GiB short;",
            self.least_need_gib, self.stage, self.config, self.short_by_gib
        )?;
        if self.short_by_gib <= 0.0 {
            writeln!(
                f,
                "it would fit with the most recompute and offload searched combined, but no single \
                 searched option combines them; add such an option to the search space."
            )?;
        }
        write_breakdown(f, &self.dominant, &self.memory)?;
        if self.suggestions.is_empty() {
            return Ok(());
        }
        writeln!(f, "what would help:")?;
        for s in &self.suggestions {
            let verdict = if s.fits { "fits" } else { "still short" };
            let about = if s.estimated { "about " } else { "" };
            writeln!(
                f,
                "  - {}: needs {about}{:.1} GiB ({verdict})",
                s.change, s.need_gib
            )?;
        }
        Ok(())
    }
}

/// A fixed configuration's fullest stage against the memory it may use.
#[derive(Clone, Debug, PartialEq)]
pub struct FixedDoesNotFit {
    pub config: String,
    pub capacity_gib: f64,
    pub stage: u64,
    pub need_gib: f64,
    /// The fullest stage's breakdown, GiB (as the estimate gives it).
    pub memory: MemoryBreakdown,
    pub dominant: String,
}

impl FixedDoesNotFit {
    /// The fullest stage of an estimate that does not fit.
    pub fn of(config: String, estimate: &Estimate) -> FixedDoesNotFit {
        let fullest = estimate
            .stages
            .iter()
            .max_by(|a, b| a.memory.total().total_cmp(&b.memory.total()));
        let (stage, memory) =
            fullest.map_or((0, MemoryBreakdown::default()), |s| (s.stage, s.memory));
        FixedDoesNotFit {
            config,
            capacity_gib: estimate.memory_capacity_gib,
            stage,
            need_gib: estimate.peak_memory_gib,
            memory,
            dominant: dominant_component(&memory).to_string(),
        }
    }
}

impl fmt::Display for FixedDoesNotFit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} does not fit: stage {} needs {:.1} GiB per GPU of the {:.1} GiB it may use, {:.1} GiB short.",
            self.config,
            self.stage,
            self.need_gib,
            self.capacity_gib,
            (self.need_gib - self.capacity_gib).max(0.0)
        )?;
        write_breakdown(f, &self.dominant, &self.memory)?;
        writeln!(
            f,
            "raise tp, pp or the ZeRO stage, recompute, or leave the degrees out and let `tessel plan` search for one that fits."
        )
    }
}

/// `optimizer states dominate: weights 16.4, gradients 32.9, … GiB.`
fn write_breakdown(f: &mut fmt::Formatter<'_>, dominant: &str, m: &MemoryBreakdown) -> fmt::Result {
    writeln!(
        f,
        "{dominant} dominate: weights {:.1}, gradients {:.1}, optimizer {:.1}, activations {:.1}, buffers {:.1} GiB.",
        m.weights, m.gradients, m.optimizer, m.activations, m.buffers
    )
}

fn dominant_component(memory: &MemoryBreakdown) -> &'static str {
    let parts = [
        ("weights", memory.weights),
        ("gradients", memory.gradients),
        ("optimizer states", memory.optimizer),
        ("activations", memory.activations),
        ("buffers", memory.buffers),
    ];
    parts
        .iter()
        .fold(
            parts[0],
            |best, part| if part.1 > best.1 { *part } else { best },
        )
        .0
}

fn in_gib(memory: &MemoryBreakdown) -> MemoryBreakdown {
    MemoryBreakdown {
        weights: memory.weights / GIB,
        gradients: memory.gradients / GIB,
        optimizer: memory.optimizer / GIB,
        activations: memory.activations / GIB,
        buffers: memory.buffers / GIB,
    }
}

/// Peak bytes of the fullest stage at the even split.
fn even_need(
    spec: &Spec,
    model: &dyn StageCostModel,
    outer: OuterConfig,
    option: &StageOption,
) -> f64 {
    let mut probe = OuterProbe::new(spec, model, outer);
    probe
        .probe(option)
        .even
        .iter()
        .map(|cost| cost.memory.total())
        .fold(0.0, f64::max)
}

/// The memory an outer configuration needs at its even split with its leanest option.
#[derive(Clone, Debug)]
pub struct LeanNeed {
    pub outer: OuterConfig,
    /// Peak bytes of the fullest stage.
    pub need: f64,
    pub stage: u64,
    pub memory: MemoryBreakdown,
}

pub fn lean_need(
    spec: &Spec,
    model: &dyn StageCostModel,
    outer: OuterConfig,
    lean_option: &StageOption,
) -> LeanNeed {
    let mut probe = OuterProbe::new(spec, model, outer);
    let costs = probe.probe_with(lean_option, true, false).even;
    let (stage, cost) = costs.iter().enumerate().fold(
        (0, costs.first().copied().unwrap_or_default()),
        |best, (stage, cost)| {
            if cost.memory.total() > best.1.memory.total() {
                (stage as u64, *cost)
            } else {
                best
            }
        },
    );
    LeanNeed {
        outer,
        need: cost.memory.total(),
        stage,
        memory: cost.memory,
    }
}

/// Builds the explanation from the configuration with the least need.
/// Builds a cost model for another spec (more nodes, a shorter sequence), so that those changes
/// can be tried rather than estimated.
pub type ModelFactory<'a> = &'a (dyn Fn(&Spec) -> Result<Box<dyn StageCostModel>, String> + Sync);

/// The configuration of `spec` whose leanest even split needs the least memory.
pub fn least_need(spec: &Spec, model: &dyn StageCostModel) -> Option<LeanNeed> {
    let (configs, _) = outer_configs(spec);
    configs
        .par_iter()
        .map(|outer| {
            let lean = leanest_envelope(&stage_options(spec, outer));
            lean_need(spec, model, *outer, &lean)
        })
        .collect::<Vec<_>>()
        .into_iter()
        .min_by(|a, b| {
            a.need
                .total_cmp(&b.need)
                .then_with(|| a.outer.cmp(&b.outer))
        })
}

/// Tries `changed` specs in order with the factory's cost models, up to the first that fits.
fn try_specs(
    factory: ModelFactory<'_>,
    changes: Vec<(String, Spec)>,
    suggestions: &mut Vec<Suggestion>,
) {
    for (change, changed) in changes {
        let Ok(model) = factory(&changed) else {
            continue;
        };
        let Some(least) = least_need(&changed, model.as_ref()) else {
            continue;
        };
        let fits = least.need <= model.memory_capacity();
        suggestions.push(Suggestion {
            change,
            need_gib: least.need / GIB,
            fits,
            estimated: false,
        });
        if fits {
            break;
        }
    }
}

pub fn explain(
    spec: &Spec,
    model: &dyn StageCostModel,
    least: &LeanNeed,
    lean_option: &StageOption,
    factory: Option<ModelFactory<'_>>,
) -> NothingFits {
    let capacity = model.memory_capacity();
    let outer = least.outer;
    let memory = in_gib(&least.memory);
    let mut suggestions = Vec::new();
    let mut try_change = |change: String, outer: OuterConfig, option: StageOption| {
        let need = even_need(spec, model, outer, &option);
        suggestions.push(Suggestion {
            change,
            need_gib: need / GIB,
            fits: need <= capacity,
            estimated: false,
        });
    };
    if outer.zero < 3 && outer.dp * outer.cp > 1 {
        try_change(
            "ZeRO-3 (shard weights, gradients and optimizer states)".to_string(),
            OuterConfig { zero: 3, ..outer },
            *lean_option,
        );
    }
    if lean_option.recompute != Recompute::Full {
        try_change(
            "full activation recompute".to_string(),
            outer,
            StageOption {
                recompute: Recompute::Full,
                ..*lean_option
            },
        );
    }
    let all_offload = Offload {
        optimizer: 1.0,
        weights: 1.0,
        gradients: 1.0,
        activations: 1.0,
    };
    if lean_option.offload != all_offload {
        try_change(
            "offload optimizer states, weights, gradients and activations to host memory"
                .to_string(),
            outer,
            StageOption {
                recompute: Recompute::Full,
                offload: all_offload,
            },
        );
    }
    if outer.microbatch > 1 {
        try_change(
            "micro-batch of 1".to_string(),
            OuterConfig {
                microbatch: 1,
                microbatches: outer.microbatches * outer.microbatch,
                ..outer
            },
            *lean_option,
        );
    }
    if let Some(factory) = factory {
        let more_nodes = [2u64, 4, 8, 16]
            .iter()
            .map(|&factor| {
                let mut changed = spec.clone();
                changed.cluster.nodes = spec.cluster.nodes.saturating_mul(factor);
                let change = format!(
                    "{factor}× the nodes ({} GPUs)",
                    changed.cluster.total_gpus()
                );
                (change, changed)
            })
            .collect();
        try_specs(factory, more_nodes, &mut suggestions);
        // A shorter sequence only shrinks activations; worth trying when they exceed the
        // shortfall.
        let shortfall = least.need - capacity;
        let shorter_helps = least.memory.activations > shortfall;
        let shorter = [2u64, 4, 8]
            .iter()
            .filter(|&&divisor| shorter_helps && spec.train.seq_len / divisor >= 1)
            .map(|&divisor| {
                let mut changed = spec.clone();
                changed.train.seq_len = spec.train.seq_len / divisor;
                let change = format!(
                    "a sequence of {} tokens instead of {}",
                    changed.train.seq_len, spec.train.seq_len
                );
                (change, changed)
            })
            .collect();
        try_specs(factory, shorter, &mut suggestions);
    } else {
        estimate_scaling(spec, least, capacity, &mut suggestions);
    }
    NothingFits {
        capacity_gib: capacity / GIB,
        least_need_gib: least.need / GIB,
        config: format!("{} with {}", outer.label(), lean_option.label()),
        stage: least.stage,
        memory,
        dominant: dominant_component(&least.memory).to_string(),
        short_by_gib: (least.need - capacity).max(0.0) / GIB,
        suggestions,
    }
}

/// Without a way to build cost models for other specs: more GPUs and a shorter sequence,
/// estimated from the breakdown (model state shards over GPUs, activations scale with the
/// sequence).
fn estimate_scaling(
    spec: &Spec,
    least: &LeanNeed,
    capacity: f64,
    suggestions: &mut Vec<Suggestion>,
) {
    let state = least.memory.weights + least.memory.gradients + least.memory.optimizer;
    let rest = least.memory.total() - state;
    if state > 0.0 && rest < capacity {
        let factor = (state / (capacity - rest)).ceil().max(2.0);
        let gpus = spec.cluster.total_gpus() as f64 * factor;
        suggestions.push(Suggestion {
            change: format!(
                "{factor:.0}× the GPUs ({gpus:.0}), with the model state sharded over them"
            ),
            need_gib: (state / factor + rest) / GIB,
            fits: true,
            estimated: true,
        });
    }
    let activations = least.memory.activations;
    let others = least.memory.total() - activations;
    if activations > 0.0 && others < capacity {
        let fraction = (capacity - others) / activations;
        if fraction < 1.0 {
            let mut seq = spec.train.seq_len;
            while seq > 1 && (seq as f64) > spec.train.seq_len as f64 * fraction {
                seq /= 2;
            }
            let need = others + activations * seq as f64 / spec.train.seq_len as f64;
            suggestions.push(Suggestion {
                change: format!(
                    "a sequence of {seq} tokens instead of {} (activations scale with it)",
                    spec.train.seq_len
                ),
                need_gib: need / GIB,
                fits: need <= capacity,
                estimated: true,
            });
        }
    }
}
