//! Hash-consed expression DAG: the intermediate form between simplified `Expr` trees and the
//! flat program. Structurally equal subtrees of any output map to one node (constants compare
//! by their bits), and nodes whose operands are all constant are folded as they are built.

use std::collections::HashMap;

use super::program::CompileError;
use super::{Expr, Symbol};

/// Index of a node; operands always have smaller ids than the nodes using them.
pub(crate) type NodeId = u32;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Node {
    /// A constant, by its bits.
    Const(u64),
    /// The input in this slot.
    Input(u32),
    /// `bias + Σ weight·operand`, operands sorted and distinct; values as bits.
    Linear {
        bias: u64,
        terms: Vec<(u64, NodeId)>,
    },
    /// `scale · Π operand`, at least two operands, sorted.
    Product {
        scale: u64,
        factors: Vec<NodeId>,
    },
    Div(NodeId, NodeId),
    /// At least two operands, sorted and distinct.
    Max(Vec<NodeId>),
    Min(Vec<NodeId>),
    Ceil(NodeId),
}

impl Node {
    /// The nodes this one reads.
    pub(crate) fn operands(&self) -> Vec<NodeId> {
        match self {
            Node::Const(_) | Node::Input(_) => Vec::new(),
            Node::Linear { terms, .. } => terms.iter().map(|&(_, id)| id).collect(),
            Node::Product { factors, .. } => factors.clone(),
            Node::Div(a, b) => vec![*a, *b],
            Node::Max(items) | Node::Min(items) => items.clone(),
            Node::Ceil(a) => vec![*a],
        }
    }
}

pub(crate) struct Dag {
    pub(crate) nodes: Vec<Node>,
    index: HashMap<Node, NodeId>,
    slot_of: HashMap<Symbol, u32>,
}

impl Dag {
    pub(crate) fn new(slots: &[Symbol]) -> Result<Dag, CompileError> {
        let mut slot_of = HashMap::with_capacity(slots.len());
        for (i, symbol) in slots.iter().enumerate() {
            let slot = u32::try_from(i).map_err(|_| CompileError::TooLarge { count: i })?;
            if slot_of.insert(symbol.clone(), slot).is_some() {
                return Err(CompileError::DuplicateSlot {
                    symbol: symbol.clone(),
                });
            }
        }
        Ok(Dag {
            nodes: Vec::new(),
            index: HashMap::new(),
            slot_of,
        })
    }

    fn intern(&mut self, node: Node) -> Result<NodeId, CompileError> {
        if let Some(&id) = self.index.get(&node) {
            return Ok(id);
        }
        let id = NodeId::try_from(self.nodes.len()).map_err(|_| CompileError::TooLarge {
            count: self.nodes.len(),
        })?;
        self.nodes.push(node.clone());
        self.index.insert(node, id);
        Ok(id)
    }

    fn constant(&mut self, value: f64) -> Result<NodeId, CompileError> {
        self.intern(Node::Const(value.to_bits()))
    }

    pub(crate) fn const_value(&self, id: NodeId) -> Option<f64> {
        match self.nodes[id as usize] {
            Node::Const(bits) => Some(f64::from_bits(bits)),
            _ => None,
        }
    }

    /// Adds the expression's nodes and returns the id of its root.
    pub(crate) fn lower(&mut self, expr: &Expr, output: usize) -> Result<NodeId, CompileError> {
        match expr {
            Expr::Const(c) => self.constant(*c),
            Expr::Sym(symbol) => match self.slot_of.get(symbol) {
                Some(&slot) => self.intern(Node::Input(slot)),
                None => Err(CompileError::UnknownSymbol {
                    symbol: symbol.clone(),
                    output,
                }),
            },
            Expr::Sum(items) => {
                let mut terms = Vec::with_capacity(items.len());
                for item in items {
                    terms.push(self.lower_term(item, output)?);
                }
                self.linear(0.0, terms)
            }
            Expr::Product(items) => {
                let (scale, factors) = self.lower_factors(items, output)?;
                self.product(scale, factors)
            }
            Expr::Div(num, den) => {
                let a = self.lower(num, output)?;
                let b = self.lower(den, output)?;
                match (self.const_value(a), self.const_value(b)) {
                    (Some(x), Some(y)) => self.constant(x / y),
                    _ => self.intern(Node::Div(a, b)),
                }
            }
            Expr::Max(items) => self.extremum(items, output, true),
            Expr::Min(items) => self.extremum(items, output, false),
            Expr::Ceil(arg) => {
                let a = self.lower(arg, output)?;
                match (self.const_value(a), &self.nodes[a as usize]) {
                    (Some(x), _) => self.constant(x.ceil()),
                    (None, Node::Ceil(_)) => Ok(a),
                    (None, _) => self.intern(Node::Ceil(a)),
                }
            }
        }
    }

