//! Compilation of expressions to a flat register program, the planner's hot path.
//!
//! All outputs are simplified, hash-consed into one DAG (so a subexpression shared by several
//! outputs is computed once) and lowered to instructions over a single register array laid out
//! as `[inputs | constants | one register per computed node]`. Each DAG node is one
//! instruction; n-ary sums with weights, products with a scale and max/min read their operand
//! lists from side tables, and the common small shapes (`a + b`, `a*b`, `k*a + c`) have their
//! own operations so they skip the operand-list loop.
//!
//! Instructions are scheduled into runs of one operation (a topological order that keeps each
//! operation going while it has ready nodes), and each operation keeps its operands in a table
//! of its own: the interpreter dispatches once per run and then loops over plain records, which
//! on the cost model's programs (590 instructions in 94 runs) is about 1.5× faster than
//! dispatching every instruction. The register array's length is a power of two and indices are
//! masked by it, so the loops carry no bounds checks and no `unsafe`. Evaluation copies the
//! inputs and constants into the registers, runs the instructions and reads the outputs; with a
//! caller-kept scratch buffer it allocates nothing.

use std::collections::VecDeque;
use std::fmt;

use super::dag::{Dag, Node, NodeId};
use super::{Expr, Symbol};

/// Why a set of expressions could not be compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompileError {
    /// An output uses a symbol that is not one of the program's input slots.
    UnknownSymbol { symbol: Symbol, output: usize },
    /// The same symbol was given for two input slots.
    DuplicateSlot { symbol: Symbol },
    /// More nodes or slots than a 32-bit register index can address.
    TooLarge { count: usize },
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CompileError::UnknownSymbol { symbol, output } => write!(
                f,
                "output {output} uses the symbol `{symbol}`, which is not one of the input slots"
            ),
            CompileError::DuplicateSlot { symbol } => {
                write!(
                    f,
                    "the symbol `{symbol}` is given for more than one input slot"
                )
            }
            CompileError::TooLarge { count } => write!(
                f,
                "the program needs {count} or more registers, more than a 32-bit index addresses"
            ),
        }
    }
}

impl std::error::Error for CompileError {}

/// The operation of a run of instructions. Each reads its operands from one record table:
/// `Add`..`Min` from [`Binary`], `Ceil` from [`Unary`], `Affine` from [`AffineRecord`], and
/// the n-ary ones from [`Gather`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Op {
    Add,
    Mul,
    Div,
    Max,
    Min,
    Ceil,
    /// `scale*a + bias`.
    Affine,
    /// `bias + Σ weight·register` over `terms[start..start+len]`.
    Linear,
    /// `scale · Π register` over `operands[start..start+len]`.
    Product,
    MaxN,
    MinN,
}

impl Op {
    const ALL: [Op; 11] = [
        Op::Add,
        Op::Mul,
        Op::Div,
        Op::Max,
        Op::Min,
        Op::Ceil,
        Op::Affine,
        Op::Linear,
        Op::Product,
        Op::MaxN,
        Op::MinN,
    ];
}

/// `len` consecutive instructions of one operation, taken in order from its record table.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Run {
    op: Op,
    len: u32,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Binary {
    dst: u32,
    a: u32,
    b: u32,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Unary {
    dst: u32,
    a: u32,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct AffineRecord {
    dst: u32,
    a: u32,
    scale: f64,
    bias: f64,
}

/// An n-ary instruction: its operands are `start..start+len` of the term table (`Linear`) or
/// the operand table (the others); `init` is the bias, the scale, or the identity of max/min.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Gather {
    dst: u32,
    start: u32,
    len: u32,
    init: f64,
}

/// A weighted operand of a `Linear` instruction.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Term {
    weight: f64,
    reg: u32,
}

/// Each operation's records, and the operand lists the n-ary ones read.
#[derive(Clone, Debug, Default)]
struct Records {
    binary: Vec<Binary>,
    unary: Vec<Unary>,
    affine: Vec<AffineRecord>,
    gather: Vec<Gather>,
    operands: Vec<u32>,
    terms: Vec<Term>,
}

/// What a register holds while a program runs: one value, or one per candidate of a batch.
pub(super) trait Register: Copy {
    fn splat(value: f64) -> Self;
    fn map(self, f: impl Fn(f64) -> f64) -> Self;
    fn zip(self, other: Self, f: impl Fn(f64, f64) -> f64) -> Self;
}

