//! The backend trait: tensor operations with their backward, the optimizer, and collectives
//! over the mesh's process groups. Every tensor is a row-major 2-D f32 matrix; vectors are
//! `1×n` rows and flat parameter buffers are `n×1` columns (so that row-wise collectives
//! shard them). Model and executor code is written once against this trait; `cpu` is the
//! implementation that always builds.

pub mod attention_blocks;
pub mod cpu;
pub(crate) mod exchange;
pub mod memory_saving;
pub mod shared_memory;

// The only place the `cuda` feature is tested: without it, `cuda` is a module with the same
// entry points that explain how to build the real one.
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "cuda/disabled.rs"]
pub mod cuda;

use crate::error::RuntimeError;
use crate::mesh::GroupKind;
use tessel_grammar::NormKind;

/// Shape of one causal attention call. Queries are rows `[batch·q_len, heads·head_dim]` at
/// sequence positions `q_offset..q_offset+q_len`; keys and values are rows
/// `[batch·kv_len, kv_heads·head_dim]` at positions `0..kv_len`. Query head `h` reads key/value
/// head `h / (heads / kv_heads)` (grouped-query attention).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    pub batch: usize,
    pub q_len: usize,
    pub kv_len: usize,
    pub q_offset: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// Adam hyper-parameters (Kingma & Ba 2015), bias-corrected, no weight decay.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamParams {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
}

impl Default for AdamParams {
    fn default() -> Self {
        AdamParams {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
        }
    }
}

pub const NORM_EPS: f32 = 1e-5;
/// GELU is the tanh approximation `0.5·x·(1 + tanh(GELU_C·(x + GELU_CUBIC·x³)))`.
pub const GELU_C: f32 = 0.797_884_6; // sqrt(2/pi)
pub const GELU_CUBIC: f32 = 0.044715;
pub const ROPE_BASE: f32 = 10_000.0;

pub trait Backend {
    type Tensor: Clone + Send;

    // Creation and inspection.
    fn tensor(&self, data: Vec<f32>, rows: usize, cols: usize) -> Self::Tensor;
    fn zeros(&self, rows: usize, cols: usize) -> Self::Tensor;
    fn to_vec(&self, t: &Self::Tensor) -> Vec<f32>;
    fn shape(&self, t: &Self::Tensor) -> (usize, usize);
    fn reshape(&self, t: &Self::Tensor, rows: usize, cols: usize) -> Self::Tensor;

    // Linear algebra and element-wise arithmetic.
    /// `op(a)·op(b)` where `op` transposes when the flag is set.
    fn matmul(
        &self,
        a: &Self::Tensor,
        b: &Self::Tensor,
        trans_a: bool,
        trans_b: bool,
    ) -> Self::Tensor;
    /// The matmuls this backend timed, by shape, for `tessel launch --trace` (`tessel
    /// calibrate` fits the GEMM primitive to them). A backend whose matmuls run
    /// asynchronously times none.
    fn timed_matmuls(&self) -> Vec<crate::trace::MatmulRecord> {
        Vec::new()
    }
    fn add(&self, a: &Self::Tensor, b: &Self::Tensor) -> Self::Tensor;
    fn add_assign(&self, a: &mut Self::Tensor, b: &Self::Tensor);
    fn mul(&self, a: &Self::Tensor, b: &Self::Tensor) -> Self::Tensor;
    /// Adds the `1×cols` row `bias` to every row.
    fn add_row(&self, a: &Self::Tensor, bias: &Self::Tensor) -> Self::Tensor;
    /// Column sums as a `1×cols` row (the gradient of `add_row`'s bias).
    fn sum_rows(&self, a: &Self::Tensor) -> Self::Tensor;
    /// Multiplies row `i` by `scales[i]`.
    fn scale_rows(&self, a: &Self::Tensor, scales: &[f32]) -> Self::Tensor;
    /// Dot product of each row of `a` with the same row of `b`.
    fn row_dots(&self, a: &Self::Tensor, b: &Self::Tensor) -> Vec<f32>;

    // Activations.
    fn gelu(&self, x: &Self::Tensor) -> Self::Tensor;
    fn gelu_backward(&self, x: &Self::Tensor, dy: &Self::Tensor) -> Self::Tensor;
    fn silu(&self, x: &Self::Tensor) -> Self::Tensor;
    fn silu_backward(&self, x: &Self::Tensor, dy: &Self::Tensor) -> Self::Tensor;

    /// Tempo's in-place GELU: the output and the branch bits (a `words × 1` tensor, see
    /// [`memory_saving`]) that [`Self::gelu_backward_from_output`] needs instead of the input.
    fn gelu_keeping_output(&self, x: &Self::Tensor) -> (Self::Tensor, Self::Tensor) {
        let bits = memory_saving::gelu_branch_bits(&self.to_vec(x));
        let words = bits.len();
        (self.gelu(x), self.tensor(bits, words, 1))
    }
    fn gelu_backward_from_output(
        &self,
        y: &Self::Tensor,
        bits: &Self::Tensor,
        dy: &Self::Tensor,
    ) -> Self::Tensor {
        let (rows, cols) = self.shape(y);
        let x = memory_saving::gelu_input(&self.to_vec(y), &self.to_vec(bits));
        self.gelu_backward(&self.tensor(x, rows, cols), dy)
    }

