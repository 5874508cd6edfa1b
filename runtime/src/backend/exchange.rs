//! Collectives built on one primitive, an exchange in which every member of a group deposits
//! its parts and receives every member's parts in member order. The shared-memory CPU backend
//! and the TCP one differ only in how they exchange; both reduce the same way (sums in member
//! order), which is what makes a multi-process run bit-identical to the threaded one.

use super::cpu::{CpuBackend, CpuTensor};
use super::Backend;
use crate::error::RuntimeError;
use crate::mesh::GroupKind;

pub(crate) trait ExchangeCollectives {
    /// One member's parts as received.
    type Received: AsRef<Vec<CpuTensor>>;

    /// The arithmetic the reductions use.
    fn arithmetic(&self) -> &CpuBackend;
    fn members(&self, kind: GroupKind) -> usize;
    fn member_index(&self, kind: GroupKind) -> usize;
    fn exchange(
        &self,
        kind: GroupKind,
        parts: Vec<CpuTensor>,
    ) -> Result<Vec<Self::Received>, RuntimeError>;

    fn exchange_all_reduce(
        &self,
        kind: GroupKind,
        t: &CpuTensor,
    ) -> Result<CpuTensor, RuntimeError> {
        if self.members(kind) == 1 {
            return Ok(t.clone());
        }
        let all = self.exchange(kind, vec![t.clone()])?;
        Ok(self.sum_in_member_order(&all, 0))
    }

    /// The sum of every member's part `part`, added in member order (which is what makes the
    /// result the same on every rank and every backend).
    fn sum_in_member_order(&self, all: &[Self::Received], part: usize) -> CpuTensor {
        let mut sum = all[0].as_ref()[part].clone();
        for d in &all[1..] {
            self.arithmetic().add_assign(&mut sum, &d.as_ref()[part]);
        }
        sum
    }

    fn exchange_all_gather(
        &self,
        kind: GroupKind,
        t: &CpuTensor,
    ) -> Result<CpuTensor, RuntimeError> {
        if self.members(kind) == 1 {
            return Ok(t.clone());
        }
        let all = self.exchange(kind, vec![t.clone()])?;
        let parts: Vec<&CpuTensor> = all.iter().map(|d| &d.as_ref()[0]).collect();
        Ok(self.arithmetic().concat_rows(&parts))
    }

    fn exchange_reduce_scatter(
        &self,
        kind: GroupKind,
        t: &CpuTensor,
    ) -> Result<CpuTensor, RuntimeError> {
        let n = self.members(kind);
        if !t.rows.is_multiple_of(n) {
            return Err(RuntimeError::invalid_plan(format!(
                "reduce-scatter of {} rows over {n} ranks",
                t.rows
            )));
        }
        if n == 1 {
            return Ok(t.clone());
        }
        // Each member sends every other only the block it keeps and sums only its own block,
        // in member order: the bytes and additions of a reduce-scatter, not an all-reduce's.
        let block = t.rows / n;
        let blocks = (0..n)
            .map(|j| self.arithmetic().slice_rows(t, j * block, (j + 1) * block))
            .collect();
        let i = self.member_index(kind);
        let all = self.exchange(kind, blocks)?;
        Ok(self.sum_in_member_order(&all, i))
    }

    fn exchange_all_to_all(
        &self,
        kind: GroupKind,
        parts: Vec<CpuTensor>,
    ) -> Result<Vec<CpuTensor>, RuntimeError> {
        if parts.len() != self.members(kind) {
            return Err(RuntimeError::invalid_plan(
                "all-to-all needs one part per member",
            ));
        }
        if parts.len() == 1 {
            return Ok(parts);
        }
        let i = self.member_index(kind);
        let all = self.exchange(kind, parts)?;
        Ok(all.iter().map(|d| d.as_ref()[i].clone()).collect())
    }

    fn exchange_broadcast(
        &self,
        kind: GroupKind,
        t: &CpuTensor,
        root: usize,
    ) -> Result<CpuTensor, RuntimeError> {
        if self.members(kind) == 1 {
            return Ok(t.clone());
        }
        let all = self.exchange(kind, vec![t.clone()])?;
        Ok(all[root].as_ref()[0].clone())
    }

    fn exchange_barrier(&self, kind: GroupKind) -> Result<(), RuntimeError> {
        self.exchange(kind, Vec::new()).map(|_| ())
    }
}