impl Register for f64 {
    #[inline(always)]
    fn splat(value: f64) -> Self {
        value
    }

    #[inline(always)]
    fn map(self, f: impl Fn(f64) -> f64) -> Self {
        f(self)
    }

    #[inline(always)]
    fn zip(self, other: Self, f: impl Fn(f64, f64) -> f64) -> Self {
        f(self, other)
    }
}

/// Expressions compiled for fast repeated evaluation over a fixed list of input slots.
///
/// `Program` is `Send + Sync + Clone`: threads can share one program and each keep its own
/// scratch buffer for [`Program::eval_into`].
#[derive(Clone, Debug)]
pub struct Program {
    pub(super) slots: Vec<Symbol>,
    pub(super) constants: Vec<f64>,
    runs: Vec<Run>,
    records: Records,
    pub(super) outputs: Vec<u32>,
    /// A power of two, so that masking an index by it keeps it in bounds.
    pub(super) num_registers: usize,
}

impl Program {
    /// Compiles `outputs`, whose symbols must all be among `slots`; `slots[i]` is read from
    /// `inputs[i]` at evaluation. Outputs are simplified first (see [`Expr::simplify`] for the
    /// finiteness it assumes), so an unsimplified expression evaluates as fast as its simplified
    /// form, and the values match tree evaluation up to rounding.
    pub fn compile(outputs: &[Expr], slots: &[Symbol]) -> Result<Program, CompileError> {
        let mut dag = Dag::new(slots)?;
        let mut roots = Vec::with_capacity(outputs.len());
        for (i, output) in outputs.iter().enumerate() {
            roots.push(dag.lower(&output.simplify(), i)?);
        }
        Emitter::new(&dag).emit(&roots, slots)
    }

    /// The input slots, in the order `inputs` gives their values.
    pub fn slots(&self) -> &[Symbol] {
        &self.slots
    }

    /// Values each evaluation reads, one per slot.
    pub fn num_inputs(&self) -> usize {
        self.slots.len()
    }

    /// Values each evaluation writes, one per compiled expression, in order.
    pub fn num_outputs(&self) -> usize {
        self.outputs.len()
    }

    /// Instructions one evaluation runs (after sharing and constant folding).
    pub fn num_instructions(&self) -> usize {
        self.records.binary.len()
            + self.records.unary.len()
            + self.records.affine.len()
            + self.records.gather.len()
    }

    /// Runs of one operation the instructions are scheduled into: the interpreter's
    /// dispatches per evaluation.
    pub fn num_runs(&self) -> usize {
        self.runs.len()
    }

    /// Size of the register array: inputs, constants and computed values, rounded up to a
    /// power of two.
    pub fn num_registers(&self) -> usize {
        self.num_registers
    }

    /// Evaluates every output; allocates a scratch buffer, so hot loops should prefer
    /// [`Program::eval_into`].
    ///
    /// # Panics
    /// When `inputs.len() != self.num_inputs()` or `outputs.len() != self.num_outputs()`.
    pub fn eval(&self, inputs: &[f64], outputs: &mut [f64]) {
        let mut scratch = Vec::new();
        self.eval_into(inputs, &mut scratch, outputs);
    }

    /// Evaluates every output using `scratch` as the register array. The buffer is grown on
    /// first use and reused after, so repeated calls allocate nothing; its contents between
    /// calls do not matter.
    ///
    /// # Panics
    /// When `inputs.len() != self.num_inputs()` or `outputs.len() != self.num_outputs()`.
    pub fn eval_into(&self, inputs: &[f64], scratch: &mut Vec<f64>, outputs: &mut [f64]) {
        assert_eq!(
            inputs.len(),
            self.slots.len(),
            "Program::eval: expected {} inputs",
            self.slots.len()
        );
        assert_eq!(
            outputs.len(),
            self.outputs.len(),
            "Program::eval: expected {} outputs",
            self.outputs.len()
        );
        if scratch.len() < self.num_registers {
            scratch.resize(self.num_registers, 0.0);
        }
        let regs = &mut scratch[..self.num_registers];
        let constants_end = inputs.len() + self.constants.len();
        regs[..inputs.len()].copy_from_slice(inputs);
        regs[inputs.len()..constants_end].copy_from_slice(&self.constants);
        self.run(regs);
        for (out, &reg) in outputs.iter_mut().zip(&self.outputs) {
            *out = regs[reg as usize];
        }
    }