    /// A sum term as `(weight, node)`: a product's constant factors become the weight, so
    /// `2*x*y` and `3*x*y` share the node `x*y`.
    fn lower_term(&mut self, item: &Expr, output: usize) -> Result<(f64, NodeId), CompileError> {
        if let Expr::Product(items) = item {
            let (scale, factors) = self.lower_factors(items, output)?;
            let id = self.product(1.0, factors)?;
            Ok((scale, id))
        } else {
            Ok((1.0, self.lower(item, output)?))
        }
    }

    /// Lowers a product's operands, folding constant ones into the returned scale.
    fn lower_factors(
        &mut self,
        items: &[Expr],
        output: usize,
    ) -> Result<(f64, Vec<NodeId>), CompileError> {
        let mut scale = 1.0;
        let mut factors = Vec::with_capacity(items.len());
        for item in items {
            let id = self.lower(item, output)?;
            match self.const_value(id) {
                Some(v) => scale *= v,
                None => factors.push(id),
            }
        }
        Ok((scale, factors))
    }

    fn linear(&mut self, bias: f64, terms: Vec<(f64, NodeId)>) -> Result<NodeId, CompileError> {
        let mut bias = bias;
        let mut merged: Vec<(f64, NodeId)> = Vec::with_capacity(terms.len());
        let mut sorted = terms;
        sorted.sort_by_key(|&(_, id)| id);
        for (weight, id) in sorted {
            if let Some(v) = self.const_value(id) {
                bias += weight * v;
            } else if let Some(last) = merged.last_mut().filter(|last| last.1 == id) {
                last.0 += weight;
            } else {
                merged.push((weight, id));
            }
        }
        merged.retain(|&(weight, _)| weight != 0.0);
        match merged.as_slice() {
            [] => self.constant(bias),
            [(weight, id)] if *weight == 1.0 && bias == 0.0 => Ok(*id),
            _ => self.intern(Node::Linear {
                bias: bias.to_bits(),
                terms: merged.iter().map(|&(w, id)| (w.to_bits(), id)).collect(),
            }),
        }
    }

    fn product(&mut self, scale: f64, factors: Vec<NodeId>) -> Result<NodeId, CompileError> {
        let mut scale = scale;
        let mut kept = Vec::with_capacity(factors.len());
        for id in factors {
            match self.const_value(id) {
                Some(v) => scale *= v,
                None => kept.push(id),
            }
        }
        kept.sort_unstable();
        if scale == 0.0 {
            return self.constant(0.0);
        }
        match kept.as_slice() {
            [] => self.constant(scale),
            [id] => self.linear(0.0, vec![(scale, *id)]),
            _ => self.intern(Node::Product {
                scale: scale.to_bits(),
                factors: kept,
            }),
        }
    }

    fn extremum(
        &mut self,
        items: &[Expr],
        output: usize,
        is_max: bool,
    ) -> Result<NodeId, CompileError> {
        let pick = |a: f64, b: f64| if is_max { a.max(b) } else { a.min(b) };
        let mut constant: Option<f64> = None;
        let mut ids = Vec::with_capacity(items.len());
        for item in items {
            let id = self.lower(item, output)?;
            match self.const_value(id) {
                Some(v) => {
                    let identity = if is_max {
                        f64::NEG_INFINITY
                    } else {
                        f64::INFINITY
                    };
                    constant = Some(pick(constant.unwrap_or(identity), v));
                }
                None => ids.push(id),
            }
        }
        if let Some(c) = constant {
            ids.push(self.constant(c)?);
        }
        ids.sort_unstable();
        ids.dedup();
        match ids.as_slice() {
            [] => self.constant(if is_max {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            }),
            [id] => Ok(*id),
            _ if is_max => self.intern(Node::Max(ids)),
            _ => self.intern(Node::Min(ids)),
        }
    }
}
