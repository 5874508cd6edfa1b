//! Host halves of Tempo's activation-saving kernels (Andoorveedu et al., NeurIPS 2022, arXiv
//! 2210.10246), used by the [`Backend`](super::Backend) defaults: an in-place GELU keeps its
//! output and one bit per element saying on which side of GELU's minimum the input lay, and
//! its backward recovers the input from the two; an in-place norm keeps its output and
//! statistics, and its backward recovers the input from them. The recovered inputs then go
//! through the backend's own backward, so the gradients are the ordinary ones up to rounding.

use super::{GELU_C, GELU_CUBIC};
use tessel_grammar::NormKind;

/// The tanh-approximated GELU every backend computes, in f64.
fn gelu(x: f64) -> f64 {
    let (c, cubic) = (f64::from(GELU_C), f64::from(GELU_CUBIC));
    0.5 * x * (1.0 + (c * (x + cubic * x * x * x)).tanh())
}

fn gelu_slope(x: f64) -> f64 {
    let (c, cubic) = (f64::from(GELU_C), f64::from(GELU_CUBIC));
    let t = (c * (x + cubic * x * x * x)).tanh();
    0.5 * (1.0 + t) + 0.5 * x * c * (1.0 + 3.0 * cubic * x * x) * (1.0 - t * t)
}

/// Steps of the safeguarded Newton iteration below: it converges in a handful, and bisection
/// alone would need about 60 to pin an f64 root within the brackets used here.
const MAX_STEPS: usize = 100;

/// The root of the increasing `f` (with derivative `slope`) in `[lo, hi]`, from `x`: Newton
/// steps, falling back to bisection where a step would leave the bracket.
fn increasing_root(
    f: impl Fn(f64) -> f64,
    slope: impl Fn(f64) -> f64,
    (mut lo, mut hi): (f64, f64),
    mut x: f64,
) -> f64 {
    x = x.clamp(lo, hi);
    for _ in 0..MAX_STEPS {
        let value = f(x);
        if value == 0.0 {
            return x;
        }
        if value < 0.0 {
            lo = x;
        } else {
            hi = x;
        }
        let step = value / slope(x);
        let mut next = x - step;
        if !(next > lo && next < hi) {
            next = 0.5 * (lo + hi);
        }
        if (next - x).abs() <= 1e-15 * x.abs().max(1.0) {
            return next;
        }
        x = next;
    }
    x
}

/// Where GELU has its minimum (about −0.7518): left of it GELU falls, right of it it rises.
fn gelu_argmin() -> f64 {
    let curvature = |x: f64| (gelu_slope(x + 1e-6) - gelu_slope(x - 1e-6)) / 2e-6;
    increasing_root(gelu_slope, curvature, (-2.0, 0.0), -0.75)
}

/// Below this, GELU's output is zero in f32: the left branch's bracket ends here.
const LEFT_END: f64 = -20.0;

/// One bit per element, packed 32 to an f32 word (its bit pattern): set where the input lies
/// left of GELU's minimum.
pub fn gelu_branch_bits(x: &[f32]) -> Vec<f32> {
    let argmin = gelu_argmin();
    x.chunks(32)
        .map(|chunk| {
            let word = chunk
                .iter()
                .enumerate()
                .filter(|(_, &v)| f64::from(v) < argmin)
                .fold(0u32, |w, (j, _)| w | (1 << j));
            f32::from_bits(word)
        })
        .collect()
}

/// Words [`gelu_branch_bits`] packs `elements` into.
pub fn branch_words(elements: usize) -> usize {
    elements.div_ceil(32)
}