    /// Runs every instruction over `regs` (inputs and constants already in place), whose
    /// length is [`Program::num_registers`]. Register indices are masked by that power of two,
    /// which leaves them unchanged and lets the compiler drop the bounds checks.
    pub(super) fn run<R: Register>(&self, regs: &mut [R]) {
        assert!(regs.len() == self.num_registers && regs.len().is_power_of_two());
        let mask = regs.len() - 1;
        let at = |reg: u32| reg as usize & mask;
        let (mut binary, mut unary, mut affine, mut gather) = (0, 0, 0, 0);
        for run in &self.runs {
            let len = run.len as usize;
            match run.op {
                Op::Add | Op::Mul | Op::Div | Op::Max | Op::Min => {
                    let records = take(&self.records.binary, &mut binary, len);
                    match run.op {
                        Op::Add => combine_pairs(records, regs, |x, y| x + y),
                        Op::Mul => combine_pairs(records, regs, |x, y| x * y),
                        Op::Div => combine_pairs(records, regs, |x, y| x / y),
                        Op::Max => combine_pairs(records, regs, larger),
                        _ => combine_pairs(records, regs, smaller),
                    }
                }
                Op::Ceil => {
                    for i in take(&self.records.unary, &mut unary, len) {
                        regs[at(i.dst)] = regs[at(i.a)].map(f64::ceil);
                    }
                }
                Op::Affine => {
                    for i in take(&self.records.affine, &mut affine, len) {
                        regs[at(i.dst)] = regs[at(i.a)].map(|x| i.scale * x + i.bias);
                    }
                }
                Op::Linear => {
                    for i in take(&self.records.gather, &mut gather, len) {
                        let mut acc = R::splat(i.init);
                        for term in &self.records.terms[i.range()] {
                            acc = acc.zip(regs[at(term.reg)], |sum, x| sum + term.weight * x);
                        }
                        regs[at(i.dst)] = acc;
                    }
                }
                Op::Product | Op::MaxN | Op::MinN => {
                    let records = take(&self.records.gather, &mut gather, len);
                    let operands = &self.records.operands;
                    match run.op {
                        Op::Product => fold_operands(records, operands, regs, |p, x| p * x),
                        Op::MaxN => fold_operands(records, operands, regs, larger),
                        _ => fold_operands(records, operands, regs, smaller),
                    }
                }
            }
        }
    }
}

impl Gather {
    fn range(&self) -> std::ops::Range<usize> {
        self.start as usize..(self.start + self.len) as usize
    }
}

/// `dst = f(a, b)` for each record; `regs.len()` is a power of two (see [`Program::run`]).
#[inline(always)]
fn combine_pairs<R: Register>(
    records: &[Binary],
    regs: &mut [R],
    f: impl Fn(f64, f64) -> f64 + Copy,
) {
    let mask = regs.len() - 1;
    for i in records {
        let (a, b) = (regs[i.a as usize & mask], regs[i.b as usize & mask]);
        regs[i.dst as usize & mask] = a.zip(b, f);
    }
}

/// `dst = f(…f(f(init, r₁), r₂)…)` over each record's operands.
#[inline(always)]
fn fold_operands<R: Register>(
    records: &[Gather],
    operands: &[u32],
    regs: &mut [R],
    f: impl Fn(f64, f64) -> f64 + Copy,
) {
    let mask = regs.len() - 1;
    for i in records {
        let mut acc = R::splat(i.init);
        for &reg in &operands[i.range()] {
            acc = acc.zip(regs[reg as usize & mask], f);
        }
        regs[i.dst as usize & mask] = acc;
    }
}

/// The next `len` records of a table, from `next` on.
fn take<'a, T>(records: &'a [T], next: &mut usize, len: usize) -> &'a [T] {
    let taken = &records[*next..*next + len];
    *next += len;
    taken
}

