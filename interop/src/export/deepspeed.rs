//! DeepSpeed: a `ds_config.json` (keys as documented in DeepSpeed's "Configuration JSON").
//!
//! The config holds batch sizes, precision, ZeRO stage and offload, and activation
//! checkpointing. Tensor, pipeline, sequence, context and expert parallel degrees are not part
//! of it: they come from Megatron-DeepSpeed's flags or from the model code (`PipelineModule`,
//! `deepspeed.moe.layer.MoE`), so they are reported, not written.

use serde::Serialize;
use tessel_grammar::{AttentionKernel, Precision, Recompute, Spec, Strategy};

use super::batches::batches;
use super::{zero_stage, ExportOptions, ExportOutput, Report};

/// DeepSpeed's documented default bucket sizes (elements), written out so they can be tuned.
const BUCKET_SIZE: u64 = 500_000_000;
const PERSISTENCE_THRESHOLD: u64 = 100_000;

#[derive(Serialize)]
struct DsConfig {
    train_batch_size: u64,
    train_micro_batch_size_per_gpu: u64,
    gradient_accumulation_steps: u64,
    gradient_clipping: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    bf16: Option<Enabled>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fp16: Option<Fp16>,
    zero_optimization: Zero,
    #[serde(skip_serializing_if = "Option::is_none")]
    activation_checkpointing: Option<ActivationCheckpointing>,
}

#[derive(Serialize)]
struct Enabled {
    enabled: bool,
}

#[derive(Serialize)]
struct Fp16 {
    enabled: bool,
    /// 0 selects dynamic loss scaling.
    loss_scale: u64,
    initial_scale_power: u64,
    loss_scale_window: u64,
    hysteresis: u64,
    min_loss_scale: u64,
}

#[derive(Serialize)]
struct Zero {
    stage: u8,
    #[serde(skip_serializing_if = "Option::is_none")]
    overlap_comm: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    contiguous_gradients: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reduce_bucket_size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allgather_bucket_size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stage3_prefetch_bucket_size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stage3_param_persistence_threshold: Option<u64>,
    /// MiCS: ZeRO-3 state sharded within groups of this many data-parallel ranks.
    #[serde(skip_serializing_if = "Option::is_none")]
    mics_shard_size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    offload_optimizer: Option<OffloadOptimizer>,
    #[serde(skip_serializing_if = "Option::is_none")]
    offload_param: Option<OffloadParam>,
}

#[derive(Serialize)]
struct OffloadOptimizer {
    device: &'static str,
    pin_memory: bool,
    /// Fraction of the optimizer step run on the CPU (ZeRO-3 only).
    #[serde(skip_serializing_if = "Option::is_none")]
    ratio: Option<f64>,
}

#[derive(Serialize)]
struct OffloadParam {
    device: &'static str,
    pin_memory: bool,
}

#[derive(Serialize)]
struct ActivationCheckpointing {
    partition_activations: bool,
    cpu_checkpointing: bool,
    contiguous_memory_optimization: bool,
    number_checkpoints: u64,
    synchronize_checkpoint_boundary: bool,
    profile: bool,
}

pub(crate) fn export(spec: &Spec, strategy: &Strategy, options: &ExportOptions) -> ExportOutput {
    let mut report = Report::new();
    report.check_common(spec, strategy);
    report_degrees(spec, strategy, &mut report);
    let batch = batches(spec, strategy, &mut report);

    let (bf16, fp16) = match spec.train.precision {
        Precision::Bf16 => (Some(Enabled { enabled: true }), None),
        Precision::Fp16 => (
            None,
            Some(Fp16 {
                enabled: true,
                loss_scale: 0,
                initial_scale_power: 16,
                loss_scale_window: 1000,
                hysteresis: 2,
                min_loss_scale: 1,
            }),
        ),
        Precision::Fp8 => {
            report.unsupported(
                "precision fp8: ds_config has no FP8 switch (FP8 comes from Transformer Engine \
                 layers in the model code); written as bf16",
            );
            (Some(Enabled { enabled: true }), None)
        }
        Precision::Fp32 => (None, None),
    };
    report_attention_kernel(spec, &mut report);

    let zero = zero_section(spec, strategy, &mut report);
    let activation_checkpointing = checkpointing_section(spec, strategy, &mut report);
    report.note("gradient_clipping 1.0 is the customary value; Tessel's spec does not set one");
    if zero.offload_optimizer.is_some() {
        report.note(
            "add an optimizer and scheduler (here or in code); with offload_optimizer DeepSpeed \
             steps on the CPU with its CPU Adam",
        );
    } else {
        report.note("add an optimizer and scheduler (here or in code)");
    }

    let config = DsConfig {
        train_batch_size: batch.global,
        train_micro_batch_size_per_gpu: batch.micro,
        gradient_accumulation_steps: batch.micro_batches,
        gradient_clipping: 1.0,
        bf16,
        fp16,
        zero_optimization: zero,
        activation_checkpointing,
    };
    let mut text = serde_json::to_string_pretty(&config)
        .expect("a struct of numbers, booleans and strings always serializes");
    text.push('\n');
    if let Some(every) = options.checkpoint_every {
        let steps = if every == 1 {
            "step".to_string()
        } else {
            format!("{every} steps")
        };
        report.note(format!(
            "save a checkpoint every {steps} (`model_engine.save_checkpoint` in the training \
             loop): a DeepSpeed config has no interval"
        ));
    }
    ExportOutput {
        text,
        file_name_hint: format!("{}.ds_config.json", strategy.name),
        unsupported: report.unsupported,
        notes: report.notes,
    }
}

