//! Pipeline schedules: the per-rank instruction streams of 1F1B and interleaved 1F1B.
//!
//! One generator feeds both the planner's timeline and the runtime's executor, so what is
//! predicted and what is run follow the same order of work. A schedule lists, for every
//! pipeline rank, the compute (forward / backward of a micro-batch through one model chunk),
//! the point-to-point transfers around it, and the closing gradient reduction and optimizer
//! step. Sends are eager (they never wait); receives block until the matching send happened.
//!
//! Virtual stages: with `chunks` model chunks per rank, chunk `c` of rank `r` is virtual stage
//! `c·pp + r` (Megatron's interleaved assignment), so activations flow rank 0 → 1 → … → pp−1 →
//! rank 0 of the next chunk.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

/// One step of a pipeline rank's work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Instruction {
    Forward {
        microbatch: u64,
        chunk: u64,
    },
    Backward {
        microbatch: u64,
        chunk: u64,
    },
    /// Send the output activation of `(microbatch, chunk)` of this rank to `peer`.
    SendActivation {
        microbatch: u64,
        chunk: u64,
        peer: u64,
    },
    /// Receive from `peer` the input activation of `(microbatch, chunk)` of this rank.
    RecvActivation {
        microbatch: u64,
        chunk: u64,
        peer: u64,
    },
    /// Send the gradient of the input of `(microbatch, chunk)` of this rank to `peer`.
    SendGrad {
        microbatch: u64,
        chunk: u64,
        peer: u64,
    },
    /// Receive from `peer` the gradient of the output of `(microbatch, chunk)` of this rank.
    RecvGrad {
        microbatch: u64,
        chunk: u64,
        peer: u64,
    },
    /// Reduce gradients over the data-parallel replicas (all-reduce or reduce-scatter).
    ReduceGradients,
    OptimizerStep,
}

/// What a point-to-point message carries; used to match sends with receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MessageKind {
    Activation,
    Grad,
}

/// Identifies one point-to-point message: its kind, micro-batch and the virtual stage of the
/// sender. Sender and receiver compute the same key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageKey {
    pub kind: MessageKind,
    pub microbatch: u64,
    pub sender_virtual_stage: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScheduleError {
    /// A degree or count is zero.
    Zero { what: &'static str },
    /// Interleaving needs the micro-batch count to be a multiple of the pipeline depth.
    MicrobatchesNotMultipleOfStages { microbatches: u64, stages: u64 },
    /// Interleaving with a single pipeline stage has no peer to alternate with.
    InterleaveWithoutPipeline { chunks: u64 },
}

impl fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScheduleError::Zero { what } => write!(f, "{what} must be at least 1"),
            ScheduleError::MicrobatchesNotMultipleOfStages {
                microbatches,
                stages,
            } => write!(
                f,
                "interleaved 1F1B needs the micro-batch count ({microbatches}) to be a multiple \
                 of the pipeline stages ({stages})"
            ),
            ScheduleError::InterleaveWithoutPipeline { chunks } => write!(
                f,
                "interleaving ({chunks} chunks) needs at least 2 pipeline stages"
            ),
        }
    }
}

impl std::error::Error for ScheduleError {}

/// Instruction streams for every pipeline rank of one training step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelineSchedule {
    pub stages: u64,
    pub microbatches: u64,
    /// Model chunks per rank (1 = plain 1F1B).
    pub chunks: u64,
    /// `ranks[i]` is the ordered instruction list of pipeline rank `i`.
    pub ranks: Vec<Vec<Instruction>>,
}

/// Compute steps only, before the transfers are woven in.
#[derive(Clone, Copy)]
enum Compute {
    Forward(u64, u64),
    Backward(u64, u64),
}