/// `a.max(b)` for the finite values a program computes, without `f64::max`'s NaN handling.
#[inline(always)]
fn larger(a: f64, b: f64) -> f64 {
    if b > a {
        b
    } else {
        a
    }
}

/// `a.min(b)` for finite values, as [`larger`].
#[inline(always)]
fn smaller(a: f64, b: f64) -> f64 {
    if b < a {
        b
    } else {
        a
    }
}

/// Lowers the reachable part of a DAG to instructions.
struct Emitter<'a> {
    dag: &'a Dag,
    /// Register of each reachable node (every operand of a reachable node is reachable).
    register: Vec<u32>,
    records: Records,
}

fn to_u32(value: usize) -> Result<u32, CompileError> {
    u32::try_from(value).map_err(|_| CompileError::TooLarge { count: value })
}

/// The operation a computed node lowers to; `None` for inputs and constants.
fn op_of(node: &Node) -> Option<Op> {
    Some(match node {
        Node::Const(_) | Node::Input(_) => return None,
        Node::Linear { bias, terms } => match terms.as_slice() {
            [_] => Op::Affine,
            [(wa, _), (wb, _)]
                if f64::from_bits(*bias) == 0.0
                    && f64::from_bits(*wa) == 1.0
                    && f64::from_bits(*wb) == 1.0 =>
            {
                Op::Add
            }
            _ => Op::Linear,
        },
        Node::Product { scale, factors } => match factors.as_slice() {
            [_, _] if f64::from_bits(*scale) == 1.0 => Op::Mul,
            _ => Op::Product,
        },
        Node::Div(..) => Op::Div,
        Node::Max(items) if items.len() == 2 => Op::Max,
        Node::Max(_) => Op::MaxN,
        Node::Min(items) if items.len() == 2 => Op::Min,
        Node::Min(_) => Op::MinN,
        Node::Ceil(_) => Op::Ceil,
    })
}

impl<'a> Emitter<'a> {
    fn new(dag: &'a Dag) -> Self {
        Emitter {
            dag,
            register: vec![u32::MAX; dag.nodes.len()],
            records: Records::default(),
        }
    }

    fn emit(mut self, roots: &[NodeId], slots: &[Symbol]) -> Result<Program, CompileError> {
        let reachable = self.reachable(roots);

        // Inputs sit at their slot; constants follow, then computed values in the order
        // they run.
        let mut constants = Vec::new();
        for (id, node) in self.dag.nodes.iter().enumerate() {
            if !reachable[id] {
                continue;
            }
            match node {
                Node::Input(slot) => self.register[id] = *slot,
                Node::Const(bits) => {
                    self.register[id] = to_u32(slots.len() + constants.len())?;
                    constants.push(f64::from_bits(*bits));
                }
                _ => {}
            }
        }
        let (order, runs) = self.schedule(&reachable);
        let mut used = slots.len() + constants.len();
        for &id in &order {
            self.register[id] = to_u32(used)?;
            used += 1;
        }
        for &id in &order {
            self.instruction(&self.dag.nodes[id], self.register[id])?;
        }
        let outputs = roots.iter().map(|&id| self.reg(id)).collect();
        Ok(Program {
            slots: slots.to_vec(),
            constants,
            runs,
            records: self.records,
            outputs,
            num_registers: used.next_power_of_two(),
        })
    }

    /// Orders the computed nodes so that nodes of one operation run back to back: the
    /// interpreter then dispatches once per run instead of once per instruction. Greedy list
    /// scheduling: take every ready node of one operation, including those its own nodes make
    /// ready, then switch to the operation with the most ready nodes (the first in [`Op`]'s
    /// order on a tie), so the order is deterministic.
    fn schedule(&self, reachable: &[bool]) -> (Vec<usize>, Vec<Run>) {
        let nodes = &self.dag.nodes;
        let ops: Vec<Option<Op>> = nodes.iter().map(op_of).collect();
        let mut waiting = vec![0usize; nodes.len()];
        let mut users: Vec<Vec<(usize, Op)>> = vec![Vec::new(); nodes.len()];
        let mut ready: Vec<VecDeque<usize>> = vec![VecDeque::new(); Op::ALL.len()];
        for (id, node) in nodes.iter().enumerate() {
            let Some(op) = ops[id].filter(|_| reachable[id]) else {
                continue;
            };
            for operand in node.operands() {
                if ops[operand as usize].is_some() {
                    waiting[id] += 1;
                    users[operand as usize].push((id, op));
                }
            }
            if waiting[id] == 0 {
                ready[op as usize].push_back(id);
            }
        }
        let mut order = Vec::new();
        let mut runs = Vec::new();
        while let Some(op) = Op::ALL
            .into_iter()
            .filter(|&op| !ready[op as usize].is_empty())
            .max_by_key(|&op| (ready[op as usize].len(), std::cmp::Reverse(op)))
        {
            let first = order.len();
            while let Some(id) = ready[op as usize].pop_front() {
                order.push(id);
                for &(user, user_op) in &users[id] {
                    waiting[user] -= 1;
                    if waiting[user] == 0 {
                        ready[user_op as usize].push_back(user);
                    }
                }
            }
            let len = u32::try_from(order.len() - first).expect("fewer nodes than u32::MAX");
            runs.push(Run { op, len });
        }
        (order, runs)
    }

