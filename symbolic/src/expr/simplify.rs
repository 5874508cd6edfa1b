//! Simplification to a normal form by smart constructors.
//!
//! Every `make_*` function takes operands that are already in normal form and returns a node in
//! normal form, so one bottom-up pass suffices and a second pass changes nothing. The normal form:
//!
//! - `Sum`: at least two terms, none a `Sum`; terms sorted by their coefficient-free part (each
//!   part appears once, with a nonzero coefficient); at most one nonzero constant, last.
//! - `Product`: at least two factors, none a `Product` or a `Sum` when a coefficient is present
//!   and it is the only other factor (constants distribute over sums); an optional coefficient
//!   (not 0 or 1) first, then the other factors sorted. A quotient appears only as
//!   `coefficient * (n / d)`.
//! - `Div(n, d)`: `n` and `d` carry no coefficient and no quotient, `d` is not a constant, and
//!   they share no factor.
//! - `Max`/`Min`: at least two operands, flattened, sorted, without duplicates, without two
//!   operands that differ only by an added constant, and with at most one constant, last.
//! - `Ceil(a)`: `a` is not integer-valued and is not a sum with integer-valued terms.
//!
//! The rewrites are identities over the reals given that every subexpression is finite, which
//! is what lets `x*0` become `0` and `(a*b)/(a*c)` become `b/c`.

use std::cmp::Ordering;

use super::order::cmp_expr;
use super::Expr;

impl Expr {
    /// Returns an equivalent expression in normal form: nested sums and products flattened,
    /// constants folded, identities dropped (`x + 0`, `x*1`, `x/1`, `x*0 → 0`), like terms
    /// merged (`2*x + 3*x → 5*x`), constant coefficients distributed over sums, common factors
    /// of a quotient cancelled, nested max/min flattened and pruned, and integer terms pulled
    /// out of `ceil`. Operands are sorted, so expressions equal up to reordering simplify to
    /// identical trees, and `e.simplify().simplify() == e.simplify()`.
    ///
    /// Assumes every subexpression is finite (no division by zero); within that domain the
    /// result has the same value up to floating-point rounding.
    pub fn simplify(&self) -> Expr {
        match self {
            Expr::Const(c) => Expr::Const(*c),
            Expr::Sym(s) => Expr::Sym(s.clone()),
            Expr::Sum(items) => make_sum(items.iter().map(Expr::simplify).collect()),
            Expr::Product(items) => make_product(items.iter().map(Expr::simplify).collect()),
            Expr::Div(num, den) => make_div(num.simplify(), den.simplify()),
            Expr::Max(items) => {
                make_extremum(Extremum::Max, items.iter().map(Expr::simplify).collect())
            }
            Expr::Min(items) => {
                make_extremum(Extremum::Min, items.iter().map(Expr::simplify).collect())
            }
            Expr::Ceil(arg) => make_ceil(arg.simplify()),
        }
    }
}

/// Splits a normalised non-constant term into its coefficient and coefficient-free part.
fn split_coefficient(term: Expr) -> (f64, Expr) {
    match term {
        Expr::Product(mut factors) => match factors.first() {
            Some(Expr::Const(c)) => {
                let c = *c;
                factors.remove(0);
                let rest = if factors.len() == 1 {
                    factors.pop().unwrap_or(Expr::Const(1.0))
                } else {
                    Expr::Product(factors)
                };
                (c, rest)
            }
            _ => (1.0, Expr::Product(factors)),
        },
        other => (1.0, other),
    }
}

/// Multiplies a normalised coefficient-free part by a coefficient, in normal form.
fn scale(coefficient: f64, part: Expr) -> Expr {
    if coefficient == 1.0 {
        return part;
    }
    match part {
        Expr::Product(factors) => {
            let mut all = Vec::with_capacity(factors.len() + 1);
            all.push(Expr::Const(coefficient));
            all.extend(factors);
            Expr::Product(all)
        }
        other => Expr::Product(vec![Expr::Const(coefficient), other]),
    }
}

