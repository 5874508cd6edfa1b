//! The CPU backend for ranks that are separate processes: the arithmetic is the threaded CPU
//! backend's (an inner single-rank `CpuBackend`), the collectives go through the hub over TCP.
//! Reductions sum the members' deposits in group order, exactly as the shared-memory exchange
//! does, so a multi-process run gives bit-identical results to the threaded run.

use super::comm::HubLink;
use super::wire::{GroupKey, WireTensor};
use crate::backend::cpu::{CpuBackend, CpuTensor};
use crate::backend::exchange::ExchangeCollectives;
use crate::backend::shared_memory::{World, ALL_GROUP_KINDS};
use crate::backend::{AdamParams, AttentionShape, Backend};
use crate::error::RuntimeError;
use crate::mesh::{GroupKind, Mesh};
use std::collections::BTreeMap;
use std::sync::Arc;
use tessel_grammar::NormKind;

struct Group {
    key: GroupKey,
    index: usize,
}

pub struct TcpCpuBackend {
    compute: CpuBackend,
    link: Arc<HubLink>,
    groups: BTreeMap<GroupKind, Group>,
}

impl TcpCpuBackend {
    pub fn new(mesh: &Mesh, link: Arc<HubLink>) -> Self {
        let rank = link.rank();
        let groups = ALL_GROUP_KINDS
            .iter()
            .enumerate()
            .map(|(code, &kind)| {
                let members = mesh.group(kind, rank);
                let index = members
                    .iter()
                    .position(|&m| m == rank)
                    .expect("member of own group");
                let key = (code as u8, members);
                (kind, Group { key, index })
            })
            .collect();
        let alone = Mesh {
            dp: 1,
            tp: 1,
            pp: 1,
            cp: 1,
            ep: 1,
        };
        TcpCpuBackend {
            compute: CpuBackend::new(World::new(alone), 0),
            link,
            groups,
        }
    }

    fn to_wire(&self, t: &CpuTensor) -> WireTensor {
        let (rows, cols) = self.compute.shape(t);
        WireTensor {
            rows,
            cols,
            data: self.compute.to_vec(t),
        }
    }

    fn wire_to_tensor(&self, t: WireTensor) -> CpuTensor {
        self.compute.tensor(t.data, t.rows, t.cols)
    }
}

impl ExchangeCollectives for TcpCpuBackend {
    type Received = Vec<CpuTensor>;

    fn arithmetic(&self) -> &CpuBackend {
        &self.compute
    }

    fn members(&self, kind: GroupKind) -> usize {
        self.groups[&kind].key.1.len()
    }

    fn member_index(&self, kind: GroupKind) -> usize {
        self.groups[&kind].index
    }

    fn exchange(
        &self,
        kind: GroupKind,
        parts: Vec<CpuTensor>,
    ) -> Result<Vec<Vec<CpuTensor>>, RuntimeError> {
        let g = &self.groups[&kind];
        let wire = parts.iter().map(|t| self.to_wire(t)).collect();
        let all = self.link.exchange(&g.key, g.index, wire)?;
        Ok(all
            .into_iter()
            .map(|d| d.into_iter().map(|t| self.wire_to_tensor(t)).collect())
            .collect())
    }
}

impl Backend for TcpCpuBackend {
    type Tensor = CpuTensor;