impl PipelineSchedule {
    /// Non-interleaved 1F1B (PipeDream-Flush): rank `i` runs `min(pp−i−1, m)` warm-up
    /// forwards, then alternates one forward and one backward, then drains the backwards.
    pub fn one_f_one_b(stages: u64, microbatches: u64) -> Result<Self, ScheduleError> {
        check_nonzero(stages, microbatches, 1)?;
        let ranks = (0..stages)
            .map(|rank| {
                let warmup = (stages - rank - 1).min(microbatches);
                let mut order = Vec::new();
                for mb in 0..warmup {
                    order.push(Compute::Forward(mb, 0));
                }
                for k in 0..microbatches - warmup {
                    order.push(Compute::Forward(k + warmup, 0));
                    order.push(Compute::Backward(k, 0));
                }
                for mb in microbatches - warmup..microbatches {
                    order.push(Compute::Backward(mb, 0));
                }
                weave(stages, 1, rank, &order)
            })
            .collect();
        Ok(PipelineSchedule {
            stages,
            microbatches,
            chunks: 1,
            ranks,
        })
    }

    /// Megatron-LM's interleaved 1F1B (Narayanan et al., SC'21, §2.2): micro-batches advance
    /// through the chunks of a rank in groups of `pp`; warm-up is `2·(pp−i−1) + (v−1)·pp`
    /// chunk-forwards (all of them when `m = pp`).
    pub fn interleaved(stages: u64, microbatches: u64, chunks: u64) -> Result<Self, ScheduleError> {
        check_nonzero(stages, microbatches, chunks)?;
        if chunks == 1 {
            return Self::one_f_one_b(stages, microbatches);
        }
        if stages == 1 {
            return Err(ScheduleError::InterleaveWithoutPipeline { chunks });
        }
        if !microbatches.is_multiple_of(stages) {
            return Err(ScheduleError::MicrobatchesNotMultipleOfStages {
                microbatches,
                stages,
            });
        }
        let total = microbatches * chunks;
        let group = stages * chunks;
        let locate = |k: u64, forward: bool| {
            let in_group = k % group;
            let chunk = in_group / stages;
            let chunk = if forward { chunk } else { chunks - 1 - chunk };
            let mb = (k / group) * stages + in_group % stages;
            (mb, chunk)
        };
        let ranks = (0..stages)
            .map(|rank| {
                let warmup = if microbatches == stages {
                    total
                } else {
                    ((stages - rank - 1) * 2 + (chunks - 1) * stages).min(total)
                };
                let mut order = Vec::new();
                for k in 0..warmup {
                    let (mb, c) = locate(k, true);
                    order.push(Compute::Forward(mb, c));
                }
                for k in 0..total - warmup {
                    let (mb, c) = locate(k + warmup, true);
                    order.push(Compute::Forward(mb, c));
                    let (mb, c) = locate(k, false);
                    order.push(Compute::Backward(mb, c));
                }
                for k in total - warmup..total {
                    let (mb, c) = locate(k, false);
                    order.push(Compute::Backward(mb, c));
                }
                weave(stages, chunks, rank, &order)
            })
            .collect();
        Ok(PipelineSchedule {
            stages,
            microbatches,
            chunks,
            ranks,
        })
    }

    /// Virtual stage of chunk `chunk` on pipeline rank `rank`.
    pub fn virtual_stage(&self, rank: u64, chunk: u64) -> u64 {
        chunk * self.stages + rank
    }

    pub fn virtual_stages(&self) -> u64 {
        self.stages * self.chunks
    }

    /// The key of the message a send or receive instruction of `rank` moves; `None` for
    /// compute and step instructions.
    pub fn message_key(&self, rank: u64, instruction: &Instruction) -> Option<MessageKey> {
        let key = |kind, microbatch, vs| MessageKey {
            kind,
            microbatch,
            sender_virtual_stage: vs,
        };
        match *instruction {
            Instruction::SendActivation {
                microbatch, chunk, ..
            } => Some(key(
                MessageKind::Activation,
                microbatch,
                self.virtual_stage(rank, chunk),
            )),
            Instruction::RecvActivation {
                microbatch, chunk, ..
            } => Some(key(
                MessageKind::Activation,
                microbatch,
                self.virtual_stage(rank, chunk) - 1,
            )),
            Instruction::SendGrad {
                microbatch, chunk, ..
            } => Some(key(
                MessageKind::Grad,
                microbatch,
                self.virtual_stage(rank, chunk),
            )),
            Instruction::RecvGrad {
                microbatch, chunk, ..
            } => Some(key(
                MessageKind::Grad,
                microbatch,
                self.virtual_stage(rank, chunk) + 1,
            )),
            _ => None,
        }
    }

