//! Command-line overrides of a strategy (`tessel estimate --tp 8 --pp 4 ...`).

use tessel_grammar::{Recompute, Strategy};

/// Fields given on the command line replace the strategy's; `dp`, when not given, becomes
/// the cluster's GPUs divided by the resulting `tp·pp·cp` (at least 1).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StrategyOverrides {
    pub dp: Option<u64>,
    pub tp: Option<u64>,
    pub pp: Option<u64>,
    pub cp: Option<u64>,
    pub ep: Option<u64>,
    pub microbatch: Option<u64>,
    pub interleave: Option<u64>,
    pub recompute: Option<Recompute>,
    pub zero: Option<u8>,
    pub sequence_parallel: Option<bool>,
}

impl StrategyOverrides {
    pub fn apply(&self, base: &Strategy, cluster_gpus: u64) -> Strategy {
        let mut strategy = base.clone();
        strategy.tp = self.tp.unwrap_or(base.tp);
        strategy.pp = self.pp.unwrap_or(base.pp);
        strategy.cp = self.cp.unwrap_or(base.cp);
        strategy.ep = self.ep.unwrap_or(base.ep);
        strategy.microbatch = self.microbatch.unwrap_or(base.microbatch);
        strategy.interleave = self.interleave.unwrap_or(base.interleave);
        if let Some(recompute) = self.recompute {
            strategy.recompute = recompute;
            strategy.stage_recompute = None;
        }
        strategy.zero = self.zero.unwrap_or(base.zero);
        strategy.sequence_parallel = self.sequence_parallel.unwrap_or(base.sequence_parallel);
        let model_parallel = strategy
            .tp
            .saturating_mul(strategy.pp)
            .saturating_mul(strategy.cp)
            .max(1);
        strategy.dp = self
            .dp
            .unwrap_or_else(|| (cluster_gpus / model_parallel).max(1));
        // Explicit per-stage layers no longer match a changed pipeline.
        if strategy.pp != base.pp || strategy.interleave != base.interleave {
            strategy.stages = None;
        }
        // Per-stage choices of another pipeline depth no longer match either: the first
        // stage's applies to all.
        if strategy.pp != base.pp {
            strategy.stage_recompute = None;
            strategy.stage_offload = None;
        }
        strategy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Strategy {
        Strategy {
            name: "base".into(),
            dp: 8,
            tp: 8,
            pp: 2,
            zero: 1,
            stages: Some(vec![40, 40]),
            ..Strategy::default()
        }
    }

    #[test]
    fn dp_follows_the_other_degrees() {
        let over = StrategyOverrides {
            tp: Some(4),
            pp: Some(4),
            ..Default::default()
        };
        let s = over.apply(&base(), 128);
        assert_eq!((s.dp, s.tp, s.pp), (8, 4, 4));
        assert_eq!(s.stages, None);
    }

    #[test]
    fn explicit_dp_and_flags_win() {
        let over = StrategyOverrides {
            dp: Some(2),
            recompute: Some(Recompute::Full),
            sequence_parallel: Some(true),
            zero: Some(3),
            ..Default::default()
        };
        let s = over.apply(&base(), 128);
        assert_eq!(s.dp, 2);
        assert_eq!(s.recompute, Recompute::Full);
        assert!(s.sequence_parallel);
        assert_eq!(s.zero, 3);
        assert_eq!(s.stages, Some(vec![40, 40]));
    }

    #[test]
    fn nothing_given_keeps_the_base() {
        assert_eq!(StrategyOverrides::default().apply(&base(), 128), base());
    }
}
