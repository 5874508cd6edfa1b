//! The fixed slot list of the stage-cost expressions: the strategy symbols a stage's cost
//! depends on, and the outputs the expressions produce. A compiled program evaluates the
//! outputs from the slot values in this order.

use tessel_grammar::{Offload, Recompute, RecomputeModules, Strategy};

use crate::Symbol;

/// Inputs of the stage-cost expressions, in slot order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// Sequences per micro-batch.
    Microbatch,
    Tp,
    Pp,
    Dp,
    Cp,
    Ep,
    /// Micro-batches per step.
    Microbatches,
    Interleave,
    /// Pipeline device index, 0-based.
    Stage,
    /// Layers the device holds (all its chunks).
    Layers,
    /// Of those, layers recomputed in full.
    FullRecomputeLayers,
    /// 1 when the layers not fully recomputed re-run their attention core, else 0.
    Selective,
    /// 1 with sequence parallelism, else 0.
    SequenceParallel,
    /// ZeRO stage 0–3.
    Zero,
    OffloadOptimizer,
    OffloadWeights,
    OffloadGradients,
    OffloadActivations,
    /// The experts' tensor-parallel degree (`tp` unless folded).
    ExpertTp,
    /// 1 when the layers not fully recomputed re-run their norms, else 0.
    RecomputeNorms,
    /// 1 when they re-run the experts' activation function, else 0.
    RecomputeMoeAct,
    /// Data-parallel ranks ZeRO shards over (`dp` unless hybrid sharding).
    DpShard,
}

impl Slot {
    pub const ALL: [Slot; 22] = [
        Slot::Microbatch,
        Slot::Tp,
        Slot::Pp,
        Slot::Dp,
        Slot::Cp,
        Slot::Ep,
        Slot::Microbatches,
        Slot::Interleave,
        Slot::Stage,
        Slot::Layers,
        Slot::FullRecomputeLayers,
        Slot::Selective,
        Slot::SequenceParallel,
        Slot::Zero,
        Slot::OffloadOptimizer,
        Slot::OffloadWeights,
        Slot::OffloadGradients,
        Slot::OffloadActivations,
        Slot::ExpertTp,
        Slot::RecomputeNorms,
        Slot::RecomputeMoeAct,
        Slot::DpShard,
    ];

    /// The symbol's name in the expressions.
    pub fn name(self) -> &'static str {
        match self {
            Slot::Microbatch => "b",
            Slot::Tp => "t",
            Slot::Pp => "p",
            Slot::Dp => "d",
            Slot::Cp => "c",
            Slot::Ep => "e",
            Slot::Microbatches => "m",
            Slot::Interleave => "v",
            Slot::Stage => "i",
            Slot::Layers => "layers",
            Slot::FullRecomputeLayers => "r",
            Slot::Selective => "selective",
            Slot::SequenceParallel => "sp",
            Slot::Zero => "zero",
            Slot::OffloadOptimizer => "off_opt",
            Slot::OffloadWeights => "off_w",
            Slot::OffloadGradients => "off_g",
            Slot::OffloadActivations => "off_act",
            Slot::ExpertTp => "et",
            Slot::RecomputeNorms => "re_norms",
            Slot::RecomputeMoeAct => "re_moe_act",
            Slot::DpShard => "ds",
        }
    }

    pub fn symbol(self) -> Symbol {
        Symbol::new(self.name())
    }

    /// The slot's position in [`Slot::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The position of the slot named `name`, if any (a `match`, cheaper than a search in the
    /// evaluation's inner loop).
    pub fn index_of(name: &str) -> Option<usize> {
        Some(match name {
            "b" => 0,
            "t" => 1,
            "p" => 2,
            "d" => 3,
            "c" => 4,
            "e" => 5,
            "m" => 6,
            "v" => 7,
            "i" => 8,
            "layers" => 9,
            "r" => 10,
            "selective" => 11,
            "sp" => 12,
            "zero" => 13,
            "off_opt" => 14,
            "off_w" => 15,
            "off_g" => 16,
            "off_act" => 17,
            "et" => 18,
            "re_norms" => 19,
            "re_moe_act" => 20,
            "ds" => 21,
            _ => return None,
        })
    }
}

