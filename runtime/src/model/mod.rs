//! The transformer built from a `ModelSpec`, written once against the backend trait: each
//! piece has a forward that returns what its backward needs, and a backward that accumulates
//! parameter gradients and returns the input gradient.

pub mod attention;
pub mod block;
pub mod embedding;
pub mod layout;
pub mod lora;
pub mod mlp;
pub mod moe;

use crate::backend::Backend;
use crate::error::RuntimeError;
use crate::mesh::GroupKind;
use std::collections::{BTreeMap, BTreeSet};
use tessel_grammar::ModelSpec;

pub type Values<T> = BTreeMap<String, T>;

/// Parameter values by global name, failing with a clear error when one is missing.
pub fn param<'a, T>(values: &'a Values<T>, name: &str) -> Result<&'a T, RuntimeError> {
    values.get(name).ok_or_else(|| RuntimeError::InvalidModel {
        reason: format!("parameter {name} is not held by this rank"),
    })
}

/// Accumulated parameter gradients by global name, of the parameters that train.
pub struct Grads<T> {
    pub map: BTreeMap<String, T>,
    /// Parameters that take no gradient (frozen under adapter fine-tuning).
    frozen: BTreeSet<String>,
}

impl<T> Default for Grads<T> {
    fn default() -> Self {
        Grads::new(BTreeSet::new())
    }
}

impl<T> Grads<T> {
    pub fn new(frozen: BTreeSet<String>) -> Self {
        Grads {
            map: BTreeMap::new(),
            frozen,
        }
    }

    /// Whether parameter `name` takes a gradient.
    pub fn trains(&self, name: &str) -> bool {
        !self.frozen.contains(name)
    }
}

impl<T: Clone> Grads<T> {
    /// Adds the gradient `g` computes to `name`'s; a frozen parameter's is not computed.
    pub fn add<B: Backend<Tensor = T>>(&mut self, b: &B, name: &str, g: impl FnOnce() -> T) {
        if !self.trains(name) {
            return;
        }
        let g = g();
        match self.map.get_mut(name) {
            Some(acc) => b.add_assign(acc, &g),
            None => {
                self.map.insert(name.to_string(), g);
            }
        }
    }
}

/// What a layer needs to know about where it runs: the backend, the model, the micro-batch
/// shape, and this rank's place in the tensor, context and expert groups.
pub struct Env<'a, B: Backend> {
    pub b: &'a B,
    pub model: &'a ModelSpec,
    pub tp: usize,
    pub tp_index: usize,
    pub sequence_parallel: bool,
    pub cp: usize,
    pub cp_index: usize,
    /// Sequences in the micro-batch.
    pub batch: usize,
    /// Sequence positions this context-parallel rank holds (all its chunks).
    pub seq_chunk: usize,
    /// Length of one context chunk: the sequence is cut into `2·cp` chunks and context rank
    /// `r` holds chunks `r` and `2cp − 1 − r` (Megatron's split: every rank then has the same
    /// share of causal attention work); without context parallelism one chunk, the sequence.
    /// A rank's tokens are chunk-major: its first chunk's sequences, then its second's.
    pub chunk_len: usize,
    /// Global ranks of the next and the previous member of the context group (ring order).
    pub cp_next_rank: usize,
    pub cp_prev_rank: usize,
    /// LoRA adapters beside the frozen projections (adapter fine-tuning).
    pub adapters: Option<lora::Adapters>,
    /// Tempo's in-place GELU and norms: they keep their outputs instead of their inputs.
    pub memory_saving_kernels: bool,
}

/// Tag of ring-attention messages; pipeline messages use the bits below 63.
const CP_RING_TAG: u64 = 1 << 63;

impl<B: Backend> Env<'_, B> {
    /// Tokens of one micro-batch on this context rank (before sequence-parallel sharding).
    pub fn tokens(&self) -> usize {
        self.batch * self.seq_chunk
    }

    /// Whether sequence parallelism shards the tokens between blocks (it needs `tp > 1`).
    pub fn sp_active(&self) -> bool {
        self.sequence_parallel && self.tp > 1
    }

    /// Tokens held between blocks: a 1/tp share under sequence parallelism.
    pub fn local_tokens(&self) -> usize {
        if self.sp_active() {
            self.tokens() / self.tp
        } else {
            self.tokens()
        }
    }

    /// Entry of a tensor-parallel region: all-gather the sequence shards (sequence parallel)
    /// or pass the replicated tokens through. Also the backward of [`Self::reduce_tp`].
    pub fn gather_tp(&self, x: &B::Tensor) -> Result<B::Tensor, RuntimeError> {
        if self.sp_active() {
            self.b.all_gather(GroupKind::Tensor, x)
        } else {
            Ok(x.clone())
        }
    }

    /// Exit of a tensor-parallel region: sum the partial results, reduce-scattered over the
    /// sequence (sequence parallel) or all-reduced. Also the backward of [`Self::gather_tp`].
    pub fn reduce_tp(&self, x: &B::Tensor) -> Result<B::Tensor, RuntimeError> {
        if self.tp == 1 {
            Ok(x.clone())
        } else if self.sequence_parallel {
            self.b.reduce_scatter(GroupKind::Tensor, x)
        } else {
            self.b.all_reduce(GroupKind::Tensor, x)
        }
    }

    /// Passes a tensor one step around the context ring: sends it to the next context rank
    /// and returns what the previous one sent. Sends never block, so every rank sending
    /// first cannot deadlock; messages between two ranks arrive in the order they were sent.
    pub fn pass_around_cp_ring(&self, t: &B::Tensor) -> Result<B::Tensor, RuntimeError> {
        self.b.send(self.cp_next_rank, CP_RING_TAG, t)?;
        self.b.recv(self.cp_prev_rank, CP_RING_TAG)
    }

    /// Indices of the sequence chunks this rank holds, in its token order.
    pub fn chunks(&self) -> Vec<usize> {
        if self.cp > 1 {
            vec![self.cp_index, 2 * self.cp - 1 - self.cp_index]
        } else {
            vec![0]
        }
    }

    /// Tokens of one chunk in a micro-batch.
    pub fn chunk_tokens(&self) -> usize {
        self.batch * self.chunk_len
    }

    /// Sequence position of this rank's token `i` (before sequence-parallel sharding).
    pub fn position(&self, i: usize) -> usize {
        let chunk = self.chunks()[i / self.chunk_tokens()];
        chunk * self.chunk_len + i % self.chunk_len
    }

    /// Rotary embedding of rows in this rank's token order, chunk by chunk.
    pub fn rope(&self, x: &B::Tensor, inverse: bool) -> B::Tensor {
        let head_dim = self.model.head_dim as usize;
        let n = self.chunk_tokens();
        let parts: Vec<B::Tensor> = self
            .chunks()
            .iter()
            .enumerate()
            .map(|(j, &chunk)| {
                let rows = self.b.slice_rows(x, j * n, (j + 1) * n);
                self.b.rope(
                    &rows,
                    head_dim,
                    self.chunk_len,
                    chunk * self.chunk_len,
                    inverse,
                )
            })
            .collect();
        self.b.concat_rows(&parts.iter().collect::<Vec<_>>())
    }
}
