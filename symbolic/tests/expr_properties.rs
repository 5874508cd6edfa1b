//! Property tests of the expression engine against tree evaluation of the original expression.
//!
//! Random trees mix every operation over four symbols bound to random positive inputs.
//! Denominators are drawn from a separate generator of expressions that are positive by
//! construction (no subtraction), so no division is close to a division by zero. Simplification
//! and compilation reorder floating-point operations, so values are compared with a tolerance of
//! 1e-12 relative to the expression's magnitude (its value with every operand made
//! non-negative), which bounds cancellation error. A `ceil` whose argument is within that
//! tolerance of an integer may legitimately round either way; such cases are recognised and not
//! counted as failures.

use std::collections::BTreeMap;

use proptest::prelude::*;
use tessel_symbolic::{BatchScratch, Expr, Program, Symbol};

const NAMES: [&str; 4] = ["a", "b", "c", "d"];
const TOLERANCE: f64 = 1e-12;

fn slots() -> Vec<Symbol> {
    NAMES.iter().map(|n| Symbol::new(n)).collect()
}

fn constant() -> impl Strategy<Value = f64> {
    prop_oneof![(-4i32..=8).prop_map(f64::from), -16.0..16.0f64]
}

fn positive_constant() -> impl Strategy<Value = f64> {
    prop_oneof![(1i32..=8).prop_map(f64::from), 0.25..16.0f64]
}

fn symbol() -> impl Strategy<Value = Expr> {
    prop::sample::select(NAMES.to_vec()).prop_map(Expr::symbol)
}

/// Expressions whose value is positive and computed without cancellation, at most `depth`
/// operations deep.
fn positive(depth: u32) -> BoxedStrategy<Expr> {
    let leaf = prop_oneof![positive_constant().prop_map(Expr::constant), symbol()];
    if depth == 0 {
        return leaf.boxed();
    }
    let inner = positive(depth - 1);
    prop_oneof![
        2 => leaf,
        1 => prop::collection::vec(inner.clone(), 1..4).prop_map(Expr::sum),
        1 => prop::collection::vec(inner.clone(), 1..3).prop_map(Expr::product),
        1 => (inner.clone(), inner.clone()).prop_map(|(a, b)| a / b),
        1 => prop::collection::vec(inner.clone(), 1..4).prop_map(Expr::max),
        1 => prop::collection::vec(inner.clone(), 1..4).prop_map(Expr::min),
        1 => inner.prop_map(Expr::ceil),
    ]
    .boxed()
}

/// Expressions of any sign using every operation, at most `depth` operations deep;
/// denominators are `positive` expressions.
fn general(depth: u32) -> BoxedStrategy<Expr> {
    let leaf = prop_oneof![constant().prop_map(Expr::constant), symbol()];
    if depth == 0 {
        return leaf.boxed();
    }
    let inner = general(depth - 1);
    prop_oneof![
        2 => leaf,
        2 => prop::collection::vec(inner.clone(), 1..5).prop_map(Expr::sum),
        2 => prop::collection::vec(inner.clone(), 1..4).prop_map(Expr::product),
        2 => (inner.clone(), inner.clone()).prop_map(|(a, b)| a - b),
        1 => inner.clone().prop_map(|a| -a),
        2 => (inner.clone(), positive(2)).prop_map(|(a, b)| a / b),
        1 => prop::collection::vec(inner.clone(), 1..4).prop_map(Expr::max),
        1 => prop::collection::vec(inner.clone(), 1..4).prop_map(Expr::min),
        1 => inner.clone().prop_map(Expr::ceil),
        // The same subtree twice, so like terms, cancellation and CSE have work to do.
        1 => inner.prop_map(|a| a.clone() * 2u64 + a * 3u64 - 1u64),
    ]
    .boxed()
}

/// The trees the properties are checked on.
fn expression() -> BoxedStrategy<Expr> {
    general(5)
}

fn inputs() -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(0.5..8.0f64, NAMES.len())
}

fn env(values: &[f64]) -> impl Fn(&Symbol) -> f64 + '_ {
    move |s: &Symbol| {
        let i = NAMES
            .iter()
            .position(|n| *n == s.name())
            .unwrap_or(NAMES.len());
        values[i]
    }
}

fn eval(e: &Expr, values: &[f64]) -> f64 {
    e.eval(&env(values))
}

/// The value with every constant, input and intermediate made non-negative: a bound on the
/// size of the terms whose rounding errors add up to the error of the value.
fn magnitude(e: &Expr, values: &[f64]) -> f64 {
    match e {
        Expr::Const(c) => c.abs(),
        Expr::Sym(_) => eval(e, values).abs(),
        Expr::Sum(items) => items.iter().map(|i| magnitude(i, values)).sum(),
        Expr::Product(items) => items.iter().map(|i| magnitude(i, values)).product(),
        Expr::Div(n, d) => magnitude(n, values) / eval(d, values).abs(),
        Expr::Max(items) | Expr::Min(items) => items
            .iter()
            .map(|i| magnitude(i, values))
            .fold(0.0, f64::max),
        Expr::Ceil(a) => magnitude(a, values) + 1.0,
    }
}

/// Whether some `ceil` in the tree has an argument within rounding distance of an integer.
fn has_fragile_ceil(e: &Expr, values: &[f64]) -> bool {
    match e {
        Expr::Const(_) | Expr::Sym(_) => false,
        Expr::Sum(items) | Expr::Product(items) | Expr::Max(items) | Expr::Min(items) => {
            items.iter().any(|i| has_fragile_ceil(i, values))
        }
        Expr::Div(n, d) => has_fragile_ceil(n, values) || has_fragile_ceil(d, values),
        Expr::Ceil(a) => {
            let v = eval(a, values);
            (v - v.round()).abs() <= 1e-9 * (magnitude(a, values) + 1.0)
                || has_fragile_ceil(a, values)
        }
    }
}

