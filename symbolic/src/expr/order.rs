//! A total structural order on expressions. Simplification sorts the operands of commutative
//! nodes by it, so two expressions that are equal up to operand order end up identical.

use std::cmp::Ordering;

use super::Expr;

/// Rank of each variant: symbols first so that products read `2*b*t`, constants last so that
/// sums read `x + 3` (simplification places a product's coefficient first explicitly).
fn rank(expr: &Expr) -> u8 {
    match expr {
        Expr::Sym(_) => 0,
        Expr::Product(_) => 1,
        Expr::Div(..) => 2,
        Expr::Ceil(_) => 3,
        Expr::Max(_) => 4,
        Expr::Min(_) => 5,
        Expr::Sum(_) => 6,
        Expr::Const(_) => 7,
    }
}

/// Compares two expressions structurally. Constants compare with `f64::total_cmp`, so the order
/// is total (NaN included) and `Equal` means the trees are identical.
pub(crate) fn cmp_expr(a: &Expr, b: &Expr) -> Ordering {
    match (a, b) {
        (Expr::Const(x), Expr::Const(y)) => x.total_cmp(y),
        (Expr::Sym(x), Expr::Sym(y)) => x.cmp(y),
        (Expr::Sum(x), Expr::Sum(y))
        | (Expr::Product(x), Expr::Product(y))
        | (Expr::Max(x), Expr::Max(y))
        | (Expr::Min(x), Expr::Min(y)) => cmp_slices(x, y),
        (Expr::Div(an, ad), Expr::Div(bn, bd)) => cmp_expr(an, bn).then_with(|| cmp_expr(ad, bd)),
        (Expr::Ceil(x), Expr::Ceil(y)) => cmp_expr(x, y),
        _ => rank(a).cmp(&rank(b)),
    }
}

/// Lexicographic comparison of operand lists.
pub(crate) fn cmp_slices(a: &[Expr], b: &[Expr]) -> Ordering {
    for (x, y) in a.iter().zip(b) {
        let ord = cmp_expr(x, y);
        if ord != Ordering::Equal {
            return ord;
        }
    }
    a.len().cmp(&b.len())
}
