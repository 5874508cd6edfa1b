//! Where every global rank runs and its coordinate in each parallel dimension.
//!
//! Ranks are numbered with tensor parallel innermost, then context parallel, then data parallel,
//! and pipeline parallel outermost: `rank = ((pp_i · dp + dp_i) · cp + cp_i) · tp + tp_i`. With
//! `tp ≤ gpus_per_node` dividing it, a tensor-parallel group never leaves a node. Consecutive
//! ranks fill a node: `node = rank / gpus_per_node`, `local_gpu = rank mod gpus_per_node`.
//! Expert-parallel ranks are drawn from the data- and context-parallel ranks (Megatron-Core's
//! convention): with `j = dp_i · cp + cp_i`, the expert-parallel coordinate is `j mod ep`.

use serde::{Deserialize, Serialize};

/// Column names of [`RankMap::ranks`] rows.
pub const RANK_COLUMNS: [&str; 8] = ["rank", "node", "local_gpu", "pp", "dp", "cp", "tp", "ep"];

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankMap {
    /// Parallel dimensions from outermost to innermost.
    pub order: Vec<String>,
    /// Names of the entries of each row of `ranks`.
    pub columns: Vec<String>,
    /// One row per global rank, in rank order.
    pub ranks: Vec<[u64; 8]>,
}

/// One rank's place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankCoordinates {
    pub rank: u64,
    pub node: u64,
    pub local_gpu: u64,
    pub pp: u64,
    pub dp: u64,
    pub cp: u64,
    pub tp: u64,
    pub ep: u64,
}

/// Degrees the map is built from.
#[derive(Clone, Copy, Debug)]
pub struct MeshShape {
    pub tp: u64,
    pub cp: u64,
    pub dp: u64,
    pub pp: u64,
    pub ep: u64,
    /// The experts' tensor-parallel degree; below `tp`, expert-parallel ranks are counted over
    /// the tp·cp·dp ranks of a stage in blocks of `etp` (Megatron-Core's expert rank order).
    pub etp: u64,
    pub gpus_per_node: u64,
}

pub fn coordinates(shape: &MeshShape, rank: u64) -> RankCoordinates {
    let tp = shape.tp.max(1);
    let cp = shape.cp.max(1);
    let dp = shape.dp.max(1);
    let ep = shape.ep.max(1);
    let tp_i = rank % tp;
    let cp_i = (rank / tp) % cp;
    let dp_i = (rank / (tp * cp)) % dp;
    let pp_i = rank / (tp * cp * dp);
    RankCoordinates {
        rank,
        node: rank / shape.gpus_per_node.max(1),
        local_gpu: rank % shape.gpus_per_node.max(1),
        pp: pp_i,
        dp: dp_i,
        cp: cp_i,
        tp: tp_i,
        ep: if shape.etp < tp {
            ((rank % (tp * cp * dp)) / shape.etp.max(1)) % ep
        } else {
            (dp_i * cp + cp_i) % ep
        },
    }
}

impl RankMap {
    pub fn build(shape: &MeshShape) -> RankMap {
        let world = shape.tp * shape.cp * shape.dp * shape.pp;
        let ranks = (0..world)
            .map(|rank| {
                let c = coordinates(shape, rank);
                [c.rank, c.node, c.local_gpu, c.pp, c.dp, c.cp, c.tp, c.ep]
            })
            .collect();
        RankMap {
            order: ["pp", "dp", "cp", "tp"].map(String::from).to_vec(),
            columns: RANK_COLUMNS.map(String::from).to_vec(),
            ranks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_parallel_is_innermost_and_stays_in_a_node() {
        let shape = MeshShape {
            tp: 4,
            cp: 2,
            dp: 2,
            pp: 2,
            ep: 2,
            etp: 4,
            gpus_per_node: 8,
        };
        let map = RankMap::build(&shape);
        assert_eq!(map.ranks.len(), 32);
        assert_eq!(map.ranks[0], [0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(map.ranks[5], [5, 0, 5, 0, 0, 1, 1, 1]);
        assert_eq!(map.ranks[9], [9, 1, 1, 0, 1, 0, 1, 0]);
        assert_eq!(map.ranks[16], [16, 2, 0, 1, 0, 0, 0, 0]);
        for row in &map.ranks {
            let group_start = row[0] - row[6];
            assert_eq!(
                group_start / 8,
                row[1],
                "tp group of rank {} spans nodes",
                row[0]
            );
        }
    }
}
