//! The CUDA implementation of the backend trait. Matmuls go to cuBLAS (row-major operands are
//! passed as their column-major transposes), the element-wise, norm, loss, embedding and Adam
//! operations to the NVRTC-compiled kernels in `crate::kernels`, attention to one cuBLAS GEMM
//! per (batch, head) around the causal-softmax kernel, collectives to NCCL. A few small row
//! operations run through the CPU backend's code on a host copy: slower,
//! but the same formulas and indexing by construction.
//!
//! The trait's compute operations cannot return errors; a CUDA error there is a broken device,
//! so it panics with the CUDA message and the worker turns the panic into a rank failure.

use super::collectives::{to_wire, Communicators};
use super::device::Device;
use crate::backend::cpu::{CpuBackend, CpuTensor};
use crate::backend::shared_memory::World;
use crate::backend::{AdamParams, AttentionShape, Backend};
use crate::error::RuntimeError;
use crate::kernels::{grid_for, BLOCK, ROW_BLOCK};
use crate::mesh::{GroupKind, Mesh};
use cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use std::fmt::Debug;
use tessel_grammar::NormKind;

#[derive(Clone, Debug)]
pub struct CudaTensor {
    pub data: CudaSlice<f32>,
    pub rows: usize,
    pub cols: usize,
}

pub struct CudaBackend {
    pub(super) dev: Device,
    pub(super) comms: Communicators,
    host: CpuBackend,
}

pub(super) fn check<T, E: Debug>(r: Result<T, E>, what: &str) -> T {
    r.unwrap_or_else(|e| panic!("CUDA {what}: {e:?}"))
}

fn elementwise(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid_for(n), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn per_row(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.max(1) as u32, 1, 1),
        block_dim: (ROW_BLOCK, 1, 1),
        shared_mem_bytes: ROW_BLOCK * 4,
    }
}

/// Launches kernel `$name` on the compute stream with the given arguments.
macro_rules! launch {
    ($self:expr, $name:expr, $cfg:expr, $($arg:expr),* $(,)?) => {{
        let f = $self.dev.function($name);
        let mut b = $self.dev.compute.launch_builder(f);
        $( b.arg($arg); )*
        // SAFETY: the argument list matches the kernel's signature in `crate::kernels`.
        check(unsafe { b.launch($cfg) }, $name);
    }};
}

/// A row-major matrix inside a device buffer: starts at `offset`, rows `ld` elements apart
/// (a column block of a wider matrix when `ld` exceeds its width).
#[derive(Clone, Copy)]
struct Block<'a> {
    buf: &'a CudaSlice<f32>,
    offset: usize,
    ld: usize,
}

fn op(transpose: bool) -> cublasOperation_t {
    if transpose {
        cublasOperation_t::CUBLAS_OP_T
    } else {
        cublasOperation_t::CUBLAS_OP_N
    }
}

