//! An analytic cost model for the planner's tests and benchmark: realistic in shape (time per
//! layer from FLOPs and links, memory by stage with in-flight micro-batches, embedding on the
//! first stage and logits on the last), and monotone in layers, recompute and offload as the
//! planner's bounds assume. It is not the project's calibrated cost model.

use tessel_grammar::{Offload, Recompute, Spec, Strategy};
use tessel_planner::{even_chunks, stage_totals, StageCostModel};
use tessel_symbolic::cost::{
    Estimate, MemoryBreakdown, PipelineShape, StageCost, StageEstimate, TimeBreakdown,
};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
/// Bytes of a bf16 value.
const HALF: f64 = 2.0;
/// fp32 master weights and two Adam moments.
const OPTIMIZER_BYTES: f64 = 12.0;
/// Framework and allocator overhead per GPU.
const FIXED_OVERHEAD: f64 = 1.5 * GIB;
/// Fraction of the data-parallel gradient reduction left exposed after overlap.
const DP_EXPOSED: f64 = 0.15;

pub struct SyntheticModel {
    pub spec: Spec,
}

/// Per-micro-batch time of a stage, by component.
#[derive(Clone, Copy, Default)]
struct StageTimes {
    compute: f64,
    recompute: f64,
    tp: f64,
    cp: f64,
    ep: f64,
    pp: f64,
    /// Exposed ZeRO-3 weight gathers.
    dp: f64,
}

impl StageTimes {
    fn total(&self) -> f64 {
        self.compute + self.recompute + self.tp + self.cp + self.ep + self.pp + self.dp
    }
}

#[derive(Clone, Copy, Default)]
struct TailTimes {
    dp: f64,
    optimizer: f64,
    offload: f64,
}

impl SyntheticModel {
    pub fn new(spec: Spec) -> Self {
        SyntheticModel { spec }
    }

    fn tokens(&self, s: &Strategy) -> f64 {
        (s.microbatch * self.spec.train.seq_len) as f64 / s.cp as f64
    }

    /// Parameters of one block held by one GPU of the tensor- and expert-parallel group.
    fn block_params(&self, s: &Strategy) -> (f64, f64) {
        let m = &self.spec.model;
        let attention = m.attention_matmul_params() as f64;
        let (mlp, active_mlp) = match &m.moe {
            Some(moe) => {
                let expert = m.mlp_matmul_params(moe.expert_ffn_hidden) as f64;
                (
                    expert * moe.experts as f64 / s.ep as f64,
                    expert * moe.top_k as f64,
                )
            }
            None => {
                let dense = m.mlp_matmul_params(m.ffn_hidden) as f64;
                (dense, dense)
            }
        };
        ((attention + mlp) / s.tp as f64, attention + active_mlp)
    }

    fn matmul_efficiency(&self, s: &Strategy) -> f64 {
        let width = self.spec.model.hidden as f64 / s.tp as f64;
        0.62 * width / (width + 512.0) * (self.tokens(s) / (self.tokens(s) + 1024.0))
    }

    fn peak(&self) -> f64 {
        self.spec
            .cluster
            .gpu
            .peak
            .for_precision(self.spec.train.precision)
    }

    fn group_bandwidth(&self, size: u64, inner: u64) -> f64 {
        if size * inner <= self.spec.cluster.gpus_per_node {
            self.spec.cluster.intra_node.bandwidth
        } else {
            self.spec.cluster.inter_node.bandwidth
        }
    }

