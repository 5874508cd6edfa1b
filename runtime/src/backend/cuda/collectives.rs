//! Collectives of the CUDA backend. Sums, gathers and reduce-scatters use one NCCL communicator
//! per process group, created from unique ids that rank 0 makes and hands out through the
//! rendezvous, all on the device's reduction stream. Operations whose receivers cannot know the
//! size in advance (point-to-point, all-to-all, broadcast) are staged through the host over
//! the rendezvous connection, as on the CPU backend: correct for any shape, not fast.

use super::backend::{CudaBackend, CudaTensor};
use crate::backend::shared_memory::ALL_GROUP_KINDS;
use crate::backend::Backend;
use crate::error::RuntimeError;
use crate::launcher::comm::HubLink;
use crate::launcher::wire::{GroupKey, WireTensor};
use crate::mesh::{GroupKind, Mesh};
use cudarc::driver::CudaStream;
use cudarc::nccl::{Comm, Id, ReduceOp};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Bytes of one NCCL unique id.
pub const ID_BYTES: usize = 128;

/// Every distinct group of the mesh with more than one member, in a fixed order: the order
/// of the unique ids in the rendezvous payload.
pub fn group_keys(mesh: &Mesh) -> Vec<GroupKey> {
    let mut keys = BTreeSet::new();
    for rank in 0..mesh.world_size() {
        for (code, &kind) in ALL_GROUP_KINDS.iter().enumerate() {
            let members = mesh.group(kind, rank);
            if members.len() > 1 {
                keys.insert((code as u8, members));
            }
        }
    }
    keys.into_iter().collect()
}

/// Rank 0's payload: one fresh NCCL unique id per group, in `group_keys` order.
pub fn make_ids(mesh: &Mesh) -> Result<Vec<u8>, String> {
    let mut payload = Vec::new();
    for _ in group_keys(mesh) {
        let id = Id::new().map_err(|e| format!("NCCL cannot make a unique id: {e:?}"))?;
        payload.extend(id.internal().iter().map(|&c| c as u8));
    }
    Ok(payload)
}

struct Group {
    key: GroupKey,
    index: usize,
    comm: Option<Comm>,
}

pub struct Communicators {
    groups: BTreeMap<GroupKind, Group>,
    link: Arc<HubLink>,
}

fn nccl_error(what: &str, e: impl std::fmt::Debug) -> RuntimeError {
    RuntimeError::RankFailed {
        rank: usize::MAX,
        reason: format!("NCCL {what}: {e:?}"),
    }
}

impl Communicators {
    /// Joins one communicator per group of this rank. Every rank walks the group kinds in the
    /// same order, so the blocking NCCL initialisations meet.
    pub fn new(
        mesh: &Mesh,
        rank: u64,
        payload: &[u8],
        stream: &Arc<CudaStream>,
        link: Arc<HubLink>,
    ) -> Result<Communicators, String> {
        let keys = group_keys(mesh);
        if payload.len() != keys.len() * ID_BYTES {
            return Err(format!(
                "rank 0 sent {} bytes of NCCL ids; {} groups need {}",
                payload.len(),
                keys.len(),
                keys.len() * ID_BYTES
            ));
        }
        let mut groups = BTreeMap::new();
        for (code, &kind) in ALL_GROUP_KINDS.iter().enumerate() {
            let members = mesh.group(kind, rank);
            let index = members
                .iter()
                .position(|&m| m == rank)
                .expect("member of own group");
            let key: GroupKey = (code as u8, members);
            let comm = match keys.iter().position(|k| *k == key) {
                None => None,
                Some(at) => {
                    let mut raw = [0 as std::ffi::c_char; ID_BYTES];
                    for (d, s) in raw.iter_mut().zip(&payload[at * ID_BYTES..][..ID_BYTES]) {
                        *d = *s as std::ffi::c_char;
                    }
                    let comm = Comm::from_rank(stream.clone(), index, key.1.len(), Id::uninit(raw))
                        .map_err(|e| format!("NCCL cannot join the {kind:?} group: {e:?}"))?;
                    Some(comm)
                }
            };
            groups.insert(kind, Group { key, index, comm });
        }
        Ok(Communicators { groups, link })
    }

    pub fn size(&self, kind: GroupKind) -> usize {
        self.groups[&kind].key.1.len()
    }

    pub fn index(&self, kind: GroupKind) -> usize {
        self.groups[&kind].index
    }

    fn check_alive(&self) -> Result<(), RuntimeError> {
        match self.link.abort_reason() {
            Some(_) => Err(RuntimeError::Aborted),
            None => Ok(()),
        }
    }

