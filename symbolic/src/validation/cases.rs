//! Turns rows of the published-runs table into costable cases: a `Spec`, a `Strategy` and
//! what was measured. Rows that lack something the cost model needs are kept with the reason.

use tessel_grammar::{
    AttentionKernel, Choice, Fp8Scaling, Framework, MlpKind, ModelSpec, NormKind, Objective,
    Optimizer, OverlapSpec, PositionKind, Precision, Recompute, SearchSpace, Spec, Strategy,
    TrainSpec,
};

use super::hardware::{cluster_for, gpu_for};

/// Which published source a row comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    Korthikanti,
    MegatronReadme,
    Bloom,
    Torchtitan,
    /// MPT runs on H100 (throughput fit source for the Hopper generation).
    MptHopper,
    /// MPT runs on A100 (evaluation).
    MptAmpere,
    Nemo,
    Mist,
    MtNlg,
    Palm,
}

impl Source {
    pub fn from_columns(source: &str, gpu: &str) -> Source {
        let starts = |prefix: &str| source.starts_with(prefix);
        if starts("Korthikanti") {
            Source::Korthikanti
        } else if starts("Megatron-LM") {
            Source::MegatronReadme
        } else if starts("BLOOM") {
            Source::Bloom
        } else if starts("torchtitan") {
            Source::Torchtitan
        } else if starts("MPT") && gpu.to_ascii_lowercase().contains("h100") {
            Source::MptHopper
        } else if starts("MPT") {
            Source::MptAmpere
        } else if starts("NeMo") || starts("Megatron-Bridge") {
            Source::Nemo
        } else if starts("Mist") {
            Source::Mist
        } else if starts("MT-NLG") {
            Source::MtNlg
        } else {
            Source::Palm
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Source::Korthikanti => "Korthikanti et al. 2022",
            Source::MegatronReadme => "Megatron-LM README 2020",
            Source::Bloom => "BLOOM-176B sweeps and run",
            Source::Torchtitan => "torchtitan",
            Source::MptHopper => "MosaicML llm-foundry (MPT), H100",
            Source::MptAmpere => "MosaicML llm-foundry (MPT), A100",
            Source::Nemo => "NeMo / Megatron-Bridge",
            Source::Mist => "Mist artifact",
            Source::MtNlg => "MT-NLG 530B",
            Source::Palm => "PaLM (TPU)",
        }
    }

    /// Sources the calibration was fitted on: every GPU source with complete configurations
    /// (each weighs the same). How well the fit transfers is measured by leaving one source
    /// out at a time (`examples/calibrate.rs`, the cross-validation table of
    /// `docs/VALIDATION.md`).
    pub fn is_fit(self) -> bool {
        self != Source::Palm
    }

    /// How a source enters the calibration, in words.
    pub fn role(self) -> &'static str {
        if self.is_fit() {
            "fit"
        } else {
            "not costed"
        }
    }
}

/// How the source measured memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryMeasure {
    /// nvidia-smi: everything on the device, CUDA context included.
    Device,
    /// The caching allocator's reserved bytes (no CUDA context, no NCCL buffers).
    Reserved,
    /// The caching allocator's allocated bytes (reserved minus fragmentation).
    Allocated,
}

/// What a row measured about throughput.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Throughput {
    StepTime(f64),
    TokensPerGpu(f64),
}

/// One costable published run.
#[derive(Clone, Debug)]
pub struct Case {
    pub line: usize,
    pub source: Source,
    pub table: String,
    pub model: String,
    pub spec: Spec,
    pub strategy: Strategy,
    pub throughput: Option<Throughput>,
    /// GiB per GPU and how it was measured.
    pub memory: Option<(f64, MemoryMeasure)>,
    /// The run ran out of memory.
    pub oom: bool,
    /// Assumptions the conversion made for fields the row leaves empty.
    pub assumptions: Vec<String>,
}

/// A row that could not be costed, and why.
#[derive(Clone, Debug)]
pub struct Skipped {
    pub line: usize,
    pub source: Source,
    pub model: String,
    pub reason: String,
}