    fn times(&self, s: &Strategy, stage: u64, layers: u64, recompute: Recompute) -> StageTimes {
        let m = &self.spec.model;
        let tokens = self.tokens(s);
        let (_, active) = self.block_params(s);
        let seq = self.spec.train.seq_len as f64;
        let flops_per_second = self.peak() * self.matmul_efficiency(s);
        let matmul_forward = 2.0 * tokens * active / s.tp as f64;
        let attention_forward = 2.0 * tokens * seq * m.q_dim() as f64 / s.tp as f64;
        let layer_forward = (matmul_forward + attention_forward) / flops_per_second;
        let layers_f = layers as f64;
        let mut compute = 3.0 * layer_forward * layers_f;
        let full_layers = match recompute {
            Recompute::None | Recompute::Selective | Recompute::Modules(_) => 0.0,
            Recompute::Full => layers_f,
            Recompute::Partial { full_layers } => full_layers.min(layers) as f64,
        };
        let mut recompute_s = full_layers * layer_forward;
        if recompute == Recompute::Selective {
            recompute_s += layers_f * attention_forward / flops_per_second;
        }
        let vocab_flops = 2.0 * tokens * (m.hidden * m.vocab) as f64 / s.tp as f64;
        if stage == s.pp - 1 {
            compute += 3.0 * vocab_flops / flops_per_second;
        }
        if stage == 0 {
            compute += tokens * m.hidden as f64 / self.spec.cluster.gpu.hbm_bandwidth;
        }
        let activation_bytes = tokens * m.hidden as f64 * HALF;
        let mut tp = 0.0;
        if s.tp > 1 {
            let ring = 2.0 * (s.tp - 1) as f64 / s.tp as f64;
            let exposed = if s.sequence_parallel { 0.7 } else { 1.0 };
            tp = 4.0 * layers_f * activation_bytes * ring * exposed / self.group_bandwidth(s.tp, 1)
                + 4.0 * layers_f * self.spec.cluster.intra_node.latency;
        }
        let mut cp = 0.0;
        if s.cp > 1 {
            let kv = tokens * m.kv_dim() as f64 * HALF * 2.0;
            cp = 0.25 * 3.0 * layers_f * kv * (s.cp - 1) as f64 / self.group_bandwidth(s.cp, s.tp);
        }
        let mut ep = 0.0;
        if let Some(moe) = &m.moe {
            if s.ep > 1 {
                let moe_layers = layers_f / moe.every as f64;
                ep = 4.0 * moe_layers * activation_bytes * moe.top_k as f64 * (s.ep - 1) as f64
                    / s.ep as f64
                    / self.group_bandwidth(s.ep, s.tp * s.cp);
            }
        }
        // ZeRO-3 gathers every layer's weights in forward, recompute-free backward and for the
        // gradient reduce-scatter over the sharding ranks; about a third of it stays exposed.
        let shard = s.shard_degree() * s.cp;
        let mut dp = 0.0;
        if s.zero >= 3 && shard > 1 {
            let (block, _) = self.block_params(s);
            let ring = (shard - 1) as f64 / shard as f64;
            dp = 0.3 * 3.0 * layers_f * block * HALF * ring / self.group_bandwidth(shard, s.tp);
        }
        let mut pp = 0.0;
        if s.pp > 1 {
            pp = 2.0 * s.interleave as f64 * activation_bytes
                / s.tp as f64
                / self.spec.cluster.inter_node.bandwidth;
        }
        StageTimes {
            compute,
            recompute: recompute_s,
            tp,
            cp,
            ep,
            pp,
            dp,
        }
    }

    fn stage_params(&self, s: &Strategy, stage: u64, layers: u64) -> f64 {
        let m = &self.spec.model;
        let (block, _) = self.block_params(s);
        let mut params = block * layers as f64;
        let embedding = (m.vocab * m.hidden) as f64 / s.tp as f64;
        if stage == 0 {
            params += embedding;
        }
        if stage == s.pp - 1 && (!m.tie_embeddings || s.pp > 1) {
            params += embedding;
        }
        params
    }

    fn tail(&self, s: &Strategy, stage: u64, layers: u64, offload: Offload) -> TailTimes {
        let params = self.stage_params(s, stage, layers);
        let shard = (s.dp * s.cp) as f64;
        let mut dp = 0.0;
        if shard > 1.0 {
            let ring = 2.0 * (shard - 1.0) / shard;
            let bandwidth = self.group_bandwidth(s.dp * s.cp, s.tp);
            dp = DP_EXPOSED * params * HALF * ring / bandwidth;
            if s.zero >= 3 {
                dp += 0.05 * params * HALF / bandwidth;
            }
        }
        // Hybrid sharding: the gradient shard is all-reduced across the replicas as well.
        let replicas = (s.dp / s.shard_degree().max(1)) as f64;
        if s.zero >= 1 && replicas > 1.0 {
            let bandwidth = self.group_bandwidth(s.dp / s.shard_degree().max(1), s.tp);
            dp += params * HALF * 2.0 * (replicas - 1.0) / replicas / shard / bandwidth;
        }
        let sharded = if s.zero >= 1 {
            (s.shard_degree() * s.cp) as f64
        } else {
            1.0
        };
        let state = params * OPTIMIZER_BYTES / sharded;
        let optimizer = 2.0 * state / self.spec.cluster.gpu.hbm_bandwidth;
        let offload_s = 2.0 * (offload.optimizer * state + offload.weights * params * HALF)
            / self.spec.cluster.host_link;
        TailTimes {
            dp,
            optimizer,
            offload: offload_s,
        }
    }

