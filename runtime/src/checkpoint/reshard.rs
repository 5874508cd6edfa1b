//! Which rank's shards each rank of a new plan reads when a run moves to it through a
//! checkpoint: the resharding map `tessel replan` prints and costs, computed from the same
//! layouts the runtime writes and reads, so it is what the runtime moves.
//!
//! Under the old plan the first of each group's replicas writes each parameter's rectangle
//! (with both Adam moments, but for frozen parameters); pieces with the same rectangle
//! (replicated key/value heads, a tied embedding's copy) are read from the lowest rank. Each
//! rank of the new plan reads every rectangle it holds, the moments whole where it trains the
//! parameter and the checkpoint has them, and keeps its ZeRO shard of them.

use std::collections::BTreeMap;

use tessel_grammar::ModelSpec;

use super::StateKind;
use crate::mesh::Mesh;
use crate::model::layout::{rank_groups, ParamSpec};
use crate::plan::ExecutionPlan;

/// Elements one rank of the new plan reads from one rank of the old, over all states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReshardSource {
    /// The old plan's rank that wrote them.
    pub from: u64,
    /// The new plan's rank that reads them.
    pub to: u64,
    /// f32 elements: parameters and both moments.
    pub elements: u64,
}

/// A written piece: its rank, its rectangle and whether its moments were written too.
type Piece = (u64, ParamSpec, bool);

/// The pieces a checkpoint of `plan` holds, by parameter name, sorted by offsets then rank,
/// identical rectangles once.
fn written(model: &ModelSpec, plan: &ExecutionPlan) -> BTreeMap<String, Vec<Piece>> {
    let mesh = Mesh::new(plan);
    let mut pieces: BTreeMap<String, Vec<Piece>> = BTreeMap::new();
    for rank in 0..plan.world_size() {
        for group in rank_groups(model, plan, mesh.coords(rank)) {
            if mesh.group(group.replication, rank).first() != Some(&rank) {
                continue;
            }
            for p in group.params {
                let moments = !group.frozen;
                pieces
                    .entry(p.name.clone())
                    .or_default()
                    .push((rank, p, moments));
            }
        }
    }
    for list in pieces.values_mut() {
        list.sort_by_key(|(rank, p, _)| (p.row_range(), p.col_range(), *rank));
        list.dedup_by_key(|(_, p, _)| (p.row_range(), p.col_range()));
    }
    pieces
}

/// For each (old rank, new rank) pair, the elements the new rank reads from the old one's
/// pieces when `new` resumes a checkpoint `old` wrote.
pub fn reshard_sources(
    model: &ModelSpec,
    old: &ExecutionPlan,
    new: &ExecutionPlan,
) -> Vec<ReshardSource> {
    let pieces = written(model, old);
    let mesh = Mesh::new(new);
    let mut pairs: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    for to in 0..new.world_size() {
        for group in rank_groups(model, new, mesh.coords(to)) {
            for p in &group.params {
                let ((r0, r1), (c0, c1)) = (p.row_range(), p.col_range());
                for (from, q, moments) in pieces.get(&p.name).into_iter().flatten() {
                    let ((q0, q1), (d0, d1)) = (q.row_range(), q.col_range());
                    let rows = r1.min(q1).saturating_sub(r0.max(q0));
                    let cols = c1.min(d1).saturating_sub(c0.max(d0));
                    let states = if *moments && !group.frozen {
                        StateKind::ALL.len() as u64
                    } else {
                        1
                    };
                    if rows * cols > 0 {
                        *pairs.entry((*from, to)).or_insert(0) += rows * cols * states;
                    }
                }
            }
        }
    }
    pairs
        .into_iter()
        .map(|((from, to), elements)| ReshardSource { from, to, elements })
        .collect()
}
