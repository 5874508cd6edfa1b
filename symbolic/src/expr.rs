//! A small symbolic expression type: symbols, constants, n-ary sum and product, division,
//! max/min and ceil. The cost model is written once as `Expr` over the strategy symbols and
//! evaluated many times by the planner.
//!
//! # Design
//!
//! `Expr` is a plain tree, in the spirit of an in-house symbolic dimension type rather than a
//! computer-algebra system: it knows exactly the operations a training-step cost model needs
//! and nothing else. Work is split in three layers:
//!
//! - **Building** (`expr.rs`): constructors and operator overloading build trees without any
//!   rewriting, except that `+`, `-` and `*` append to a sum or product on their left instead of
//!   nesting, so long chains like `a + b + c + ...` stay one level deep.
//! - **Simplification** ([`Expr::simplify`], `expr/simplify.rs`): a single bottom-up pass of
//!   smart constructors that each take normalised children and return a normalised node:
//!   flattening, constant folding, merging of like terms (`2*x + 3*x → 5*x`), cancellation of
//!   common factors in quotients, distribution of constant coefficients over sums, pruning of
//!   max/min operands that differ only by a constant, and pulling integer terms out of `ceil`.
//!   Operands are sorted by a total structural order (`expr/order.rs`), so expressions that
//!   differ only in operand order, grouping or constant arithmetic simplify to identical trees,
//!   and the pass is idempotent. There is no general expansion (`x*(y + z)` stays a product),
//!   which keeps results small. The rewrites are exact over the reals and assume every
//!   subexpression is finite (no division by zero), which holds for the positive strategy
//!   symbols of a cost model; in floating point they change results only by rounding.
//! - **Compilation** ([`Program`], `expr/dag.rs`, `expr/program.rs`): the simplified outputs
//!   are hash-consed into one DAG shared by all outputs (common-subexpression elimination,
//!   constants compared by their bits), folded once more, and lowered to register
//!   instructions over a single `f64` array, scheduled into runs of one operation. Evaluating a
//!   candidate strategy is then one dispatch per run and a loop over plain records, with no
//!   allocation and no tree walking, which is the planner's hot path. [`Program::eval_batch`]
//!   (`expr/batch.rs`) runs the same instructions over several candidates side by side for a
//!   few times the throughput, with identical results.
//!
//! [`Expr::substitute`], [`Expr::symbols`] and the `Display` form (`expr/display.rs`) complete
//! the surface.

mod batch;
mod dag;
mod display;
mod order;
mod program;
mod simplify;
mod substitute;

pub use batch::BatchScratch;
pub use program::{CompileError, Program};

use std::fmt;
use std::ops::{Add, Div, Mul, Neg, Sub};
use std::sync::Arc;

/// A named variable, such as `t` (tensor-parallel degree). Cheap to clone and compare.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Symbol(Arc<str>);

impl Symbol {
    pub fn new(name: &str) -> Self {
        Symbol(Arc::from(name))
    }

    pub fn name(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A symbolic expression over `f64`.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    Const(f64),
    Sym(Symbol),
    Sum(Vec<Expr>),
    Product(Vec<Expr>),
    Div(Box<Expr>, Box<Expr>),
    Max(Vec<Expr>),
    Min(Vec<Expr>),
    Ceil(Box<Expr>),
}

impl Expr {
    pub fn constant(value: f64) -> Expr {
        Expr::Const(value)
    }

    pub fn symbol(name: &str) -> Expr {
        Expr::Sym(Symbol::new(name))
    }

    pub fn max(items: impl IntoIterator<Item = Expr>) -> Expr {
        Expr::Max(items.into_iter().collect())
    }

    pub fn min(items: impl IntoIterator<Item = Expr>) -> Expr {
        Expr::Min(items.into_iter().collect())
    }

    pub fn ceil(self) -> Expr {
        Expr::Ceil(Box::new(self))
    }

    pub fn sum(items: impl IntoIterator<Item = Expr>) -> Expr {
        Expr::Sum(items.into_iter().collect())
    }

    pub fn product(items: impl IntoIterator<Item = Expr>) -> Expr {
        Expr::Product(items.into_iter().collect())
    }

    /// The value of a constant expression, such as a simplified expression whose symbols were
    /// all substituted; `None` when the expression is not a `Const` node.
    pub fn as_constant(&self) -> Option<f64> {
        match self {
            Expr::Const(c) => Some(*c),
            _ => None,
        }
    }

    /// Evaluates by walking the tree; `env` gives each symbol's value. Panics on an unbound
    /// symbol, which is a programming error in the caller (the planner binds every symbol).
    pub fn eval(&self, env: &dyn Fn(&Symbol) -> f64) -> f64 {
        match self {
            Expr::Const(c) => *c,
            Expr::Sym(s) => env(s),
            Expr::Sum(items) => items.iter().map(|e| e.eval(env)).sum(),
            Expr::Product(items) => items.iter().map(|e| e.eval(env)).product(),
            Expr::Div(a, b) => a.eval(env) / b.eval(env),
            Expr::Max(items) => items
                .iter()
                .map(|e| e.eval(env))
                .fold(f64::NEG_INFINITY, f64::max),
            Expr::Min(items) => items
                .iter()
                .map(|e| e.eval(env))
                .fold(f64::INFINITY, f64::min),
            Expr::Ceil(a) => a.eval(env).ceil(),
        }
    }
}

impl From<f64> for Expr {
    fn from(value: f64) -> Self {
        Expr::Const(value)
    }
}

impl From<u64> for Expr {
    fn from(value: u64) -> Self {
        Expr::Const(value as f64)
    }
}

impl From<Symbol> for Expr {
    fn from(symbol: Symbol) -> Self {
        Expr::Sym(symbol)
    }
}

/// `sum + term`, appending to `sum` when it already is a sum.
fn append_term(sum: Expr, term: Expr) -> Expr {
    match sum {
        Expr::Sum(mut terms) => {
            terms.push(term);
            Expr::Sum(terms)
        }
        other => Expr::Sum(vec![other, term]),
    }
}

impl<T: Into<Expr>> Add<T> for Expr {
    type Output = Expr;
    fn add(self, rhs: T) -> Expr {
        append_term(self, rhs.into())
    }
}

impl<T: Into<Expr>> Sub<T> for Expr {
    type Output = Expr;
    fn sub(self, rhs: T) -> Expr {
        append_term(self, Expr::Product(vec![Expr::Const(-1.0), rhs.into()]))
    }
}

impl<T: Into<Expr>> Mul<T> for Expr {
    type Output = Expr;
    fn mul(self, rhs: T) -> Expr {
        match self {
            Expr::Product(mut factors) => {
                factors.push(rhs.into());
                Expr::Product(factors)
            }
            other => Expr::Product(vec![other, rhs.into()]),
        }
    }
}

impl<T: Into<Expr>> Div<T> for Expr {
    type Output = Expr;
    fn div(self, rhs: T) -> Expr {
        Expr::Div(Box::new(self), Box::new(rhs.into()))
    }
}

impl Neg for Expr {
    type Output = Expr;
    fn neg(self) -> Expr {
        Expr::Product(vec![Expr::Const(-1.0), self])
    }
}
