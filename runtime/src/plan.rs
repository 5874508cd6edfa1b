//! The runtime's own input: the degrees, batch split, layer placement, recompute and offload
//! of one training configuration, checked against the model it runs.

use crate::error::RuntimeError;
use crate::model::lora::Adapters;
use tessel_grammar::{CompressionMethod, GradCompression, ModelSpec, Offload, Recompute, Strategy};
use tessel_symbolic::cost::CompressedBuckets;

/// Everything the executor needs to know about a parallel configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct ExecutionPlan {
    pub dp: u64,
    pub tp: u64,
    pub pp: u64,
    pub cp: u64,
    pub ep: u64,
    /// Model chunks per pipeline rank (1 = plain 1F1B).
    pub interleave: u64,
    /// Sequences per micro-batch.
    pub microbatch: u64,
    /// Micro-batches per data-parallel replica and step.
    pub microbatches: u64,
    pub seq_len: u64,
    pub zero: u8,
    pub sequence_parallel: bool,
    /// Layer range `[start, end)` of each virtual pipeline stage, in virtual-stage order
    /// (virtual stage `c·pp + r` is chunk `c` of pipeline rank `r`).
    pub chunk_layers: Vec<(u64, u64)>,
    /// Recompute choice of each pipeline rank.
    pub recompute: Vec<Recompute>,
    /// Offload fractions of each pipeline rank.
    pub offload: Vec<Offload>,
    /// Seeds the parameter initialisation.
    pub seed: u64,
    /// Adapter fine-tuning: the model frozen, LoRA adapters training beside it.
    pub adapters: Option<Adapters>,
    /// Tempo's in-place GELU and norms (`train.memory_saving_kernels`).
    pub memory_saving_kernels: bool,
    /// Compressed data-parallel gradients (`train.grad_compression`).
    pub compression: Option<Compression>,
}

/// How the data-parallel gradients are compressed, and which buckets: per pipeline stage,
/// the layers' and the embedding's and output layer's, as the plan chose.
#[derive(Clone, Debug, PartialEq)]
pub struct Compression {
    pub method: GradCompression,
    pub stages: Vec<CompressedBuckets>,
}

impl Compression {
    /// Every bucket of every one of `pp` stages compressed by `method`.
    pub fn everywhere(method: GradCompression, pp: u64) -> Self {
        let all = CompressedBuckets {
            layers: true,
            edges: true,
        };
        Compression {
            method,
            stages: vec![all; pp as usize],
        }
    }
}

impl ExecutionPlan {
    /// Builds the plan of a fixed strategy. `strategy.stages`, when given, lists the layers of
    /// every virtual stage (`pp·interleave` entries) or of every pipeline rank (`pp` entries,
    /// each then split evenly over its chunks).
    pub fn from_strategy(
        model: &ModelSpec,
        strategy: &Strategy,
        global_batch: u64,
        seq_len: u64,
    ) -> Result<Self, RuntimeError> {
        for (what, v) in [
            ("dp", strategy.dp),
            ("tp", strategy.tp),
            ("pp", strategy.pp),
            ("cp", strategy.cp),
            ("ep", strategy.ep),
            ("interleave", strategy.interleave),
            ("microbatch", strategy.microbatch),
            ("global batch", global_batch),
            ("sequence length", seq_len),
        ] {
            if v == 0 {
                return Err(RuntimeError::invalid_plan(format!(
                    "{what} must be at least 1"
                )));
            }
        }
        let replica_batch = strategy.dp * strategy.microbatch;
        if !global_batch.is_multiple_of(replica_batch) {
            return Err(RuntimeError::invalid_plan(format!(
                "global batch {global_batch} is not a multiple of dp·microbatch = {replica_batch}"
            )));
        }
        let virtual_stages = strategy.pp * strategy.interleave;
        let chunk_layers = match &strategy.stages {
            None => even_split(model.layers, virtual_stages)?,
            Some(stages) if stages.len() as u64 == virtual_stages => ranges(stages),
            Some(stages) if stages.len() as u64 == strategy.pp => {
                let mut per_chunk = vec![0u64; virtual_stages as usize];
                for (rank, &layers) in stages.iter().enumerate() {
                    for (c, (s, e)) in even_split(layers, strategy.interleave)?
                        .into_iter()
                        .enumerate()
                    {
                        per_chunk[c * strategy.pp as usize + rank] = e - s;
                    }
                }
                ranges(&per_chunk)
            }
            Some(stages) => {
                return Err(RuntimeError::invalid_plan(format!(
                    "{} stage sizes given for {} pipeline stages",
                    stages.len(),
                    strategy.pp
                )))
            }
        };
        experts_split_over_tp(strategy.tp, strategy.etp)?;
        shards_over_every_dp_rank(strategy.dp, strategy.dp_shard)?;
        let plan = ExecutionPlan {
            dp: strategy.dp,
            tp: strategy.tp,
            pp: strategy.pp,
            cp: strategy.cp,
            ep: strategy.ep,
            interleave: strategy.interleave,
            microbatch: strategy.microbatch,
            microbatches: global_batch / replica_batch,
            seq_len,
            zero: strategy.zero,
            sequence_parallel: strategy.sequence_parallel,
            chunk_layers,
            recompute: (0..strategy.pp).map(|s| strategy.recompute_of(s)).collect(),
            offload: (0..strategy.pp).map(|s| strategy.offload_of(s)).collect(),
            seed: 0,
            adapters: None,
            memory_saving_kernels: false,
            compression: None,
        };
        plan.validate(model)?;
        Ok(plan)
    }