impl CudaBackend {
    /// Row-major `C = op(A)·op(B) + beta·C` for `op(A)` of `m×k`, `op(B)` of `k×n`. A row-major
    /// matrix read column-major is its transpose, so this issues the column-major
    /// `Cᵀ = op(B)ᵀ·op(A)ᵀ`: B goes first, A second.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        a: Block,
        ta: bool,
        b: Block,
        tb: bool,
        c: (&mut CudaSlice<f32>, usize, usize),
        (m, n, k): (usize, usize, usize),
        beta: f32,
    ) {
        if m == 0 || n == 0 || k == 0 {
            return;
        }
        let cfg = GemmConfig {
            transa: op(tb),
            transb: op(ta),
            m: n as i32,
            n: m as i32,
            k: k as i32,
            alpha: 1.0f32,
            lda: b.ld as i32,
            ldb: a.ld as i32,
            beta,
            ldc: c.2 as i32,
        };
        let a_view = a.buf.slice(a.offset..);
        let b_view = b.buf.slice(b.offset..);
        let mut c_view = c.0.slice_mut(c.1..);
        // SAFETY: the sizes, offsets and leading dimensions above stay inside the buffers.
        check(
            unsafe { self.dev.blas.gemm(cfg, &b_view, &a_view, &mut c_view) },
            "gemm",
        );
    }

    pub fn new(dev: Device, comms: Communicators) -> Self {
        let alone = Mesh {
            dp: 1,
            tp: 1,
            pp: 1,
            cp: 1,
            ep: 1,
        };
        CudaBackend {
            dev,
            comms,
            host: CpuBackend::new(World::new(alone), 0),
        }
    }

    fn empty(&self, rows: usize, cols: usize) -> CudaTensor {
        CudaTensor {
            data: check(
                self.dev.compute.alloc_zeros::<f32>((rows * cols).max(1)),
                "alloc",
            ),
            rows,
            cols,
        }
    }

    fn upload_u32(&self, v: &[u32]) -> CudaSlice<u32> {
        let v = if v.is_empty() { vec![0] } else { v.to_vec() };
        check(self.dev.compute.clone_htod(&v), "upload")
    }

    fn to_host(&self, t: &CudaTensor) -> CpuTensor {
        self.host.tensor(self.to_vec(t), t.rows, t.cols)
    }

    fn upload_host(&self, t: &CpuTensor) -> CudaTensor {
        let (rows, cols) = self.host.shape(t);
        self.tensor(self.host.to_vec(t), rows, cols)
    }

    fn unary(&self, name: &str, x: &CudaTensor) -> CudaTensor {
        let mut y = self.empty(x.rows, x.cols);
        let n = (x.rows * x.cols) as u32;
        launch!(
            self,
            name,
            elementwise(n as usize),
            &x.data,
            &mut y.data,
            &n
        );
        y
    }

    fn binary(&self, name: &str, a: &CudaTensor, b: &CudaTensor) -> CudaTensor {
        assert_eq!(
            (a.rows, a.cols),
            (b.rows, b.cols),
            "{name} of different shapes"
        );
        let mut y = self.empty(a.rows, a.cols);
        let n = (a.rows * a.cols) as u32;
        launch!(
            self,
            name,
            elementwise(n as usize),
            &a.data,
            &b.data,
            &mut y.data,
            &n
        );
        y
    }
}

impl Backend for CudaBackend {
    type Tensor = CudaTensor;

    fn tensor(&self, data: Vec<f32>, rows: usize, cols: usize) -> CudaTensor {
        assert_eq!(
            data.len(),
            rows * cols,
            "tensor data does not match its shape"
        );
        let data = if data.is_empty() { vec![0.0] } else { data };
        CudaTensor {
            data: check(self.dev.compute.clone_htod(&data), "upload"),
            rows,
            cols,
        }
    }
    fn zeros(&self, rows: usize, cols: usize) -> CudaTensor {
        self.empty(rows, cols)
    }
    fn to_vec(&self, t: &CudaTensor) -> Vec<f32> {
        let mut v = check(self.dev.compute.clone_dtoh(&t.data), "download");
        v.truncate(t.rows * t.cols);
        v
    }
    fn shape(&self, t: &CudaTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }
    fn reshape(&self, t: &CudaTensor, rows: usize, cols: usize) -> CudaTensor {
        assert_eq!(rows * cols, t.rows * t.cols, "reshape changes the size");
        CudaTensor {
            data: t.data.clone(),
            rows,
            cols,
        }
    }

