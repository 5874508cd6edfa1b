//! `tessel export`: one strategy of a spec as another framework's launch configuration.
//!
//! Each target writes what it can express and lists, in words, what it cannot
//! ([`ExportOutput::unsupported`]) and what the user must still add or check
//! ([`ExportOutput::notes`]). Output is deterministic: fixed key order, fixed number formats.

mod batches;
mod deepspeed;
mod megatron;
pub mod serving;
mod stages;
#[cfg(test)]
pub(crate) mod test_spec;
mod toml_writer;
mod torchtitan;

use std::fmt;
use std::str::FromStr;

use tessel_grammar::{Framework, Recompute, Spec, Strategy};

/// The frameworks `tessel export` writes for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExportTarget {
    /// Megatron-LM: a `torchrun … pretrain_gpt.py` command with one flag per line.
    Megatron,
    /// torchtitan: a TOML job config.
    Torchtitan,
    /// DeepSpeed: a `ds_config.json`.
    Deepspeed,
}

impl ExportTarget {
    pub const ALL: [ExportTarget; 3] = [
        ExportTarget::Megatron,
        ExportTarget::Torchtitan,
        ExportTarget::Deepspeed,
    ];

    /// The framework whose row of the capability table this target writes for: the spec's own
    /// when it is one this target launches (Megatron-FSDP through Megatron-LM's script).
    pub fn framework(self, spec: &Spec) -> Framework {
        match self {
            ExportTarget::Megatron if spec.train.framework == Framework::MegatronFsdp => {
                Framework::MegatronFsdp
            }
            ExportTarget::Megatron => Framework::Megatron,
            ExportTarget::Torchtitan => Framework::Fsdp,
            ExportTarget::Deepspeed => Framework::Deepspeed,
        }
    }

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ExportTarget::Megatron => "megatron",
            ExportTarget::Torchtitan => "torchtitan",
            ExportTarget::Deepspeed => "deepspeed",
        }
    }
}

impl fmt::Display for ExportTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An export target name that is not one of [`ExportTarget::ALL`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownTarget(pub String);

impl fmt::Display for UnknownTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = ExportTarget::ALL.iter().map(|t| t.name()).collect();
        write!(
            f,
            "unknown export target `{}`; expected one of: {}",
            self.0,
            names.join(", ")
        )
    }
}

impl std::error::Error for UnknownTarget {}

impl FromStr for ExportTarget {
    type Err = UnknownTarget;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        ExportTarget::ALL
            .into_iter()
            .find(|t| t.name() == lower || (lower == "megatron-lm" && *t == ExportTarget::Megatron))
            .ok_or_else(|| UnknownTarget(s.to_string()))
    }
}

/// What an export produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportOutput {
    /// The configuration file's contents.
    pub text: String,
    /// A file name to save `text` under, e.g. `megatron_reference.megatron.sh`.
    pub file_name_hint: String,
    /// Parts of the strategy the target cannot express, and what was written instead.
    pub unsupported: Vec<String>,
    /// What the user still has to add or check; not losses.
    pub notes: Vec<String>,
}

impl ExportOutput {
    /// The unsupported items and notes as indented lines for a terminal (empty when there are
    /// none), e.g. for the CLI to print on stderr after writing `text`.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        for (title, items) in [
            ("not expressible", &self.unsupported),
            ("notes", &self.notes),
        ] {
            if items.is_empty() {
                continue;
            }
            out.push_str(&format!("{title}:\n"));
            for item in items.iter() {
                out.push_str(&format!("  - {item}\n"));
            }
        }
        out
    }
}

/// Writes `strategy` (one of `spec`'s, or one the planner chose) for `target`.
pub fn export(spec: &Spec, strategy: &Strategy, target: ExportTarget) -> ExportOutput {
    export_with(spec, strategy, target, &ExportOptions::default())
}

/// What the export knows beyond the spec and strategy: facts a plan adds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportOptions {
    /// Optimizer steps between checkpoints (a plan's interval, when its spec has failures).
    pub checkpoint_every: Option<u64>,
}

/// [`export`] with what a plan adds.
pub fn export_with(
    spec: &Spec,
    strategy: &Strategy,
    target: ExportTarget,
    options: &ExportOptions,
) -> ExportOutput {
    match target {
        ExportTarget::Megatron => megatron::export(spec, strategy, options),
        ExportTarget::Torchtitan => torchtitan::export(spec, strategy, options),
        ExportTarget::Deepspeed => deepspeed::export(spec, strategy, options),
    }
}