/// The software a row trained with: what its notes or ZeRO column name (DeepSpeed, FSDP), else
/// what its source states for all its runs (BLOOM and MT-NLG ran Megatron-DeepSpeed,
/// torchtitan and llm-foundry are FSDP-based), else Megatron-LM.
fn framework_of(source: Source, notes: &str, zero_column: &str) -> Framework {
    let notes = notes.to_ascii_lowercase();
    // Megatron-Bridge's "FSDP column" is Megatron-Core's own sharding (Megatron-FSDP).
    if source == Source::Nemo {
        return if zero_column.contains("megatron-fsdp") {
            Framework::MegatronFsdp
        } else {
            Framework::Megatron
        };
    }
    if notes.contains("deepspeed") {
        return Framework::Deepspeed;
    }
    if zero_column.contains("fsdp") || notes.contains("fsdp") {
        return Framework::Fsdp;
    }
    match source {
        Source::Bloom | Source::MtNlg => Framework::Deepspeed,
        Source::Torchtitan | Source::MptHopper | Source::MptAmpere => Framework::Fsdp,
        _ => Framework::Megatron,
    }
}

/// What a row's software overlapped, where it differs from its framework's default today:
/// - Megatron-LM before Megatron-Core (the 2020 README, Korthikanti et al. 2022) reduced
///   gradients after the backward pass and had no distributed optimizer to overlap;
///   `--overlap-grad-reduce` and `--overlap-param-gather` came with Megatron-Core in 2023.
/// - NeMo's performance configurations, which its published tables run, overlap the
///   tensor-parallel collectives with the GEMMs through Transformer Engine's userbuffers
///   (`ub_tp_comm_overlap: True` in NeMo-Framework-Launcher's
///   `conf/training/gpt3/175b_fp8_performance.yaml`; NeMo 2.0's and Megatron-Bridge's
///   performance recipes turn on `tp_comm_overlap` the same way).
fn overlap_of(source: Source) -> Option<OverlapSpec> {
    match source {
        Source::Korthikanti | Source::MegatronReadme => Some(OverlapSpec {
            grad_reduce: Some(false),
            param_gather: Some(false),
            tp_comm: None,
        }),
        Source::Nemo => Some(OverlapSpec {
            grad_reduce: None,
            param_gather: None,
            tp_comm: Some(true),
        }),
        _ => None,
    }
}

/// A GPT-3-style shape: layers, hidden size and heads (the MLP is 4 × hidden).
#[derive(Clone, Copy)]
struct Gpt3Shape {
    layers: u64,
    hidden: u64,
    heads: u64,
}

/// GPT-2's BPE vocabulary, which GPT-3 and NeMo's GPT-3 configurations use.
const GPT2_BPE_VOCAB: u64 = 50257;

/// The shapes of the GPT-3 models NeMo's performance tables name without giving them: NeMo's
/// training configurations (NeMo-Framework-Launcher `launcher_scripts/conf/training/gpt3/5b.yaml`
/// and `20b.yaml`) and the GPT-3 paper's Table 2.1 for 175B.
fn published_gpt3_shape(model: &str) -> Option<Gpt3Shape> {
    let shape = |layers, hidden, heads| Gpt3Shape {
        layers,
        hidden,
        heads,
    };
    match model {
        "GPT3-5B" => Some(shape(24, 4096, 32)),
        "GPT3-20B" => Some(shape(44, 6144, 48)),
        "GPT3-175B" => Some(shape(96, 12288, 96)),
        _ => None,
    }
}

/// Reads every row of the table (the first record is the header).
pub fn cases_from_records(records: &[Vec<String>]) -> (Vec<Case>, Vec<Skipped>) {
    let mut cases = Vec::new();
    let mut skipped = Vec::new();
    let Some(header) = records.first() else {
        return (cases, skipped);
    };
    for (index, record) in records.iter().enumerate().skip(1) {
        let row = Row { header, record };
        let line = index + 1;
        match case_from_row(&row, line) {
            Ok(case) => cases.push(case),
            Err(reason) => skipped.push(Skipped {
                line,
                source: Source::from_columns(row.get("source"), row.get("gpu")),
                model: row.get("model").to_string(),
                reason,
            }),
        }
    }
    (cases, skipped)
}

struct Row<'a> {
    header: &'a [String],
    record: &'a [String],
}

impl Row<'_> {
    fn get(&self, column: &str) -> &str {
        self.header
            .iter()
            .position(|h| h == column)
            .and_then(|i| self.record.get(i))
            .map_or("", |s| s.trim())
    }

    fn number(&self, column: &str) -> Option<f64> {
        self.get(column).parse::<f64>().ok()
    }

    fn count(&self, column: &str) -> Option<u64> {
        let value = self.number(column)?;
        (value >= 0.0 && value.fract() == 0.0).then_some(value as u64)
    }

    fn require(&self, column: &str) -> Result<u64, String> {
        self.count(column)
            .ok_or_else(|| format!("`{column}` not given"))
    }
}