    /// A single-rank plan: the reference every parallel plan must reproduce.
    pub fn single_rank(
        model: &ModelSpec,
        global_batch: u64,
        seq_len: u64,
    ) -> Result<Self, RuntimeError> {
        let strategy = Strategy {
            name: "single".into(),
            microbatch: global_batch,
            ..Strategy::default()
        };
        Self::from_strategy(model, &strategy, global_batch, seq_len)
    }

    pub fn world_size(&self) -> u64 {
        self.dp * self.tp * self.pp * self.cp
    }

    /// Chunks the sequence is cut into for context parallelism: `2·cp` (each context rank
    /// holds two, for causal load balance), or the whole sequence without it.
    pub fn cp_chunks(&self) -> u64 {
        if self.cp > 1 {
            2 * self.cp
        } else {
            1
        }
    }

    pub fn global_batch(&self) -> u64 {
        self.dp * self.microbatch * self.microbatches
    }

    /// Checks every divisibility the executor relies on.
    pub fn validate(&self, model: &ModelSpec) -> Result<(), RuntimeError> {
        let bad = |s: String| Err(RuntimeError::invalid_plan(s));
        if let Some((stage, recompute)) = self
            .recompute
            .iter()
            .enumerate()
            .find(|(_, r)| matches!(r, Recompute::Modules(_)))
        {
            return bad(format!(
                "recompute = {recompute} (stage {stage}): the CPU runtime recomputes none, \
                 selective, full or the first layers of a stage, not named modules"
            ));
        }
        for (what, v) in [
            ("dp", self.dp),
            ("tp", self.tp),
            ("pp", self.pp),
            ("cp", self.cp),
            ("ep", self.ep),
            ("interleave", self.interleave),
            ("microbatch", self.microbatch),
            ("micro-batch count", self.microbatches),
            ("sequence length", self.seq_len),
        ] {
            if v == 0 {
                return bad(format!("{what} must be at least 1"));
            }
        }
        if self.zero > 3 {
            return bad(format!("ZeRO stage {} does not exist (0–3)", self.zero));
        }
        let vs = self.pp * self.interleave;
        if self.chunk_layers.len() as u64 != vs {
            return bad(format!(
                "{} layer ranges for {vs} virtual stages",
                self.chunk_layers.len()
            ));
        }
        let mut next = 0;
        for &(s, e) in &self.chunk_layers {
            if s != next || e <= s {
                return bad(
                    "every virtual pipeline stage needs at least one layer, in order".into(),
                );
            }
            next = e;
        }
        if next != model.layers {
            return bad(format!(
                "stages hold {next} layers but the model has {}",
                model.layers
            ));
        }
        if self.recompute.len() as u64 != self.pp || self.offload.len() as u64 != self.pp {
            return bad("recompute and offload need one entry per pipeline stage".into());
        }
        if let Some(c) = &self.compression {
            if self.zero != 0 || self.adapters.is_some() {
                return Err(RuntimeError::unsupported(
                    "gradient compression beside ZeRO or adapters (it compresses ZeRO 0's \
                     all-reduce of every weight's gradient)",
                ));
            }
            if c.method.method == CompressionMethod::Auto {
                return bad(
                    "`grad_compression.method = auto` must be resolved by `tessel plan` first"
                        .into(),
                );
            }
            if c.stages.len() as u64 != self.pp {
                return bad("gradient compression needs one entry per pipeline stage".into());
            }
        }
        if !model.encoders.is_empty() {
            return Err(RuntimeError::unsupported(
                "a multimodal model's encoders (the runtime trains decoder-only language \
                 models; the planner costs the encoders)",
            ));
        }
        if self.adapters.is_some() {
            if model.moe.is_some() {
                return Err(RuntimeError::unsupported(
                    "adapter fine-tuning of a mixture of experts (the CPU runtime's adapters \
                     sit on dense projections only)",
                ));
            }
            if self.zero == 3 {
                return Err(RuntimeError::unsupported(
                    "adapter fine-tuning under ZeRO-3 (use ZeRO 0–2: the adapters' states are \
                     small and the frozen weights have none to shard)",
                ));
            }
        }
        if self.interleave > 1 && self.pp == 1 {
            return Err(RuntimeError::unsupported(
                "interleaving without pipeline parallelism",
            ));
        }
        if self.interleave > 1 && !self.microbatches.is_multiple_of(self.pp) {
            return bad(format!(
                "interleaving needs the micro-batch count ({}) to be a multiple of pp ({})",
                self.microbatches, self.pp
            ));
        }
        let divides = |what: &str, n: u64, by: &str, d: u64| -> Result<(), RuntimeError> {
            if n.is_multiple_of(d) {
                Ok(())
            } else {
                bad(format!("{by} = {d} does not divide {what} = {n}"))
            }
        };
        divides("attention heads", model.heads, "tp", self.tp)?;
        if self.tp > model.kv_heads {
            divides("tp", self.tp, "key/value heads", model.kv_heads)?;
        } else {
            divides("key/value heads", model.kv_heads, "tp", self.tp)?;
        }
        divides("ffn hidden", model.ffn_hidden, "tp", self.tp)?;
        divides(
            "vocabulary (vocab-parallel embedding)",
            model.vocab,
            "tp",
            self.tp,
        )?;
        divides(
            "sequence length",
            self.seq_len,
            "2·cp (two chunks per context rank)",
            self.cp_chunks(),
        )?;
        if self.sequence_parallel {
            divides(
                "tokens per micro-batch and context rank",
                self.microbatch * self.seq_len / self.cp,
                "tp",
                self.tp,
            )?;
        }
        match &model.moe {
            Some(moe) => {
                divides("experts", moe.experts, "ep", self.ep)?;
                divides("dp·cp", self.dp * self.cp, "ep", self.ep)?;
                divides("expert ffn hidden", moe.expert_ffn_hidden, "tp", self.tp)?;
            }
            None if self.ep > 1 => {
                return bad("expert parallelism needs a mixture-of-experts model".into())
            }
            None => {}
        }
        if let Some(max) = model.max_seq_len {
            if self.seq_len > max {
                return bad(format!(
                    "sequence length {} exceeds the model's {max}",
                    self.seq_len
                ));
            }
        }
        for (stage, r) in self.recompute.iter().enumerate() {
            if let Recompute::Partial { full_layers } = r {
                let held: u64 = (0..self.interleave)
                    .map(|c| {
                        let (s, e) = self.chunk_layers[(c * self.pp + stage as u64) as usize];
                        e - s
                    })
                    .sum();
                if *full_layers > held {
                    return bad(format!(
                        "partial recompute of {full_layers} layers on stage {stage}, which holds {held}"
                    ));
                }
            }
        }
        for o in &self.offload {
            for f in [o.optimizer, o.weights, o.gradients, o.activations] {
                if !(0.0..=1.0).contains(&f) {
                    return bad(format!("offload fraction {f} outside [0, 1]"));
                }
            }
        }
        Ok(())
    }

