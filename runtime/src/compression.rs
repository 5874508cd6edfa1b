//! Data-parallel gradient compression with error feedback (`train.grad_compression`): what a
//! rank's compressed gradient leaves out is added to its next step's gradient, so nothing is
//! lost, only delayed. Per weight matrix (vectors such as norms and biases are summed whole):
//! - PowerSGD (Vogels et al., NeurIPS 2019, Algorithm 1): one power-iteration step, warm-started
//!   from the last step's `Q`. `P = M·Q` summed over the group and orthonormalised, `Q = Mᵀ·P`
//!   summed, and the group's gradient is `P·Qᵀ`; each rank keeps as error its gradient less its
//!   share `P·Qᵀ / W` (PyTorch's PowerSGD hook does the same with means).
//! - top-k: the `ratio` largest entries by magnitude (ties to the lower index) with their
//!   indices, all-gathered and summed into a dense gradient; the error is what was not sent.
//! - fp8: each entry rounded to FP8 E4M3 (3 mantissa bits) under a per-tensor scale that maps
//!   the largest magnitude to 448, then summed; the error is the rounding.
//!
//! The collectives move f32 tensors: the CPU backend emulates the smaller payloads' arithmetic,
//! the bytes on the wire are the cost model's business.

use crate::backend::Backend;
use crate::error::RuntimeError;
use crate::init::{init_block, Init};
use crate::mesh::GroupKind;
use std::collections::BTreeMap;
use tessel_grammar::{CompressionMethod, GradCompression};

/// The largest finite FP8 E4M3 magnitude (OCP 8-bit floating point specification, 2023).
const E4M3_MAX: f32 = 448.0;
/// E4M3's smallest normal exponent, and its mantissa bits.
const E4M3_MIN_EXPONENT: f32 = -6.0;
const E4M3_MANTISSA_BITS: f32 = 3.0;

/// What one parameter's compression keeps between steps.
struct ParamState<T> {
    error: T,
    /// PowerSGD's `Q`, warm-starting the next step.
    q: Option<T>,
}

/// One rank's compression state.
pub struct Compressor<T> {
    method: GradCompression,
    seed: u64,
    state: BTreeMap<String, ParamState<T>>,
}

impl<T: Clone> Compressor<T> {
    pub fn new(method: GradCompression, seed: u64) -> Self {
        Compressor {
            method,
            seed,
            state: BTreeMap::new(),
        }
    }