/// Facts every target reports the same way.
pub(crate) struct Report {
    pub unsupported: Vec<String>,
    pub notes: Vec<String>,
}

impl Report {
    pub fn new() -> Self {
        Report {
            unsupported: Vec::new(),
            notes: Vec::new(),
        }
    }

    pub fn unsupported(&mut self, text: impl Into<String>) {
        self.unsupported.push(text.into());
    }

    pub fn note(&mut self, text: impl Into<String>) {
        self.notes.push(text.into());
    }

    /// Checks that hold for every target: the degrees multiply to the cluster, ZeRO exists.
    pub fn check_common(&mut self, spec: &Spec, strategy: &Strategy) {
        let world = spec.cluster.total_gpus();
        let product = strategy
            .dp
            .saturating_mul(strategy.tp)
            .saturating_mul(strategy.pp)
            .saturating_mul(strategy.cp);
        if product != world {
            self.note(format!(
                "dp·tp·pp·cp = {}·{}·{}·{} = {product}, but the cluster has {world} GPUs; the \
                 frameworks derive the data-parallel size from the GPUs they run on",
                strategy.dp, strategy.tp, strategy.pp, strategy.cp
            ));
        }
        if strategy.zero > 3 {
            self.unsupported(format!(
                "zero = {}: ZeRO stages are 0 to 3; exported as stage 3",
                strategy.zero
            ));
        }
        if let Some(stages) = &strategy.stage_recompute {
            let each: Vec<String> = stages.iter().map(Recompute::to_string).collect();
            self.unsupported(format!(
                "recompute differs by pipeline stage ({}): one choice applies to every stage; \
                 written as stage 0's, which holds the most micro-batches in flight",
                each.join(", ")
            ));
        }
        if strategy.stage_offload.is_some() {
            self.unsupported(
                "offload differs by pipeline stage: one setting applies to every stage; written \
                 as stage 0's",
            );
        }
        if strategy.ep > 1 && spec.model.moe.is_none() {
            self.unsupported(format!(
                "ep = {} on a model without experts: expert parallelism is ignored",
                strategy.ep
            ));
        }
        if spec.train.memory_saving_kernels.is_on() {
            self.unsupported(
                "memory_saving_kernels = true: Tempo's in-place GELU and norms and its dropout \
                 recompute are not in the target's kernels; written without them, which keeps \
                 the norms' and GELU's inputs (more activation memory than planned)",
            );
        }
        if let Some(c) = spec.train.grad_compression {
            self.unsupported(format!(
                "grad_compression = {}: the target sums data-parallel gradients uncompressed \
                 (PyTorch's DDP communication hooks run PowerSGD, not this target's optimizer); \
                 written without it, which sends every gradient whole",
                c.label()
            ));
        }
        for encoder in &spec.model.encoders {
            let placement = spec
                .train
                .multimodal
                .map_or("first_stage", |m| m.placement.name());
            self.unsupported(format!(
                "encoder `{}` ({} layers of {}, {} tokens per item, placement {placement}): the \
                 target's language-model script has no modality encoder; written for the \
                 language model alone (Megatron-LM's LLaVA example and NeMo's multimodal \
                 recipes train one, placed on the first pipeline stage)",
                encoder.name, encoder.layers, encoder.hidden, encoder.tokens_per_item
            ));
        }
        if let Some(finetune) = spec.train.finetune.filter(|f| f.is_adapter()) {
            self.unsupported(format!(
                "finetune = {} (rank {}): the target's training script trains every weight and \
                 has no adapters; written as full training, which needs gradients and optimizer \
                 states for every weight (Hugging Face PEFT or NeMo's PEFT runs LoRA)",
                finetune.method.name(),
                finetune.rank
            ));
        }
    }

    /// Appends the report as comment lines (`prefix` is `#` for shell and TOML).
    pub fn push_comments(&self, out: &mut String, prefix: &str) {
        let sections = [
            ("Not expressible in this format:", &self.unsupported),
            ("Notes:", &self.notes),
        ];
        for (title, items) in sections {
            if items.is_empty() {
                continue;
            }
            out.push_str(&format!("{prefix} {title}\n"));
            for item in items.iter() {
                push_wrapped(out, prefix, item);
            }
        }
    }
}