    /// Layers of pipeline rank `stage` in execution order of its chunks.
    pub fn stage_layers(&self, stage: u64) -> Vec<u64> {
        (0..self.interleave)
            .flat_map(|c| {
                let (s, e) = self.chunk_layers[(c * self.pp + stage) as usize];
                s..e
            })
            .collect()
    }
}

fn ranges(sizes: &[u64]) -> Vec<(u64, u64)> {
    let mut start = 0;
    sizes
        .iter()
        .map(|&n| {
            let r = (start, start + n);
            start += n;
            r
        })
        .collect()
}

/// Splits `layers` into `parts` contiguous ranges, the earlier ones one larger when uneven.
fn even_split(layers: u64, parts: u64) -> Result<Vec<(u64, u64)>, RuntimeError> {
    if layers < parts {
        return Err(RuntimeError::invalid_plan(format!(
            "{layers} layers cannot fill {parts} pipeline stages"
        )));
    }
    let sizes: Vec<u64> = (0..parts)
        .map(|i| layers / parts + u64::from(i < layers % parts))
        .collect();
    Ok(ranges(&sizes))
}

/// The runtime's ZeRO shards over every data-parallel rank; a hybrid-sharded plan
/// (`dp_shard` below `dp`) is refused.
pub(crate) fn shards_over_every_dp_rank(
    dp: u64,
    dp_shard: Option<u64>,
) -> Result<(), RuntimeError> {
    match dp_shard.filter(|&shard| shard != dp) {
        Some(shard) => Err(RuntimeError::invalid_plan(format!(
            "dp_shard = {shard}: the runtime shards ZeRO state over all {dp} data-parallel \
             ranks; hybrid sharding is planned and exported, not executed here"
        ))),
        None => Ok(()),
    }
}

/// The CPU runtime splits experts over the tensor-parallel ranks; a plan whose experts are
/// folded (`etp` below `tp`) is refused.
pub(crate) fn experts_split_over_tp(tp: u64, etp: Option<u64>) -> Result<(), RuntimeError> {
    match etp.filter(|&etp| etp != tp) {
        Some(etp) => Err(RuntimeError::invalid_plan(format!(
            "etp = {etp}: the CPU runtime splits experts over tp ({tp}); folded experts are \
             planned and exported, not executed here"
        ))),
        None => Ok(()),
    }
}