    fn matmul(&self, a: &CudaTensor, b: &CudaTensor, ta: bool, tb: bool) -> CudaTensor {
        let (m, k) = if ta {
            (a.cols, a.rows)
        } else {
            (a.rows, a.cols)
        };
        let (k2, n) = if tb {
            (b.cols, b.rows)
        } else {
            (b.rows, b.cols)
        };
        assert_eq!(k, k2, "matmul inner sizes differ");
        let mut c = self.empty(m, n);
        self.gemm(
            whole(a),
            ta,
            whole(b),
            tb,
            (&mut c.data, 0, n),
            (m, n, k),
            0.0,
        );
        c
    }
    fn add(&self, a: &CudaTensor, b: &CudaTensor) -> CudaTensor {
        self.binary("add", a, b)
    }
    fn add_assign(&self, a: &mut CudaTensor, b: &CudaTensor) {
        *a = self.binary("add", a, b);
    }
    fn mul(&self, a: &CudaTensor, b: &CudaTensor) -> CudaTensor {
        self.binary("mul", a, b)
    }
    fn add_row(&self, a: &CudaTensor, bias: &CudaTensor) -> CudaTensor {
        let mut y = self.empty(a.rows, a.cols);
        let (rows, cols) = (a.rows as u32, a.cols as u32);
        launch!(
            self,
            "add_row",
            elementwise(a.rows * a.cols),
            &a.data,
            &bias.data,
            &mut y.data,
            &rows,
            &cols
        );
        y
    }
    fn sum_rows(&self, a: &CudaTensor) -> CudaTensor {
        let mut y = self.empty(1, a.cols);
        let (rows, cols) = (a.rows as u32, a.cols as u32);
        launch!(
            self,
            "sum_rows",
            elementwise(a.cols),
            &a.data,
            &mut y.data,
            &rows,
            &cols
        );
        y
    }
    fn scale_rows(&self, a: &CudaTensor, scales: &[f32]) -> CudaTensor {
        self.upload_host(&self.host.scale_rows(&self.to_host(a), scales))
    }
    fn row_dots(&self, a: &CudaTensor, b: &CudaTensor) -> Vec<f32> {
        self.host.row_dots(&self.to_host(a), &self.to_host(b))
    }

    fn gelu(&self, x: &CudaTensor) -> CudaTensor {
        self.unary("gelu_forward", x)
    }
    fn gelu_backward(&self, x: &CudaTensor, dy: &CudaTensor) -> CudaTensor {
        self.binary("gelu_backward", x, dy)
    }
    fn silu(&self, x: &CudaTensor) -> CudaTensor {
        self.unary("silu_forward", x)
    }
    fn silu_backward(&self, x: &CudaTensor, dy: &CudaTensor) -> CudaTensor {
        self.binary("silu_backward", x, dy)
    }

    fn norm(
        &self,
        kind: NormKind,
        x: &CudaTensor,
        weight: &CudaTensor,
        bias: Option<&CudaTensor>,
    ) -> (CudaTensor, CudaTensor) {
        let mut y = self.empty(x.rows, x.cols);
        let mut stats = self.empty(x.rows, 2);
        let cols = x.cols as u32;
        let layer = i32::from(kind == NormKind::Layernorm);
        match bias {
            Some(b) => launch!(
                self,
                "norm_forward",
                per_row(x.rows),
                &x.data,
                &weight.data,
                &b.data,
                &mut y.data,
                &mut stats.data,
                &cols,
                &layer
            ),
            None => launch!(
                self,
                "norm_forward",
                per_row(x.rows),
                &x.data,
                &weight.data,
                &0u64,
                &mut y.data,
                &mut stats.data,
                &cols,
                &layer
            ),
        }
        (y, stats)
    }
    fn norm_backward(
        &self,
        kind: NormKind,
        x: &CudaTensor,
        weight: &CudaTensor,
        stats: &CudaTensor,
        dy: &CudaTensor,
        has_bias: bool,
    ) -> (CudaTensor, CudaTensor, Option<CudaTensor>) {
        let mut dx = self.empty(x.rows, x.cols);
        let mut dw = self.empty(1, x.cols);
        let mut db = self.empty(1, x.cols);
        let (rows, cols) = (x.rows as u32, x.cols as u32);
        let layer = i32::from(kind == NormKind::Layernorm);
        launch!(
            self,
            "norm_backward_input",
            per_row(x.rows),
            &x.data,
            &weight.data,
            &stats.data,
            &dy.data,
            &mut dx.data,
            &cols,
            &layer
        );
        launch!(
            self,
            "norm_backward_params",
            elementwise(x.cols),
            &x.data,
            &stats.data,
            &dy.data,
            &mut dw.data,
            &mut db.data,
            &rows,
            &cols
        );
        (dx, dw, has_bias.then_some(db))
    }