    /// Runs the schedule as a discrete-event simulation: each forward of one chunk takes
    /// `forward` time units and each backward `backward`; transfers take no time; a receive
    /// waits for its send. Returns each rank's finishing time, or the ranks that are stuck
    /// waiting when the schedule deadlocks.
    pub fn simulate(&self, forward: f64, backward: f64) -> Result<Vec<f64>, Vec<u64>> {
        let n = self.ranks.len();
        let mut pc = vec![0usize; n];
        let mut clock = vec![0.0f64; n];
        let mut sent: HashMap<MessageKey, f64> = HashMap::new();
        loop {
            let mut progressed = false;
            for rank in 0..n {
                while let Some(instr) = self.ranks[rank].get(pc[rank]) {
                    match instr {
                        Instruction::Forward { .. } => clock[rank] += forward,
                        Instruction::Backward { .. } => clock[rank] += backward,
                        Instruction::SendActivation { .. } | Instruction::SendGrad { .. } => {
                            let key = self.message_key(rank as u64, instr).expect("send");
                            sent.insert(key, clock[rank]);
                        }
                        Instruction::RecvActivation { .. } | Instruction::RecvGrad { .. } => {
                            let key = self.message_key(rank as u64, instr).expect("recv");
                            match sent.get(&key) {
                                Some(&t) => clock[rank] = clock[rank].max(t),
                                None => break,
                            }
                        }
                        Instruction::ReduceGradients | Instruction::OptimizerStep => {}
                    }
                    pc[rank] += 1;
                    progressed = true;
                }
            }
            let stuck: Vec<u64> = (0..n)
                .filter(|&r| pc[r] < self.ranks[r].len())
                .map(|r| r as u64)
                .collect();
            if stuck.is_empty() {
                return Ok(clock);
            }
            if !progressed {
                return Err(stuck);
            }
        }
    }

    /// Largest number of micro-batches each rank holds activations for at once (forwarded
    /// through a chunk but not yet backwarded), counted per (micro-batch, chunk).
    pub fn peak_in_flight(&self) -> Vec<u64> {
        self.ranks
            .iter()
            .map(|instrs| {
                let mut live: BTreeSet<(u64, u64)> = BTreeSet::new();
                let mut peak = 0u64;
                for instr in instrs {
                    match *instr {
                        Instruction::Forward { microbatch, chunk } => {
                            live.insert((microbatch, chunk));
                            peak = peak.max(live.len() as u64);
                        }
                        Instruction::Backward { microbatch, chunk } => {
                            live.remove(&(microbatch, chunk));
                        }
                        _ => {}
                    }
                }
                peak
            })
            .collect()
    }

    /// Every send paired with exactly one receive on the named peer (and vice versa).
    pub fn unmatched_messages(&self) -> Vec<MessageKey> {
        let mut balance: BTreeMap<MessageKey, (i64, Option<(u64, u64)>)> = BTreeMap::new();
        for (rank, instrs) in self.ranks.iter().enumerate() {
            for instr in instrs {
                let Some(key) = self.message_key(rank as u64, instr) else {
                    continue;
                };
                let entry = balance.entry(key).or_insert((0, None));
                match *instr {
                    Instruction::SendActivation { peer, .. }
                    | Instruction::SendGrad { peer, .. } => {
                        entry.0 += 1;
                        let pair = (rank as u64, peer);
                        check_pair(entry, pair);
                    }
                    Instruction::RecvActivation { peer, .. }
                    | Instruction::RecvGrad { peer, .. } => {
                        entry.0 -= 1;
                        let pair = (peer, rank as u64);
                        check_pair(entry, pair);
                    }
                    _ => {}
                }
            }
        }
        balance
            .into_iter()
            .filter(|(_, (count, _))| *count != 0)
            .map(|(key, _)| key)
            .collect()
    }
}

/// Records the (sender, receiver) pair of a message; a mismatch makes the count unbalanced.
fn check_pair(entry: &mut (i64, Option<(u64, u64)>), pair: (u64, u64)) {
    match entry.1 {
        None => entry.1 = Some(pair),
        Some(existing) if existing != pair => entry.0 += 1_000_000,
        Some(_) => {}
    }
}

