//! One rank's training loop: builds the rank's parameter shards, follows its pipeline
//! instruction stream for every step, reduces gradients over the replicas (ZeRO 0–3) and
//! applies Adam.

use crate::backend::{AdamParams, Backend};
use crate::checkpoint::{
    commit, snapshot_folder, write_rank, write_records, Checkpoint, InjectedFailure, ShardRecord,
    StateKind, StatePiece,
};
use crate::compression::Compressor;
use crate::data::TokenStream;
use crate::error::RuntimeError;
use crate::init::init_block;
use crate::memory::{MemoryCategory, MemoryPeaks, MemoryTracker};
use crate::mesh::{Coords, GroupKind, Mesh};
use crate::model::block::{self, BlockCtx, Keep};
use crate::model::embedding::{self, EmbedCtx, HeadCtx};
use crate::model::layout::{adapter_group_name, rank_groups, GroupSpec, ParamSpec};
use crate::model::{Env, Grads, Values};
use crate::plan::ExecutionPlan;
use crate::trace::{CollectiveRecord, MatmulRecord, TraceEvent};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Instant;
use tessel_grammar::{ModelSpec, Recompute};
use tessel_planner::schedule::{Instruction, MessageKind, PipelineSchedule};

/// What every rank shares.
pub struct RunSetup<'a> {
    pub model: &'a ModelSpec,
    pub plan: &'a ExecutionPlan,
    pub schedule: &'a PipelineSchedule,
    pub stream: &'a TokenStream,
    pub steps: usize,
    /// The checkpoint the run resumes from: parameters and Adam's moments from it, steps
    /// (data and bias correction) numbered on from its step.
    pub resume: Option<&'a Checkpoint>,
    /// Where the run writes checkpoints: after the last step, and every `snapshot_every`
    /// steps when set.
    pub checkpoint_to: Option<&'a Path>,
    pub snapshot_every: Option<u64>,
    /// A failure to inject, for tests of recovery: this rank fails as this step starts.
    pub fail_at: Option<InjectedFailure>,
    pub adam: AdamParams,
    pub collect_parameters: bool,
    pub start: Instant,
}

/// What a rank reports back.
pub struct RankOutput {
    pub rank: usize,
    /// Global loss of each step (every rank holds the same values).
    pub losses: Vec<f64>,
    pub step_times: Vec<f64>,
    pub peaks: MemoryPeaks,
    pub events: Vec<TraceEvent>,
    /// The matmuls the backend timed, by shape.
    pub matmuls: Vec<MatmulRecord>,
    /// Elements read from each rank of the checkpoint resumed, by that rank.
    pub resumed_from: BTreeMap<u64, u64>,
    /// Local parameter shards after the last step (when asked for).
    pub parameters: Vec<(ParamSpec, Vec<f32>)>,
}

struct GroupState<T> {
    spec: GroupSpec,
    len: usize,
    padded: usize,
    /// ZeRO-3: the owned slice of the flat parameter buffer.
    shard: Option<T>,
    adam_m: T,
    adam_v: T,
    /// Reduced gradient: the whole flat buffer (ZeRO 0–1) or this rank's slice (ZeRO 2–3).
    reduced: Option<T>,
}

enum Piece<T> {
    Embed(EmbedCtx),
    Block(u64, BlockCtx<T>),
    Head(HeadCtx<T>),
}

/// What a forward keeps for its backward, and the bytes it holds.
type Stashed<T> = (Vec<Piece<T>>, u64);

struct Rank<'a, B: Backend> {
    b: &'a B,
    rank: usize,
    setup: &'a RunSetup<'a>,
    mesh: Mesh,
    coords: Coords,
    groups: Vec<GroupState<B::Tensor>>,
    values: Values<B::Tensor>,
    grads: Grads<B::Tensor>,
    grad_bytes: u64,
    /// Gradient compression's state, where the plan compresses.
    compressor: Option<Compressor<B::Tensor>>,
    memory: MemoryTracker,
    stash: HashMap<(u64, u64), Stashed<B::Tensor>>,
    outbox: HashMap<(u64, u64), B::Tensor>,
    inbox: HashMap<(u64, u64), B::Tensor>,
    grad_inbox: HashMap<(u64, u64), B::Tensor>,
    grad_outbox: HashMap<(u64, u64), B::Tensor>,
    events: Vec<TraceEvent>,
    loss: f64,
    step: usize,
    opt_step: u64,
    /// Elements read from each rank of the checkpoint resumed.
    resumed_from: BTreeMap<u64, u64>,
}

pub fn run_rank<B: Backend>(
    b: &B,
    rank: usize,
    setup: &RunSetup,
) -> Result<RankOutput, RuntimeError> {
    let mut r = Rank::new(b, rank, setup)?;
    let mut losses = Vec::with_capacity(setup.steps);
    let mut step_times = Vec::with_capacity(setup.steps);
    let first_step = setup.resume.map_or(0, |c| c.manifest.step as usize);
    let last_step = first_step + setup.steps;
    for step in first_step..last_step {
        let done = step as u64 + 1;
        if setup
            .fail_at
            .is_some_and(|f| f.rank == rank && f.step == done)
        {
            return Err(RuntimeError::RankFailed {
                rank,
                reason: format!("failure injected as step {done} started"),
            });
        }
        let t0 = Instant::now();
        r.step = step;
        r.loss = 0.0;
        let stage = r.coords.pp as usize;
        for instr in &setup.schedule.ranks[stage] {
            r.execute(instr)?;
        }
        let total = b.all_reduce(GroupKind::World, &b.tensor(vec![r.loss as f32], 1, 1))?;
        losses.push(f64::from(b.to_vec(&total)[0]));
        step_times.push(t0.elapsed().as_secs_f64());
        if let Some(dir) = setup.checkpoint_to {
            let due = setup.snapshot_every.is_some_and(|n| done.is_multiple_of(n));
            if due || step + 1 == last_step {
                r.snapshot(dir, done)?;
            }
        }
    }
    // Peaks of training only: collecting the parameters gathers ZeRO-3 shards.
    let peaks = r.memory.peaks();
    let parameters = if setup.collect_parameters {
        r.parameters()?
    } else {
        Vec::new()
    };
    Ok(RankOutput {
        rank,
        losses,
        step_times,
        peaks,
        events: r.events,
        matmuls: b.timed_matmuls(),
        resumed_from: std::mem::take(&mut r.resumed_from),
        parameters,
    })
}