/// GELU's input recovered from its output and branch bits.
pub fn gelu_input(y: &[f32], bits: &[f32]) -> Vec<f32> {
    let argmin = gelu_argmin();
    let floor = gelu(argmin);
    y.iter()
        .enumerate()
        .map(|(i, &out)| {
            let left = bits[i / 32].to_bits() >> (i % 32) & 1 == 1;
            let target = f64::from(out).max(floor);
            let x = if left {
                // GELU falls on the left branch: `target − GELU` rises.
                increasing_root(
                    |x| target - gelu(x),
                    |x| -gelu_slope(x),
                    (LEFT_END, argmin),
                    argmin - 1.0,
                )
            } else {
                // For outputs above zero the input lies within 0.2 above them (x − GELU(x)
                // = x·(1 − Φ(x)) is below 0.17 there).
                let hi = target.max(0.0) + 1.0;
                increasing_root(
                    |x| gelu(x) - target,
                    gelu_slope,
                    (argmin, hi),
                    target.max(argmin / 2.0),
                )
            };
            x as f32
        })
        .collect()
}

/// A norm's input recovered from its output `y` (`rows × cols`), weight, bias and the
/// `(mean, rstd)` statistics of each row: `x = ((y − bias) / weight) / rstd + mean`. The
/// weight must have no zero (it starts at one and stays away from zero in practice, as Tempo
/// notes).
pub fn norm_input(
    kind: NormKind,
    y: &[f32],
    cols: usize,
    weight: &[f32],
    bias: Option<&[f32]>,
    stats: &[f32],
) -> Vec<f32> {
    y.chunks(cols)
        .enumerate()
        .flat_map(|(r, row)| {
            let (mean, rstd) = match kind {
                NormKind::Layernorm => (stats[2 * r], stats[2 * r + 1]),
                NormKind::Rmsnorm => (0.0, stats[2 * r + 1]),
            };
            row.iter().enumerate().map(move |(j, &v)| {
                let shifted = v - bias.map_or(0.0, |b| b[j]);
                shifted / weight[j] / rstd + mean
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_inputs_come_back_from_outputs_and_bits() {
        let xs: Vec<f32> = (-400..=400).map(|i| i as f32 / 50.0).collect();
        let ys: Vec<f32> = xs.iter().map(|&x| gelu(f64::from(x)) as f32).collect();
        let bits = gelu_branch_bits(&xs);
        assert_eq!(bits.len(), branch_words(xs.len()));
        let back = gelu_input(&ys, &bits);
        for ((&x, &r), &y) in xs.iter().zip(&back).zip(&ys) {
            // Where GELU is flat (its minimum, far left) the input is ill-determined but so
            // is its influence: compare the slopes the backward uses.
            let (s, sr) = (gelu_slope(f64::from(x)), gelu_slope(f64::from(r)));
            assert!(
                (s - sr).abs() < 2e-3,
                "x {x}, y {y}: recovered {r}, slope {s} vs {sr}"
            );
            if x > -0.5 || (-4.0..-1.0).contains(&x) {
                assert!(
                    (x - r).abs() < 1e-4 * x.abs().max(1.0),
                    "x {x}: recovered {r}"
                );
            }
        }
        assert!((gelu_argmin() + 0.7518).abs() < 1e-3, "{}", gelu_argmin());
    }

    #[test]
    fn norm_inputs_come_back_from_outputs() {
        // One row of LayerNorm: x = [1, 2, 3, 6], mean 3, variance 3.5.
        let x = [1.0f32, 2.0, 3.0, 6.0];
        let (mean, rstd) = (3.0f32, 1.0 / 3.5f32.sqrt());
        let (w, b) = ([1.0f32, 0.5, 2.0, 1.5], [0.1f32, -0.2, 0.0, 0.3]);
        let y: Vec<f32> = (0..4).map(|j| (x[j] - mean) * rstd * w[j] + b[j]).collect();
        let back = norm_input(NormKind::Layernorm, &y, 4, &w, Some(&b), &[mean, rstd]);
        for (a, r) in x.iter().zip(&back) {
            assert!((a - r).abs() < 1e-5, "{a} vs {r}");
        }
    }
}
