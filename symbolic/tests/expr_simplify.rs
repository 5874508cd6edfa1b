//! Specific simplifications, checked through their exact printed form.

use std::collections::BTreeMap;

use tessel_symbolic::{Expr, Symbol};

fn s(name: &str) -> Expr {
    Expr::symbol(name)
}

fn c(value: f64) -> Expr {
    Expr::constant(value)
}

fn simplified(e: Expr) -> String {
    e.simplify().to_string()
}

#[test]
fn constants_fold() {
    assert_eq!(simplified(c(2.0) + 3u64), "5");
    assert_eq!(simplified(c(2.0) * 3u64 - 1u64), "5");
    assert_eq!(simplified(c(7.0) / 2u64), "3.5");
    assert_eq!(simplified((c(7.0) / 2u64).ceil()), "4");
    assert_eq!(simplified(Expr::max([c(1.0), c(4.0), c(2.0)])), "4");
    assert_eq!(simplified(Expr::min([c(1.0), c(4.0), c(2.0)])), "1");
}

#[test]
fn identities_drop() {
    assert_eq!(simplified(s("x") + 0u64), "x");
    assert_eq!(simplified(s("x") * 1u64), "x");
    assert_eq!(simplified(Expr::product([s("x"), c(0.0)])), "0");
    assert_eq!(simplified(s("x") / 1u64), "x");
    assert_eq!(simplified(c(0.0) / s("x")), "0");
    assert_eq!(simplified(s("x") - s("x")), "0");
    assert_eq!(simplified(Expr::sum([])), "0");
    assert_eq!(simplified(Expr::product([])), "1");
}

#[test]
fn nested_sums_and_products_flatten_and_sort() {
    assert_eq!(
        simplified(s("z") + (s("y") + (s("x") + 1u64))),
        "x + y + z + 1"
    );
    assert_eq!(simplified(s("z") * (s("y") * (s("x") * 2u64))), "2*x*y*z");
    assert_eq!(
        simplified(s("a") * s("b") + s("b") * s("a")),
        simplified(c(2.0) * s("b") * s("a"))
    );
}

#[test]
fn like_terms_merge() {
    assert_eq!(simplified(c(2.0) * s("x") + c(3.0) * s("x")), "5*x");
    assert_eq!(
        simplified(c(2.0) * s("t") * s("b") + s("x") - s("b") * s("t")),
        "x + b*t"
    );
    assert_eq!(simplified(s("x") + s("x") + s("y") - 4u64), "2*x + y - 4");
    assert_eq!(simplified(-s("x") + 1u64), "-x + 1");
}

#[test]
fn constant_coefficients_distribute_over_sums() {
    assert_eq!(simplified(c(2.0) * (s("x") + 1u64)), "2*x + 2");
    assert_eq!(simplified(s("a") - (s("b") + s("c"))), "a - b - c");
    assert_eq!(
        simplified(c(3.0) * (s("x") + s("y")) - c(3.0) * s("y")),
        "3*x"
    );
}

#[test]
fn quotients_combine_and_cancel() {
    assert_eq!(simplified(s("x") / c(4.0)), "x/4");
    assert_eq!(simplified(s("x") / c(4.0) + s("x") / c(4.0)), "x/2");
    assert_eq!(simplified(s("a") * s("b") / (s("b") * s("c"))), "a/c");
    assert_eq!(simplified(s("a") / s("b") / s("c")), "a/(b*c)");
    assert_eq!(simplified(s("a") / (s("b") / s("c"))), "a*c/b");
    assert_eq!(simplified(s("x") * (s("a") / s("b"))), "a*x/b");
    assert_eq!(simplified(c(6.0) * s("x") / (c(3.0) * s("y"))), "2*x/y");
    assert_eq!(simplified(s("x") * s("t") / s("t")), "x");
    assert_eq!(simplified((s("a") + s("b")) / s("p")), "(a + b)/p");
    assert_eq!(simplified(s("a") / (s("p") + 1u64)), "a/(p + 1)");
}

#[test]
fn max_min_flatten_and_prune() {
    assert_eq!(
        simplified(Expr::max([s("b"), Expr::max([s("a"), c(1.0)]), c(3.0)])),
        "max(a, b, 3)"
    );
    assert_eq!(
        simplified(Expr::max([s("x") + 1u64, s("x") + 3u64, s("y")])),
        "max(y, x + 3)"
    );
    assert_eq!(
        simplified(Expr::min([s("x") + 1u64, s("x") + 3u64, s("x")])),
        "x"
    );
    assert_eq!(simplified(Expr::max([s("a"), s("a")])), "a");
    assert_eq!(
        simplified(Expr::min([s("a"), Expr::min([s("b"), s("a")])])),
        "min(a, b)"
    );
    assert_eq!(simplified(Expr::max([s("a")])), "a");
}

