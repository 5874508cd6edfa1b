//! The CPU backend: f32 row-major matrices, matmul from `matrixmultiply`, collectives over
//! shared memory between the rank threads of one process.

use super::exchange::ExchangeCollectives;
use super::shared_memory::{GroupHandle, World, ALL_GROUP_KINDS};
use super::{AdamParams, AttentionShape, Backend, GELU_C, GELU_CUBIC, NORM_EPS, ROPE_BASE};
use crate::error::RuntimeError;
use crate::mesh::GroupKind;
use crate::trace::MatmulRecord;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tessel_grammar::NormKind;

#[derive(Clone, Debug, PartialEq)]
pub struct CpuTensor {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl CpuTensor {
    fn new(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        debug_assert_eq!(rows * cols, data.len());
        CpuTensor { rows, cols, data }
    }

    fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }

    fn map(&self, f: impl Fn(f32) -> f32) -> CpuTensor {
        CpuTensor::new(
            self.rows,
            self.cols,
            self.data.iter().map(|&x| f(x)).collect(),
        )
    }

    fn zip(&self, o: &CpuTensor, f: impl Fn(f32, f32) -> f32) -> CpuTensor {
        assert_eq!((self.rows, self.cols), (o.rows, o.cols), "shape mismatch");
        let data = self
            .data
            .iter()
            .zip(&o.data)
            .map(|(&a, &b)| f(a, b))
            .collect();
        CpuTensor::new(self.rows, self.cols, data)
    }
}

/// One rank's CPU backend.
pub struct CpuBackend {
    rank: usize,
    world: Arc<World>,
    groups: BTreeMap<GroupKind, GroupHandle>,
    /// Seconds of each matmul call, by `(m, n, k)`.
    matmul_seconds: Mutex<BTreeMap<(usize, usize, usize), Vec<f64>>>,
}

impl CpuBackend {
    pub fn new(world: Arc<World>, rank: usize) -> Self {
        let groups = ALL_GROUP_KINDS
            .iter()
            .map(|&k| (k, world.group(k, rank as u64)))
            .collect();
        CpuBackend {
            rank,
            world,
            groups,
            matmul_seconds: Mutex::default(),
        }
    }
}

impl ExchangeCollectives for CpuBackend {
    type Received = Arc<Vec<CpuTensor>>;

    fn arithmetic(&self) -> &CpuBackend {
        self
    }

    fn members(&self, kind: GroupKind) -> usize {
        self.groups[&kind].members.len()
    }

    fn member_index(&self, kind: GroupKind) -> usize {
        self.groups[&kind].index
    }