    fn attention(
        &self,
        s: AttentionShape,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
    ) -> (CudaTensor, CudaTensor) {
        let d = s.head_dim;
        let group = s.heads / s.kv_heads;
        let scale = 1.0 / (d as f32).sqrt();
        let rows = s.batch * s.heads * s.q_len;
        let mut probs = self.empty(rows, s.kv_len);
        let mut out = self.empty(q.rows, q.cols);
        let heads = attention_heads(s);
        for &(b, h) in &heads {
            let kh = h / group;
            // Scores of head h: Q_bh · K_bkᵀ, into its q_len rows of `probs`.
            self.gemm(
                q_block(q, s, b, h),
                false,
                kv_block(k, s, b, kh),
                true,
                (&mut probs.data, probs_row(s, b, h) * s.kv_len, s.kv_len),
                (s.q_len, s.kv_len, d),
                0.0,
            );
        }
        let (q_len, kv_len, q_offset) = (s.q_len as u32, s.kv_len as u32, s.q_offset as u32);
        launch!(
            self,
            "causal_softmax",
            per_row(rows),
            &mut probs.data,
            &q_len,
            &kv_len,
            &q_offset,
            &scale
        );
        for &(b, h) in &heads {
            let kh = h / group;
            let p = probs_block(&probs, s, b, h);
            let at = b * s.q_len * q.cols + h * d;
            self.gemm(
                p,
                false,
                kv_block(v, s, b, kh),
                false,
                (&mut out.data, at, q.cols),
                (s.q_len, d, s.kv_len),
                0.0,
            );
        }
        (out, probs)
    }
    fn attention_backward(
        &self,
        s: AttentionShape,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        probs: &CudaTensor,
        dout: &CudaTensor,
    ) -> (CudaTensor, CudaTensor, CudaTensor) {
        let d = s.head_dim;
        let group = s.heads / s.kv_heads;
        let scale = 1.0 / (d as f32).sqrt();
        let rows = s.batch * s.heads * s.q_len;
        let mut dprobs = self.empty(rows, s.kv_len);
        let mut dscores = self.empty(rows, s.kv_len);
        let mut dq = self.empty(q.rows, q.cols);
        let mut dk = self.empty(k.rows, k.cols);
        let mut dv = self.empty(v.rows, v.cols);
        let heads = attention_heads(s);
        for &(b, h) in &heads {
            let kh = h / group;
            let at = probs_row(s, b, h) * s.kv_len;
            self.gemm(
                q_block(dout, s, b, h),
                false,
                kv_block(v, s, b, kh),
                true,
                (&mut dprobs.data, at, s.kv_len),
                (s.q_len, s.kv_len, d),
                0.0,
            );
        }
        let kv_len = s.kv_len as u32;
        launch!(
            self,
            "causal_softmax_backward",
            per_row(rows),
            &probs.data,
            &dprobs.data,
            &mut dscores.data,
            &kv_len,
            &scale
        );
        // Heads sharing a key/value head add into its gradient in head order.
        for &(b, h) in &heads {
            let kh = h / group;
            let q_at = b * s.q_len * q.cols + h * d;
            let kv_at = b * s.kv_len * k.cols + kh * d;
            self.gemm(
                probs_block(&dscores, s, b, h),
                false,
                kv_block(k, s, b, kh),
                false,
                (&mut dq.data, q_at, q.cols),
                (s.q_len, d, s.kv_len),
                0.0,
            );
            self.gemm(
                probs_block(&dscores, s, b, h),
                true,
                q_block(q, s, b, h),
                false,
                (&mut dk.data, kv_at, k.cols),
                (s.kv_len, d, s.q_len),
                1.0,
            );
            self.gemm(
                probs_block(probs, s, b, h),
                true,
                q_block(dout, s, b, h),
                false,
                (&mut dv.data, kv_at, v.cols),
                (s.kv_len, d, s.q_len),
                1.0,
            );
        }
        (dq, dk, dv)
    }
    fn rope(
        &self,
        x: &CudaTensor,
        head_dim: usize,
        seq_len: usize,
        offset: usize,
        inverse: bool,
    ) -> CudaTensor {
        let mut y = self.empty(x.rows, x.cols);
        let pairs = x.rows * (x.cols / head_dim) * (head_dim / 2);
        let (rows, cols, hd, seq, off) = (
            x.rows as u32,
            x.cols as u32,
            head_dim as u32,
            seq_len as u32,
            offset as u32,
        );
        let inv = i32::from(inverse);
        launch!(
            self,
            "rope",
            elementwise(pairs),
            &x.data,
            &mut y.data,
            &rows,
            &cols,
            &hd,
            &seq,
            &off,
            &inv
        );
        y
    }

