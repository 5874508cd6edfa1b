//! Evaluation of expressions to values: arithmetic with units, names bound by `let` and by
//! earlier fields, lists, ranges and records.

use crate::ast::{BinaryOp, Expr, ExprKind, Name};
use crate::diagnostic::Problem;
use crate::source::Span;
use crate::suggest;
use crate::units::{self, Dim};

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A number (`Dim::NUMBER`) or a quantity, in base units.
    Quantity {
        value: f64,
        dim: Dim,
    },
    Bool(bool),
    Str(String),
    /// A bare name left unresolved: an enum value or a reference to a block.
    Ident(String),
    List(Vec<Spanned>),
    Range {
        low: f64,
        high: f64,
    },
    Record(Vec<RecordField>),
    /// A value whose evaluation failed and was reported; uses of it stay silent.
    Invalid,
}

impl Value {
    pub fn number(value: f64) -> Value {
        Value::Quantity {
            value,
            dim: Dim::NUMBER,
        }
    }

    /// What kind of value this is, for "expected X, found Y" messages.
    pub fn describe(&self) -> String {
        match self {
            Value::Quantity { dim, .. } => dim.describe(),
            Value::Bool(b) => format!("`{b}`"),
            Value::Str(_) => "a string".into(),
            Value::Ident(name) => format!("`{name}`"),
            Value::List(_) => "a list".into(),
            Value::Range { .. } => "a range".into(),
            Value::Record(_) => "a record".into(),
            Value::Invalid => "an invalid value".into(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Spanned {
    pub value: Value,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RecordField {
    pub key: Name,
    pub value: Spanned,
}

/// Names visible to an expression, innermost last.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    bindings: Vec<(String, Value)>,
}

impl Scope {
    pub fn bind(&mut self, name: &str, value: Value) {
        self.bindings.push((name.to_string(), value));
    }

    pub fn get(&self, name: &str) -> Option<&Value> {
        self.bindings
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }

    fn names(&self) -> impl Iterator<Item = &str> {
        self.bindings.iter().map(|(n, _)| n.as_str())
    }
}

/// Evaluates `expr`; on failure the reasons are in `problems`.
pub fn eval(expr: &Expr, scope: &Scope, problems: &mut Vec<Problem>) -> Option<Spanned> {
    let span = expr.span;
    let value = match &expr.kind {
        ExprKind::Number(n) => finite(*n, span, problems).map(Value::number)?,
        ExprKind::Percent(p) => finite(*p, span, problems).map(Value::number)?,
        ExprKind::Quantity { value, unit } => {
            match units::lookup(&unit.text) {
                Ok((dim, multiplier, divisor)) => Value::Quantity {
                    value: finite(value * multiplier / divisor, span, problems)?,
                    dim,
                },
                Err(suggestion) => {
                    let help = suggestion.map(|s| format!("did you mean `{s}`?")).unwrap_or_else(|| {
                    "units are B KB MB GB TB KiB MiB GiB TiB, MB/s GB/s TB/s Gb/s Gbps Tb/s, \
                     GFLOPS TFLOPS PFLOPS, ns us ms s min h"
                        .to_string()
                });
                    problems.push(
                        Problem::new(unit.span, format!("unknown unit `{}`", unit.text))
                            .with_help(help),
                    );
                    return None;
                }
            }
        }
        ExprKind::Bool(b) => Value::Bool(*b),
        ExprKind::String(s) => Value::Str(s.clone()),
        ExprKind::Ident(name) => scope
            .get(name)
            .cloned()
            .unwrap_or_else(|| Value::Ident(name.clone())),
        ExprKind::List(elements) => {
            let mut values = Vec::new();
            let mut ok = true;
            for e in elements {
                match eval(e, scope, problems) {
                    Some(v) => values.push(v),
                    None => ok = false,
                }
            }
            if !ok {
                return None;
            }
            Value::List(values)
        }
        ExprKind::Record(fields) => {
            let mut values: Vec<RecordField> = Vec::new();
            let mut ok = true;
            for f in fields {
                if values.iter().any(|v| v.key.text == f.key.text) {
                    problems.push(
                        Problem::new(
                            f.key.span,
                            format!("`{}` is set twice in this record", f.key.text),
                        )
                        .with_help("remove one of the two"),
                    );
                    ok = false;
                    continue;
                }
                match eval(&f.value, scope, problems) {
                    Some(v) => values.push(RecordField {
                        key: f.key.clone(),
                        value: v,
                    }),
                    None => ok = false,
                }
            }
            if !ok {
                return None;
            }
            Value::Record(values)
        }
        ExprKind::Range(low, high) => {
            let low_value = arithmetic_operand(scope, eval(low, scope, problems)?, problems)?;
            let high_value = arithmetic_operand(scope, eval(high, scope, problems)?, problems)?;
            for (v, e) in [(low_value, low), (high_value, high)] {
                if v.1 != Dim::NUMBER {
                    problems.push(Problem::new(
                        e.span,
                        format!(
                            "a range needs numbers at both ends, found {}",
                            v.1.describe()
                        ),
                    ));
                    return None;
                }
            }
            if low_value.0 > high_value.0 {
                problems.push(
                    Problem::new(span, "this range is empty: its start is above its end")
                        .with_help(format!(
                            "ranges include both ends and count up, like `{}..={}`",
                            format_number(high_value.0),
                            format_number(low_value.0)
                        )),
                );
                return None;
            }
            Value::Range {
                low: low_value.0,
                high: high_value.0,
            }
        }
        ExprKind::Neg(inner) => {
            let (value, dim) = arithmetic_operand(scope, eval(inner, scope, problems)?, problems)?;
            Value::Quantity { value: -value, dim }
        }
        ExprKind::Chain { first, rest } => {
            if let Some(name) = dashed_name(first, rest, scope) {
                return Some(Spanned {
                    value: Value::Ident(name),
                    span,
                });
            }
            let (mut value, mut dim) =
                arithmetic_operand(scope, eval(first, scope, problems)?, problems)?;
            for (op, operand) in rest {
                let (rhs, rhs_dim) =
                    arithmetic_operand(scope, eval(operand, scope, problems)?, problems)?;
                match op {
                    BinaryOp::Add | BinaryOp::Sub => {
                        if dim != rhs_dim {
                            let verb = if *op == BinaryOp::Add {
                                "add"
                            } else {
                                "subtract"
                            };
                            problems.push(Problem::new(
                                span,
                                format!(
                                    "cannot {verb} {} and {}",
                                    dim.describe(),
                                    rhs_dim.describe()
                                ),
                            ));
                            return None;
                        }
                        value = if *op == BinaryOp::Add {
                            value + rhs
                        } else {
                            value - rhs
                        };
                    }
                    BinaryOp::Mul => {
                        value *= rhs;
                        dim = dim.times(rhs_dim);
                    }
                    BinaryOp::Div => {
                        if rhs == 0.0 {
                            problems.push(Problem::new(operand.span, "division by zero"));
                            return None;
                        }
                        value /= rhs;
                        dim = dim.divided_by(rhs_dim);
                    }
                }
                value = finite(value, span, problems)?;
            }
            Value::Quantity { value, dim }
        }
    };
    Some(Spanned { value, span })
}

/// `H100-SXM` or `A100-80GB` written without spaces parses as a subtraction of unknown names;
/// it is read as one name so that the error can say "unknown GPU `H100-SXM`; did you mean
/// `H100_SXM`?" instead of complaining about arithmetic.
fn dashed_name(first: &Expr, rest: &[(BinaryOp, Expr)], scope: &Scope) -> Option<String> {
    let part = |e: &Expr| match &e.kind {
        ExprKind::Ident(name) if scope.get(name).is_none() => Some(name.clone()),
        ExprKind::Number(n) => Some(format_number(*n)),
        ExprKind::Quantity { value, unit } => {
            Some(format!("{}{}", format_number(*value), unit.text))
        }
        _ => None,
    };
    let ExprKind::Ident(_) = first.kind else {
        return None;
    };
    let mut name = part(first)?;
    let mut end = first.span.end;
    for (op, e) in rest {
        if *op != BinaryOp::Sub || e.span.start != end + 1 {
            return None;
        }
        name.push('-');
        name.push_str(&part(e)?);
        end = e.span.end;
    }
    Some(name)
}

/// The number and dimension of an arithmetic operand, or why it cannot be one.
fn arithmetic_operand(
    scope: &Scope,
    v: Spanned,
    problems: &mut Vec<Problem>,
) -> Option<(f64, Dim)> {
    match v.value {
        Value::Quantity { value, dim } => Some((value, dim)),
        Value::Invalid => None,
        // A unit standing alone is one of it, so that `6/s` is a rate and `2 * GB` a size.
        Value::Ident(name) if crate::units::lookup(&name).is_ok() => {
            let (dim, multiplier, divisor) = crate::units::lookup(&name).ok()?;
            Some((multiplier / divisor, dim))
        }
        Value::Ident(name) => {
            problems.push(
                Problem::new(v.span, format!("unknown name `{name}` in arithmetic")).with_help(
                    suggest::did_you_mean(&name, scope.names()).unwrap_or_else(|| {
                        "arithmetic can use numbers, quantities, `let` names and fields set \
                         earlier in the same block"
                            .to_string()
                    }),
                ),
            );
            None
        }
        other => {
            problems.push(Problem::new(
                v.span,
                format!(
                    "arithmetic needs numbers or quantities, found {}",
                    other.describe()
                ),
            ));
            None
        }
    }
}

fn finite(value: f64, span: Span, problems: &mut Vec<Problem>) -> Option<f64> {
    if value.is_finite() {
        Some(value)
    } else {
        problems.push(Problem::new(span, "number too large"));
        None
    }
}

/// A number as written in messages: integers without a fraction, others as short as exact.
pub fn format_number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else if n.abs() >= 1e15 {
        format!("{n:e}")
    } else {
        let text = format!("{n:.6}");
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ast::Item;
    use crate::parser::parse_file;

    /// Evaluates the last top-level `let` of `text`, binding the earlier ones.
    fn eval_lets(text: &str) -> Result<Value, Vec<String>> {
        let (items, mut problems) = parse_file(0, text);
        assert!(problems.is_empty(), "{problems:?}");
        let mut scope = Scope::default();
        let mut last = None;
        for item in items {
            if let Item::Let(l) = item {
                if let Some(v) = eval(&l.value, &scope, &mut problems) {
                    scope.bind(&l.name.text, v.value.clone());
                    last = Some(v.value);
                }
            }
        }
        if problems.is_empty() {
            Ok(last.unwrap())
        } else {
            Err(problems.into_iter().map(|p| p.message).collect())
        }
    }

    fn quantity(value: f64, dim: Dim) -> Value {
        Value::Quantity { value, dim }
    }

    #[test]
    fn arithmetic_precedence_and_parentheses() {
        assert_eq!(eval_lets("let x = 2 + 3 * 4"), Ok(Value::number(14.0)));
        assert_eq!(eval_lets("let x = (2 + 3) * 4"), Ok(Value::number(20.0)));
        assert_eq!(eval_lets("let x = 10 - 4 - 3"), Ok(Value::number(3.0)));
        assert_eq!(eval_lets("let x = 64 / 4 / 2"), Ok(Value::number(8.0)));
        assert_eq!(eval_lets("let x = --3"), Ok(Value::number(3.0)));
        assert_eq!(eval_lets("let x = -(1 + 2)"), Ok(Value::number(-3.0)));
    }

    #[test]
    fn names_defined_earlier() {
        assert_eq!(
            eval_lets("let hidden = 8192\nlet ffn = 4 * hidden\nlet y = ffn / 2"),
            Ok(Value::number(16384.0))
        );
        assert_eq!(
            eval_lets("let x = 2 * hiden"),
            Err(vec!["unknown name `hiden` in arithmetic".into()])
        );
    }

    #[test]
    fn unit_algebra() {
        assert_eq!(
            eval_lets("let x = 8 * 80 GiB"),
            Ok(quantity(640.0 * 1073741824.0, Dim::SIZE))
        );
        assert_eq!(
            eval_lets("let x = 1 GB + 500 MB"),
            Ok(quantity(1.5e9, Dim::SIZE))
        );
        assert_eq!(
            eval_lets("let x = 100 GB / 4 s"),
            Ok(quantity(25e9, Dim::BANDWIDTH))
        );
        assert_eq!(eval_lets("let x = 80 GB / 40 GB"), Ok(Value::number(2.0)));
        assert_eq!(
            eval_lets("let x = 1 GB + 1 GB/s"),
            Err(vec!["cannot add a size and a bandwidth".into()])
        );
        assert_eq!(
            eval_lets("let x = 1 / 0"),
            Err(vec!["division by zero".into()])
        );
    }

    #[test]
    fn percent_ranges_lists_records() {
        assert_eq!(eval_lets("let x = 95%"), Ok(Value::number(0.95)));
        assert_eq!(
            eval_lets("let n = 8\nlet x = 1..=n"),
            Ok(Value::Range {
                low: 1.0,
                high: 8.0
            })
        );
        assert_eq!(
            eval_lets("let x = 8..=1"),
            Err(vec![
                "this range is empty: its start is above its end".into()
            ])
        );
        match eval_lets("let x = [1, 2 * 2, auto]").unwrap() {
            Value::List(v) => {
                assert_eq!(v[1].value, Value::number(4.0));
                assert_eq!(v[2].value, Value::Ident("auto".into()));
            }
            other => panic!("{other:?}"),
        }
        match eval_lets("let x = { a = 1, b = 2 GB }").unwrap() {
            Value::Record(fields) => assert_eq!(fields[1].value.value, quantity(2e9, Dim::SIZE)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn dashed_names_stay_names() {
        assert_eq!(
            eval_lets("let x = H100-SXM"),
            Ok(Value::Ident("H100-SXM".into()))
        );
        assert_eq!(
            eval_lets("let x = A100-80GB"),
            Ok(Value::Ident("A100-80GB".into()))
        );
        // With spaces, or with a known name, it is arithmetic.
        assert_eq!(
            eval_lets("let x = a - b"),
            Err(vec!["unknown name `a` in arithmetic".into()])
        );
        assert_eq!(eval_lets("let n = 8\nlet x = n-2"), Ok(Value::number(6.0)));
    }

    #[test]
    fn unknown_unit_is_reported() {
        assert_eq!(
            eval_lets("let x = 80 Gib"),
            Err(vec!["unknown unit `Gib`".into()])
        );
    }
}
