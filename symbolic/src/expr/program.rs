//! Compilation of expressions to a flat register program, the planner's hot path.
//!
//! All outputs are simplified, hash-consed into one DAG (so a subexpression shared by several
//! outputs is computed once) and lowered to a list of instructions over a single `f64` register
//! array laid out as `[inputs | constants | one register per computed node]`. Each DAG node is
//! one instruction; n-ary sums with weights, products with a scale and max/min read their
//! operand lists from side tables, and the common small shapes (`a + b`, `a*b`, `k*a + c`)
//! have their own instructions so they skip the operand-list loop. Evaluation copies the inputs
//! and constants into the registers, runs the instructions in order and reads the outputs; with
//! a caller-kept scratch buffer it allocates nothing.

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

/// One instruction. Register operands are indices into the register array; `start..start+len`
/// index the program's operand (or term) table.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Instruction {
    Add {
        dst: u32,
        a: u32,
        b: u32,
    },
    Mul {
        dst: u32,
        a: u32,
        b: u32,
    },
    Div {
        dst: u32,
        a: u32,
        b: u32,
    },
    Max {
        dst: u32,
        a: u32,
        b: u32,
    },
    Min {
        dst: u32,
        a: u32,
        b: u32,
    },
    Ceil {
        dst: u32,
        a: u32,
    },
    /// `scale*a + bias`.
    Affine {
        dst: u32,
        a: u32,
        scale: f64,
        bias: f64,
    },
    /// `bias + Σ weight·register` over `terms[start..start+len]`.
    Linear {
        dst: u32,
        start: u32,
        len: u32,
        bias: f64,
    },
    /// `scale · Π register` over `operands[start..start+len]`.
    Product {
        dst: u32,
        start: u32,
        len: u32,
        scale: f64,
    },
    MaxN {
        dst: u32,
        start: u32,
        len: u32,
    },
    MinN {
        dst: u32,
        start: u32,
        len: u32,
    },
}

/// A weighted operand of a `Linear` instruction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Term {
    pub(super) weight: f64,
    pub(super) reg: u32,
}

/// Expressions compiled for fast repeated evaluation over a fixed list of input slots.
///
/// `Program` is `Send + Sync + Clone`: threads can share one program and each keep its own
/// scratch buffer for [`Program::eval_into`].
#[derive(Clone, Debug)]
pub struct Program {
    pub(super) slots: Vec<Symbol>,
    pub(super) constants: Vec<f64>,
    pub(super) instructions: Vec<Instruction>,
    pub(super) operands: Vec<u32>,
    pub(super) terms: Vec<Term>,
    pub(super) outputs: Vec<u32>,
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
        self.instructions.len()
    }

    /// Size of the register array (inputs, constants and computed values).
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

    fn run(&self, regs: &mut [f64]) {
        for instruction in &self.instructions {
            match *instruction {
                Instruction::Add { dst, a, b } => {
                    regs[dst as usize] = regs[a as usize] + regs[b as usize];
                }
                Instruction::Mul { dst, a, b } => {
                    regs[dst as usize] = regs[a as usize] * regs[b as usize];
                }
                Instruction::Div { dst, a, b } => {
                    regs[dst as usize] = regs[a as usize] / regs[b as usize];
                }
                Instruction::Max { dst, a, b } => {
                    regs[dst as usize] = larger(regs[a as usize], regs[b as usize]);
                }
                Instruction::Min { dst, a, b } => {
                    regs[dst as usize] = smaller(regs[a as usize], regs[b as usize]);
                }
                Instruction::Ceil { dst, a } => {
                    regs[dst as usize] = regs[a as usize].ceil();
                }
                Instruction::Affine {
                    dst,
                    a,
                    scale,
                    bias,
                } => {
                    regs[dst as usize] = scale * regs[a as usize] + bias;
                }
                Instruction::Linear {
                    dst,
                    start,
                    len,
                    bias,
                } => {
                    let terms = &self.terms[start as usize..(start + len) as usize];
                    let mut acc = bias;
                    for term in terms {
                        acc += term.weight * regs[term.reg as usize];
                    }
                    regs[dst as usize] = acc;
                }
                Instruction::Product {
                    dst,
                    start,
                    len,
                    scale,
                } => {
                    let operands = &self.operands[start as usize..(start + len) as usize];
                    let mut acc = scale;
                    for &reg in operands {
                        acc *= regs[reg as usize];
                    }
                    regs[dst as usize] = acc;
                }
                Instruction::MaxN { dst, start, len } => {
                    let operands = &self.operands[start as usize..(start + len) as usize];
                    let mut acc = f64::NEG_INFINITY;
                    for &reg in operands {
                        acc = larger(acc, regs[reg as usize]);
                    }
                    regs[dst as usize] = acc;
                }
                Instruction::MinN { dst, start, len } => {
                    let operands = &self.operands[start as usize..(start + len) as usize];
                    let mut acc = f64::INFINITY;
                    for &reg in operands {
                        acc = smaller(acc, regs[reg as usize]);
                    }
                    regs[dst as usize] = acc;
                }
            }
        }
    }
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
    instructions: Vec<Instruction>,
    operands: Vec<u32>,
    terms: Vec<Term>,
}