    // Normalisation: returns the output and per-row statistics for the backward.
    fn norm(
        &self,
        kind: NormKind,
        x: &Self::Tensor,
        weight: &Self::Tensor,
        bias: Option<&Self::Tensor>,
    ) -> (Self::Tensor, Self::Tensor);
    /// Returns `(dx, dweight, dbias)`; `dbias` only for layer norm with a bias.
    fn norm_backward(
        &self,
        kind: NormKind,
        x: &Self::Tensor,
        weight: &Self::Tensor,
        stats: &Self::Tensor,
        dy: &Self::Tensor,
        has_bias: bool,
    ) -> (Self::Tensor, Self::Tensor, Option<Self::Tensor>);
    /// Tempo's in-place norm: [`Self::norm_backward`] from the output `y` instead of the input.
    #[allow(clippy::too_many_arguments)]
    fn norm_backward_from_output(
        &self,
        kind: NormKind,
        y: &Self::Tensor,
        weight: &Self::Tensor,
        bias: Option<&Self::Tensor>,
        stats: &Self::Tensor,
        dy: &Self::Tensor,
        has_bias: bool,
    ) -> (Self::Tensor, Self::Tensor, Option<Self::Tensor>) {
        let (rows, cols) = self.shape(y);
        let bias = bias.map(|b| self.to_vec(b));
        let x = memory_saving::norm_input(
            kind,
            &self.to_vec(y),
            cols,
            &self.to_vec(weight),
            bias.as_deref(),
            &self.to_vec(stats),
        );
        self.norm_backward(
            kind,
            &self.tensor(x, rows, cols),
            weight,
            stats,
            dy,
            has_bias,
        )
    }

    // Attention.
    /// Returns the output and the attention probabilities `[batch·heads·q_len, kv_len]`.
    fn attention(
        &self,
        shape: AttentionShape,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
    ) -> (Self::Tensor, Self::Tensor);
    /// Returns `(dq, dk, dv)`.
    fn attention_backward(
        &self,
        shape: AttentionShape,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        probs: &Self::Tensor,
        dout: &Self::Tensor,
    ) -> (Self::Tensor, Self::Tensor, Self::Tensor);

    // Blockwise attention, for ring attention over the context group (keys `q_offset`
    // positions before the queries, see `attention_blocks`). The defaults run on the host
    // through `to_vec` and `tensor`; a backend may replace them with device kernels.
    /// Returns the output normalised over this block's keys, the block's probabilities and the
    /// log-sum-exp of its scores `[batch·q_len, heads]`.
    fn attention_block(
        &self,
        shape: AttentionShape,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
    ) -> (Self::Tensor, Self::Tensor, Self::Tensor) {
        let (out, probs, lse) =
            attention_blocks::forward(&shape, &self.to_vec(q), &self.to_vec(k), &self.to_vec(v));
        let rows = shape.batch * shape.q_len;
        (
            self.tensor(out, rows, shape.heads * shape.head_dim),
            self.tensor(probs, shape.batch * shape.heads * shape.q_len, shape.kv_len),
            self.tensor(lse, rows, shape.heads),
        )
    }
    /// Merges two partial attentions of the same queries over disjoint keys: `(out, lse)`.
    fn attention_merge(
        &self,
        shape: AttentionShape,
        a: (&Self::Tensor, &Self::Tensor),
        b: (&Self::Tensor, &Self::Tensor),
    ) -> (Self::Tensor, Self::Tensor) {
        let (out, lse) = attention_blocks::merge(
            shape.head_dim,
            &self.to_vec(a.0),
            &self.to_vec(a.1),
            &self.to_vec(b.0),
            &self.to_vec(b.1),
        );
        let rows = shape.batch * shape.q_len;
        (
            self.tensor(out, rows, shape.heads * shape.head_dim),
            self.tensor(lse, rows, shape.heads),
        )
    }
    /// A block's probabilities normalised over the block, as a share of the softmax over every
    /// key (`lse`, the merged log-sum-exp).
    fn attention_rescale(
        &self,
        shape: AttentionShape,
        probs: &Self::Tensor,
        lse_block: &Self::Tensor,
        lse: &Self::Tensor,
    ) -> Self::Tensor {
        let mut p = self.to_vec(probs);
        attention_blocks::rescale(&shape, &mut p, &self.to_vec(lse_block), &self.to_vec(lse));
        let (rows, cols) = self.shape(probs);
        self.tensor(p, rows, cols)
    }
    /// A block's share of the probabilities recomputed from the merged log-sum-exp.
    fn attention_block_probs(
        &self,
        shape: AttentionShape,
        q: &Self::Tensor,
        k: &Self::Tensor,
        lse: &Self::Tensor,
    ) -> Self::Tensor {
        let p = attention_blocks::probabilities(
            &shape,
            &self.to_vec(q),
            &self.to_vec(k),
            &self.to_vec(lse),
        );
        self.tensor(p, shape.batch * shape.heads * shape.q_len, shape.kv_len)
    }
    /// Backward of one block against the merged output `out`: `(dq part, dk, dv)`.
    #[allow(clippy::too_many_arguments)]
    fn attention_block_backward(
        &self,
        shape: AttentionShape,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        probs: &Self::Tensor,
        out: &Self::Tensor,
        dout: &Self::Tensor,
    ) -> (Self::Tensor, Self::Tensor, Self::Tensor) {
        let (dq, dk, dv) = attention_blocks::backward(
            &shape,
            &self.to_vec(q),
            &self.to_vec(k),
            &self.to_vec(v),
            &self.to_vec(probs),
            &self.to_vec(out),
            &self.to_vec(dout),
        );
        let (q_rows, q_cols) = self.shape(q);
        let (kv_rows, kv_cols) = self.shape(k);
        (
            self.tensor(dq, q_rows, q_cols),
            self.tensor(dk, kv_rows, kv_cols),
            self.tensor(dv, kv_rows, kv_cols),
        )
    }