/// Outputs of the stage-cost expressions, in order. Times are seconds, memory bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Per micro-batch: forward and backward compute.
    Compute,
    Recompute,
    TpComm,
    CpComm,
    EpComm,
    PpComm,
    /// ZeRO-3 gathers and reduce-scatters not hidden behind the micro-batch's compute, and
    /// ZeRO-2's reduce-scatters where the framework reduces every micro-batch.
    DpCommPerMicrobatch,
    OffloadPerMicrobatch,
    /// Once per step, after the last backward.
    DpCommTail,
    OptimizerTail,
    OffloadTail,
    /// Peak memory per GPU.
    Weights,
    Gradients,
    OptimizerStates,
    Activations,
    Buffers,
    /// Gradient compression: 1 where the layers' buckets, or the embedding's and output
    /// layer's, go compressed.
    CompressedLayerBuckets,
    CompressedEdgeBuckets,
}

impl Output {
    pub const ALL: [Output; 18] = [
        Output::Compute,
        Output::Recompute,
        Output::TpComm,
        Output::CpComm,
        Output::EpComm,
        Output::PpComm,
        Output::DpCommPerMicrobatch,
        Output::OffloadPerMicrobatch,
        Output::DpCommTail,
        Output::OptimizerTail,
        Output::OffloadTail,
        Output::Weights,
        Output::Gradients,
        Output::OptimizerStates,
        Output::Activations,
        Output::Buffers,
        Output::CompressedLayerBuckets,
        Output::CompressedEdgeBuckets,
    ];

    pub fn index(self) -> usize {
        self as usize
    }

    /// Outputs that add up to a stage's `microbatch_s`.
    pub const MICROBATCH: [Output; 8] = [
        Output::Compute,
        Output::Recompute,
        Output::TpComm,
        Output::CpComm,
        Output::EpComm,
        Output::PpComm,
        Output::DpCommPerMicrobatch,
        Output::OffloadPerMicrobatch,
    ];

    /// Outputs that add up to a stage's `tail_s`.
    pub const TAIL: [Output; 3] = [
        Output::DpCommTail,
        Output::OptimizerTail,
        Output::OffloadTail,
    ];
}

/// Slot values for one stage of a strategy.
#[allow(clippy::too_many_arguments)]
pub fn slot_values(
    strategy: &Strategy,
    microbatches: u64,
    stage: u64,
    layers: u64,
    recompute: Recompute,
    offload: Offload,
) -> [f64; Slot::ALL.len()] {
    let full = match recompute {
        Recompute::Full => layers,
        Recompute::Partial { full_layers } => full_layers.min(layers),
        Recompute::None | Recompute::Selective | Recompute::Modules(_) => 0,
    };
    let modules = recompute.modules();
    let flag = |module: RecomputeModules| if modules.contains(module) { 1.0 } else { 0.0 };
    let mut values = [0.0; Slot::ALL.len()];
    let mut set = |slot: Slot, value: f64| values[slot.index()] = value;
    set(Slot::Microbatch, strategy.microbatch as f64);
    set(Slot::Tp, strategy.tp as f64);
    set(Slot::Pp, strategy.pp as f64);
    set(Slot::Dp, strategy.dp as f64);
    set(Slot::Cp, strategy.cp as f64);
    set(Slot::Ep, strategy.ep as f64);
    set(Slot::Microbatches, microbatches as f64);
    set(Slot::Interleave, strategy.interleave as f64);
    set(Slot::Stage, stage as f64);
    set(Slot::Layers, layers as f64);
    set(Slot::FullRecomputeLayers, full as f64);
    set(Slot::Selective, flag(RecomputeModules::CORE_ATTN));
    set(Slot::RecomputeNorms, flag(RecomputeModules::LAYERNORM));
    set(Slot::RecomputeMoeAct, flag(RecomputeModules::MOE_ACT));
    set(Slot::ExpertTp, strategy.expert_tp() as f64);
    set(Slot::DpShard, strategy.shard_degree() as f64);
    set(
        Slot::SequenceParallel,
        if strategy.sequence_parallel { 1.0 } else { 0.0 },
    );
    set(Slot::Zero, strategy.zero as f64);
    set(Slot::OffloadOptimizer, offload.optimizer);
    set(Slot::OffloadWeights, offload.weights);
    set(Slot::OffloadGradients, offload.gradients);
    set(Slot::OffloadActivations, offload.activations);
    values
}

#[cfg(test)]
mod tests {
    use super::Slot;

    #[test]
    fn index_of_agrees_with_the_slot_order() {
        for (position, slot) in Slot::ALL.iter().enumerate() {
            assert_eq!(slot.index(), position);
            assert_eq!(Slot::index_of(slot.name()), Some(position));
        }
        assert_eq!(Slot::index_of("unknown"), None);
    }
}