fn to_u32(value: usize) -> Result<u32, CompileError> {
    u32::try_from(value).map_err(|_| CompileError::TooLarge { count: value })
}

impl<'a> Emitter<'a> {
    fn new(dag: &'a Dag) -> Self {
        Emitter {
            dag,
            register: vec![u32::MAX; dag.nodes.len()],
            instructions: Vec::new(),
            operands: Vec::new(),
            terms: Vec::new(),
        }
    }

    fn emit(mut self, roots: &[NodeId], slots: &[Symbol]) -> Result<Program, CompileError> {
        let reachable = self.reachable(roots);

        // Inputs sit at their slot; constants follow, then computed values in DAG order,
        // which is a topological order.
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
        let mut num_registers = slots.len() + constants.len();
        let mut computed = Vec::new();
        for (id, node) in self.dag.nodes.iter().enumerate() {
            if reachable[id] && !matches!(node, Node::Input(_) | Node::Const(_)) {
                self.register[id] = to_u32(num_registers)?;
                num_registers += 1;
                computed.push(id);
            }
        }
        for id in computed {
            self.instruction(&self.dag.nodes[id], self.register[id])?;
        }
        let outputs = roots.iter().map(|&id| self.reg(id)).collect();
        Ok(Program {
            slots: slots.to_vec(),
            constants,
            instructions: self.instructions,
            operands: self.operands,
            terms: self.terms,
            outputs,
            num_registers,
        })
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

    fn operand_list(&mut self, ids: &[NodeId]) -> Result<(u32, u32), CompileError> {
        let start = to_u32(self.operands.len())?;
        for &id in ids {
            let reg = self.reg(id);
            self.operands.push(reg);
        }
        Ok((start, to_u32(ids.len())?))
    }

    fn instruction(&mut self, node: &Node, dst: u32) -> Result<(), CompileError> {
        let instruction = match node {
            Node::Const(_) | Node::Input(_) => return Ok(()),
            Node::Linear { bias, terms } => {
                let bias = f64::from_bits(*bias);
                let weight = |i: usize| f64::from_bits(terms[i].0);
                match terms.as_slice() {
                    [(_, a)] => Instruction::Affine {
                        dst,
                        a: self.reg(*a),
                        scale: weight(0),
                        bias,
                    },
                    [(_, a), (_, b)] if bias == 0.0 && weight(0) == 1.0 && weight(1) == 1.0 => {
                        Instruction::Add {
                            dst,
                            a: self.reg(*a),
                            b: self.reg(*b),
                        }
                    }
                    _ => {
                        let start = to_u32(self.terms.len())?;
                        for &(w, id) in terms {
                            let reg = self.reg(id);
                            self.terms.push(Term {
                                weight: f64::from_bits(w),
                                reg,
                            });
                        }
                        Instruction::Linear {
                            dst,
                            start,
                            len: to_u32(terms.len())?,
                            bias,
                        }
                    }
                }
            }
            Node::Product { scale, factors } => {
                let scale = f64::from_bits(*scale);
                match factors.as_slice() {
                    [a, b] if scale == 1.0 => Instruction::Mul {
                        dst,
                        a: self.reg(*a),
                        b: self.reg(*b),
                    },
                    _ => {
                        let (start, len) = self.operand_list(factors)?;
                        Instruction::Product {
                            dst,
                            start,
                            len,
                            scale,
                        }
                    }
                }
            }
            Node::Div(a, b) => Instruction::Div {
                dst,
                a: self.reg(*a),
                b: self.reg(*b),
            },
            Node::Max(items) => match items.as_slice() {
                [a, b] => Instruction::Max {
                    dst,
                    a: self.reg(*a),
                    b: self.reg(*b),
                },
                _ => {
                    let (start, len) = self.operand_list(items)?;
                    Instruction::MaxN { dst, start, len }
                }
            },
            Node::Min(items) => match items.as_slice() {
                [a, b] => Instruction::Min {
                    dst,
                    a: self.reg(*a),
                    b: self.reg(*b),
                },
                _ => {
                    let (start, len) = self.operand_list(items)?;
                    Instruction::MinN { dst, start, len }
                }
            },
            Node::Ceil(a) => Instruction::Ceil {
                dst,
                a: self.reg(*a),
            },
        };
        self.instructions.push(instruction);
        Ok(())
    }
}