    fn gather_rows(&self, table: &CudaTensor, rows: &[usize]) -> CudaTensor {
        let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        let idx_dev = self.upload_u32(&idx);
        let mut y = self.empty(rows.len(), table.cols);
        let (count, cols) = (rows.len() as u32, table.cols as u32);
        launch!(
            self,
            "gather_rows",
            elementwise(rows.len() * table.cols),
            &table.data,
            &idx_dev,
            &mut y.data,
            &count,
            &cols
        );
        y
    }
    fn scatter_add_rows(&self, dst: &mut CudaTensor, rows: &[usize], src: &CudaTensor) {
        let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        let idx_dev = self.upload_u32(&idx);
        let (count, cols) = (rows.len() as u32, dst.cols as u32);
        launch!(
            self,
            "scatter_add_rows",
            elementwise(dst.cols),
            &mut dst.data,
            &idx_dev,
            &src.data,
            &count,
            &cols
        );
    }
    fn slice_rows(&self, t: &CudaTensor, start: usize, end: usize) -> CudaTensor {
        let mut y = self.empty(end - start, t.cols);
        if end > start {
            let src = t.data.slice(start * t.cols..end * t.cols);
            check(self.dev.compute.memcpy_dtod(&src, &mut y.data), "copy");
        }
        y
    }
    fn concat_rows(&self, parts: &[&CudaTensor]) -> CudaTensor {
        let cols = parts.first().map_or(0, |p| p.cols);
        let rows: usize = parts.iter().map(|p| p.rows).sum();
        let mut y = self.empty(rows, cols);
        let mut at = 0;
        for p in parts {
            let n = p.rows * p.cols;
            if n > 0 {
                let mut dst = y.data.slice_mut(at..at + n);
                check(
                    self.dev.compute.memcpy_dtod(&p.data.slice(0..n), &mut dst),
                    "copy",
                );
            }
            at += n;
        }
        y
    }
    fn slice_cols(&self, t: &CudaTensor, start: usize, end: usize) -> CudaTensor {
        self.upload_host(&self.host.slice_cols(&self.to_host(t), start, end))
    }

    fn cross_entropy(&self, logits: &CudaTensor, targets: &[u32], scale: f32) -> (f64, CudaTensor) {
        assert_eq!(targets.len(), logits.rows, "one target per row");
        let t = self.upload_u32(targets);
        let mut grad = self.empty(logits.rows, logits.cols);
        let mut row_loss = self.empty(logits.rows, 1);
        let cols = logits.cols as u32;
        launch!(
            self,
            "cross_entropy",
            per_row(logits.rows),
            &logits.data,
            &t,
            &mut grad.data,
            &mut row_loss.data,
            &cols,
            &scale
        );
        // Summed on the host in f64, in row order, as the CPU backend does.
        let loss: f64 = self.to_vec(&row_loss).iter().map(|&l| f64::from(l)).sum();
        (loss * f64::from(scale), grad)
    }

    fn adam(
        &self,
        param: &mut CudaTensor,
        grad: &CudaTensor,
        m: &mut CudaTensor,
        v: &mut CudaTensor,
        hp: AdamParams,
        step: u64,
    ) {
        let c1 = 1.0 - hp.beta1.powi(step as i32);
        let c2 = 1.0 - hp.beta2.powi(step as i32);
        let n = (param.rows * param.cols) as u32;
        launch!(
            self,
            "adam_step",
            elementwise(n as usize),
            &mut param.data,
            &grad.data,
            &mut m.data,
            &mut v.data,
            &n,
            &hp.lr,
            &hp.beta1,
            &hp.beta2,
            &hp.eps,
            &c1,
            &c2
        );
    }

