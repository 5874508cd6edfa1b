//! The CUDA implementation of the backend trait. Matmuls go to cuBLAS (row-major operands are
//! passed as their column-major transposes), the element-wise, norm, loss, embedding and Adam
//! operations to the NVRTC-compiled kernels in `crate::kernels`, collectives to NCCL. Attention,
//! rotary embeddings and a few small row operations run through the CPU backend's code on a
//! host copy: slower, but the same formulas and indexing by construction.
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

impl CudaBackend {
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
        if m == 0 || n == 0 || k == 0 {
            return c;
        }
        let op = |t: bool| {
            if t {
                cublasOperation_t::CUBLAS_OP_T
            } else {
                cublasOperation_t::CUBLAS_OP_N
            }
        };
        // Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ, and a row-major
        // matrix read column-major is its transpose: so B goes first, A second.
        let cfg = GemmConfig {
            transa: op(tb),
            transb: op(ta),
            m: n as i32,
            n: m as i32,
            k: k as i32,
            alpha: 1.0f32,
            lda: b.cols as i32,
            ldb: a.cols as i32,
            beta: 0.0f32,
            ldc: n as i32,
        };
        // SAFETY: the sizes and leading dimensions above describe the three buffers.
        check(
            unsafe { self.dev.blas.gemm(cfg, &b.data, &a.data, &mut c.data) },
            "gemm",
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
        shape: AttentionShape,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
    ) -> (CudaTensor, CudaTensor) {
        let (o, p) =
            self.host
                .attention(shape, &self.to_host(q), &self.to_host(k), &self.to_host(v));
        (self.upload_host(&o), self.upload_host(&p))
    }
    fn attention_backward(
        &self,
        shape: AttentionShape,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        probs: &CudaTensor,
        dout: &CudaTensor,
    ) -> (CudaTensor, CudaTensor, CudaTensor) {
        let (dq, dk, dv) = self.host.attention_backward(
            shape,
            &self.to_host(q),
            &self.to_host(k),
            &self.to_host(v),
            &self.to_host(probs),
            &self.to_host(dout),
        );
        (
            self.upload_host(&dq),
            self.upload_host(&dk),
            self.upload_host(&dv),
        )
    }
    fn rope(
        &self,
        x: &CudaTensor,
        head_dim: usize,
        seq_len: usize,
        offset: usize,
        inverse: bool,
    ) -> CudaTensor {
        let r = self
            .host
            .rope(&self.to_host(x), head_dim, seq_len, offset, inverse);
        self.upload_host(&r)
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
