//! One cost function, two evaluations: the primitives are written once over [`Scalar`], which
//! both `f64` (fitting them to microbenchmarks, where every input is a number) and [`Expr`]
//! (the cost model, where the strategy's degrees are symbols) implement.

use std::ops::{Add, Div, Mul, Sub};

use crate::Expr;

/// What a primitive's cost function needs of a number: arithmetic, `min`, `max` and `ceil`.
pub trait Scalar:
    Clone
    + From<f64>
    + Add<Self, Output = Self>
    + Sub<Self, Output = Self>
    + Mul<Self, Output = Self>
    + Div<Self, Output = Self>
{
    fn min_of(self, other: Self) -> Self;
    fn max_of(self, other: Self) -> Self;
    fn ceil_of(self) -> Self;
}

impl Scalar for f64 {
    fn min_of(self, other: f64) -> f64 {
        self.min(other)
    }
    fn max_of(self, other: f64) -> f64 {
        self.max(other)
    }
    fn ceil_of(self) -> f64 {
        self.ceil()
    }
}

impl Scalar for Expr {
    fn min_of(self, other: Expr) -> Expr {
        Expr::min([self, other])
    }
    fn max_of(self, other: Expr) -> Expr {
        Expr::max([self, other])
    }
    fn ceil_of(self) -> Expr {
        self.ceil()
    }
}

/// The constant `value`.
pub fn c<S: Scalar>(value: f64) -> S {
    S::from(value)
}

/// 1 when the whole number `x` exceeds `threshold`, else 0.
pub fn exceeds<S: Scalar>(x: S, threshold: f64) -> S {
    (x - c(threshold)).max_of(c(0.0)).min_of(c(1.0))
}

/// `⌈log2 x⌉` of a whole number `1 ≤ x ≤ largest`, as a sum of indicators (`Expr` has no
/// logarithm; a tree's depth is all that needs one). The bound keeps the expression short.
pub fn ceil_log2<S: Scalar>(x: S, largest: f64) -> S {
    let terms = largest.max(1.0).log2().ceil() as u32;
    (0..terms.min(30)).fold(c(0.0), |depth, power| {
        depth + exceeds(x.clone(), f64::from(1u32 << power))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceil_log2_of_whole_numbers() {
        for (x, expected) in [(1.0, 0.0), (2.0, 1.0), (3.0, 2.0), (16.0, 4.0), (17.0, 5.0)] {
            assert_eq!(ceil_log2(x, 32.0), expected, "x = {x}");
        }
    }

    #[test]
    fn expr_and_f64_agree() {
        let x = Expr::symbol("x");
        let e = ceil_log2(x, 16.0) * exceeds(Expr::symbol("x"), 4.0);
        let value = e.eval(&|_| 12.0);
        assert_eq!(value, ceil_log2(12.0, 16.0) * exceeds(12.0, 4.0));
    }
}