    fn group_size(&self, kind: GroupKind) -> usize {
        self.comms.size(kind)
    }
    fn group_index(&self, kind: GroupKind) -> usize {
        self.comms.index(kind)
    }
    fn all_reduce(&self, kind: GroupKind, t: &CudaTensor) -> Result<CudaTensor, RuntimeError> {
        self.comms.all_reduce(self, kind, t)
    }
    fn all_gather(&self, kind: GroupKind, t: &CudaTensor) -> Result<CudaTensor, RuntimeError> {
        self.comms.all_gather(self, kind, t)
    }
    fn reduce_scatter(&self, kind: GroupKind, t: &CudaTensor) -> Result<CudaTensor, RuntimeError> {
        self.comms.reduce_scatter(self, kind, t)
    }
    fn all_to_all(
        &self,
        kind: GroupKind,
        parts: Vec<CudaTensor>,
    ) -> Result<Vec<CudaTensor>, RuntimeError> {
        self.comms.all_to_all(self, kind, parts)
    }
    fn broadcast(
        &self,
        kind: GroupKind,
        t: &CudaTensor,
        root: usize,
    ) -> Result<CudaTensor, RuntimeError> {
        self.comms.broadcast(self, kind, t, root)
    }
    fn barrier(&self, kind: GroupKind) -> Result<(), RuntimeError> {
        let one = self.tensor(vec![0.0], 1, 1);
        self.comms.all_reduce(self, kind, &one).map(|_| ())
    }
    fn send(&self, peer: usize, tag: u64, t: &CudaTensor) -> Result<(), RuntimeError> {
        self.comms.send(peer, tag, &to_wire(self, t))
    }
    fn recv(&self, peer: usize, tag: u64) -> Result<CudaTensor, RuntimeError> {
        let w = self.comms.recv(peer, tag)?;
        Ok(self.tensor(w.data, w.rows, w.cols))
    }
}

/// Every (batch, head) pair, batch-major as the probabilities are laid out.
fn attention_heads(s: AttentionShape) -> Vec<(usize, usize)> {
    (0..s.batch)
        .flat_map(|b| (0..s.heads).map(move |h| (b, h)))
        .collect()
}

/// First row of head `h` of batch `b` in the `[batch·heads·q_len, kv_len]` probabilities.
fn probs_row(s: AttentionShape, b: usize, h: usize) -> usize {
    (b * s.heads + h) * s.q_len
}

/// Head `h` of batch `b` in query-shaped rows `[batch·q_len, heads·head_dim]`.
fn q_block(t: &CudaTensor, s: AttentionShape, b: usize, h: usize) -> Block<'_> {
    Block {
        buf: &t.data,
        offset: b * s.q_len * t.cols + h * s.head_dim,
        ld: t.cols,
    }
}

/// Key/value head `kh` of batch `b` in rows `[batch·kv_len, kv_heads·head_dim]`.
fn kv_block(t: &CudaTensor, s: AttentionShape, b: usize, kh: usize) -> Block<'_> {
    Block {
        buf: &t.data,
        offset: b * s.kv_len * t.cols + kh * s.head_dim,
        ld: t.cols,
    }
}

/// A whole tensor.
fn whole(t: &CudaTensor) -> Block<'_> {
    Block {
        buf: &t.data,
        offset: 0,
        ld: t.cols,
    }
}

/// Head `h` of batch `b` in probability-shaped rows `[batch·heads·q_len, kv_len]`.
fn probs_block(t: &CudaTensor, s: AttentionShape, b: usize, h: usize) -> Block<'_> {
    Block {
        buf: &t.data,
        offset: probs_row(s, b, h) * s.kv_len,
        ld: s.kv_len,
    }
}
