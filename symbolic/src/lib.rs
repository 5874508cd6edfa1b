//! Symbolic expressions and the Tessel cost model.

mod expr;

pub use expr::{CompileError, Expr, Program, Symbol};
