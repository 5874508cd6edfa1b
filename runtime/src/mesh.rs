//! The device mesh: global rank ↔ coordinates, and the members of every process group.
//!
//! Rank mapping (Megatron-Core order): tensor parallel innermost, then context, then data,
//! pipeline outermost: `rank = ((pp_i·dp + dp_i)·cp + cp_i)·tp + tp_i`. Expert-parallel groups
//! are drawn from the `dp×cp` ranks of one (pp, tp) coordinate: consecutive blocks of `ep`.

use crate::plan::ExecutionPlan;

/// Kinds of process group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GroupKind {
    World,
    Tensor,
    Context,
    Data,
    Pipeline,
    /// Data × context: the ranks that hold the same dense parameters.
    DataContext,
    Expert,
    /// Ranks holding the same experts (data × context ranks with one expert index).
    ExpertData,
    /// First and last pipeline stage of one (dp, cp, tp): the tied-embedding copies.
    Embedding,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coords {
    pub pp: u64,
    pub dp: u64,
    pub cp: u64,
    pub tp: u64,
    /// Index within the expert-parallel group.
    pub ep: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mesh {
    pub dp: u64,
    pub tp: u64,
    pub pp: u64,
    pub cp: u64,
    pub ep: u64,
}

impl Mesh {
    pub fn new(plan: &ExecutionPlan) -> Self {
        Mesh {
            dp: plan.dp,
            tp: plan.tp,
            pp: plan.pp,
            cp: plan.cp,
            ep: plan.ep,
        }
    }

    pub fn world_size(&self) -> u64 {
        self.dp * self.tp * self.pp * self.cp
    }

    pub fn rank_of(&self, pp: u64, dp: u64, cp: u64, tp: u64) -> u64 {
        ((pp * self.dp + dp) * self.cp + cp) * self.tp + tp
    }

    pub fn coords(&self, rank: u64) -> Coords {
        let tp = rank % self.tp;
        let cp = (rank / self.tp) % self.cp;
        let dp = (rank / (self.tp * self.cp)) % self.dp;
        let pp = rank / (self.tp * self.cp * self.dp);
        Coords {
            pp,
            dp,
            cp,
            tp,
            ep: (dp * self.cp + cp) % self.ep,
        }
    }

    /// Members of the group of `kind` that `rank` belongs to, in ascending rank order
    /// (a member's index in this list is its rank within the group).
    pub fn group(&self, kind: GroupKind, rank: u64) -> Vec<u64> {
        let c = self.coords(rank);
        let dpcp = |pp: u64, tp: u64, keep: &dyn Fn(u64) -> bool| -> Vec<u64> {
            (0..self.dp * self.cp)
                .filter(|&i| keep(i))
                .map(|i| self.rank_of(pp, i / self.cp, i % self.cp, tp))
                .collect()
        };
        let my_dpcp = c.dp * self.cp + c.cp;
        let mut members: Vec<u64> = match kind {
            GroupKind::World => (0..self.world_size()).collect(),
            GroupKind::Tensor => (0..self.tp)
                .map(|t| self.rank_of(c.pp, c.dp, c.cp, t))
                .collect(),
            GroupKind::Context => (0..self.cp)
                .map(|x| self.rank_of(c.pp, c.dp, x, c.tp))
                .collect(),
            GroupKind::Data => (0..self.dp)
                .map(|d| self.rank_of(c.pp, d, c.cp, c.tp))
                .collect(),
            GroupKind::Pipeline => (0..self.pp)
                .map(|p| self.rank_of(p, c.dp, c.cp, c.tp))
                .collect(),
            GroupKind::DataContext => dpcp(c.pp, c.tp, &|_| true),
            GroupKind::Expert => dpcp(c.pp, c.tp, &|i| i / self.ep == my_dpcp / self.ep),
            GroupKind::ExpertData => dpcp(c.pp, c.tp, &|i| i % self.ep == my_dpcp % self.ep),
            GroupKind::Embedding if c.pp == 0 || c.pp == self.pp - 1 => {
                let mut v = vec![self.rank_of(0, c.dp, c.cp, c.tp)];
                if self.pp > 1 {
                    v.push(self.rank_of(self.pp - 1, c.dp, c.cp, c.tp));
                }
                v
            }
            // Middle stages hold no embedding copy: a group of their own.
            GroupKind::Embedding => vec![rank],
        };
        members.sort_unstable();
        members
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh(dp: u64, tp: u64, pp: u64, cp: u64, ep: u64) -> Mesh {
        Mesh { dp, tp, pp, cp, ep }
    }

    #[test]
    fn rank_mapping_round_trips_with_tp_innermost() {
        let m = mesh(2, 2, 3, 2, 2);
        for r in 0..m.world_size() {
            let c = m.coords(r);
            assert_eq!(m.rank_of(c.pp, c.dp, c.cp, c.tp), r);
        }
        assert_eq!(m.coords(1).tp, 1);
        assert_eq!(m.coords(2).cp, 1);
        assert_eq!(m.coords(4).dp, 1);
        assert_eq!(m.coords(8).pp, 1);
    }

    #[test]
    fn groups_partition_the_world() {
        let m = mesh(4, 2, 2, 1, 2);
        for kind in [
            GroupKind::Tensor,
            GroupKind::Data,
            GroupKind::Pipeline,
            GroupKind::DataContext,
            GroupKind::Expert,
            GroupKind::ExpertData,
        ] {
            let mut seen = vec![0; m.world_size() as usize];
            for r in 0..m.world_size() {
                let g = m.group(kind, r);
                assert!(g.contains(&r));
                for &o in &g {
                    assert_eq!(m.group(kind, o), g, "{kind:?}");
                }
                seen[r as usize] += 1;
            }
            assert!(seen.iter().all(|&s| s == 1));
        }
        assert_eq!(m.group(GroupKind::Tensor, 5), vec![4, 5]);
        assert_eq!(m.group(GroupKind::Data, 1), vec![1, 3, 5, 7]);
        assert_eq!(m.group(GroupKind::Pipeline, 3), vec![3, 11]);
        assert_eq!(m.group(GroupKind::Expert, 0), vec![0, 2]);
        assert_eq!(m.group(GroupKind::ExpertData, 0), vec![0, 4]);
        assert_eq!(m.group(GroupKind::Embedding, 9), vec![1, 9]);
        let deep = mesh(1, 1, 4, 1, 1);
        assert_eq!(deep.group(GroupKind::Embedding, 0), vec![0, 3]);
        assert_eq!(deep.group(GroupKind::Embedding, 2), vec![2]);
    }
}
