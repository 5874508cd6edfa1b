//! Symbolic expressions and the Tessel cost model.

mod expr;

pub use expr::{BatchScratch, CompileError, Expr, Program, Symbol};