/// The attention kernel is Megatron-DeepSpeed's choice, by flag, not ds_config's:
/// `--use-flash-attn-v1` or `--use-flash-attn-v2` (its arguments); it has no cuDNN path.
fn report_attention_kernel(spec: &Spec, report: &mut Report) {
    match spec.train.attention_kernel {
        None => {}
        Some(AttentionKernel::Flash1) => report.note(
            "attention_kernel = flash1: Megatron-DeepSpeed's --use-flash-attn-v1 (a launch flag, \
             not part of ds_config)",
        ),
        Some(AttentionKernel::Flash2) => report.note(
            "attention_kernel = flash2: Megatron-DeepSpeed's --use-flash-attn-v2 (a launch flag, \
             not part of ds_config)",
        ),
        Some(AttentionKernel::Cudnn) => report.unsupported(
            "attention_kernel = cudnn: Megatron-DeepSpeed runs flash-attention \
             (--use-flash-attn-v1, --use-flash-attn-v2) or its own attention, not cuDNN's fused \
             kernel",
        ),
    }
}

/// Parallel degrees and training settings that live outside ds_config: notes of what to set in
/// the launcher or the model code, and what DeepSpeed cannot run.
fn report_degrees(spec: &Spec, strategy: &Strategy, report: &mut Report) {
    if spec.train.compile {
        report.note(
            "compile = true: torch.compile is applied in the training script (the engine's \
             compile()), not in ds_config",
        );
    }
    if strategy.tp > 1 {
        report.note(format!(
            "tp = {}: tensor parallelism is not part of ds_config; set it with Megatron-DeepSpeed \
             (--tensor-model-parallel-size {}) or, for Hugging Face models, DeepSpeed's AutoTP",
            strategy.tp, strategy.tp
        ));
    }
    if strategy.sequence_parallel && strategy.tp > 1 {
        report.note(
            "sequence_parallel: a Megatron-DeepSpeed flag (--sequence-parallel), not part of \
             ds_config",
        );
    }
    if strategy.pp > 1 {
        report.note(format!(
            "pp = {}: pipeline stages come from the model code (deepspeed.pipe.PipelineModule \
             with num_stages = {}); gradient_accumulation_steps is then the number of pipeline \
             micro-batches",
            strategy.pp, strategy.pp
        ));
        if strategy.interleave > 1 {
            report.unsupported(format!(
                "interleave = {}: DeepSpeed's pipeline engine has no interleaved schedule",
                strategy.interleave
            ));
        }
        if zero_stage(strategy) >= 2 {
            report.unsupported(format!(
                "zero = {} with pp = {}: DeepSpeed's pipeline engine accepts ZeRO stage 0 or 1 \
                 only",
                zero_stage(strategy),
                strategy.pp
            ));
        }
        if strategy.stages.is_some() {
            report.note("stages: set the split in code (PipelineModule partition_method)");
        }
    }
    if strategy.cp > 1 {
        report.unsupported(format!(
            "cp = {}: context parallelism is not part of ds_config; DeepSpeed-Ulysses \
             (sequence_parallel_size in code) splits the sequence with all-to-all instead of \
             ring attention",
            strategy.cp
        ));
    }
    if strategy.ep > 1 && spec.model.moe.is_some() {
        report.note(format!(
            "ep = {}: expert parallelism is set in code (deepspeed.moe.layer.MoE(ep_size = {}))",
            strategy.ep, strategy.ep
        ));
    }
}

