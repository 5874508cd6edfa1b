//! Batch arithmetic shared by the targets: sequences per micro-batch, per data-parallel rank
//! and per step, and the micro-batches (gradient-accumulation steps) in between.

use tessel_grammar::{Spec, Strategy};

use super::Report;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Batches {
    /// Sequences per micro-batch.
    pub micro: u64,
    /// Data-parallel replicas.
    pub dp: u64,
    /// Sequences per optimizer step.
    pub global: u64,
    /// Micro-batches per replica per step (gradient accumulation, or pipeline micro-batches).
    pub micro_batches: u64,
}

impl Batches {
    /// Sequences each data-parallel replica processes per step.
    pub fn per_replica(&self) -> u64 {
        self.micro.saturating_mul(self.micro_batches)
    }
}

pub(crate) fn batches(spec: &Spec, strategy: &Strategy, report: &mut Report) -> Batches {
    let micro = strategy.microbatch.max(1);
    let dp = strategy.dp.max(1);
    let global = spec.train.global_batch;
    let per_round = micro.saturating_mul(dp);
    let micro_batches = (global / per_round).max(1);
    if !global.is_multiple_of(per_round) || global < per_round {
        report.note(format!(
            "global_batch {global} is not a multiple of microbatch·dp = {micro}·{dp}; the \
             frameworks need it to be, so each replica runs {micro_batches} micro-batch(es) and \
             the global batch becomes {}",
            micro_batches.saturating_mul(per_round)
        ));
    }
    Batches {
        micro,
        dp,
        global: micro_batches.saturating_mul(per_round),
        micro_batches,
    }
}
