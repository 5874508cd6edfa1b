//! Human-readable form: `2*b*t + max(a, b)/p`, `x - 3`, `x/4`, `ceil(m/v)`.
//!
//! Parentheses appear only where the usual precedence needs them; subtraction and negative
//! coefficients print as `- term`; a coefficient that is the reciprocal of an integer prints as
//! a division (`0.25*x` as `x/4`). Numbers use a fixed format so the output is deterministic.

use std::fmt;

use super::Expr;

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_expr(f, self)
    }
}

/// Formats a number: integers without a fraction, ordinary magnitudes in the shortest form that
/// reads back exactly, very large or small ones in scientific notation.
pub(crate) fn format_number(value: f64) -> String {
    if value.is_nan() {
        "NaN".to_string()
    } else if value.is_infinite() {
        if value > 0.0 { "inf" } else { "-inf" }.to_string()
    } else if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else if value.abs() >= 1e-4 && value.abs() < 1e15 {
        format!("{value}")
    } else {
        format!("{value:e}")
    }
}

/// The integer `k` when `value` is exactly `1/k` for an integer `|k| >= 2`.
fn reciprocal_integer(value: f64) -> Option<f64> {
    let k = 1.0 / value;
    (k.is_finite() && k.fract() == 0.0 && k.abs() >= 2.0 && k.abs() < 1e15 && 1.0 / k == value)
        .then_some(k)
}

fn write_expr(f: &mut fmt::Formatter<'_>, expr: &Expr) -> fmt::Result {
    match expr {
        Expr::Const(c) => f.write_str(&format_number(*c)),
        Expr::Sym(s) => f.write_str(s.name()),
        Expr::Sum(items) => write_sum(f, items),
        Expr::Product(items) => write_product(f, items, false),
        Expr::Div(num, den) => {
            write_numerator(f, num)?;
            f.write_str("/")?;
            write_denominator(f, den)
        }
        Expr::Max(items) => write_call(f, "max", items),
        Expr::Min(items) => write_call(f, "min", items),
        Expr::Ceil(arg) => {
            f.write_str("ceil(")?;
            write_expr(f, arg)?;
            f.write_str(")")
        }
    }
}

fn write_call(f: &mut fmt::Formatter<'_>, name: &str, items: &[Expr]) -> fmt::Result {
    f.write_str(name)?;
    f.write_str("(")?;
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write_expr(f, item)?;
    }
    f.write_str(")")
}

fn parenthesized(f: &mut fmt::Formatter<'_>, expr: &Expr) -> fmt::Result {
    f.write_str("(")?;
    write_expr(f, expr)?;
    f.write_str(")")
}

/// Whether the expression prints with a leading minus sign.
fn is_negative(expr: &Expr) -> bool {
    match expr {
        Expr::Const(c) => c.is_sign_negative() && *c != 0.0,
        Expr::Product(items) => items.len() >= 2 && is_negative(&items[0]),
        _ => false,
    }
}

fn write_sum(f: &mut fmt::Formatter<'_>, items: &[Expr]) -> fmt::Result {
    if items.is_empty() {
        return f.write_str("0");
    }
    for (i, item) in items.iter().enumerate() {
        let negative = is_negative(item);
        match (i, negative) {
            (0, true) => f.write_str("-")?,
            (0, false) => {}
            (_, true) => f.write_str(" - ")?,
            (_, false) => f.write_str(" + ")?,
        }
        match item {
            Expr::Const(c) if negative => f.write_str(&format_number(-c))?,
            Expr::Product(factors) if negative => write_product(f, factors, true)?,
            Expr::Sum(_) => parenthesized(f, item)?,
            other => write_expr(f, other)?,
        }
    }
    Ok(())
}

/// Writes a product; with `negated`, the sign of its leading coefficient is flipped (the caller
/// already wrote the minus).
fn write_product(f: &mut fmt::Formatter<'_>, items: &[Expr], negated: bool) -> fmt::Result {
    let (coefficient, rest) = match items.split_first() {
        Some((Expr::Const(c), rest)) if !rest.is_empty() => (*c, rest),
        _ if items.is_empty() => return f.write_str("1"),
        _ => (1.0, items),
    };
    let coefficient = if negated { -coefficient } else { coefficient };
    let divisor = reciprocal_integer(coefficient.abs());
    let mut wrote_factor = false;
    if coefficient == -1.0 || (coefficient < 0.0 && divisor.is_some()) {
        f.write_str("-")?;
    } else if coefficient != 1.0 && divisor.is_none() {
        if coefficient < 0.0 {
            f.write_str("-")?;
        }
        f.write_str(&format_number(coefficient.abs()))?;
        wrote_factor = true;
    }
    for factor in rest {
        match factor {
            // `2*(1/x)` reads as `2/x`.
            Expr::Div(num, den) if wrote_factor && matches!(**num, Expr::Const(n) if n == 1.0) => {
                f.write_str("/")?;
                write_denominator(f, den)?;
            }
            _ => {
                if wrote_factor {
                    f.write_str("*")?;
                }
                write_factor(f, factor)?;
            }
        }
        wrote_factor = true;
    }
    if let Some(k) = divisor {
        f.write_str("/")?;
        f.write_str(&format_number(k))?;
    }
    Ok(())
}

fn write_factor(f: &mut fmt::Formatter<'_>, expr: &Expr) -> fmt::Result {
    match expr {
        Expr::Sum(_) | Expr::Product(_) => parenthesized(f, expr),
        e if is_negative(e) => parenthesized(f, e),
        e => write_expr(f, e),
    }
}

fn write_numerator(f: &mut fmt::Formatter<'_>, expr: &Expr) -> fmt::Result {
    match expr {
        Expr::Sum(_) => parenthesized(f, expr),
        e if is_negative(e) => parenthesized(f, e),
        e => write_expr(f, e),
    }
}

fn write_denominator(f: &mut fmt::Formatter<'_>, expr: &Expr) -> fmt::Result {
    match expr {
        Expr::Sym(_) | Expr::Ceil(_) | Expr::Max(_) | Expr::Min(_) => write_expr(f, expr),
        Expr::Const(c) if !is_negative(expr) && c.is_finite() => write_expr(f, expr),
        _ => parenthesized(f, expr),
    }
}