fn close(expected: f64, actual: f64, scale: f64) -> bool {
    (expected - actual).abs() <= TOLERANCE * scale.max(1.0)
}

fn check_close(e: &Expr, values: &[f64], actual: f64, what: &str) -> Result<(), TestCaseError> {
    let expected = eval(e, values);
    if close(expected, actual, magnitude(e, values)) || has_fragile_ceil(e, values) {
        return Ok(());
    }
    Err(TestCaseError::fail(format!(
        "{what}: expected {expected}, got {actual} for {e} at {values:?}"
    )))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn compiled_program_matches_tree_evaluation(
        exprs in prop::collection::vec(expression(), 1..4),
        values in inputs(),
    ) {
        let program = Program::compile(&exprs, &slots()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut outputs = vec![0.0; exprs.len()];
        let mut scratch = Vec::new();
        program.eval_into(&values, &mut scratch, &mut outputs);
        for (e, &actual) in exprs.iter().zip(&outputs) {
            check_close(e, &values, actual, "compiled")?;
        }
        // A reused scratch buffer with stale contents gives the same result.
        let mut again = vec![0.0; exprs.len()];
        program.eval_into(&values, &mut scratch, &mut again);
        prop_assert_eq!(outputs, again);
    }

    #[test]
    fn batch_evaluation_equals_one_at_a_time(
        exprs in prop::collection::vec(expression(), 1..4),
        candidates in prop::collection::vec(inputs(), 0..20),
    ) {
        let program = Program::compile(&exprs, &slots()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let n = exprs.len();
        let flat: Vec<f64> = candidates.iter().flatten().copied().collect();
        let mut batch = vec![0.0; candidates.len() * n];
        let mut scratch = BatchScratch::new();
        program.eval_batch(&flat, &mut scratch, &mut batch);
        let mut single = vec![0.0; n];
        let mut registers = Vec::new();
        for (i, candidate) in candidates.iter().enumerate() {
            program.eval_into(candidate, &mut registers, &mut single);
            for (b, s) in batch[i * n..(i + 1) * n].iter().zip(&single) {
                prop_assert_eq!(b.to_bits(), s.to_bits(), "candidate {}", i);
            }
        }
    }

    #[test]
    fn simplify_preserves_value(e in expression(), values in inputs()) {
        check_close(&e, &values, eval(&e.simplify(), &values), "simplified")?;
    }

    #[test]
    fn simplify_is_idempotent(e in expression()) {
        let once = e.simplify();
        let twice = once.simplify();
        prop_assert_eq!(format!("{once:?}"), format!("{twice:?}"), "for {}", e);
    }

    #[test]
    fn substitute_then_eval_equals_eval_with_bound_value(
        e in expression(),
        value in positive(3),
        values in inputs(),
    ) {
        let a = Symbol::new("a");
        let substituted = e.substitute(&a, &value);
        prop_assert!(!substituted.symbols().contains(&a) || value.symbols().contains(&a));
        let mut bound = values.clone();
        bound[0] = eval(&value, &values);
        let expected = eval(&e, &bound);
        let actual = eval(&substituted, &values);
        prop_assert!(expected == actual || (expected.is_nan() && actual.is_nan()),
            "{} vs {}", expected, actual);
    }

    #[test]
    fn substitute_all_binds_simultaneously(
        e in expression(),
        for_a in positive(3),
        for_b in positive(3),
        values in inputs(),
    ) {
        let mut bindings = BTreeMap::new();
        bindings.insert(Symbol::new("a"), for_a.clone());
        bindings.insert(Symbol::new("b"), for_b.clone());
        let mut bound = values.clone();
        bound[0] = eval(&for_a, &values);
        bound[1] = eval(&for_b, &values);
        let expected = eval(&e, &bound);
        let actual = eval(&e.substitute_all(&bindings), &values);
        prop_assert!(expected == actual || (expected.is_nan() && actual.is_nan()),
            "{} vs {}", expected, actual);
    }

    #[test]
    fn duplicated_outputs_share_all_instructions(e in expression(), f in expression()) {
        let single = Program::compile(std::slice::from_ref(&e), &slots()).map_err(|x| TestCaseError::fail(x.to_string()))?;
        let doubled = Program::compile(&[e.clone(), e.clone()], &slots()).map_err(|x| TestCaseError::fail(x.to_string()))?;
        prop_assert_eq!(single.num_instructions(), doubled.num_instructions());
        let pair = Program::compile(&[e.clone(), f.clone()], &slots()).map_err(|x| TestCaseError::fail(x.to_string()))?;
        let triple = Program::compile(&[e.clone(), f, e], &slots()).map_err(|x| TestCaseError::fail(x.to_string()))?;
        prop_assert_eq!(pair.num_instructions(), triple.num_instructions());
    }

    #[test]
    fn symbols_lists_exactly_the_symbols_used(e in expression()) {
        let listed: Vec<String> = e.symbols().iter().map(|s| s.name().to_string()).collect();
        let printed = format!("{e:?}");
        for name in NAMES {
            let used = printed.contains(&format!("Symbol(\"{name}\")"));
            prop_assert_eq!(used, listed.iter().any(|l| l == name), "{}", name);
        }
    }
}