    fn memory(
        &self,
        s: &Strategy,
        stage: u64,
        layers: u64,
        recompute: Recompute,
        offload: Offload,
        microbatches: u64,
    ) -> MemoryBreakdown {
        let m = &self.spec.model;
        let params = self.stage_params(s, stage, layers);
        let shard = (s.shard_degree() * s.cp) as f64;
        let weights_div = if s.zero >= 3 { shard } else { 1.0 };
        let grads_div = if s.zero >= 2 { shard } else { 1.0 };
        let optim_div = if s.zero >= 1 { shard } else { 1.0 };
        let weights = params * HALF / weights_div * (1.0 - offload.weights);
        let gradients = params * HALF / grads_div * (1.0 - offload.gradients);
        let optimizer = params * OPTIMIZER_BYTES / optim_div * (1.0 - offload.optimizer);
        let tokens = self.tokens(s);
        let sbh = tokens * m.hidden as f64;
        let tp = s.tp as f64;
        let per_layer_none = if s.sequence_parallel {
            sbh * 34.0 / tp
        } else {
            sbh * (10.0 + 24.0 / tp)
        };
        let per_layer_full = 2.0 * sbh / if s.sequence_parallel { tp } else { 1.0 };
        let layers_f = layers as f64;
        let full_layers = match recompute {
            Recompute::None | Recompute::Selective | Recompute::Modules(_) => 0.0,
            Recompute::Full => layers_f,
            Recompute::Partial { full_layers } => full_layers.min(layers) as f64,
        };
        let kept = if recompute == Recompute::Selective {
            0.85 * per_layer_none
        } else {
            per_layer_none
        };
        let per_microbatch = (layers_f - full_layers) * kept + full_layers * per_layer_full;
        let in_flight = (s.pp - stage).min(microbatches) as f64;
        let interleave_factor = if s.interleave > 1 {
            1.0 + (s.pp - 1) as f64 / (s.pp * s.interleave) as f64
        } else {
            1.0
        };
        let activations =
            per_microbatch * in_flight * interleave_factor * (1.0 - 0.9 * offload.activations);
        let mut buffers = FIXED_OVERHEAD;
        if stage == s.pp - 1 {
            buffers += tokens * m.vocab as f64 * 4.0 / tp;
        }
        if s.zero >= 3 {
            buffers += 2.0 * self.block_params(s).0 * HALF;
        }
        MemoryBreakdown {
            weights,
            gradients,
            optimizer,
            activations,
            buffers,
        }
    }

    fn microbatches(&self, s: &Strategy) -> u64 {
        self.spec.train.global_batch / (s.dp * s.microbatch).max(1)
    }
}

impl StageCostModel for SyntheticModel {
    fn stage_cost(
        &self,
        strategy: &Strategy,
        stage: u64,
        layers: u64,
        recompute: Recompute,
        offload: Offload,
    ) -> StageCost {
        let times = self.times(strategy, stage, layers, recompute);
        let tail = self.tail(strategy, stage, layers, offload);
        let m = self.microbatches(strategy);
        StageCost {
            microbatch_s: times.total(),
            tail_s: tail.dp + tail.optimizer + tail.offload,
            memory: self.memory(strategy, stage, layers, recompute, offload, m),
        }
    }

    fn pipeline_shape(&self, strategy: &Strategy) -> PipelineShape {
        let m = self.microbatches(strategy) as f64;
        let v = strategy.interleave.max(1) as f64;
        PipelineShape {
            sum_weight: 1.0 / v,
            max_weight: m - 1.0 / v,
        }
    }

