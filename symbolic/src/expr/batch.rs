//! Evaluation of a program over many input vectors at once.
//!
//! Registers hold one value per lane (`LANES` candidates side by side), so each instruction is
//! dispatched once per group of candidates and its arithmetic runs over a fixed-size array the
//! compiler can vectorise. Every lane performs exactly the operations of the scalar evaluation,
//! in the same order, so the results are bit-for-bit those of [`Program::eval_into`].

use super::program::{Instruction, Program};

/// Candidates evaluated side by side.
const LANES: usize = 8;

type Lanes = [f64; LANES];

/// Reusable register storage for [`Program::eval_batch`]; one per thread.
#[derive(Clone, Debug, Default)]
pub struct BatchScratch {
    registers: Vec<Lanes>,
}

impl BatchScratch {
    pub fn new() -> Self {
        BatchScratch::default()
    }
}

fn map1(a: &Lanes, f: impl Fn(f64) -> f64) -> Lanes {
    let mut out = [0.0; LANES];
    for (o, &x) in out.iter_mut().zip(a) {
        *o = f(x);
    }
    out
}

fn map2(a: &Lanes, b: &Lanes, f: impl Fn(f64, f64) -> f64) -> Lanes {
    let mut out = [0.0; LANES];
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = f(x, y);
    }
    out
}

impl Program {
    /// Evaluates the program for `count = outputs.len() / num_outputs()` candidates: `inputs`
    /// holds each candidate's `num_inputs()` values one candidate after another, and `outputs`
    /// receives each candidate's `num_outputs()` values the same way. Results are identical to
    /// calling [`Program::eval_into`] on each candidate, several times faster. Allocates only
    /// when `scratch` is smaller than this program needs.
    ///
    /// # Panics
    /// When `outputs.len()` is not a multiple of `num_outputs()`, or `inputs.len()` is not
    /// `count * num_inputs()`.
    pub fn eval_batch(&self, inputs: &[f64], scratch: &mut BatchScratch, outputs: &mut [f64]) {
        let num_inputs = self.slots.len();
        let num_outputs = self.outputs.len();
        if num_outputs == 0 {
            assert!(
                outputs.is_empty(),
                "Program::eval_batch: the program has no outputs"
            );
            return;
        }
        assert_eq!(
            outputs.len() % num_outputs,
            0,
            "Program::eval_batch: outputs must hold whole candidates of {num_outputs} values"
        );
        let count = outputs.len() / num_outputs;
        assert_eq!(
            inputs.len(),
            count * num_inputs,
            "Program::eval_batch: expected {count} candidates of {num_inputs} inputs"
        );
        if scratch.registers.len() < self.num_registers {
            scratch.registers.resize(self.num_registers, [0.0; LANES]);
        }
        let regs = &mut scratch.registers[..self.num_registers];
        for (reg, &value) in regs[num_inputs..].iter_mut().zip(&self.constants) {
            *reg = [value; LANES];
        }

        let mut first = 0;
        while first < count {
            let lanes = LANES.min(count - first);
            // Unused lanes repeat the last candidate so they compute ordinary values.
            for (slot, reg) in regs[..num_inputs].iter_mut().enumerate() {
                for (lane, value) in reg.iter_mut().enumerate() {
                    let candidate = first + lane.min(lanes - 1);
                    *value = inputs[candidate * num_inputs + slot];
                }
            }
            self.run_lanes(regs);
            for lane in 0..lanes {
                let row = &mut outputs[(first + lane) * num_outputs..][..num_outputs];
                for (out, &reg) in row.iter_mut().zip(&self.outputs) {
                    *out = regs[reg as usize][lane];
                }
            }
            first += lanes;
        }
    }

    fn run_lanes(&self, regs: &mut [Lanes]) {
        for instruction in &self.instructions {
            match *instruction {
                Instruction::Add { dst, a, b } => {
                    regs[dst as usize] = map2(&regs[a as usize], &regs[b as usize], |x, y| x + y);
                }
                Instruction::Mul { dst, a, b } => {
                    regs[dst as usize] = map2(&regs[a as usize], &regs[b as usize], |x, y| x * y);
                }
                Instruction::Div { dst, a, b } => {
                    regs[dst as usize] = map2(&regs[a as usize], &regs[b as usize], |x, y| x / y);
                }
                Instruction::Max { dst, a, b } => {
                    regs[dst as usize] = map2(&regs[a as usize], &regs[b as usize], f64::max);
                }
                Instruction::Min { dst, a, b } => {
                    regs[dst as usize] = map2(&regs[a as usize], &regs[b as usize], f64::min);
                }
                Instruction::Ceil { dst, a } => {
                    regs[dst as usize] = map1(&regs[a as usize], f64::ceil);
                }
                Instruction::Affine {
                    dst,
                    a,
                    scale,
                    bias,
                } => {
                    regs[dst as usize] = map1(&regs[a as usize], |x| scale * x + bias);
                }
                Instruction::Linear {
                    dst,
                    start,
                    len,
                    bias,
                } => {
                    let mut acc = [bias; LANES];
                    for term in &self.terms[start as usize..(start + len) as usize] {
                        acc = map2(&acc, &regs[term.reg as usize], |sum, x| {
                            sum + term.weight * x
                        });
                    }
                    regs[dst as usize] = acc;
                }
                Instruction::Product {
                    dst,
                    start,
                    len,
                    scale,
                } => {
                    let mut acc = [scale; LANES];
                    for &reg in &self.operands[start as usize..(start + len) as usize] {
                        acc = map2(&acc, &regs[reg as usize], |p, x| p * x);
                    }
                    regs[dst as usize] = acc;
                }
                Instruction::MaxN { dst, start, len } => {
                    let mut acc = [f64::NEG_INFINITY; LANES];
                    for &reg in &self.operands[start as usize..(start + len) as usize] {
                        acc = map2(&acc, &regs[reg as usize], f64::max);
                    }
                    regs[dst as usize] = acc;
                }
                Instruction::MinN { dst, start, len } => {
                    let mut acc = [f64::INFINITY; LANES];
                    for &reg in &self.operands[start as usize..(start + len) as usize] {
                        acc = map2(&acc, &regs[reg as usize], f64::min);
                    }
                    regs[dst as usize] = acc;
                }
            }
        }
    }
}