#[test]
fn ceil_keeps_what_is_provably_integer_out() {
    assert_eq!(simplified((s("m") / s("v")).ceil().ceil()), "ceil(m/v)");
    assert_eq!(simplified((s("m") / s("v") + 3u64).ceil()), "ceil(m/v) + 3");
    assert_eq!(simplified((s("x") + 0.5).ceil()), "ceil(x + 0.5)");
    assert_eq!(
        simplified((s("x").ceil() * 2u64 + s("y")).ceil()),
        "2*ceil(x) + ceil(y)"
    );
    assert_eq!(
        simplified(Expr::max([s("a").ceil(), c(2.0)]).ceil()),
        "max(ceil(a), 2)"
    );
}

#[test]
fn display_of_readable_cost_terms() {
    let e = c(2.0) * s("t") * s("b") + Expr::max([s("a"), s("b")]) / s("p");
    assert_eq!(simplified(e), "2*b*t + max(a, b)/p");
    assert_eq!(simplified(c(1.5e20) * s("x")), "1.5e20*x");
    assert_eq!(simplified(c(-0.5) * s("x") + s("y")), "-x/2 + y");
    assert_eq!(simplified(c(1.0) / s("x")), "1/x");
    assert_eq!(simplified(c(-2.0) / s("x")), "-2/x");
}

#[test]
fn display_of_unsimplified_trees_keeps_meaning() {
    assert_eq!((s("a") - (s("b") + s("c"))).to_string(), "a - (b + c)");
    assert_eq!((s("a") * (s("b") + s("c"))).to_string(), "a*(b + c)");
    assert_eq!((s("a") / (s("b") * s("c"))).to_string(), "a/(b*c)");
    assert_eq!((s("x") * c(-2.0)).to_string(), "x*(-2)");
}

#[test]
fn substitute_and_symbols() {
    let e = s("t") * s("b") + s("p") / s("t");
    let bound = e.substitute(&Symbol::new("t"), &c(2.0)).simplify();
    assert_eq!(bound.to_string(), "2*b + p/2");
    let names: Vec<String> = e.symbols().iter().map(|x| x.name().to_string()).collect();
    assert_eq!(names, ["b", "p", "t"]);

    let mut bindings = BTreeMap::new();
    bindings.insert(Symbol::new("b"), s("t"));
    bindings.insert(Symbol::new("t"), c(4.0));
    // Values are not substituted into: `b` becomes the symbol `t`, which then stays.
    let all = e.substitute_all(&bindings).simplify();
    assert_eq!(all.to_string(), "p/4 + 4*t");
    assert_eq!(all.as_constant(), None);

    bindings.insert(Symbol::new("p"), c(8.0));
    bindings.insert(Symbol::new("b"), c(3.0));
    let number = e.substitute_all(&bindings).simplify();
    assert_eq!(number.as_constant(), Some(14.0));
}

#[test]
fn operator_chains_build_flat_sums_and_products() {
    let e = s("a") + s("b") - s("c") + 1u64;
    match &e {
        Expr::Sum(terms) => assert_eq!(terms.len(), 4),
        other => panic!("expected a flat sum, got {other:?}"),
    }
    match &(s("a") * s("b") * 2u64) {
        Expr::Product(factors) => assert_eq!(factors.len(), 3),
        other => panic!("expected a flat product, got {other:?}"),
    }
    // A long chain is one level deep, so simplification and evaluation do not recurse deeply.
    let long = (0..100_000u64).fold(Expr::constant(0.0), |acc, i| acc + s("x") * i);
    assert_eq!(simplified(long), "4999950000*x");
}

#[test]
fn numbers_print_in_a_fixed_format() {
    let cases: [(f64, &str); 12] = [
        (3.0, "3"),
        (-3.0, "-3"),
        (0.0, "0"),
        (0.1, "0.1"),
        (2.5e-3, "0.0025"),
        (1e-7, "1e-7"),
        (123_456_789_012_345.0, "123456789012345"),
        (1e15, "1e15"),
        (6.02e23, "6.02e23"),
        (f64::INFINITY, "inf"),
        (f64::NEG_INFINITY, "-inf"),
        (f64::NAN, "NaN"),
    ];
    for (value, text) in cases {
        assert_eq!(c(value).to_string(), text, "{value:e}");
    }
    assert_eq!(simplified(s("x") - 1e-7), "x - 1e-7");
    assert_eq!(simplified(s("x") / 3u64), "x/3");
    assert_eq!(simplified(s("x") * (2.0 / 3.0)), "0.6666666666666666*x");
}