fn zero_section(spec: &Spec, strategy: &Strategy, report: &mut Report) -> Zero {
    let stage = zero_stage(strategy);
    // `overlap_comm` as the spec's `train.overlap.grad_reduce` (DeepSpeed's defaults unless
    // written: on under ZeRO-3 only).
    let overlap = spec.train.overlap(stage == 3);
    let offload = strategy.offload;
    let sharded = stage >= 1;
    let mut zero = Zero {
        stage,
        overlap_comm: sharded.then_some(overlap.grad_reduce),
        contiguous_gradients: sharded.then_some(true),
        reduce_bucket_size: sharded.then_some(BUCKET_SIZE),
        allgather_bucket_size: (stage == 1 || stage == 2).then_some(BUCKET_SIZE),
        stage3_prefetch_bucket_size: (stage == 3).then_some(BUCKET_SIZE),
        stage3_param_persistence_threshold: (stage == 3).then_some(PERSISTENCE_THRESHOLD),
        mics_shard_size: None,
        offload_optimizer: None,
        offload_param: None,
    };
    let shard = strategy.shard_degree();
    if shard < strategy.dp {
        if stage == 3 {
            zero.mics_shard_size = Some(shard);
            report.note(format!(
                "dp_shard = {shard}: MiCS shards ZeRO-3 state over groups of {shard} \
                 data-parallel ranks; build the model under deepspeed.zero.MiCS_Init"
            ));
        } else {
            report.unsupported(format!(
                "dp_shard = {shard}: DeepSpeed shards over part of the data-parallel ranks with \
                 MiCS, under ZeRO-3 only; written as sharding over all {}",
                strategy.dp
            ));
        }
    }

    if offload.optimizer > 0.0 {
        if !sharded {
            report.unsupported(format!(
                "offload.optimizer = {}: DeepSpeed offloads optimizer state only with ZeRO stage \
                 1 or higher; not written",
                offload.optimizer
            ));
        } else {
            let partial = offload.optimizer < 1.0;
            let ratio = if partial && stage == 3 {
                Some(offload.optimizer)
            } else {
                if partial {
                    report.unsupported(format!(
                        "offload.optimizer = {}: partial optimizer offload (ratio) needs ZeRO-3; \
                         written as full offload",
                        offload.optimizer
                    ));
                }
                None
            };
            zero.offload_optimizer = Some(OffloadOptimizer {
                device: "cpu",
                pin_memory: true,
                ratio,
            });
        }
    }
    if offload.weights > 0.0 {
        if stage == 3 {
            if offload.weights < 1.0 {
                report.unsupported(format!(
                    "offload.weights = {}: DeepSpeed offloads all parameters or none; written as \
                     full parameter offload",
                    offload.weights
                ));
            }
            zero.offload_param = Some(OffloadParam {
                device: "cpu",
                pin_memory: true,
            });
        } else {
            report.unsupported(format!(
                "offload.weights = {}: parameter offload needs ZeRO-3; not written",
                offload.weights
            ));
        }
    }
    if offload.gradients > 0.0 {
        if zero.offload_optimizer.is_some() {
            report.note(format!(
                "offload.gradients = {}: with offload_optimizer DeepSpeed moves gradients to the \
                 host for the CPU optimizer step; there is no separate gradient setting",
                offload.gradients
            ));
        } else {
            report.unsupported(format!(
                "offload.gradients = {}: DeepSpeed moves gradients to the host only together \
                 with offload_optimizer",
                offload.gradients
            ));
        }
    }
    zero
}

fn checkpointing_section(
    spec: &Spec,
    strategy: &Strategy,
    report: &mut Report,
) -> Option<ActivationCheckpointing> {
    let pp = strategy.pp.max(1);
    let layers_per_gpu = spec.model.layers.div_ceil(pp);
    let offload_activations = strategy.offload.activations > 0.0;
    let checkpoints = match strategy.recompute {
        Recompute::None => {
            if offload_activations {
                report.unsupported(format!(
                    "offload.activations = {}: DeepSpeed offloads only checkpointed activations \
                     (cpu_checkpointing), and this strategy does not recompute",
                    strategy.offload.activations
                ));
            }
            return None;
        }
        Recompute::Selective => {
            report.note(
                "recompute = selective: pass --recompute-granularity selective to \
                 Megatron-DeepSpeed; ds_config's activation_checkpointing configures whole-layer \
                 checkpoints only",
            );
            if offload_activations {
                report.unsupported(
                    "offload.activations: DeepSpeed's cpu_checkpointing applies to whole-layer \
                     checkpoints only",
                );
            }
            return None;
        }
        Recompute::Modules(modules) => {
            report.unsupported(format!(
                "recompute = {}: DeepSpeed recomputes whole layers, not the modules {modules}",
                strategy.recompute
            ));
            return None;
        }
        Recompute::Full => layers_per_gpu,
        Recompute::Partial { full_layers } => {
            report.note(format!(
                "recompute = {{ full_layers = {full_layers} }}: the model code chooses which \
                 layers are checkpointed (Megatron-DeepSpeed: --recompute-method block \
                 --recompute-num-layers {full_layers})"
            ));
            full_layers.min(layers_per_gpu)
        }
    };
    if offload_activations && strategy.offload.activations < 1.0 {
        report.unsupported(format!(
            "offload.activations = {}: cpu_checkpointing moves every checkpoint to the host; \
             written as enabled",
            strategy.offload.activations
        ));
    }
    report.note(
        "activation_checkpointing takes effect where the model code calls \
         deepspeed.checkpointing.checkpoint (Megatron-DeepSpeed does)",
    );
    Some(ActivationCheckpointing {
        // Splits each checkpoint over the tensor-parallel ranks; the host copy needs it too.
        partition_activations: strategy.tp > 1 || offload_activations,
        cpu_checkpointing: offload_activations,
        contiguous_memory_optimization: true,
        number_checkpoints: checkpoints,
        synchronize_checkpoint_boundary: false,
        profile: false,
    })
}
