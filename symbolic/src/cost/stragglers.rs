//! The wait for the slowest rank. Ranks that synchronise (a gradient reduction, a ZeRO-3
//! gather, a tensor-parallel all-reduce, a pipeline send) leave each synchronisation together,
//! at the slowest one's time. When each rank's compute between two synchronisations varies
//! independently by a coefficient of variation `σ`, `n` ranks wait on average `σ · E[max of n
//! standard normals]` of that compute, and over a step, however often they synchronise, the
//! same fraction of the step's compute: the factor [`straggler_factor`] puts on it.
//!
//! `σ` is the cluster calibration's `jitter` (`ComputeParams::jitter`), measured by `tessel
//! calibrate` on traced steps, where ranks that synchronise once a step leave their spread in
//! each step's forward and backward; without a calibration it is 0 and no factor applies.

use super::context::{k, Ctx};
use crate::Expr;

/// Ranks up to which [`expected_max_of_normals`] is tabulated at powers of two; the last chord
/// extends beyond.
const MAX_RANKS_LOG2: u32 = 17;

/// The standard normal distribution's upper tail, `1 − Φ(x)`, from the complementary error
/// function's Chebyshev fit in Press et al., *Numerical Recipes* (2nd ed., §6.2, `erfcc`):
/// relative error below 1.2e-7 everywhere, tails included, which a million ranks' maximum
/// needs.
fn normal_upper_tail(x: f64) -> f64 {
    let z = x.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = [
        -1.265_512_23,
        1.000_023_68,
        0.374_091_96,
        0.096_784_18,
        -0.186_288_06,
        0.278_868_07,
        -1.135_203_98,
        1.488_515_87,
        -0.822_152_23,
        0.170_872_77,
    ]
    .iter()
    .rev()
    .fold(0.0, |acc, c| c + t * acc);
    let erfc = t * (-z * z + poly).exp();
    if x >= 0.0 {
        erfc / 2.0
    } else {
        1.0 - erfc / 2.0
    }
}

/// `E[max(X₁, …, Xₙ)]` of `n` independent standard normal variables: 0 for one, 1/√π for
/// two. From `E[M] = ∫₀^∞ (1 − Φⁿ) dx − ∫₀^∞ Φ(−x)ⁿ dx`, each by Simpson's rule on [0, 10].
pub fn expected_max_of_normals(n: u64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let n = n as f64;
    // Φⁿ through logarithms, so that a tail's 1 − Φ of 1e-12 survives n = 1e5.
    let cdf_n = |x: f64| (n * (-normal_upper_tail(x)).ln_1p()).exp();
    simpson(|x| 1.0 - cdf_n(x)) - simpson(|x| cdf_n(-x))
}

/// `∫₀^10 f` by Simpson's rule on 10,000 intervals.
fn simpson(f: impl Fn(f64) -> f64) -> f64 {
    let steps = 10_000;
    let h = 10.0 / steps as f64;
    let sum: f64 = (0..=steps)
        .map(|i| {
            let weight = if i == 0 || i == steps {
                1.0
            } else if i % 2 == 1 {
                4.0
            } else {
                2.0
            };
            weight * f(i as f64 * h)
        })
        .sum();
    sum * h / 3.0
}

/// [`expected_max_of_normals`] at 1, 2, 4, … ranks, integrated once per process.
fn at_powers_of_two() -> &'static [(f64, f64)] {
    static TABLE: std::sync::OnceLock<Vec<(f64, f64)>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=MAX_RANKS_LOG2)
            .map(|i| {
                let n = 1u64 << i;
                (n as f64, expected_max_of_normals(n))
            })
            .collect()
    })
}

/// [`expected_max_of_normals`] of a rank count that is an expression: the chords between
/// powers of two, whose minimum is the interpolation (the expectation is concave in `n`).
fn expected_max_expr(ranks: Expr) -> Expr {
    Expr::min(at_powers_of_two().windows(2).map(|pair| {
        let ((n0, e0), (n1, e1)) = (pair[0], pair[1]);
        let slope = (e1 - e0) / (n1 - n0);
        k(e0 - slope * n0) + ranks.clone() * slope
    }))
}

/// The factor on a stage's compute for the wait at every synchronisation of the job's
/// `dp · tp · pp · cp` ranks; exactly 1 without a measured jitter.
pub(crate) fn straggler_factor(ctx: &Ctx) -> Option<Expr> {
    let jitter = ctx.cal.compute.map_or(0.0, |c| c.jitter);
    if jitter <= 0.0 {
        return None;
    }
    let ranks = ctx.d.clone() * ctx.t.clone() * ctx.p.clone() * ctx.c.clone();
    Some(k(1.0) + expected_max_expr(ranks) * jitter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_expected_maximum_matches_its_tabulated_values() {
        // 1/√π for two; the others integrated independently (Python's `math.erfc`, Simpson's
        // rule with 200,000 steps on [−12, 12]), to four places.
        for (n, expected) in [
            (1, 0.0),
            (2, 0.5642),
            (4, 1.0294),
            (8, 1.4236),
            (16, 1.7660),
            (32, 2.0697),
            (64, 2.3438),
        ] {
            let got = expected_max_of_normals(n);
            assert!(
                (got - expected).abs() < 2e-4,
                "n = {n}: {got} against {expected}"
            );
        }
        let million = expected_max_of_normals(1 << 20);
        assert!((million - 4.8723).abs() < 5e-4, "{million}");
    }

    #[test]
    fn the_expression_interpolates_between_powers_of_two() {
        let at = |n: f64| expected_max_expr(k(n)).eval(&|_| 0.0);
        assert!((at(2.0) - expected_max_of_normals(2)).abs() < 1e-12);
        assert!((at(1024.0) - expected_max_of_normals(1024)).abs() < 1e-12);
        assert!(at(1.0).abs() < 1e-12);
        // On the chords, below the true value (it is concave in n): by 5.8 % at 3 ranks, the
        // most between any two powers of two, and 3.2 % at 6.
        for (n, below) in [(3, 0.059), (6, 0.033)] {
            let (chord, exact) = (at(n as f64), expected_max_of_normals(n));
            assert!(
                chord <= exact && chord > (1.0 - below) * exact,
                "{n}: {chord} against {exact}"
            );
        }
    }
}