/// One `- item`, wrapped at 96 columns under `prefix`.
fn push_wrapped(out: &mut String, prefix: &str, text: &str) {
    const WIDTH: usize = 96;
    let mut line = format!("{prefix}   -");
    for word in text.split_whitespace() {
        if line.len() + 1 + word.len() > WIDTH && !line.ends_with('-') {
            out.push_str(&line);
            out.push('\n');
            line = format!("{prefix}    ");
        }
        line.push(' ');
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
}

/// `16 nodes × 8 GPUs`, for headers.
pub(crate) fn cluster_size(spec: &Spec) -> String {
    let nodes = spec.cluster.nodes;
    format!(
        "{nodes} node{} × {} GPUs",
        if nodes == 1 { "" } else { "s" },
        spec.cluster.gpus_per_node
    )
}

/// The ZeRO stage a target writes: the strategy's, capped at 3.
pub(crate) fn zero_stage(strategy: &Strategy) -> u8 {
    strategy.zero.min(3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessel_grammar::Offload;

    #[test]
    fn target_names_round_trip() {
        for target in ExportTarget::ALL {
            assert_eq!(target.name().parse::<ExportTarget>(), Ok(target));
        }
        assert_eq!("Megatron-LM".parse(), Ok(ExportTarget::Megatron));
        let err = "nemo".parse::<ExportTarget>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown export target `nemo`; expected one of: megatron, torchtitan, deepspeed"
        );
    }

    /// The exporters and the capability table agree: a strategy of a model every target can
    /// build exports with no "not expressible" line exactly when the target's framework runs it.
    #[test]
    fn exporters_flag_exactly_what_the_table_rules_out() {
        let spec = test_spec::llama_like(8);
        let recomputes = [
            Recompute::None,
            Recompute::Selective,
            Recompute::Full,
            Recompute::Partial { full_layers: 1 },
            Recompute::Partial { full_layers: 2 },
        ];
        let offloads = [
            Offload::default(),
            Offload {
                optimizer: 1.0,
                ..Offload::default()
            },
            Offload {
                optimizer: 0.5,
                ..Offload::default()
            },
            Offload {
                optimizer: 1.0,
                weights: 1.0,
                gradients: 1.0,
                activations: 0.0,
            },
            Offload {
                optimizer: 1.0,
                gradients: 1.0,
                ..Offload::default()
            },
            Offload {
                activations: 0.5,
                ..Offload::default()
            },
        ];
        let mut disagreements = Vec::new();
        let mut checked = 0;
        for (tp, pp, cp) in [(1, 1, 1), (2, 1, 1), (1, 2, 1), (2, 2, 1), (1, 1, 2)] {
            for interleave in [1, 2] {
                for zero in 0..=3 {
                    for sequence_parallel in [false, true] {
                        for recompute in recomputes {
                            for offload in offloads {
                                if (interleave > 1 && pp == 1) || (sequence_parallel && tp == 1) {
                                    continue;
                                }
                                let dp = 8 / (tp * pp * cp);
                                // Hybrid sharding: two-way shards, where ZeRO shards anything.
                                let hybrid = (zero > 0 && dp >= 4).then_some(Some(2));
                                for dp_shard in std::iter::once(None).chain(hybrid) {
                                    let strategy = Strategy {
                                        name: "s".into(),
                                        dp,
                                        tp,
                                        pp,
                                        cp,
                                        dp_shard,
                                        interleave,
                                        zero,
                                        sequence_parallel,
                                        recompute,
                                        offload,
                                        ..Strategy::default()
                                    };
                                    for target in ExportTarget::ALL {
                                        let limits = target.framework(&spec).limits(&strategy, 8);
                                        let out = export(&spec, &strategy, target);
                                        checked += 1;
                                        if limits.is_empty() != out.unsupported.is_empty() {
                                            disagreements.push(format!(
                                            "{target} tp{tp} pp{pp} cp{cp} v{interleave} z{zero} \
                                             shard{dp_shard:?} sp{sequence_parallel} {recompute} \
                                             {offload:?}: \
                                             table {:?}, export {:?}",
                                            limits.iter().map(|l| &l.reason).collect::<Vec<_>>(),
                                            out.unsupported
                                        ));
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(checked > 1000);
        assert!(
            disagreements.is_empty(),
            "{} of {checked} disagree:\n{}",
            disagreements.len(),
            disagreements[..disagreements.len().min(40)].join("\n")
        );
    }
}