    fn reachable(&self, roots: &[NodeId]) -> Vec<bool> {
        let mut seen = vec![false; self.dag.nodes.len()];
        let mut stack: Vec<NodeId> = roots.to_vec();
        while let Some(id) = stack.pop() {
            if !std::mem::replace(&mut seen[id as usize], true) {
                stack.extend(self.dag.nodes[id as usize].operands());
            }
        }
        seen
    }

    fn reg(&self, id: NodeId) -> u32 {
        self.register[id as usize]
    }

    fn gather(&mut self, dst: u32, ids: &[NodeId], init: f64) -> Result<(), CompileError> {
        let start = to_u32(self.records.operands.len())?;
        for &id in ids {
            let reg = self.reg(id);
            self.records.operands.push(reg);
        }
        let len = to_u32(ids.len())?;
        self.records.gather.push(Gather {
            dst,
            start,
            len,
            init,
        });
        Ok(())
    }

    /// Appends the node's record to the table of its operation (see [`op_of`]).
    fn instruction(&mut self, node: &Node, dst: u32) -> Result<(), CompileError> {
        let Some(op) = op_of(node) else {
            return Ok(());
        };
        match node {
            Node::Const(_) | Node::Input(_) => {}
            Node::Linear { bias, terms } => {
                let bias = f64::from_bits(*bias);
                match (op, terms.as_slice()) {
                    (Op::Affine, [(scale, a)]) => self.records.affine.push(AffineRecord {
                        dst,
                        a: self.reg(*a),
                        scale: f64::from_bits(*scale),
                        bias,
                    }),
                    (Op::Add, [(_, a), (_, b)]) => self.records.binary.push(Binary {
                        dst,
                        a: self.reg(*a),
                        b: self.reg(*b),
                    }),
                    _ => {
                        let start = to_u32(self.records.terms.len())?;
                        for &(weight, id) in terms {
                            let reg = self.reg(id);
                            self.records.terms.push(Term {
                                weight: f64::from_bits(weight),
                                reg,
                            });
                        }
                        let len = to_u32(terms.len())?;
                        self.records.gather.push(Gather {
                            dst,
                            start,
                            len,
                            init: bias,
                        });
                    }
                }
            }
            Node::Product { scale, factors } => match (op, factors.as_slice()) {
                (Op::Mul, [a, b]) => self.records.binary.push(Binary {
                    dst,
                    a: self.reg(*a),
                    b: self.reg(*b),
                }),
                _ => self.gather(dst, factors, f64::from_bits(*scale))?,
            },
            Node::Div(a, b) => self.records.binary.push(Binary {
                dst,
                a: self.reg(*a),
                b: self.reg(*b),
            }),
            Node::Max(items) | Node::Min(items) => match (op, items.as_slice()) {
                (Op::Max | Op::Min, [a, b]) => self.records.binary.push(Binary {
                    dst,
                    a: self.reg(*a),
                    b: self.reg(*b),
                }),
                (Op::MaxN, _) => self.gather(dst, items, f64::NEG_INFINITY)?,
                _ => self.gather(dst, items, f64::INFINITY)?,
            },
            Node::Ceil(a) => self.records.unary.push(Unary {
                dst,
                a: self.reg(*a),
            }),
        }
        Ok(())
    }
}
