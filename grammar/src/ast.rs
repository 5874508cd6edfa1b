//! The syntax tree of a spec file, before evaluation. Every node keeps its span.

use crate::source::Span;

#[derive(Clone, Debug, PartialEq)]
pub struct Name {
    pub text: String,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Item {
    Use { path: String, span: Span },
    Let(Let),
    Block(Block),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Let {
    pub name: Name,
    pub value: Expr,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Block {
    /// As written; checked against the known kinds when blocks are collected.
    pub kind: Name,
    pub name: Option<Name>,
    pub parent: Option<Name>,
    pub members: Vec<Member>,
    /// The header, `KIND NAME extends PARENT`, for errors about the block as a whole.
    pub header: Span,
}

/// How a `pool NAME { … }` member is keyed: the field `pool NAME`, a key no `ident` can spell.
pub const POOL_PREFIX: &str = "pool ";
/// The field an `encoder NAME { … }` block of a model is read as, like a pool.
pub const ENCODER_PREFIX: &str = "encoder ";

/// A block member: a field (a `pool` block is one, see [`POOL_PREFIX`]), or a block-local
/// `let`.
#[derive(Clone, Debug, PartialEq)]
pub enum Member {
    Field(Field),
    Let(Let),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Field {
    pub key: Name,
    pub value: Expr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ExprKind {
    Number(f64),
    /// `95%`, already divided by 100.
    Percent(f64),
    Quantity {
        value: f64,
        unit: Name,
    },
    Bool(bool),
    String(String),
    /// A name: a `let`, an earlier field, an enum value or a reference to a block.
    Ident(String),
    List(Vec<Expr>),
    Record(Vec<Field>),
    Range(Box<Expr>, Box<Expr>),
    /// A left-associative chain `first op1 e1 op2 e2 ...` of one precedence level, kept flat so
    /// that long sums never make deep trees.
    Chain {
        first: Box<Expr>,
        rest: Vec<(BinaryOp, Expr)>,
    },
    /// An odd number of minus signs in front of an expression.
    Neg(Box<Expr>),
}