pub(crate) fn make_sum(items: Vec<Expr>) -> Expr {
    let mut constant = 0.0;
    let mut terms: Vec<(Expr, f64)> = Vec::with_capacity(items.len());
    let mut pending = items;
    while let Some(item) = pending.pop() {
        match item {
            Expr::Const(c) => constant += c,
            Expr::Sum(inner) => pending.extend(inner),
            other => {
                let (c, part) = split_coefficient(other);
                terms.push((part, c));
            }
        }
    }
    terms.sort_by(|a, b| cmp_expr(&a.0, &b.0));

    let mut out: Vec<Expr> = Vec::with_capacity(terms.len() + 1);
    let mut iter = terms.into_iter().peekable();
    while let Some((part, mut coefficient)) = iter.next() {
        while let Some((next, c)) = iter.peek() {
            if cmp_expr(next, &part) != Ordering::Equal {
                break;
            }
            coefficient += c;
            iter.next();
        }
        if coefficient != 0.0 {
            out.push(scale(coefficient, part));
        }
    }
    if constant != 0.0 {
        out.push(Expr::Const(constant));
    }
    match out.len() {
        0 => Expr::Const(0.0),
        1 => out.pop().unwrap_or(Expr::Const(0.0)),
        _ => Expr::Sum(out),
    }
}

/// Numerator and denominator factors of a product or quotient being normalised.
struct Fraction {
    coefficient: f64,
    num: Vec<Expr>,
    den: Vec<Expr>,
}

impl Fraction {
    fn new() -> Self {
        Fraction {
            coefficient: 1.0,
            num: Vec::new(),
            den: Vec::new(),
        }
    }

    /// Adds `item` as a factor, or as a divisor when `inverted`.
    fn collect(&mut self, item: Expr, inverted: bool) {
        match item {
            Expr::Const(c) => {
                if inverted {
                    self.coefficient /= c;
                } else {
                    self.coefficient *= c;
                }
            }
            Expr::Product(factors) => {
                for f in factors {
                    self.collect(f, inverted);
                }
            }
            Expr::Div(n, d) => {
                self.collect(*n, inverted);
                self.collect(*d, !inverted);
            }
            other => {
                if inverted {
                    self.den.push(other);
                } else {
                    self.num.push(other);
                }
            }
        }
    }

    fn finish(mut self) -> Expr {
        if self.coefficient == 0.0 {
            return Expr::Const(0.0);
        }
        self.num.sort_by(cmp_expr);
        self.den.sort_by(cmp_expr);
        let (num, den) = cancel_common(self.num, self.den);
        let coefficient = self.coefficient;

        if den.is_empty() {
            if num.len() == 1 && coefficient != 1.0 {
                if let Expr::Sum(terms) = &num[0] {
                    return make_sum(
                        terms
                            .iter()
                            .map(|t| make_product(vec![Expr::Const(coefficient), t.clone()]))
                            .collect(),
                    );
                }
            }
            let mut factors = Vec::with_capacity(num.len() + 1);
            if coefficient != 1.0 || num.is_empty() {
                factors.push(Expr::Const(coefficient));
            }
            factors.extend(num);
            return if factors.len() == 1 {
                factors.pop().unwrap_or(Expr::Const(1.0))
            } else {
                Expr::Product(factors)
            };
        }
        let quotient = Expr::Div(Box::new(join_factors(num)), Box::new(join_factors(den)));
        if coefficient == 1.0 {
            quotient
        } else {
            Expr::Product(vec![Expr::Const(coefficient), quotient])
        }
    }
}

/// Removes factors that appear in both sorted lists (as multisets).
fn cancel_common(num: Vec<Expr>, den: Vec<Expr>) -> (Vec<Expr>, Vec<Expr>) {
    let mut kept_num = Vec::with_capacity(num.len());
    let mut kept_den = Vec::with_capacity(den.len());
    let mut n = num.into_iter().peekable();
    let mut d = den.into_iter().peekable();
    loop {
        match (n.peek(), d.peek()) {
            (Some(a), Some(b)) => match cmp_expr(a, b) {
                Ordering::Less => kept_num.extend(n.next()),
                Ordering::Greater => kept_den.extend(d.next()),
                Ordering::Equal => {
                    n.next();
                    d.next();
                }
            },
            (Some(_), None) => kept_num.extend(n.next()),
            (None, Some(_)) => kept_den.extend(d.next()),
            (None, None) => break,
        }
    }
    (kept_num, kept_den)
}

/// A product of sorted, coefficient-free factors: `1`, the factor itself, or a `Product`.
fn join_factors(mut factors: Vec<Expr>) -> Expr {
    match factors.len() {
        0 => Expr::Const(1.0),
        1 => factors.pop().unwrap_or(Expr::Const(1.0)),
        _ => Expr::Product(factors),
    }
}

pub(crate) fn make_product(items: Vec<Expr>) -> Expr {
    let mut fraction = Fraction::new();
    for item in items {
        fraction.collect(item, false);
    }
    fraction.finish()
}