fn add_sources(total: &mut BTreeMap<u64, u64>, more: BTreeMap<u64, u64>) {
    for (rank, elements) in more {
        *total.entry(rank).or_insert(0) += elements;
    }
}

fn keep_for(recompute: Recompute, position_in_stage: usize) -> Keep {
    match recompute {
        Recompute::None => Keep::Everything,
        Recompute::Selective => Keep::AllButAttentionCore,
        Recompute::Full => Keep::InputOnly,
        Recompute::Partial { full_layers } if (position_in_stage as u64) < full_layers => {
            Keep::InputOnly
        }
        Recompute::Partial { .. } => Keep::Everything,
        // `ExecutionPlan::validate` rejects module recompute; keep what selective keeps.
        Recompute::Modules(_) => Keep::AllButAttentionCore,
    }
}

fn message_tag(kind: MessageKind, microbatch: u64, sender_virtual_stage: u64) -> u64 {
    let k = match kind {
        MessageKind::Activation => 0,
        MessageKind::Grad => 1,
    };
    k | (microbatch << 1) | (sender_virtual_stage << 40)
}

impl<'a, B: Backend> Rank<'a, B> {
    fn new(b: &'a B, rank: usize, setup: &'a RunSetup<'a>) -> Result<Self, RuntimeError> {
        let plan = setup.plan;
        let model = setup.model;
        let mesh = Mesh::new(plan);
        let coords = mesh.coords(rank as u64);
        let offload = &plan.offload[coords.pp as usize];
        let memory = MemoryTracker::new([
            offload.weights,
            offload.gradients,
            offload.optimizer,
            offload.activations,
        ]);
        let specs = rank_groups(model, plan, coords);
        let frozen = specs
            .iter()
            .filter(|g| g.frozen)
            .flat_map(|g| g.params.iter().map(|p| p.name.clone()))
            .collect();
        let mut r = Rank {
            b,
            rank,
            setup,
            mesh,
            coords,
            groups: Vec::new(),
            values: BTreeMap::new(),
            grads: Grads::new(frozen),
            grad_bytes: 0,
            compressor: plan
                .compression
                .as_ref()
                .map(|c| Compressor::new(c.method, plan.seed)),
            memory,
            stash: HashMap::new(),
            outbox: HashMap::new(),
            inbox: HashMap::new(),
            grad_inbox: HashMap::new(),
            grad_outbox: HashMap::new(),
            events: Vec::new(),
            loss: 0.0,
            step: 0,
            opt_step: setup.resume.map_or(0, |c| c.manifest.step),
            resumed_from: BTreeMap::new(),
        };
        for spec in specs {
            r.add_group(spec)?;
        }
        Ok(r)
    }

    fn zero(&self) -> u8 {
        self.setup.plan.zero
    }

    fn add_group(&mut self, spec: GroupSpec) -> Result<(), RuntimeError> {
        let b = self.b;
        let seed = self.setup.plan.seed;
        let resume = self.setup.resume;
        for p in &spec.params {
            let (rows, cols) = p.local_shape();
            // Adapters a checkpoint lacks (fine-tuning from a pretrained model's) start anew.
            let adapter = |c: &Checkpoint| {
                crate::model::lora::is_adapter(&p.name) && !c.has(&p.name, StateKind::Param)
            };
            let data = match resume.filter(|c| !adapter(c)) {
                Some(checkpoint) => {
                    let (data, sources) = checkpoint.block_with_sources(p, StateKind::Param)?;
                    add_sources(&mut self.resumed_from, sources);
                    data
                }
                None => init_block(seed, &p.name, p.cols, p.row_range(), p.col_range(), p.init),
            };
            self.values
                .insert(p.name.clone(), b.tensor(data, rows, cols));
        }
        let replicas = b.group_size(spec.replication);
        let len: usize = spec.params.iter().map(|p| p.local_len()).sum();
        let padded = len.div_ceil(replicas) * replicas;
        let (owned, first) = if spec.frozen {
            // Frozen parameters have no optimizer state.
            (0, 0)
        } else if self.zero() >= 1 {
            let owned = padded / replicas;
            (owned, b.group_index(spec.replication) * owned)
        } else {
            (padded, 0)
        };
        // Adam's moments: zero, or this rank's part of the group's flat buffer of them.
        let mut sources = BTreeMap::new();
        let mut moment = |state: StateKind| -> Result<B::Tensor, RuntimeError> {
            // Frozen groups have no moments; adapters new to the checkpoint start at zero.
            let held = |c: &&Checkpoint| spec.params.iter().all(|p| c.has(&p.name, state));
            let Some(checkpoint) = resume.filter(|c| owned > 0 && held(c)) else {
                return Ok(b.zeros(owned, 1));
            };
            let mut flat = Vec::with_capacity(padded);
            for p in &spec.params {
                let (data, from) = checkpoint.block_with_sources(p, state)?;
                add_sources(&mut sources, from);
                flat.extend(data);
            }
            flat.resize(padded, 0.0);
            Ok(b.tensor(flat[first..first + owned].to_vec(), owned, 1))
        };
        let (adam_m, adam_v) = (moment(StateKind::AdamM)?, moment(StateKind::AdamV)?);
        add_sources(&mut self.resumed_from, sources);
        let mut state = GroupState {
            spec,
            len,
            padded,
            shard: None,
            adam_m,
            adam_v,
            reduced: None,
        };
        self.memory
            .alloc(MemoryCategory::Optimizer, 2 * (owned * 4) as u64);
        if self.zero() == 3 {
            let flat = self.flatten(&state, false)?;
            let i = b.group_index(state.spec.replication);
            state.shard = Some(b.slice_rows(&flat, i * owned, (i + 1) * owned));
            for p in &state.spec.params {
                self.values.remove(&p.name);
            }
            self.memory
                .alloc(MemoryCategory::Weights, (owned * 4) as u64);
        } else {
            self.memory.alloc(MemoryCategory::Weights, (len * 4) as u64);
        }
        self.groups.push(state);
        Ok(())
    }