    fn memory_capacity(&self) -> f64 {
        self.spec.cluster.gpu.memory * self.spec.search.memory_limit
    }

    fn estimate(&self, strategy: &Strategy) -> Result<Estimate, String> {
        let s = strategy;
        // `stages` lists the layers of every chunk, as the project's cost model reads it.
        let chunks = s
            .stages
            .clone()
            .unwrap_or_else(|| even_chunks(self.spec.model.layers, s.pp, s.interleave));
        if chunks.len() as u64 != s.pp * s.interleave {
            return Err(format!(
                "{} chunks for pp·interleave = {}",
                chunks.len(),
                s.pp * s.interleave
            ));
        }
        let stages = stage_totals(&chunks, s.pp);
        let costs: Vec<StageCost> = stages
            .iter()
            .enumerate()
            .map(|(i, &l)| {
                self.stage_cost(
                    s,
                    i as u64,
                    l,
                    s.recompute_of(i as u64),
                    s.offload_of(i as u64),
                )
            })
            .collect();
        let shape = self.pipeline_shape(s);
        let step = shape.step_time(&costs);
        let m = self.microbatches(s);
        let slowest = costs
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.microbatch_s.total_cmp(&b.1.microbatch_s))
            .map_or(0, |(i, _)| i);
        let longest_tail = costs
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.tail_s.total_cmp(&b.1.tail_s))
            .map_or(0, |(i, _)| i);
        let critical = self.times(
            s,
            slowest as u64,
            stages[slowest],
            s.recompute_of(slowest as u64),
        );
        let tail = self.tail(
            s,
            longest_tail as u64,
            stages[longest_tail],
            s.offload_of(longest_tail as u64),
        );
        let mf = m as f64;
        let steady = mf * critical.total();
        let time = TimeBreakdown {
            compute: mf * critical.compute,
            recompute: mf * critical.recompute,
            tp_comm: mf * critical.tp,
            cp_comm: mf * critical.cp,
            ep_comm: mf * critical.ep,
            pp_comm: mf * critical.pp,
            dp_comm: mf * critical.dp + tail.dp,
            offload: tail.offload,
            bubble: step - steady - costs[longest_tail].tail_s,
            optimizer: tail.optimizer,
        };
        let tokens = (self.spec.train.global_batch * self.spec.train.seq_len) as f64;
        let gpus = self.spec.cluster.total_gpus() as f64;
        let model_flops = self
            .spec
            .model
            .training_flops_per_token(self.spec.train.seq_len)
            * tokens;
        let hardware_flops = model_flops * (1.0 + time.recompute / time.compute.max(1e-12) / 3.0);
        let peak = self.peak();
        let capacity = self.memory_capacity();
        let stage_estimates: Vec<StageEstimate> = costs
            .iter()
            .enumerate()
            .map(|(i, c)| StageEstimate {
                stage: i as u64,
                layers: stages[i],
                memory: MemoryBreakdown {
                    weights: c.memory.weights / GIB,
                    gradients: c.memory.gradients / GIB,
                    optimizer: c.memory.optimizer / GIB,
                    activations: c.memory.activations / GIB,
                    buffers: c.memory.buffers / GIB,
                },
                time: TimeBreakdown {
                    compute: c.microbatch_s * mf,
                    ..TimeBreakdown::default()
                },
                compressed: None,
            })
            .collect();
        let peak_memory = costs.iter().map(|c| c.memory.total()).fold(0.0, f64::max);
        Ok(Estimate {
            step_time_s: step,
            tokens_per_s: tokens / step,
            tokens_per_s_per_gpu: tokens / step / gpus,
            model_tflops_per_gpu: model_flops / step / gpus / 1e12,
            hardware_tflops_per_gpu: hardware_flops / step / gpus / 1e12,
            mfu: model_flops / step / gpus / peak,
            hfu: hardware_flops / step / gpus / peak,
            peak_memory_gib: peak_memory / GIB,
            memory_capacity_gib: capacity / GIB,
            fits: peak_memory <= capacity,
            time,
            stages: stage_estimates,
            interval: None,
            multimodal: None,
        })
    }
}