fn check_nonzero(stages: u64, microbatches: u64, chunks: u64) -> Result<(), ScheduleError> {
    if stages == 0 {
        return Err(ScheduleError::Zero {
            what: "pipeline stages",
        });
    }
    if microbatches == 0 {
        return Err(ScheduleError::Zero {
            what: "micro-batches",
        });
    }
    if chunks == 0 {
        return Err(ScheduleError::Zero {
            what: "model chunks",
        });
    }
    Ok(())
}

/// Adds the transfers around each compute step and the closing reduction and step.
fn weave(stages: u64, chunks: u64, rank: u64, order: &[Compute]) -> Vec<Instruction> {
    let last = stages * chunks - 1;
    let next = (rank + 1) % stages;
    let prev = (rank + stages - 1) % stages;
    let mut out = Vec::with_capacity(order.len() * 3 + 2);
    for step in order {
        match *step {
            Compute::Forward(microbatch, chunk) => {
                let vs = chunk * stages + rank;
                if vs > 0 {
                    out.push(Instruction::RecvActivation {
                        microbatch,
                        chunk,
                        peer: prev,
                    });
                }
                out.push(Instruction::Forward { microbatch, chunk });
                if vs < last {
                    out.push(Instruction::SendActivation {
                        microbatch,
                        chunk,
                        peer: next,
                    });
                }
            }
            Compute::Backward(microbatch, chunk) => {
                let vs = chunk * stages + rank;
                if vs < last {
                    out.push(Instruction::RecvGrad {
                        microbatch,
                        chunk,
                        peer: next,
                    });
                }
                out.push(Instruction::Backward { microbatch, chunk });
                if vs > 0 {
                    out.push(Instruction::SendGrad {
                        microbatch,
                        chunk,
                        peer: prev,
                    });
                }
            }
        }
    }
    out.push(Instruction::ReduceGradients);
    out.push(Instruction::OptimizerStep);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_shapes() -> Vec<PipelineSchedule> {
        let mut out = Vec::new();
        for p in 1..=6 {
            for m in 1..=12 {
                out.push(PipelineSchedule::one_f_one_b(p, m).unwrap());
            }
        }
        for p in 2..=5 {
            for v in 2..=4 {
                for k in 1..=4 {
                    out.push(PipelineSchedule::interleaved(p, p * k, v).unwrap());
                }
            }
        }
        out
    }

    #[test]
    fn every_forward_precedes_its_backward_and_each_runs_once() {
        for s in all_shapes() {
            for instrs in &s.ranks {
                let mut forwarded = BTreeSet::new();
                let mut backwarded = BTreeSet::new();
                for instr in instrs {
                    match *instr {
                        Instruction::Forward { microbatch, chunk } => {
                            assert!(forwarded.insert((microbatch, chunk)));
                        }
                        Instruction::Backward { microbatch, chunk } => {
                            assert!(forwarded.contains(&(microbatch, chunk)));
                            assert!(backwarded.insert((microbatch, chunk)));
                        }
                        _ => {}
                    }
                }
                assert_eq!(forwarded.len() as u64, s.microbatches * s.chunks);
                assert_eq!(forwarded, backwarded);
                assert_eq!(
                    &instrs[instrs.len() - 2..],
                    &[Instruction::ReduceGradients, Instruction::OptimizerStep]
                );
            }
        }
    }

    #[test]
    fn one_f_one_b_bounds_in_flight_microbatches() {
        for p in 1..=6u64 {
            for m in 1..=12u64 {
                let s = PipelineSchedule::one_f_one_b(p, m).unwrap();
                let peaks = s.peak_in_flight();
                for (i, peak) in peaks.iter().enumerate() {
                    assert_eq!(*peak, (p - i as u64).min(m), "p={p} m={m} rank={i}");
                }
            }
        }
    }

    #[test]
    fn sends_and_receives_pair_up() {
        for s in all_shapes() {
            assert!(s.unmatched_messages().is_empty());
        }
    }

    #[test]
    fn a_dropped_receive_is_detected() {
        let mut s = PipelineSchedule::one_f_one_b(3, 4).unwrap();
        let at = s.ranks[1]
            .iter()
            .position(|i| matches!(i, Instruction::RecvActivation { .. }))
            .unwrap();
        s.ranks[1].remove(at);
        assert_eq!(s.unmatched_messages().len(), 1);
    }

    #[test]
    fn no_schedule_deadlocks() {
        for s in all_shapes() {
            assert!(
                s.simulate(1.0, 2.0).is_ok(),
                "p={} m={}",
                s.stages,
                s.microbatches
            );
        }
    }

    #[test]
    fn a_reordered_schedule_deadlocks_in_simulation() {
        let mut s = PipelineSchedule::one_f_one_b(2, 2).unwrap();
        // Rank 0 waiting for a gradient before it sent the activation that produces it.
        let recv = s.ranks[0]
            .iter()
            .position(|i| matches!(i, Instruction::RecvGrad { .. }))
            .unwrap();
        let instr = s.ranks[0].remove(recv);
        s.ranks[0].insert(0, instr);
        assert_eq!(s.simulate(1.0, 2.0), Err(vec![0, 1]));
    }

    #[test]
    fn one_f_one_b_makespan_is_m_plus_p_minus_1_steps() {
        for (f, b) in [(1.0, 1.0), (1.0, 2.0), (3.0, 5.0)] {
            for p in 1..=6u64 {
                for m in 1..=12u64 {
                    let s = PipelineSchedule::one_f_one_b(p, m).unwrap();
                    let end = s.simulate(f, b).unwrap();
                    let makespan = end.iter().cloned().fold(0.0, f64::max);
                    assert_eq!(makespan, (m + p - 1) as f64 * (f + b), "p={p} m={m}");
                }
            }
        }
    }

    #[test]
    fn interleaved_bubble_shrinks_by_the_chunk_count() {
        // Narayanan et al. 2021: with per-chunk times f/v and b/v the bubble is (p−1)(f+b)/v,
        // so the makespan in chunk units is (m·v + p − 1)·(f_c + b_c).
        for (f, b) in [(1.0, 1.0), (1.0, 2.0)] {
            for p in 2..=5u64 {
                for v in 2..=4u64 {
                    for k in 2..=4u64 {
                        let m = p * k;
                        let s = PipelineSchedule::interleaved(p, m, v).unwrap();
                        let end = s.simulate(f, b).unwrap();
                        let makespan = end.iter().cloned().fold(0.0, f64::max);
                        assert_eq!(
                            makespan,
                            (m * v + p - 1) as f64 * (f + b),
                            "p={p} v={v} m={m}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn interleaved_rejects_bad_counts() {
        assert_eq!(
            PipelineSchedule::interleaved(4, 6, 2),
            Err(ScheduleError::MicrobatchesNotMultipleOfStages {
                microbatches: 6,
                stages: 4
            })
        );
        assert!(PipelineSchedule::interleaved(1, 4, 2).is_err());
        assert!(PipelineSchedule::one_f_one_b(0, 4).is_err());
        assert!(PipelineSchedule::one_f_one_b(2, 0).is_err());
        let plain = PipelineSchedule::interleaved(3, 5, 1).unwrap();
        assert_eq!(plain, PipelineSchedule::one_f_one_b(3, 5).unwrap());
    }

    #[test]
    fn interleaved_warmup_follows_megatron() {
        // p=2, v=2, m=4: rank 0 warms up with 2·1 + 1·2 = 4 chunk-forwards.
        let s = PipelineSchedule::interleaved(2, 4, 2).unwrap();
        let computes: Vec<_> = s.ranks[0]
            .iter()
            .filter(|i| {
                matches!(
                    i,
                    Instruction::Forward { .. } | Instruction::Backward { .. }
                )
            })
            .take(6)
            .copied()
            .collect();
        let f = |microbatch, chunk| Instruction::Forward { microbatch, chunk };
        let b = |microbatch, chunk| Instruction::Backward { microbatch, chunk };
        assert_eq!(
            computes,
            vec![f(0, 0), f(1, 0), f(0, 1), f(1, 1), f(2, 0), b(0, 1)]
        );
    }
}