    /// The sum over `group` of every member's gradient `grad` of parameter `name`, compressed;
    /// with the bytes of state this call allocated (error buffers, PowerSGD's `Q`).
    pub fn all_reduce<B: Backend<Tensor = T>>(
        &mut self,
        b: &B,
        group: GroupKind,
        name: &str,
        grad: T,
    ) -> Result<(T, u64), RuntimeError> {
        let (rows, cols) = b.shape(&grad);
        if rows.min(cols) == 1 {
            return Ok((b.all_reduce(group, &grad)?, 0));
        }
        let mut allocated = 0;
        let state = self.state.entry(name.to_string()).or_insert_with(|| {
            allocated += b.bytes(&grad);
            ParamState {
                error: b.zeros(rows, cols),
                q: None,
            }
        });
        let m = b.add(&grad, &state.error);
        let members = b.group_size(group) as f32;
        let (sum, sent) = match self.method.method {
            CompressionMethod::Powersgd => {
                let rank = (self.method.rank as usize).min(rows).min(cols);
                let q = match state.q.take() {
                    Some(q) => q,
                    None => {
                        let init = init_block(
                            self.seed,
                            &format!("{name}.powersgd_q"),
                            rank as u64,
                            (0, cols as u64),
                            (0, rank as u64),
                            Init::Normal(1.0),
                        );
                        let q = b.tensor(init, cols, rank);
                        allocated += b.bytes(&q);
                        q
                    }
                };
                let p = b.all_reduce(group, &b.matmul(&m, &q, false, false))?;
                let p = orthonormal_columns(b, &p);
                let q = b.all_reduce(group, &b.matmul(&m, &p, true, false))?;
                let sum = b.matmul(&p, &q, false, true);
                state.q = Some(q);
                // This rank's share of the sum.
                let share = b.scale_rows(&sum, &vec![1.0 / members; rows]);
                (sum, share)
            }
            CompressionMethod::Topk => {
                let values = b.to_vec(&m);
                let keep = ((self.method.ratio * values.len() as f64).ceil() as usize).max(1);
                let mut order: Vec<usize> = (0..values.len()).collect();
                order.sort_by(|&x, &y| values[y].abs().total_cmp(&values[x].abs()).then(x.cmp(&y)));
                order.truncate(keep);
                let picked: Vec<f32> = order.iter().map(|&i| values[i]).collect();
                let indices: Vec<f32> = order.iter().map(|&i| f32::from_bits(i as u32)).collect();
                let all_values = b.to_vec(&b.all_gather(group, &b.tensor(picked, keep, 1))?);
                let all_indices = b.to_vec(&b.all_gather(group, &b.tensor(indices, keep, 1))?);
                let mut dense = vec![0.0f32; values.len()];
                for (v, i) in all_values.iter().zip(&all_indices) {
                    dense[i.to_bits() as usize] += v;
                }
                let mut mine = vec![0.0f32; values.len()];
                for &i in &order {
                    mine[i] = values[i];
                }
                (b.tensor(dense, rows, cols), b.tensor(mine, rows, cols))
            }
            CompressionMethod::Fp8 | CompressionMethod::Auto => {
                let values = b.to_vec(&m);
                let largest = values.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                let scale = if largest > 0.0 {
                    largest / E4M3_MAX
                } else {
                    1.0
                };
                let rounded: Vec<f32> = values
                    .iter()
                    .map(|v| round_e4m3(v / scale) * scale)
                    .collect();
                let rounded = b.tensor(rounded, rows, cols);
                (b.all_reduce(group, &rounded)?, rounded)
            }
        };
        state.error = b.add(&m, &b.scale_rows(&sent, &vec![-1.0; rows]));
        Ok((sum, allocated))
    }
}

/// `x` rounded to the nearest FP8 E4M3 value, ties to even (saturating at ±448; subnormals
/// below 2⁻⁶).
fn round_e4m3(x: f32) -> f32 {
    if x == 0.0 || !x.is_finite() {
        return 0.0;
    }
    let magnitude = x.abs().min(E4M3_MAX);
    let exponent = magnitude.log2().floor().max(E4M3_MIN_EXPONENT);
    let step = (exponent - E4M3_MANTISSA_BITS).exp2();
    ((magnitude / step).round_ties_even() * step)
        .min(E4M3_MAX)
        .copysign(x)
}

/// The columns of `p` made orthonormal by Gram–Schmidt (a column that vanishes stays zero).
fn orthonormal_columns<B: Backend>(b: &B, p: &B::Tensor) -> B::Tensor {
    let (rows, cols) = b.shape(p);
    let mut v = b.to_vec(p);
    for j in 0..cols {
        for i in 0..j {
            let dot: f32 = (0..rows).map(|r| v[r * cols + i] * v[r * cols + j]).sum();
            for r in 0..rows {
                v[r * cols + j] -= dot * v[r * cols + i];
            }
        }
        let norm = (0..rows)
            .map(|r| v[r * cols + j].powi(2))
            .sum::<f32>()
            .sqrt();
        if norm > 0.0 {
            for r in 0..rows {
                v[r * cols + j] /= norm;
            }
        }
    }
    b.tensor(v, rows, cols)
}

#[cfg(test)]
mod tests {
    use super::round_e4m3;

    #[test]
    fn e4m3_rounds_to_three_mantissa_bits() {
        assert_eq!(round_e4m3(1.0), 1.0);
        assert_eq!(round_e4m3(1.0625), 1.0); // halfway to 1.125: to the even mantissa
        assert_eq!(round_e4m3(1.1), 1.125);
        assert_eq!(round_e4m3(-300.0), -288.0);
        assert_eq!(round_e4m3(1000.0), 448.0);
        assert_eq!(round_e4m3(2f32.powi(-9)), 2f32.powi(-9));
        assert_eq!(round_e4m3(0.0), 0.0);
    }
}