    fn exchange(
        &self,
        kind: GroupKind,
        parts: Vec<CpuTensor>,
    ) -> Result<Vec<Arc<Vec<CpuTensor>>>, RuntimeError> {
        self.world.exchange(&self.groups[&kind], parts)
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

impl Backend for CpuBackend {
    type Tensor = CpuTensor;

    fn tensor(&self, data: Vec<f32>, rows: usize, cols: usize) -> CpuTensor {
        CpuTensor::new(rows, cols, data)
    }

    fn zeros(&self, rows: usize, cols: usize) -> CpuTensor {
        CpuTensor::new(rows, cols, vec![0.0; rows * cols])
    }

    fn to_vec(&self, t: &CpuTensor) -> Vec<f32> {
        t.data.clone()
    }

    fn shape(&self, t: &CpuTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn reshape(&self, t: &CpuTensor, rows: usize, cols: usize) -> CpuTensor {
        assert_eq!(rows * cols, t.data.len(), "reshape changes the size");
        CpuTensor::new(rows, cols, t.data.clone())
    }

    fn matmul(&self, a: &CpuTensor, b: &CpuTensor, ta: bool, tb: bool) -> CpuTensor {
        let (m, k) = if ta {
            (a.cols, a.rows)
        } else {
            (a.rows, a.cols)
        };
        let (kb, n) = if tb {
            (b.cols, b.rows)
        } else {
            (b.rows, b.cols)
        };
        assert_eq!(k, kb, "matmul inner dimensions");
        let start = Instant::now();
        let mut c = vec![0.0f32; m * n];
        let (rsa, csa) = if ta {
            (1, a.cols as isize)
        } else {
            (a.cols as isize, 1)
        };
        let (rsb, csb) = if tb {
            (1, b.cols as isize)
        } else {
            (b.cols as isize, 1)
        };
        if m > 0 && n > 0 && k > 0 {
            // SAFETY: the strides describe `a`, `b` and `c` exactly as allocated above.
            unsafe {
                matrixmultiply::sgemm(
                    m,
                    k,
                    n,
                    1.0,
                    a.data.as_ptr(),
                    rsa,
                    csa,
                    b.data.as_ptr(),
                    rsb,
                    csb,
                    0.0,
                    c.as_mut_ptr(),
                    n as isize,
                    1,
                );
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        if let Ok(mut timed) = self.matmul_seconds.lock() {
            timed.entry((m, n, k)).or_default().push(seconds);
        }
        CpuTensor::new(m, n, c)
    }

    fn timed_matmuls(&self) -> Vec<MatmulRecord> {
        let timed = self
            .matmul_seconds
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default();
        MatmulRecord::tally(timed)
    }

    fn add(&self, a: &CpuTensor, b: &CpuTensor) -> CpuTensor {
        a.zip(b, |x, y| x + y)
    }

    fn add_assign(&self, a: &mut CpuTensor, b: &CpuTensor) {
        assert_eq!((a.rows, a.cols), (b.rows, b.cols), "shape mismatch");
        a.data.iter_mut().zip(&b.data).for_each(|(x, y)| *x += y);
    }

    fn mul(&self, a: &CpuTensor, b: &CpuTensor) -> CpuTensor {
        a.zip(b, |x, y| x * y)
    }

    fn add_row(&self, a: &CpuTensor, bias: &CpuTensor) -> CpuTensor {
        assert_eq!(bias.data.len(), a.cols, "bias width");
        let mut out = a.clone();
        for r in out.data.chunks_mut(a.cols) {
            r.iter_mut().zip(&bias.data).for_each(|(x, b)| *x += b);
        }
        out
    }

    fn sum_rows(&self, a: &CpuTensor) -> CpuTensor {
        let mut out = vec![0.0f32; a.cols];
        for r in a.data.chunks(a.cols.max(1)) {
            out.iter_mut().zip(r).for_each(|(o, x)| *o += x);
        }
        CpuTensor::new(1, a.cols, out)
    }

    fn scale_rows(&self, a: &CpuTensor, scales: &[f32]) -> CpuTensor {
        assert_eq!(scales.len(), a.rows, "one scale per row");
        let mut out = a.clone();
        for (r, s) in out.data.chunks_mut(a.cols.max(1)).zip(scales) {
            r.iter_mut().for_each(|x| *x *= s);
        }
        out
    }

    fn row_dots(&self, a: &CpuTensor, b: &CpuTensor) -> Vec<f32> {
        assert_eq!((a.rows, a.cols), (b.rows, b.cols), "shape mismatch");
        (0..a.rows)
            .map(|r| a.row(r).iter().zip(b.row(r)).map(|(x, y)| x * y).sum())
            .collect()
    }

    fn gelu(&self, x: &CpuTensor) -> CpuTensor {
        x.map(|v| 0.5 * v * (1.0 + (GELU_C * (v + GELU_CUBIC * v * v * v)).tanh()))
    }

    fn gelu_backward(&self, x: &CpuTensor, dy: &CpuTensor) -> CpuTensor {
        x.zip(dy, |v, d| {
            let t = (GELU_C * (v + GELU_CUBIC * v * v * v)).tanh();
            let dt = GELU_C * (1.0 + 3.0 * GELU_CUBIC * v * v) * (1.0 - t * t);
            d * (0.5 * (1.0 + t) + 0.5 * v * dt)
        })
    }

    fn silu(&self, x: &CpuTensor) -> CpuTensor {
        x.map(|v| v * sigmoid(v))
    }

    fn silu_backward(&self, x: &CpuTensor, dy: &CpuTensor) -> CpuTensor {
        x.zip(dy, |v, d| {
            let s = sigmoid(v);
            d * s * (1.0 + v * (1.0 - s))
        })
    }

    fn norm(
        &self,
        kind: NormKind,
        x: &CpuTensor,
        weight: &CpuTensor,
        bias: Option<&CpuTensor>,
    ) -> (CpuTensor, CpuTensor) {
        let n = x.cols;
        let mut out = Vec::with_capacity(x.data.len());
        let mut stats = Vec::with_capacity(2 * x.rows);
        for r in 0..x.rows {
            let row = x.row(r);
            let mean = match kind {
                NormKind::Layernorm => row.iter().sum::<f32>() / n as f32,
                NormKind::Rmsnorm => 0.0,
            };
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
            let rstd = 1.0 / (var + NORM_EPS).sqrt();
            for (j, v) in row.iter().enumerate() {
                let mut y = (v - mean) * rstd * weight.data[j];
                if let Some(b) = bias {
                    y += b.data[j];
                }
                out.push(y);
            }
            stats.push(mean);
            stats.push(rstd);
        }
        (
            CpuTensor::new(x.rows, n, out),
            CpuTensor::new(x.rows, 2, stats),
        )
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
        let n = x.cols;
        let mut dx = Vec::with_capacity(x.data.len());
        let mut dw = vec![0.0f32; n];
        let mut db = vec![0.0f32; n];
        for r in 0..x.rows {
            let (mean, rstd) = (stats.data[2 * r], stats.data[2 * r + 1]);
            let xr = x.row(r);
            let dyr = dy.row(r);
            let mut sum_g = 0.0f32;
            let mut sum_gx = 0.0f32;
            for j in 0..n {
                let xhat = (xr[j] - mean) * rstd;
                let g = dyr[j] * weight.data[j];
                dw[j] += dyr[j] * xhat;
                db[j] += dyr[j];
                sum_g += g;
                sum_gx += g * xhat;
            }
            let mean_g = match kind {
                NormKind::Layernorm => sum_g / n as f32,
                NormKind::Rmsnorm => 0.0,
            };
            let mean_gx = sum_gx / n as f32;
            for j in 0..n {
                let xhat = (xr[j] - mean) * rstd;
                let g = dyr[j] * weight.data[j];
                dx.push(rstd * (g - mean_g - xhat * mean_gx));
            }
        }
        (
            CpuTensor::new(x.rows, n, dx),
            CpuTensor::new(1, n, dw),
            has_bias.then(|| CpuTensor::new(1, n, db)),
        )
    }

    fn attention(
        &self,
        s: AttentionShape,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
    ) -> (CpuTensor, CpuTensor) {
        let d = s.head_dim;
        let group = s.heads / s.kv_heads;
        let scale = 1.0 / (d as f32).sqrt();
        let mut out = vec![0.0f32; q.data.len()];
        let mut probs = vec![0.0f32; s.batch * s.heads * s.q_len * s.kv_len];
        for b in 0..s.batch {
            for h in 0..s.heads {
                let kh = h / group;
                for i in 0..s.q_len {
                    let visible = (s.q_offset + i + 1).min(s.kv_len);
                    let qr = &q.row(b * s.q_len + i)[h * d..(h + 1) * d];
                    let p = &mut probs[((b * s.heads + h) * s.q_len + i) * s.kv_len..][..s.kv_len];
                    let mut max = f32::NEG_INFINITY;
                    for (j, pj) in p.iter_mut().enumerate().take(visible) {
                        let kr = &k.row(b * s.kv_len + j)[kh * d..(kh + 1) * d];
                        *pj = qr.iter().zip(kr).map(|(x, y)| x * y).sum::<f32>() * scale;
                        max = max.max(*pj);
                    }
                    let mut total = 0.0f32;
                    for pj in p.iter_mut().take(visible) {
                        *pj = (*pj - max).exp();
                        total += *pj;
                    }
                    let o = &mut out[(b * s.q_len + i) * q.cols + h * d..][..d];
                    for (j, pj) in p.iter_mut().enumerate().take(visible) {
                        *pj /= total;
                        let vr = &v.row(b * s.kv_len + j)[kh * d..(kh + 1) * d];
                        o.iter_mut().zip(vr).for_each(|(x, y)| *x += *pj * y);
                    }
                }
            }
        }
        (
            CpuTensor::new(q.rows, q.cols, out),
            CpuTensor::new(s.batch * s.heads * s.q_len, s.kv_len, probs),
        )
    }

    fn attention_backward(
        &self,
        s: AttentionShape,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        probs: &CpuTensor,
        dout: &CpuTensor,
    ) -> (CpuTensor, CpuTensor, CpuTensor) {
        let d = s.head_dim;
        let group = s.heads / s.kv_heads;
        let scale = 1.0 / (d as f32).sqrt();
        let mut dq = vec![0.0f32; q.data.len()];
        let mut dk = vec![0.0f32; k.data.len()];
        let mut dv = vec![0.0f32; v.data.len()];
        let mut dp = vec![0.0f32; s.kv_len];
        for b in 0..s.batch {
            for h in 0..s.heads {
                let kh = h / group;
                for i in 0..s.q_len {
                    let visible = (s.q_offset + i + 1).min(s.kv_len);
                    let qrow = b * s.q_len + i;
                    let qr = &q.row(qrow)[h * d..(h + 1) * d];
                    let dor = &dout.row(qrow)[h * d..(h + 1) * d];
                    let p = probs.row((b * s.heads + h) * s.q_len + i);
                    let mut dot = 0.0f32;
                    for j in 0..visible {
                        let krow = b * s.kv_len + j;
                        let vr = &v.row(krow)[kh * d..(kh + 1) * d];
                        dp[j] = dor.iter().zip(vr).map(|(x, y)| x * y).sum();
                        dot += p[j] * dp[j];
                        let dvr = &mut dv[krow * v.cols + kh * d..][..d];
                        dvr.iter_mut().zip(dor).for_each(|(x, y)| *x += p[j] * y);
                    }
                    for j in 0..visible {
                        let ds = p[j] * (dp[j] - dot) * scale;
                        let krow = b * s.kv_len + j;
                        let kr = &k.row(krow)[kh * d..(kh + 1) * d];
                        let dqr = &mut dq[qrow * q.cols + h * d..][..d];
                        dqr.iter_mut().zip(kr).for_each(|(x, y)| *x += ds * y);
                        let dkr = &mut dk[krow * k.cols + kh * d..][..d];
                        dkr.iter_mut().zip(qr).for_each(|(x, y)| *x += ds * y);
                    }
                }
            }
        }
        (
            CpuTensor::new(q.rows, q.cols, dq),
            CpuTensor::new(k.rows, k.cols, dk),
            CpuTensor::new(v.rows, v.cols, dv),
        )
    }

    fn rope(
        &self,
        x: &CpuTensor,
        head_dim: usize,
        seq_len: usize,
        offset: usize,
        inverse: bool,
    ) -> CpuTensor {
        let half = head_dim / 2;
        let mut out = x.clone();
        for r in 0..x.rows {
            let pos = (offset + r % seq_len) as f32;
            let row = &mut out.data[r * x.cols..(r + 1) * x.cols];
            for head in row.chunks_mut(head_dim) {
                for i in 0..half {
                    let theta = pos * ROPE_BASE.powf(-2.0 * i as f32 / head_dim as f32);
                    let (sin, cos) = theta.sin_cos();
                    let sin = if inverse { -sin } else { sin };
                    let (a, b) = (head[i], head[i + half]);
                    head[i] = a * cos - b * sin;
                    head[i + half] = a * sin + b * cos;
                }
            }
        }
        out
    }

    fn gather_rows(&self, table: &CpuTensor, rows: &[usize]) -> CpuTensor {
        let mut data = Vec::with_capacity(rows.len() * table.cols);
        for &r in rows {
            data.extend_from_slice(table.row(r));
        }
        CpuTensor::new(rows.len(), table.cols, data)
    }

    fn scatter_add_rows(&self, dst: &mut CpuTensor, rows: &[usize], src: &CpuTensor) {
        assert_eq!(rows.len(), src.rows, "one destination per row");
        let c = dst.cols;
        for (i, &r) in rows.iter().enumerate() {
            dst.data[r * c..(r + 1) * c]
                .iter_mut()
                .zip(src.row(i))
                .for_each(|(x, y)| *x += y);
        }
    }

    fn slice_rows(&self, t: &CpuTensor, start: usize, end: usize) -> CpuTensor {
        CpuTensor::new(
            end - start,
            t.cols,
            t.data[start * t.cols..end * t.cols].to_vec(),
        )
    }

    fn concat_rows(&self, parts: &[&CpuTensor]) -> CpuTensor {
        let cols = parts.first().map_or(0, |p| p.cols);
        let mut data = Vec::new();
        let mut rows = 0;
        for p in parts {
            assert!(p.cols == cols || p.rows == 0, "concat of different widths");
            data.extend_from_slice(&p.data);
            rows += p.rows;
        }
        CpuTensor::new(rows, cols, data)
    }

    fn slice_cols(&self, t: &CpuTensor, start: usize, end: usize) -> CpuTensor {
        let mut data = Vec::with_capacity(t.rows * (end - start));
        for r in 0..t.rows {
            data.extend_from_slice(&t.row(r)[start..end]);
        }
        CpuTensor::new(t.rows, end - start, data)
    }

    fn cross_entropy(&self, logits: &CpuTensor, targets: &[u32], scale: f32) -> (f64, CpuTensor) {
        assert_eq!(targets.len(), logits.rows, "one target per row");
        let mut grad = logits.clone();
        let mut loss = 0.0f64;
        for (r, &t) in targets.iter().enumerate() {
            let row = &mut grad.data[r * logits.cols..(r + 1) * logits.cols];
            let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let total: f32 = row.iter().map(|v| (v - max).exp()).sum();
            let log_total = total.ln() + max;
            loss += f64::from(log_total - row[t as usize]);
            for v in row.iter_mut() {
                *v = (*v - log_total).exp() * scale;
            }
            row[t as usize] -= scale;
        }
        (loss * f64::from(scale), grad)
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
        let c1 = 1.0 - hp.beta1.powi(step as i32);
        let c2 = 1.0 - hp.beta2.powi(step as i32);
        for i in 0..param.data.len() {
            let g = grad.data[i];
            m.data[i] = hp.beta1 * m.data[i] + (1.0 - hp.beta1) * g;
            v.data[i] = hp.beta2 * v.data[i] + (1.0 - hp.beta2) * g * g;
            let mh = m.data[i] / c1;
            let vh = v.data[i] / c2;
            param.data[i] -= hp.lr * mh / (vh.sqrt() + hp.eps);
        }
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
        if self.world.aborted() {
            return Err(RuntimeError::Aborted);
        }
        self.world.send(self.rank, peer, tag, t.clone());
        Ok(())
    }

    fn recv(&self, peer: usize, tag: u64) -> Result<CpuTensor, RuntimeError> {
        self.world.recv(peer, self.rank, tag)
    }
}