fn case_from_row(row: &Row, line: usize) -> Result<Case, String> {
    let source_column = row.get("source");
    let source = Source::from_columns(source_column, row.get("gpu"));
    if source == Source::Palm {
        return Err("TPU run: not a GPU".to_string());
    }
    let gpu_column = row.get("gpu");
    let gpu = gpu_for(gpu_column).ok_or_else(|| format!("unknown GPU `{gpu_column}`"))?;
    let notes = row.get("notes");
    let model_name = row.get("model");
    let mut assumptions = Vec::new();

    let published_shape = published_gpt3_shape(model_name);
    let shape = |column: &str, published: Option<u64>| match (row.count(column), published) {
        (Some(value), _) | (None, Some(value)) => Ok(value),
        (None, None) => Err(format!("`{column}` not given")),
    };
    let layers = shape("layers", published_shape.map(|s| s.layers))?;
    let hidden = shape("hidden", published_shape.map(|s| s.hidden))?;
    let heads = shape("heads", published_shape.map(|s| s.heads))?;
    let ffn = shape("ffn_hidden", published_shape.map(|s| 4 * s.hidden))?;
    let vocab = shape("vocab", published_shape.map(|_| GPT2_BPE_VOCAB))?;
    if published_shape.is_some() && row.count("layers").is_none() {
        assumptions.push(
            "shape of NeMo's GPT-3 configuration (NeMo-Framework-Launcher conf/training/gpt3; \
             175B: arXiv 2005.14165 Table 2.1), GPT-2 BPE vocabulary"
                .into(),
        );
    }
    let seq = row.require("seq_len")?;
    let gpus = row.require("num_gpus")?;
    let tp = row.count("tp").unwrap_or(1);
    let pp = row.count("pp").unwrap_or(1);
    let cp = row.count("cp").unwrap_or(1).max(1);
    let ep = row.count("ep").unwrap_or(1).max(1);
    let dp = row.require("dp")?;
    if heads == 0 || hidden % heads != 0 {
        return Err("hidden is not a multiple of heads".to_string());
    }
    let interleave = match row.get("interleave") {
        "" => 1,
        text => text
            .parse::<u64>()
            .map_err(|_| format!("interleave `{text}` is not a number"))?,
    };
    let microbatch = match row.count("microbatch") {
        Some(mb) => mb,
        None if source == Source::MegatronReadme => {
            assumptions.push("micro-batch = global batch / dp (one micro-batch per step)".into());
            row.require("global_batch")? / dp.max(1)
        }
        None if source == Source::MtNlg => {
            assumptions.push(
                "micro-batch 1, as in Korthikanti et al.'s configuration of the same 530B model \
                 on the same cluster"
                    .into(),
            );
            1
        }
        None => return Err("micro-batch size not given".to_string()),
    };
    let global_batch = match row.count("global_batch") {
        Some(gb) => gb,
        None if source == Source::Torchtitan => {
            assumptions.push("global batch = dp · local batch (no accumulation)".into());
            dp * microbatch
        }
        None => return Err("global batch not given".to_string()),
    };

    let lower_notes = notes.to_ascii_lowercase();
    let lower_model = model_name.to_ascii_lowercase();
    let precision = if lower_notes.contains("fp8")
        || lower_model.contains("float8")
        || lower_notes.contains("float8 linears")
    {
        Precision::Fp8
    } else if lower_notes.starts_with("fp16")
        || lower_notes.contains("mixed precision fp16")
        || lower_notes.starts_with("fp16,")
        || lower_notes.contains("; fp16")
        || (source == Source::Mist && lower_notes.contains("fp16"))
    {
        Precision::Fp16
    } else if gpu.peak.bf16 == 0.0 || source == Source::MegatronReadme {
        // The 2020 Megatron-LM README predates Megatron's bf16 support: fp16.
        Precision::Fp16
    } else {
        Precision::Bf16
    };
    let flash = match source {
        Source::MptHopper | Source::MptAmpere | Source::Torchtitan | Source::Nemo => true,
        _ => notes.contains("FlashAttention") && !notes.contains("no FlashAttention"),
    };

    let llama = lower_model.contains("llama");
    let kv_heads = if llama && (lower_model.contains("llama3") || lower_model.contains("llama 3")) {
        // Llama 3 and 3.1 use 8 key/value heads at every size (arXiv 2407.21783 Table 3).
        8
    } else if llama && lower_model.contains("70b") {
        // Llama 2 70B uses grouped-query attention with 8 key/value heads (arXiv 2307.09288).
        8
    } else {
        heads
    };
    let gpt2_style = published_shape.is_some()
        || matches!(
            source,
            Source::Korthikanti | Source::MegatronReadme | Source::MtNlg | Source::Mist
        );
    // Megatron-LM's GPT models and Hugging Face's GPT-2 train with hidden and attention dropout
    // 0.1; BLOOM (its tr11 configuration), MPT, Llama-style torchtitan and NeMo runs with none.
    let dropout = if gpt2_style { 0.1 } else { 0.0 };
    let model = ModelSpec {
        name: model_name.to_string(),
        layers,
        hidden,
        heads,
        kv_heads,
        head_dim: hidden / heads,
        ffn_hidden: ffn,
        vocab,
        mlp: if llama {
            MlpKind::Swiglu
        } else {
            MlpKind::Gelu
        },
        norm: if llama {
            NormKind::Rmsnorm
        } else {
            NormKind::Layernorm
        },
        tie_embeddings: !llama,
        // MPT has no biases (no_bias); GPT-2/3, Megatron and BLOOM do; Llama does not.
        bias: !llama && !matches!(source, Source::MptHopper | Source::MptAmpere),
        max_seq_len: Some(seq),
        // BLOOM and MPT use ALiBi, Llama rotary: neither has position parameters.
        position: if gpt2_style {
            PositionKind::Learned
        } else {
            PositionKind::Rope
        },
        moe: None,
        encoders: Vec::new(),
    };

    let full_or = |default: Recompute, note: &str, assumptions: &mut Vec<String>| {
        assumptions.push(note.to_string());
        default
    };
    let recompute_column = row.get("recompute").to_ascii_lowercase();
    let layers_per_stage = layers.div_ceil(pp.max(1));
    let recompute = if recompute_column.starts_with("full") {
        Recompute::Full
    } else if source == Source::Torchtitan && recompute_column.starts_with("selective") {
        // torchtitan's selective checkpointing either wraps every second block ("layer") or,
        // per operator ("op", its default), saves every second matmul output and recomputes
        // the rest of the forward: both re-run about half of the forward and keep about half
        // of the activations, which is full recompute of half the layers.
        assumptions.push(
            "torchtitan selective checkpointing (layer or op) = full recompute of half the layers"
                .into(),
        );
        Recompute::Partial {
            full_layers: layers_per_stage / 2,
        }
    } else if recompute_column.starts_with("selective") {
        Recompute::Selective
    } else if recompute_column.starts_with("none") {
        Recompute::None
    } else if recompute_column.starts_with("partial") {
        let full_layers = recompute_column
            .split(|c: char| !c.is_ascii_digit())
            .find_map(|part| part.parse::<u64>().ok().filter(|&n| n > 0))
            .ok_or("partial recompute without a layer count")?;
        assumptions.push(format!(
            "partial recompute of {full_layers} layers applied to every stage"
        ));
        Recompute::Partial { full_layers }
    } else if recompute_column.is_empty() {
        match source {
            Source::MegatronReadme | Source::MtNlg => full_or(
                Recompute::Full,
                "full recompute (activation checkpointing, the default of these scripts)",
                &mut assumptions,
            ),
            _ => full_or(
                Recompute::None,
                "no recompute (not stated)",
                &mut assumptions,
            ),
        }
    } else {
        return Err(format!("unknown recompute `{recompute_column}`"));
    };
    let sequence_parallel = match row.get("seq_parallel") {
        "yes" => true,
        "no" => false,
        _ => {
            let default = tp > 1 && matches!(source, Source::Nemo | Source::Torchtitan);
            if tp > 1 {
                assumptions.push(format!(
                    "sequence parallelism {} (not stated)",
                    if default { "on" } else { "off" }
                ));
            }
            default
        }
    };
    let zero_column = row.get("zero_stage").to_ascii_lowercase();
    let zero = if let Some(digit) = zero_column.chars().next().and_then(|c| c.to_digit(10)) {
        digit as u8
    } else if zero_column.contains("shard_grad_op") {
        2
    } else if zero_column.contains("fsdp") {
        3
    } else if zero_column.contains("distributed optimizer") {
        1
    } else if source == Source::Nemo {
        assumptions.push("distributed optimizer (NeMo's default)".into());
        1
    } else {
        0
    };

    let framework = framework_of(source, notes, &zero_column);
    // The FP8 recipe when a row names one other than its framework's default:
    // torchtitan's torchao recipes, Transformer Engine's current scaling ("FP8-CS", per
    // tensor and dynamic) in Megatron-Bridge, and llm-foundry's `amp_fp8`, which runs
    // Transformer Engine's delayed scaling.
    let fp8_scaling = if precision != Precision::Fp8 {
        None
    } else if lower_model.contains("rowwise") {
        Some(Fp8Scaling::Rowwise)
    } else if lower_model.contains("tensorwise") || lower_notes.contains("fp8-cs") {
        Some(Fp8Scaling::Tensorwise)
    } else if lower_notes.contains("amp_fp8") {
        Some(Fp8Scaling::Delayed)
    } else {
        None
    };
    // llm-foundry's benchmark script launches `attn_impl: triton` unless told otherwise
    // (scripts/train/benchmarking/submit_benchmarks.py, `--attn_impl` default), the Triton
    // port of FlashAttention's first algorithm. The H100 tables' sweep (sweep.sh at b2a43a14)
    // does not tell it otherwise either, but costed as FlashAttention v1 on Hopper those rows
    // run 20-28 % slow at 32-64k tokens: the Triton kernel on Hopper is not measured, and the
    // H100 rows keep the framework's default kernel (docs/VALIDATION.md).
    let attention_kernel = (source == Source::MptAmpere && flash).then(|| {
        assumptions.push("attention kernel: llm-foundry's Triton FlashAttention (flash1)".into());
        AttentionKernel::Flash1
    });
    let train = TrainSpec {
        seq_len: seq,
        global_batch,
        precision,
        optimizer: Optimizer::Adam,
        flash_attention: flash,
        attention_kernel,
        norm_kernel: None,
        dropout,
        framework,
        fp8_scaling,
        // llm-foundry's MPT configurations use flash-attn's fused cross-entropy.
        fused_cross_entropy: matches!(source, Source::MptHopper | Source::MptAmpere)
            .then_some(true),
        // torchtitan names its torch.compile runs.
        compile: lower_model.contains("compile") || lower_notes.contains("compile"),
        memory_saving_kernels: tessel_grammar::MemorySavingKernels::Off,
        overlap: overlap_of(source),
        failures: None,
        finetune: None,
        grad_compression: None,
        multimodal: None,
    };
    let cluster = cluster_for(source_column, gpu_column, gpu, gpus);
    let search = SearchSpace {
        memory_limit: 1.0,
        objective: Objective::Throughput,
        microbatch: Choice::Auto,
        ..SearchSpace::default()
    };
    let strategy = Strategy {
        name: format!("row{line}"),
        dp,
        tp,
        pp,
        cp,
        ep,
        microbatch,
        interleave,
        recompute,
        sequence_parallel,
        zero,
        ..Strategy::default()
    };
    let spec = Spec {
        model,
        cluster,
        train,
        strategies: vec![strategy.clone()],
        search,
    };

    let throughput = if let Some(step) = row.number("measured_step_time_s") {
        Some(Throughput::StepTime(step))
    } else {
        row.number("measured_tokens_per_s")
            .map(Throughput::TokensPerGpu)
    };
    let memory_measure = match source {
        Source::Bloom => Some(MemoryMeasure::Device),
        Source::Torchtitan => Some(MemoryMeasure::Reserved),
        Source::Mist => Some(MemoryMeasure::Allocated),
        _ => None,
    };
    let memory = row
        .number("measured_mem_gb")
        .and_then(|gib| memory_measure.map(|m| (gib, m)));
    let oom = notes.starts_with("OOM");
    if throughput.is_none() && memory.is_none() && !oom {
        return Err("no step time, tokens/s or memory to compare".to_string());
    }
    Ok(Case {
        line,
        source,
        table: row.get("table").to_string(),
        model: model_name.to_string(),
        spec,
        strategy,
        throughput,
        memory,
        oom,
        assumptions,
    })
}