    fn tensor(&self, data: Vec<f32>, rows: usize, cols: usize) -> CpuTensor {
        self.compute.tensor(data, rows, cols)
    }
    fn zeros(&self, rows: usize, cols: usize) -> CpuTensor {
        self.compute.zeros(rows, cols)
    }
    fn to_vec(&self, t: &CpuTensor) -> Vec<f32> {
        self.compute.to_vec(t)
    }
    fn shape(&self, t: &CpuTensor) -> (usize, usize) {
        self.compute.shape(t)
    }
    fn reshape(&self, t: &CpuTensor, rows: usize, cols: usize) -> CpuTensor {
        self.compute.reshape(t, rows, cols)
    }
    fn matmul(&self, a: &CpuTensor, b: &CpuTensor, ta: bool, tb: bool) -> CpuTensor {
        self.compute.matmul(a, b, ta, tb)
    }
    fn timed_matmuls(&self) -> Vec<crate::trace::MatmulRecord> {
        self.compute.timed_matmuls()
    }
    fn add(&self, a: &CpuTensor, b: &CpuTensor) -> CpuTensor {
        self.compute.add(a, b)
    }
    fn add_assign(&self, a: &mut CpuTensor, b: &CpuTensor) {
        self.compute.add_assign(a, b)
    }
    fn mul(&self, a: &CpuTensor, b: &CpuTensor) -> CpuTensor {
        self.compute.mul(a, b)
    }
    fn add_row(&self, a: &CpuTensor, bias: &CpuTensor) -> CpuTensor {
        self.compute.add_row(a, bias)
    }
    fn sum_rows(&self, a: &CpuTensor) -> CpuTensor {
        self.compute.sum_rows(a)
    }
    fn scale_rows(&self, a: &CpuTensor, scales: &[f32]) -> CpuTensor {
        self.compute.scale_rows(a, scales)
    }
    fn row_dots(&self, a: &CpuTensor, b: &CpuTensor) -> Vec<f32> {
        self.compute.row_dots(a, b)
    }
    fn gelu(&self, x: &CpuTensor) -> CpuTensor {
        self.compute.gelu(x)
    }
    fn gelu_backward(&self, x: &CpuTensor, dy: &CpuTensor) -> CpuTensor {
        self.compute.gelu_backward(x, dy)
    }
    fn silu(&self, x: &CpuTensor) -> CpuTensor {
        self.compute.silu(x)
    }
    fn silu_backward(&self, x: &CpuTensor, dy: &CpuTensor) -> CpuTensor {
        self.compute.silu_backward(x, dy)
    }
    fn norm(
        &self,
        kind: NormKind,
        x: &CpuTensor,
        weight: &CpuTensor,
        bias: Option<&CpuTensor>,
    ) -> (CpuTensor, CpuTensor) {
        self.compute.norm(kind, x, weight, bias)
    }
    fn norm_backward(
        &self,
        kind: NormKind,
        x: &CpuTensor,
        weight: &CpuTensor,
        stats: &CpuTensor,
        dy: &CpuTensor,
        has_bias: bool,
    ) -> (CpuTensor, CpuTensor, Option<CpuTensor>) {
        self.compute
            .norm_backward(kind, x, weight, stats, dy, has_bias)
    }
    fn attention(
        &self,
        shape: AttentionShape,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
    ) -> (CpuTensor, CpuTensor) {
        self.compute.attention(shape, q, k, v)
    }
    fn attention_backward(
        &self,
        shape: AttentionShape,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        probs: &CpuTensor,
        dout: &CpuTensor,
    ) -> (CpuTensor, CpuTensor, CpuTensor) {
        self.compute.attention_backward(shape, q, k, v, probs, dout)
    }
    fn rope(
        &self,
        x: &CpuTensor,
        head_dim: usize,
        seq_len: usize,
        offset: usize,
        inverse: bool,
    ) -> CpuTensor {
        self.compute.rope(x, head_dim, seq_len, offset, inverse)
    }
    fn gather_rows(&self, table: &CpuTensor, rows: &[usize]) -> CpuTensor {
        self.compute.gather_rows(table, rows)
    }
    fn scatter_add_rows(&self, dst: &mut CpuTensor, rows: &[usize], src: &CpuTensor) {
        self.compute.scatter_add_rows(dst, rows, src)
    }
    fn slice_rows(&self, t: &CpuTensor, start: usize, end: usize) -> CpuTensor {
        self.compute.slice_rows(t, start, end)
    }
    fn concat_rows(&self, parts: &[&CpuTensor]) -> CpuTensor {
        self.compute.concat_rows(parts)
    }
    fn slice_cols(&self, t: &CpuTensor, start: usize, end: usize) -> CpuTensor {
        self.compute.slice_cols(t, start, end)
    }
    fn cross_entropy(&self, logits: &CpuTensor, targets: &[u32], scale: f32) -> (f64, CpuTensor) {
        self.compute.cross_entropy(logits, targets, scale)
    }
    fn adam(
        &self,
        param: &mut CpuTensor,
        grad: &CpuTensor,
        m: &mut CpuTensor,
        v: &mut CpuTensor,
        hp: AdamParams,
        step: u64,
    ) {
        self.compute.adam(param, grad, m, v, hp, step)
    }

    fn group_size(&self, kind: GroupKind) -> usize {
        self.members(kind)
    }
    fn group_index(&self, kind: GroupKind) -> usize {
        self.member_index(kind)
    }
    fn all_reduce(&self, kind: GroupKind, t: &CpuTensor) -> Result<CpuTensor, RuntimeError> {
        self.exchange_all_reduce(kind, t)
    }
    fn all_gather(&self, kind: GroupKind, t: &CpuTensor) -> Result<CpuTensor, RuntimeError> {
        self.exchange_all_gather(kind, t)
    }
    fn reduce_scatter(&self, kind: GroupKind, t: &CpuTensor) -> Result<CpuTensor, RuntimeError> {
        self.exchange_reduce_scatter(kind, t)
    }
    fn all_to_all(
        &self,
        kind: GroupKind,
        parts: Vec<CpuTensor>,
    ) -> Result<Vec<CpuTensor>, RuntimeError> {
        self.exchange_all_to_all(kind, parts)
    }
    fn broadcast(
        &self,
        kind: GroupKind,
        t: &CpuTensor,
        root: usize,
    ) -> Result<CpuTensor, RuntimeError> {
        self.exchange_broadcast(kind, t, root)
    }
    fn barrier(&self, kind: GroupKind) -> Result<(), RuntimeError> {
        self.exchange_barrier(kind)
    }
    fn send(&self, peer: usize, tag: u64, t: &CpuTensor) -> Result<(), RuntimeError> {
        self.link.send_to(peer as u64, tag, self.to_wire(t))
    }
    fn recv(&self, peer: usize, tag: u64) -> Result<CpuTensor, RuntimeError> {
        let t = self.link.recv_from(peer as u64, tag)?;
        Ok(self.wire_to_tensor(t))
    }
}