    pub fn all_reduce(
        &self,
        b: &CudaBackend,
        kind: GroupKind,
        t: &CudaTensor,
    ) -> Result<CudaTensor, RuntimeError> {
        self.check_alive()?;
        let Some(comm) = &self.groups[&kind].comm else {
            return Ok(t.clone());
        };
        let n = t.rows * t.cols;
        let mut out = b.zeros(t.rows, t.cols);
        if n > 0 {
            comm.all_reduce(
                &t.data.slice(0..n),
                &mut out.data.slice_mut(0..n),
                &ReduceOp::Sum,
            )
            .map_err(|e| nccl_error("all-reduce", e))?;
        }
        Ok(out)
    }

    pub fn all_gather(
        &self,
        b: &CudaBackend,
        kind: GroupKind,
        t: &CudaTensor,
    ) -> Result<CudaTensor, RuntimeError> {
        self.check_alive()?;
        let Some(comm) = &self.groups[&kind].comm else {
            return Ok(t.clone());
        };
        let size = self.size(kind);
        let n = t.rows * t.cols;
        let mut out = b.zeros(t.rows * size, t.cols);
        if n > 0 {
            comm.all_gather(&t.data.slice(0..n), &mut out.data.slice_mut(0..n * size))
                .map_err(|e| nccl_error("all-gather", e))?;
        }
        Ok(out)
    }

    pub fn reduce_scatter(
        &self,
        b: &CudaBackend,
        kind: GroupKind,
        t: &CudaTensor,
    ) -> Result<CudaTensor, RuntimeError> {
        self.check_alive()?;
        let size = self.size(kind);
        if !t.rows.is_multiple_of(size) {
            return Err(RuntimeError::invalid_plan(format!(
                "reduce-scatter of {} rows over {size} ranks",
                t.rows
            )));
        }
        let Some(comm) = &self.groups[&kind].comm else {
            return Ok(t.clone());
        };
        let block = t.rows / size;
        let n = block * t.cols;
        let mut out = b.zeros(block, t.cols);
        if n > 0 {
            comm.reduce_scatter(
                &t.data.slice(0..n * size),
                &mut out.data.slice_mut(0..n),
                &ReduceOp::Sum,
            )
            .map_err(|e| nccl_error("reduce-scatter", e))?;
        }
        Ok(out)
    }

    fn host_exchange(
        &self,
        b: &CudaBackend,
        kind: GroupKind,
        parts: &[CudaTensor],
    ) -> Result<Vec<Vec<CudaTensor>>, RuntimeError> {
        let g = &self.groups[&kind];
        let wire = parts.iter().map(|t| to_wire(b, t)).collect();
        let all = self.link.exchange(&g.key, g.index, wire)?;
        Ok(all
            .into_iter()
            .map(|d| {
                d.into_iter()
                    .map(|w| b.tensor(w.data, w.rows, w.cols))
                    .collect()
            })
            .collect())
    }

    pub fn all_to_all(
        &self,
        b: &CudaBackend,
        kind: GroupKind,
        parts: Vec<CudaTensor>,
    ) -> Result<Vec<CudaTensor>, RuntimeError> {
        if parts.len() != self.size(kind) {
            return Err(RuntimeError::invalid_plan(
                "all-to-all needs one part per member",
            ));
        }
        if parts.len() == 1 {
            return Ok(parts);
        }
        let i = self.index(kind);
        let all = self.host_exchange(b, kind, &parts)?;
        Ok(all.into_iter().map(|mut d| d.swap_remove(i)).collect())
    }

    pub fn broadcast(
        &self,
        b: &CudaBackend,
        kind: GroupKind,
        t: &CudaTensor,
        root: usize,
    ) -> Result<CudaTensor, RuntimeError> {
        if self.size(kind) == 1 {
            return Ok(t.clone());
        }
        let mut all = self.host_exchange(b, kind, std::slice::from_ref(t))?;
        Ok(all.swap_remove(root).swap_remove(0))
    }

    pub fn send(&self, peer: usize, tag: u64, t: &WireTensor) -> Result<(), RuntimeError> {
        self.link.send_to(peer as u64, tag, t.clone())
    }

    pub fn recv(&self, peer: usize, tag: u64) -> Result<WireTensor, RuntimeError> {
        self.link.recv_from(peer as u64, tag)
    }
}

pub fn to_wire(b: &CudaBackend, t: &CudaTensor) -> WireTensor {
    WireTensor {
        rows: t.rows,
        cols: t.cols,
        data: b.to_vec(t),
    }
}