    /// The group's parameters (or gradients) as one zero-padded `padded×1` column.
    fn flatten(&self, g: &GroupState<B::Tensor>, grads: bool) -> Result<B::Tensor, RuntimeError> {
        let b = self.b;
        let mut parts = Vec::with_capacity(g.spec.params.len() + 1);
        for p in &g.spec.params {
            let source = if grads { &self.grads.map } else { &self.values };
            let t = match source.get(&p.name) {
                Some(t) => b.reshape(t, p.local_len(), 1),
                None if grads => b.zeros(p.local_len(), 1),
                None => {
                    return Err(RuntimeError::InvalidModel {
                        reason: format!("parameter {} is not materialised", p.name),
                    })
                }
            };
            parts.push(t);
        }
        if g.padded > g.len {
            parts.push(b.zeros(g.padded - g.len, 1));
        }
        Ok(b.concat_rows(&parts.iter().collect::<Vec<_>>()))
    }

    fn unflatten(&mut self, gi: usize, flat: &B::Tensor) {
        let b = self.b;
        let mut offset = 0;
        for p in &self.groups[gi].spec.params {
            let (rows, cols) = p.local_shape();
            let t = b.slice_rows(flat, offset, offset + rows * cols);
            self.values
                .insert(p.name.clone(), b.reshape(&t, rows, cols));
            offset += rows * cols;
        }
    }

    fn group_indices(&self, names: &[String]) -> Vec<usize> {
        self.groups
            .iter()
            .enumerate()
            .filter(|(_, g)| names.contains(&g.spec.name))
            .map(|(i, _)| i)
            .collect()
    }

    fn layer_group_names(layer: u64) -> Vec<String> {
        vec![
            format!("layers.{layer}"),
            format!("layers.{layer}.experts"),
            adapter_group_name(layer),
        ]
    }

    /// ZeRO-3: all-gather the full parameters of these groups just before use; they are
    /// counted as buffers (the cost model's gathered layers) until [`Self::release`].
    fn materialize(&mut self, names: &[String]) -> Result<(), RuntimeError> {
        if self.zero() < 3 {
            return Ok(());
        }
        for gi in self.group_indices(names) {
            let g = &self.groups[gi];
            let shard = g.shard.as_ref().expect("ZeRO-3 keeps a shard");
            let ranks = self.b.group_size(g.spec.replication);
            let t0 = Instant::now();
            let full = self.b.all_gather(g.spec.replication, shard)?;
            let gathered = (g.len * 4) as u64;
            self.record_collective("all_gather", self.b.bytes(&full), ranks, t0);
            self.memory.alloc(MemoryCategory::Buffers, gathered);
            self.unflatten(gi, &full);
        }
        Ok(())
    }

    /// ZeRO-3: drop the gathered parameters again.
    fn release(&mut self, names: &[String]) {
        if self.zero() < 3 {
            return;
        }
        for gi in self.group_indices(names) {
            for p in &self.groups[gi].spec.params {
                self.values.remove(&p.name);
            }
            self.memory
                .free(MemoryCategory::Buffers, (self.groups[gi].len * 4) as u64);
        }
    }