    /// Rotary position embedding (rotate-half form) of rows `[n, heads·head_dim]`; row `r` sits
    /// at position `offset + r % seq_len`. `inverse` rotates back (the backward).
    fn rope(
        &self,
        x: &Self::Tensor,
        head_dim: usize,
        seq_len: usize,
        offset: usize,
        inverse: bool,
    ) -> Self::Tensor;

    // Indexing.
    fn gather_rows(&self, table: &Self::Tensor, rows: &[usize]) -> Self::Tensor;
    /// `dst[rows[i]] += src[i]`, in order.
    fn scatter_add_rows(&self, dst: &mut Self::Tensor, rows: &[usize], src: &Self::Tensor);
    fn slice_rows(&self, t: &Self::Tensor, start: usize, end: usize) -> Self::Tensor;
    fn concat_rows(&self, parts: &[&Self::Tensor]) -> Self::Tensor;
    fn slice_cols(&self, t: &Self::Tensor, start: usize, end: usize) -> Self::Tensor;

    // Loss.
    /// Softmax cross-entropy of each row against `targets`; returns `scale·Σ loss` and
    /// `scale·∂Σloss/∂logits`.
    fn cross_entropy(
        &self,
        logits: &Self::Tensor,
        targets: &[u32],
        scale: f32,
    ) -> (f64, Self::Tensor);

    // Optimizer.
    /// One Adam step (`step` counts from 1) on a parameter and its two moment buffers.
    fn adam(
        &self,
        param: &mut Self::Tensor,
        grad: &Self::Tensor,
        m: &mut Self::Tensor,
        v: &mut Self::Tensor,
        hp: AdamParams,
        step: u64,
    );

    // Collectives over the groups of this rank. Reductions sum in group-rank order, so every
    // member gets bit-identical results whatever the thread timing.
    fn group_size(&self, kind: GroupKind) -> usize;
    fn group_index(&self, kind: GroupKind) -> usize;
    fn all_reduce(&self, kind: GroupKind, t: &Self::Tensor) -> Result<Self::Tensor, RuntimeError>;
    /// Concatenates the members' tensors by rows, in group order.
    fn all_gather(&self, kind: GroupKind, t: &Self::Tensor) -> Result<Self::Tensor, RuntimeError>;
    /// Sums, then keeps this member's block of rows.
    fn reduce_scatter(
        &self,
        kind: GroupKind,
        t: &Self::Tensor,
    ) -> Result<Self::Tensor, RuntimeError>;
    /// `parts[j]` goes to member `j`; returns what every member sent to this one.
    fn all_to_all(
        &self,
        kind: GroupKind,
        parts: Vec<Self::Tensor>,
    ) -> Result<Vec<Self::Tensor>, RuntimeError>;
    fn broadcast(
        &self,
        kind: GroupKind,
        t: &Self::Tensor,
        root: usize,
    ) -> Result<Self::Tensor, RuntimeError>;
    fn barrier(&self, kind: GroupKind) -> Result<(), RuntimeError>;
    /// Point-to-point to a global rank; never blocks.
    fn send(&self, peer: usize, tag: u64, t: &Self::Tensor) -> Result<(), RuntimeError>;
    /// Blocks until the message with `tag` from `peer` arrives.
    fn recv(&self, peer: usize, tag: u64) -> Result<Self::Tensor, RuntimeError>;

    /// Bytes a tensor occupies.
    fn bytes(&self, t: &Self::Tensor) -> u64 {
        let (r, c) = self.shape(t);
        (r * c * std::mem::size_of::<f32>()) as u64
    }
}
