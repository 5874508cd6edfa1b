//! Evaluation of a program over many input vectors at once.
//!
//! Registers hold one value per lane (`LANES` candidates side by side), and the scalar
//! interpreter (`Program::run`) runs over them: each run of instructions is dispatched once per
//! group of candidates and its arithmetic runs over a fixed-size array the compiler can
//! vectorise. Every lane performs exactly the operations of the scalar evaluation, in the same
//! order, so the results are bit-for-bit those of [`Program::eval_into`].

use super::program::{Program, Register};

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

impl Register for Lanes {
    #[inline(always)]
    fn splat(value: f64) -> Self {
        [value; LANES]
    }

    #[inline(always)]
    fn map(self, f: impl Fn(f64) -> f64) -> Self {
        let mut out = self;
        for value in &mut out {
            *value = f(*value);
        }
        out
    }

    #[inline(always)]
    fn zip(self, other: Self, f: impl Fn(f64, f64) -> f64) -> Self {
        let mut out = [0.0; LANES];
        for ((o, x), y) in out.iter_mut().zip(self).zip(other) {
            *o = f(x, y);
        }
        out
    }
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
            self.run(regs);
            for lane in 0..lanes {
                let row = &mut outputs[(first + lane) * num_outputs..][..num_outputs];
                for (out, &reg) in row.iter_mut().zip(&self.outputs) {
                    *out = regs[reg as usize][lane];
                }
            }
            first += lanes;
        }
    }
}