    fn env(&self) -> Env<'a, B> {
        let plan = self.setup.plan;
        Env {
            b: self.b,
            model: self.setup.model,
            tp: plan.tp as usize,
            tp_index: self.coords.tp as usize,
            sequence_parallel: plan.sequence_parallel,
            cp: plan.cp as usize,
            cp_index: self.coords.cp as usize,
            batch: plan.microbatch as usize,
            seq_chunk: (plan.seq_len / plan.cp) as usize,
            chunk_len: (plan.seq_len / plan.cp_chunks()) as usize,
            cp_next_rank: self.cp_neighbour(1),
            cp_prev_rank: self.cp_neighbour(plan.cp - 1),
            adapters: plan.adapters,
            memory_saving_kernels: plan.memory_saving_kernels,
        }
    }

    /// Global rank of the context rank `step` places further along the ring.
    fn cp_neighbour(&self, step: u64) -> usize {
        let c = &self.coords;
        let cp = (c.cp + step) % self.setup.plan.cp;
        self.mesh.rank_of(c.pp, c.dp, cp, c.tp) as usize
    }

    /// Inputs and targets of micro-batch `mb` on this rank: per context chunk it holds, the
    /// chunk of every sequence (chunk-major, then batch-major; see [`Env::chunk_len`]).
    fn microbatch_tokens(&self, mb: u64) -> (Vec<u32>, Vec<u32>) {
        let plan = self.setup.plan;
        let env = self.env();
        let per_replica = plan.microbatch * plan.microbatches;
        let len = env.chunk_len;
        let mut inputs = Vec::new();
        let mut targets = Vec::new();
        for chunk in env.chunks() {
            let start = chunk * len;
            for i in 0..plan.microbatch {
                let index = self.coords.dp * per_replica + mb * plan.microbatch + i;
                let seq = self.setup.stream.sequence(self.step, index as usize);
                inputs.extend_from_slice(&seq[start..start + len]);
                targets.extend_from_slice(&seq[start + 1..start + len + 1]);
            }
        }
        (inputs, targets)
    }

    fn virtual_stage(&self, chunk: u64) -> u64 {
        chunk * self.setup.plan.pp + self.coords.pp
    }

    fn last_virtual_stage(&self) -> u64 {
        self.setup.plan.pp * self.setup.plan.interleave - 1
    }

    fn peer_rank(&self, stage: u64) -> usize {
        self.mesh
            .rank_of(stage, self.coords.dp, self.coords.cp, self.coords.tp) as usize
    }

    fn record(&mut self, name: String, category: &'static str, t0: Instant) {
        self.push_event(name, category, t0, None);
    }

    /// A data-parallel collective inside the gradient reduction, with what it moved.
    fn record_collective(&mut self, name: &str, bytes: u64, ranks: usize, t0: Instant) {
        let record = CollectiveRecord {
            bytes,
            ranks: ranks as u64,
        };
        self.push_event(name.to_string(), "collective", t0, Some(record));
    }

    fn push_event(
        &mut self,
        name: String,
        category: &'static str,
        t0: Instant,
        collective: Option<CollectiveRecord>,
    ) {
        let start = t0.duration_since(self.setup.start).as_secs_f64() * 1e6;
        self.events.push(TraceEvent {
            rank: self.rank,
            name,
            category,
            start_us: start,
            duration_us: t0.elapsed().as_secs_f64() * 1e6,
            collective,
        });
    }

    fn execute(&mut self, instr: &Instruction) -> Result<(), RuntimeError> {
        let t0 = Instant::now();
        let b = self.b;
        match *instr {
            Instruction::Forward { microbatch, chunk } => {
                self.forward(microbatch, chunk)?;
                self.record(format!("forward mb{microbatch} c{chunk}"), "forward", t0);
            }
            Instruction::Backward { microbatch, chunk } => {
                self.backward(microbatch, chunk)?;
                self.record(format!("backward mb{microbatch} c{chunk}"), "backward", t0);
            }
            Instruction::SendActivation {
                microbatch,
                chunk,
                peer,
            } => {
                let t = self
                    .outbox
                    .remove(&(microbatch, chunk))
                    .ok_or_else(|| missing("activation", microbatch, chunk))?;
                let tag = message_tag(
                    MessageKind::Activation,
                    microbatch,
                    self.virtual_stage(chunk),
                );
                b.send(self.peer_rank(peer), tag, &t)?;
                self.record(format!("send act mb{microbatch}"), "comm", t0);
            }
            Instruction::RecvActivation {
                microbatch,
                chunk,
                peer,
            } => {
                let tag = message_tag(
                    MessageKind::Activation,
                    microbatch,
                    self.virtual_stage(chunk) - 1,
                );
                let t = b.recv(self.peer_rank(peer), tag)?;
                self.inbox.insert((microbatch, chunk), t);
                self.record(format!("recv act mb{microbatch}"), "comm", t0);
            }
            Instruction::SendGrad {
                microbatch,
                chunk,
                peer,
            } => {
                let t = self
                    .grad_outbox
                    .remove(&(microbatch, chunk))
                    .ok_or_else(|| missing("gradient", microbatch, chunk))?;
                let tag = message_tag(MessageKind::Grad, microbatch, self.virtual_stage(chunk));
                b.send(self.peer_rank(peer), tag, &t)?;
                self.record(format!("send grad mb{microbatch}"), "comm", t0);
            }
            Instruction::RecvGrad {
                microbatch,
                chunk,
                peer,
            } => {
                let tag = message_tag(MessageKind::Grad, microbatch, self.virtual_stage(chunk) + 1);
                let t = b.recv(self.peer_rank(peer), tag)?;
                self.grad_inbox.insert((microbatch, chunk), t);
                self.record(format!("recv grad mb{microbatch}"), "comm", t0);
            }
            Instruction::ReduceGradients => {
                self.reduce_gradients()?;
                self.record("reduce gradients".into(), "comm", t0);
            }
            Instruction::OptimizerStep => {
                self.optimizer_step()?;
                self.record("optimizer step".into(), "optimizer", t0);
            }
        }
        Ok(())
    }

    fn forward(&mut self, mb: u64, chunk: u64) -> Result<(), RuntimeError> {
        let plan = self.setup.plan;
        let vs = self.virtual_stage(chunk);
        let env = self.env();
        let (inputs, targets) = self.microbatch_tokens(mb);
        let mut pieces = Vec::new();
        let mut x = if vs == 0 {
            let names = vec!["embedding".to_string()];
            self.materialize(&names)?;
            let (x, ctx) = embedding::forward(&env, &self.values, &inputs)?;
            self.release(&names);
            pieces.push(Piece::Embed(ctx));
            x
        } else {
            self.inbox
                .remove(&(mb, chunk))
                .ok_or_else(|| missing("received activation", mb, chunk))?
        };
        let (start, end) = plan.chunk_layers[vs as usize];
        let stage_layers = plan.stage_layers(self.coords.pp);
        let recompute = plan.recompute[self.coords.pp as usize];
        for layer in start..end {
            let position = stage_layers.iter().position(|&l| l == layer).unwrap_or(0);
            let names = Self::layer_group_names(layer);
            self.materialize(&names)?;
            let (y, ctx) =
                block::forward(&env, &self.values, layer, &x, keep_for(recompute, position))?;
            self.release(&names);
            pieces.push(Piece::Block(layer, ctx));
            x = y;
        }
        if vs == self.last_virtual_stage() {
            let names = vec!["head".to_string(), "embedding".to_string()];
            self.materialize(&names)?;
            let scale = 1.0 / (plan.global_batch() * plan.seq_len) as f32;
            let (loss, ctx) = embedding::forward_loss(&env, &self.values, &x, &targets, scale)?;
            self.release(&names);
            // Every tensor rank computes the same loss of all the micro-batch's tokens.
            if self.coords.tp == 0 {
                self.loss += loss;
            }
            pieces.push(Piece::Head(ctx));
        } else {
            self.outbox.insert((mb, chunk), x);
        }
        let bytes = self.pieces_bytes(&pieces);
        self.memory.alloc(MemoryCategory::Activations, bytes);
        self.stash.insert((mb, chunk), (pieces, bytes));
        Ok(())
    }

    fn ctx_bytes(&self, ctx: &BlockCtx<B::Tensor>) -> u64 {
        ctx.tensors().iter().map(|t| self.b.bytes(t)).sum()
    }

    fn pieces_bytes(&self, pieces: &[Piece<B::Tensor>]) -> u64 {
        pieces
            .iter()
            .map(|p| match p {
                Piece::Embed(_) => 0,
                Piece::Block(_, c) => self.ctx_bytes(c),
                Piece::Head(c) => c.tensors().iter().map(|t| self.b.bytes(t)).sum(),
            })
            .sum()
    }

    fn backward(&mut self, mb: u64, chunk: u64) -> Result<(), RuntimeError> {
        let vs = self.virtual_stage(chunk);
        let env = self.env();
        let (pieces, bytes) = self
            .stash
            .remove(&(mb, chunk))
            .ok_or_else(|| missing("stashed forward", mb, chunk))?;
        let mut dx = if vs == self.last_virtual_stage() {
            None
        } else {
            Some(
                self.grad_inbox
                    .remove(&(mb, chunk))
                    .ok_or_else(|| missing("received gradient", mb, chunk))?,
            )
        };
        for piece in pieces.into_iter().rev() {
            let names = match piece {
                Piece::Head(ctx) => {
                    let names = vec!["head".to_string(), "embedding".to_string()];
                    self.materialize(&names)?;
                    dx = Some(embedding::backward_loss(
                        &env,
                        &self.values,
                        &mut self.grads,
                        &ctx,
                    )?);
                    names
                }
                Piece::Block(layer, ctx) => {
                    let names = Self::layer_group_names(layer);
                    self.materialize(&names)?;
                    let d = dx
                        .take()
                        .ok_or_else(|| missing("output gradient", mb, chunk))?;
                    // A fully recomputed layer holds its whole activations again until its
                    // backward is done (the stash already counts its input).
                    let kept = self.ctx_bytes(&ctx);
                    let ctx = block::recompute(&env, &self.values, layer, ctx)?;
                    let rebuilt = self.ctx_bytes(&ctx) - kept;
                    self.memory.alloc(MemoryCategory::Activations, rebuilt);
                    dx = Some(block::backward(
                        &env,
                        &self.values,
                        &mut self.grads,
                        layer,
                        ctx,
                        &d,
                    )?);
                    self.memory.free(MemoryCategory::Activations, rebuilt);
                    names
                }
                Piece::Embed(ctx) => {
                    let names = vec!["embedding".to_string()];
                    self.materialize(&names)?;
                    let d = dx
                        .take()
                        .ok_or_else(|| missing("output gradient", mb, chunk))?;
                    embedding::backward(&env, &self.values, &mut self.grads, &ctx, &d)?;
                    names
                }
            };
            self.track_gradient_bytes();
            self.release(&names);
            if self.zero() >= 2 {
                // The head's backward also produces the tied embedding's gradient when both
                // live here; that group is reduced after the embedding's own backward.
                let own = if names[0] == "head" {
                    &names[..1]
                } else {
                    &names[..]
                };
                for gi in self.group_indices(own) {
                    if !self.groups[gi].spec.frozen {
                        self.scatter_microbatch_gradients(gi)?;
                    }
                }
                self.track_gradient_bytes();
            }
        }
        self.memory.free(MemoryCategory::Activations, bytes);
        if vs > 0 {
            let d = dx.ok_or_else(|| missing("input gradient", mb, chunk))?;
            self.grad_outbox.insert((mb, chunk), d);
        }
        Ok(())
    }

    /// Accounts the unreduced gradients held per parameter: the accumulated local gradients
    /// (ZeRO 0–1, until the step's reduction), or with ZeRO 2–3 one piece's gradients until
    /// their reduce-scatter (a buffer: only the shard stays).
    fn track_gradient_bytes(&mut self) {
        let category = if self.zero() >= 2 {
            MemoryCategory::Buffers
        } else {
            MemoryCategory::Grads
        };
        let now: u64 = self.grads.map.values().map(|t| self.b.bytes(t)).sum();
        if now > self.grad_bytes {
            self.memory.alloc(category, now - self.grad_bytes);
        } else {
            self.memory.free(category, self.grad_bytes - now);
        }
        self.grad_bytes = now;
    }

    /// Whether a parameter's gradient is summed with a tied copy on another pipeline stage.
    fn is_tied_copy(&self, p: &ParamSpec) -> bool {
        self.setup.model.tie_embeddings && self.setup.plan.pp > 1 && p.name == "embedding.weight"
    }

    /// Sums the gradients of the group's parameters that several tensor ranks share: blocks
    /// replicated over `tp_replicas` ranks, and parameters used on sequence shards.
    fn sum_over_tensor_group(&mut self, gi: usize) -> Result<(), RuntimeError> {
        let plan = self.setup.plan;
        for p in self.groups[gi].spec.params.clone() {
            if p.tp_replicas > 1 {
                self.sum_over_replicas(&p)?;
            }
            if plan.sequence_parallel && plan.tp > 1 && p.sp_partial {
                self.all_reduce_gradient(&p, GroupKind::Tensor)?;
            }
        }
        Ok(())
    }

    /// ZeRO 2–3: reduce-scatters one micro-batch's gradients of a group over its replicas as
    /// soon as the group's backward is done, and adds them into this rank's shard, so that
    /// only the shard outlives the piece. A tied embedding copy on another stage is summed
    /// with it at the step's reduction instead (the other stage gets there at another time),
    /// so its gradient stays whole until then.
    fn scatter_microbatch_gradients(&mut self, gi: usize) -> Result<(), RuntimeError> {
        let b = self.b;
        self.sum_over_tensor_group(gi)?;
        let tied_names: Vec<String> = self.groups[gi]
            .spec
            .params
            .iter()
            .filter(|p| self.is_tied_copy(p))
            .map(|p| p.name.clone())
            .collect();
        let tied: Vec<(String, B::Tensor)> = tied_names
            .into_iter()
            .filter_map(|name| self.grads.map.remove(&name).map(|t| (name, t)))
            .collect();
        let g = &self.groups[gi];
        let flat = self.flatten(g, true)?;
        for p in &g.spec.params {
            self.grads.map.remove(&p.name);
        }
        self.grads.map.extend(tied);
        let (bytes, ranks) = (b.bytes(&flat), b.group_size(g.spec.replication));
        let t0 = Instant::now();
        let shard = b.reduce_scatter(g.spec.replication, &flat)?;
        self.record_collective("reduce_scatter", bytes, ranks, t0);
        self.add_to_reduced(gi, &shard);
        Ok(())
    }

    fn add_to_reduced(&mut self, gi: usize, shard: &B::Tensor) {
        match self.groups[gi].reduced.as_mut() {
            Some(acc) => self.b.add_assign(acc, shard),
            None => {
                self.memory
                    .alloc(MemoryCategory::Grads, self.b.bytes(shard));
                self.groups[gi].reduced = Some(shard.clone());
            }
        }
    }

    /// Sums one parameter's gradient over `group` (zeros when this rank has none yet).
    fn all_reduce_gradient(&mut self, p: &ParamSpec, group: GroupKind) -> Result<(), RuntimeError> {
        let (rows, cols) = p.local_shape();
        let g = self
            .grads
            .map
            .remove(&p.name)
            .unwrap_or_else(|| self.b.zeros(rows, cols));
        let g = self.b.all_reduce(group, &g)?;
        self.grads.map.insert(p.name.clone(), g);
        Ok(())
    }

    /// Sums the tied embedding's gradient with its copy on the other end of the pipeline.
    fn sum_tied_copies(&mut self, gi: usize) -> Result<(), RuntimeError> {
        for p in self.groups[gi].spec.params.clone() {
            if self.is_tied_copy(&p) {
                self.all_reduce_gradient(&p, GroupKind::Embedding)?;
            }
        }
        Ok(())
    }

    fn reduce_gradients(&mut self) -> Result<(), RuntimeError> {
        if self.zero() >= 2 {
            return self.finish_scattered_gradients();
        }
        let b = self.b;
        for gi in 0..self.groups.len() {
            if self.groups[gi].spec.frozen {
                continue;
            }
            self.sum_over_tensor_group(gi)?;
            self.sum_tied_copies(gi)?;
            if self.compresses(gi) {
                self.reduce_compressed(gi)?;
                continue;
            }
            let g = &self.groups[gi];
            let flat = self.flatten(g, true)?;
            // The group's gradients now live in the flat buffer (Megatron accumulates into it
            // directly), so they are not counted twice while it is reduced.
            self.release_local_gradients(gi);
            let g = &self.groups[gi];
            let (bytes, ranks) = (b.bytes(&flat), b.group_size(g.spec.replication));
            let t0 = Instant::now();
            let reduced = b.all_reduce(g.spec.replication, &flat)?;
            self.record_collective("all_reduce", bytes, ranks, t0);
            self.memory.alloc(MemoryCategory::Grads, b.bytes(&reduced));
            self.groups[gi].reduced = Some(reduced);
        }
        self.grads.map.clear();
        self.memory.free(MemoryCategory::Grads, self.grad_bytes);
        self.grad_bytes = 0;
        Ok(())
    }

    /// Drops the local gradients of group `gi` from the map and from the accounted bytes.
    fn release_local_gradients(&mut self, gi: usize) {
        let mut released = 0;
        for p in &self.groups[gi].spec.params {
            if let Some(t) = self.grads.map.remove(&p.name) {
                released += self.b.bytes(&t);
            }
        }
        let released = released.min(self.grad_bytes);
        self.memory.free(MemoryCategory::Grads, released);
        self.grad_bytes -= released;
    }

    /// Whether the plan compresses group `gi`'s gradients: its layers' buckets, or its
    /// embedding's and output layer's.
    fn compresses(&self, gi: usize) -> bool {
        let Some(c) = &self.setup.plan.compression else {
            return false;
        };
        let buckets = c.stages[self.coords.pp as usize];
        if self.groups[gi].spec.name.starts_with("layers.") {
            buckets.layers
        } else {
            buckets.edges
        }
    }

    /// ZeRO 0's reduction of group `gi` with compression: parameter by parameter (the
    /// compressors work on matrices), the sums then laid out as the flat buffer.
    fn reduce_compressed(&mut self, gi: usize) -> Result<(), RuntimeError> {
        let b = self.b;
        let g = &self.groups[gi];
        let (replication, padded, len) = (g.spec.replication, g.padded, g.len);
        let mut local = Vec::with_capacity(g.spec.params.len());
        for p in &g.spec.params {
            let (rows, cols) = p.local_shape();
            let grad = self
                .grads
                .map
                .get(&p.name)
                .cloned()
                .unwrap_or_else(|| b.zeros(rows, cols));
            local.push((p.name.clone(), p.local_len(), grad));
        }
        self.release_local_gradients(gi);
        let compressor = self
            .compressor
            .as_mut()
            .expect("a compressing plan has a compressor");
        let mut parts = Vec::with_capacity(local.len() + 1);
        let mut state = 0;
        let t0 = Instant::now();
        for (name, n, grad) in local {
            let (sum, allocated) = compressor.all_reduce(b, replication, &name, grad)?;
            state += allocated;
            parts.push(b.reshape(&sum, n, 1));
        }
        if padded > len {
            parts.push(b.zeros(padded - len, 1));
        }
        let reduced = b.concat_rows(&parts.iter().collect::<Vec<_>>());
        self.record_collective(
            "compressed_all_reduce",
            b.bytes(&reduced),
            b.group_size(replication),
            t0,
        );
        // Error buffers and PowerSGD's `Q` live as long as the run, beside the gradients.
        self.memory.alloc(MemoryCategory::Grads, state);
        self.memory.alloc(MemoryCategory::Grads, b.bytes(&reduced));
        self.groups[gi].reduced = Some(reduced);
        Ok(())
    }

    /// ZeRO 2–3 at the step's reduction: the micro-batches' shards are already summed; what is
    /// left is the tied embedding's gradient, summed with its copy and then scattered into
    /// the shards like the rest.
    fn finish_scattered_gradients(&mut self) -> Result<(), RuntimeError> {
        let b = self.b;
        for gi in 0..self.groups.len() {
            let g = &self.groups[gi];
            if g.spec.frozen {
                continue;
            }
            if g.spec.params.iter().any(|p| self.is_tied_copy(p)) {
                self.sum_tied_copies(gi)?;
                self.track_gradient_bytes();
                let g = &self.groups[gi];
                let flat = self.flatten(g, true)?;
                for p in &g.spec.params {
                    self.grads.map.remove(&p.name);
                }
                let (bytes, ranks) = (b.bytes(&flat), b.group_size(g.spec.replication));
                let t0 = Instant::now();
                let shard = b.reduce_scatter(g.spec.replication, &flat)?;
                self.record_collective("reduce_scatter", bytes, ranks, t0);
                self.add_to_reduced(gi, &shard);
                self.track_gradient_bytes();
            } else if g.reduced.is_none() {
                let replicas = b.group_size(g.spec.replication);
                let zeros = b.zeros(g.padded / replicas, 1);
                self.add_to_reduced(gi, &zeros);
            }
        }
        Ok(())
    }

    /// Sums the gradient of a block that `p.tp_replicas` consecutive tensor ranks hold, in
    /// tensor-rank order, so every replica gets the same bits.
    fn sum_over_replicas(&mut self, p: &ParamSpec) -> Result<(), RuntimeError> {
        let b = self.b;
        let (rows, cols) = p.local_shape();
        let g = self
            .grads
            .map
            .remove(&p.name)
            .unwrap_or_else(|| b.zeros(rows, cols));
        let all = b.all_gather(GroupKind::Tensor, &g)?;
        let first = (self.coords.tp / p.tp_replicas) * p.tp_replicas;
        let mut sum = b.zeros(rows, cols);
        for member in first..first + p.tp_replicas {
            let m = member as usize;
            b.add_assign(&mut sum, &b.slice_rows(&all, m * rows, (m + 1) * rows));
        }
        self.grads.map.insert(p.name.clone(), sum);
        Ok(())
    }

    fn optimizer_step(&mut self) -> Result<(), RuntimeError> {
        let b = self.b;
        self.opt_step += 1;
        let hp = self.setup.adam;
        for gi in 0..self.groups.len() {
            if self.groups[gi].spec.frozen {
                continue;
            }
            let grad = self.groups[gi]
                .reduced
                .take()
                .ok_or_else(|| RuntimeError::InvalidPlan {
                    reason: "optimizer step before the gradient reduction".into(),
                })?;
            self.memory.free(MemoryCategory::Grads, b.bytes(&grad));
            let g = &self.groups[gi];
            let replicas = b.group_size(g.spec.replication);
            let index = b.group_index(g.spec.replication);
            let owned = g.padded / replicas;
            match self.zero() {
                0 => {
                    let mut flat = self.flatten(g, false)?;
                    let g = &mut self.groups[gi];
                    b.adam(
                        &mut flat,
                        &grad,
                        &mut g.adam_m,
                        &mut g.adam_v,
                        hp,
                        self.opt_step,
                    );
                    self.unflatten(gi, &flat);
                }
                1 | 2 => {
                    let flat = self.flatten(g, false)?;
                    let mut shard = b.slice_rows(&flat, index * owned, (index + 1) * owned);
                    let grad = if self.zero() == 1 {
                        b.slice_rows(&grad, index * owned, (index + 1) * owned)
                    } else {
                        grad
                    };
                    let replication = g.spec.replication;
                    let g = &mut self.groups[gi];
                    b.adam(
                        &mut shard,
                        &grad,
                        &mut g.adam_m,
                        &mut g.adam_v,
                        hp,
                        self.opt_step,
                    );
                    let t0 = Instant::now();
                    let full = b.all_gather(replication, &shard)?;
                    let (bytes, ranks) = (b.bytes(&full), b.group_size(replication));
                    self.record_collective("all_gather", bytes, ranks, t0);
                    self.unflatten(gi, &full);
                }
                _ => {
                    let g = &mut self.groups[gi];
                    let shard = g.shard.as_mut().expect("ZeRO-3 keeps a shard");
                    b.adam(
                        shard,
                        &grad,
                        &mut g.adam_m,
                        &mut g.adam_v,
                        hp,
                        self.opt_step,
                    );
                }
            }
        }
        Ok(())
    }

    /// Writes checkpoint `step` into `dir`: this rank's pieces, then, once every rank has
    /// written, rank 0 commits the manifest.
    fn snapshot(&mut self, dir: &Path, step: u64) -> Result<(), RuntimeError> {
        let b = self.b;
        let folder = snapshot_folder(dir, step)?;
        let records = self.write_checkpoint(&folder)?;
        write_records(&folder, self.rank, &records)?;
        b.all_reduce(GroupKind::World, &b.zeros(1, 1))?;
        if self.rank == 0 {
            let world = self.setup.plan.world_size() as usize;
            commit(dir, step, &self.setup.model.name, world)?;
        }
        Ok(())
    }

    /// Writes this rank's pieces of a checkpoint to `folder`: each parameter's local rectangle
    /// and its Adam moments, ZeRO's shards gathered back first (outside the memory the run
    /// tracks). Of the ranks that hold the same rectangles (the group's replicas), the first
    /// writes them.
    fn write_checkpoint(&self, folder: &Path) -> Result<Vec<ShardRecord>, RuntimeError> {
        let b = self.b;
        let mut pieces = Vec::new();
        for g in &self.groups {
            let whole = |t: &B::Tensor| -> Result<Vec<f32>, RuntimeError> {
                if self.zero() >= 1 {
                    Ok(b.to_vec(&b.all_gather(g.spec.replication, t)?))
                } else {
                    Ok(b.to_vec(t))
                }
            };
            // Every replica takes part in the gathers; the first writes.
            let (m, v) = (whole(&g.adam_m)?, whole(&g.adam_v)?);
            let gathered = (g.shard.as_ref())
                .map(|shard| b.all_gather(g.spec.replication, shard))
                .transpose()?;
            if b.group_index(g.spec.replication) != 0 {
                continue;
            }
            let weights = match gathered {
                Some(weights) => weights,
                None => self.flatten(g, false)?,
            };
            let weights = b.to_vec(&weights);
            let mut offset = 0;
            for p in &g.spec.params {
                let n = p.local_len();
                // A frozen parameter has its value alone.
                let states = [
                    (StateKind::Param, &weights),
                    (StateKind::AdamM, &m),
                    (StateKind::AdamV, &v),
                ];
                let kept = if g.spec.frozen { 1 } else { states.len() };
                for (state, flat) in states.into_iter().take(kept) {
                    pieces.push(StatePiece {
                        param: p.clone(),
                        state,
                        data: flat[offset..offset + n].to_vec(),
                    });
                }
                offset += n;
            }
        }
        write_rank(folder, self.rank, &pieces)
    }

    fn parameters(&mut self) -> Result<Vec<(ParamSpec, Vec<f32>)>, RuntimeError> {
        let names: Vec<String> = self.groups.iter().map(|g| g.spec.name.clone()).collect();
        self.materialize(&names)?;
        let mut out = Vec::new();
        for g in &self.groups {
            for p in &g.spec.params {
                let t = self
                    .values
                    .get(&p.name)
                    .ok_or_else(|| RuntimeError::InvalidModel {
                        reason: format!("parameter {} missing at the end of the run", p.name),
                    })?;
                out.push((p.clone(), self.b.to_vec(t)));
            }
        }
        Ok(out)
    }
}

fn missing(what: &str, mb: u64, chunk: u64) -> RuntimeError {
    RuntimeError::InvalidPlan {
        reason: format!("schedule out of order: no {what} for micro-batch {mb}, chunk {chunk}"),
    }
}