pub(crate) fn make_div(num: Expr, den: Expr) -> Expr {
    let mut fraction = Fraction::new();
    fraction.collect(num, false);
    fraction.collect(den, true);
    fraction.finish()
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Extremum {
    Max,
    Min,
}

impl Extremum {
    fn pick(self, a: f64, b: f64) -> f64 {
        match self {
            Extremum::Max => a.max(b),
            Extremum::Min => a.min(b),
        }
    }

    /// The value of an empty max/min, matching `Expr::eval`.
    fn identity(self) -> f64 {
        match self {
            Extremum::Max => f64::NEG_INFINITY,
            Extremum::Min => f64::INFINITY,
        }
    }

    fn wrap(self, items: Vec<Expr>) -> Expr {
        match self {
            Extremum::Max => Expr::Max(items),
            Extremum::Min => Expr::Min(items),
        }
    }

    fn unwrap_same(self, expr: Expr) -> Result<Vec<Expr>, Expr> {
        match (self, expr) {
            (Extremum::Max, Expr::Max(items)) | (Extremum::Min, Expr::Min(items)) => Ok(items),
            (_, other) => Err(other),
        }
    }
}

/// Splits a normalised expression into the part without its added constant and that constant.
fn split_offset(expr: &Expr) -> (Expr, f64) {
    if let Expr::Sum(terms) = expr {
        if let Some(Expr::Const(c)) = terms.last() {
            let rest = &terms[..terms.len() - 1];
            let part = if rest.len() == 1 {
                rest[0].clone()
            } else {
                Expr::Sum(rest.to_vec())
            };
            return (part, *c);
        }
    }
    (expr.clone(), 0.0)
}

pub(crate) fn make_extremum(kind: Extremum, items: Vec<Expr>) -> Expr {
    let mut constant: Option<f64> = None;
    let mut operands: Vec<(Expr, f64, Expr)> = Vec::with_capacity(items.len());
    let mut pending = items;
    while let Some(item) = pending.pop() {
        match kind.unwrap_same(item) {
            Ok(inner) => pending.extend(inner),
            Err(Expr::Const(c)) => {
                constant = Some(kind.pick(constant.unwrap_or(kind.identity()), c));
            }
            Err(other) => {
                let (part, offset) = split_offset(&other);
                operands.push((part, offset, other));
            }
        }
    }
    operands.sort_by(|a, b| cmp_expr(&a.0, &b.0).then_with(|| a.1.total_cmp(&b.1)));

    // Among operands equal up to an added constant, only the largest (max) or smallest (min)
    // can win; after the sort it is the last (max) or first (min) of each run.
    let mut kept: Vec<Expr> = Vec::with_capacity(operands.len() + 1);
    let mut i = 0;
    while i < operands.len() {
        let mut j = i + 1;
        while j < operands.len() && cmp_expr(&operands[j].0, &operands[i].0) == Ordering::Equal {
            j += 1;
        }
        let winner = match kind {
            Extremum::Max => j - 1,
            Extremum::Min => i,
        };
        kept.push(std::mem::replace(&mut operands[winner].2, Expr::Const(0.0)));
        i = j;
    }
    kept.sort_by(cmp_expr);
    match constant {
        // `max(x, -inf)` is `x`; the identity only matters when nothing else is left.
        Some(c) if c == kind.identity() && !kept.is_empty() => {}
        Some(c) => kept.push(Expr::Const(c)),
        None => {}
    }
    match kept.len() {
        0 => Expr::Const(kind.identity()),
        1 => kept.pop().unwrap_or(Expr::Const(kind.identity())),
        _ => kind.wrap(kept),
    }
}

/// Whether a normalised expression takes only integer values whatever its symbols are.
fn is_integer_valued(expr: &Expr) -> bool {
    match expr {
        Expr::Const(c) => c.is_finite() && c.fract() == 0.0,
        Expr::Ceil(_) => true,
        Expr::Sum(items) | Expr::Product(items) | Expr::Max(items) | Expr::Min(items) => {
            items.iter().all(is_integer_valued)
        }
        Expr::Sym(_) | Expr::Div(..) => false,
    }
}

pub(crate) fn make_ceil(arg: Expr) -> Expr {
    match arg {
        Expr::Const(c) => Expr::Const(c.ceil()),
        e if is_integer_valued(&e) => e,
        Expr::Sum(terms) => {
            let (integer, rest): (Vec<Expr>, Vec<Expr>) =
                terms.into_iter().partition(is_integer_valued);
            if integer.is_empty() {
                return Expr::Ceil(Box::new(Expr::Sum(rest)));
            }
            let mut parts = integer;
            parts.push(make_ceil(make_sum(rest)));
            make_sum(parts)
        }
        other => Expr::Ceil(Box::new(other)),
    }
}
