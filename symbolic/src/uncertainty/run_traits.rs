//! What a configuration is, in the terms its prediction error depends on: the facts of a run
//! that decide which mechanisms the cost model leans on (GPU generation, software, parallel
//! degrees, ZeRO, offload, experts, precision, size). Validated runs are stored as these facts
//! beside their held-out error, so the interval model can be changed without refitting.

use tessel_grammar::{Framework, Precision, Recompute, Spec, Strategy};

use crate::cost::GpuGeneration;

/// The facts of one configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct RunTraits {
    pub generation: GpuGeneration,
    pub framework: Framework,
    pub precision: Precision,
    pub gpus: u64,
    pub dp: u64,
    pub tp: u64,
    pub pp: u64,
    pub cp: u64,
    pub ep: u64,
    pub interleave: u64,
    pub zero: u8,
    /// Any state or activation offloaded to the host.
    pub offload: bool,
    pub recompute: RecomputeKind,
    pub moe: bool,
    /// Total parameters, billions.
    pub params_b: f64,
    /// ZeRO state sharded over part of the data-parallel ranks (`dp_shard` below `dp`).
    pub hybrid_sharding: bool,
    /// Stages on GPUs of more than one type (a pipeline across pools). No run of the validated
    /// table has them, so it is not one of the stored [`RunTraits::COLUMNS`].
    pub mixed_gpus: bool,
}

/// Recompute without its per-stage detail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecomputeKind {
    None,
    Selective,
    Full,
    Partial,
}

impl RecomputeKind {
    fn of(recompute: Recompute) -> RecomputeKind {
        match recompute {
            Recompute::None => RecomputeKind::None,
            // Re-running named modules keeps most activations, as selective recompute does.
            Recompute::Selective | Recompute::Modules(_) => RecomputeKind::Selective,
            Recompute::Full => RecomputeKind::Full,
            Recompute::Partial { .. } => RecomputeKind::Partial,
        }
    }

    fn name(self) -> &'static str {
        match self {
            RecomputeKind::None => "none",
            RecomputeKind::Selective => "selective",
            RecomputeKind::Full => "full",
            RecomputeKind::Partial => "partial",
        }
    }
}

impl RunTraits {
    pub fn of(spec: &Spec, strategy: &Strategy) -> RunTraits {
        let offload = !strategy.offload.is_none()
            || strategy
                .stage_offload
                .as_ref()
                .is_some_and(|stages| stages.iter().any(|o| !o.is_none()));
        RunTraits {
            generation: GpuGeneration::from_name(&spec.cluster.gpu.name),
            framework: spec.train.framework,
            precision: spec.train.precision,
            gpus: strategy.dp * strategy.tp * strategy.pp * strategy.cp,
            dp: strategy.dp,
            tp: strategy.tp,
            pp: strategy.pp,
            cp: strategy.cp,
            ep: strategy.ep,
            interleave: strategy.interleave,
            zero: strategy.zero,
            offload,
            recompute: RecomputeKind::of(strategy.recompute),
            moe: spec.model.moe.is_some(),
            params_b: spec.model.parameter_count().total as f64 / 1e9,
            hybrid_sharding: strategy.shard_degree() < strategy.dp,
            mixed_gpus: spec.cluster.pools.len() > 1,
        }
    }

    /// The CSV columns of [`RunTraits::to_fields`], in order.
    pub const COLUMNS: [&'static str; 16] = [
        "generation",
        "framework",
        "precision",
        "gpus",
        "dp",
        "tp",
        "pp",
        "cp",
        "ep",
        "interleave",
        "zero",
        "offload",
        "recompute",
        "moe",
        "params_b",
        "hybrid_sharding",
    ];

    pub fn to_fields(&self) -> Vec<String> {
        vec![
            self.generation.name().to_string(),
            self.framework.name().to_string(),
            precision_name(self.precision).to_string(),
            self.gpus.to_string(),
            self.dp.to_string(),
            self.tp.to_string(),
            self.pp.to_string(),
            self.cp.to_string(),
            self.ep.to_string(),
            self.interleave.to_string(),
            self.zero.to_string(),
            u8::from(self.offload).to_string(),
            self.recompute.name().to_string(),
            u8::from(self.moe).to_string(),
            format!("{:.3}", self.params_b),
            u8::from(self.hybrid_sharding).to_string(),
        ]
    }

    /// Reads the fields [`RunTraits::to_fields`] wrote.
    pub fn from_fields(fields: &[&str]) -> Result<RunTraits, String> {
        if fields.len() != Self::COLUMNS.len() {
            return Err(format!(
                "expected {} trait fields, found {}",
                Self::COLUMNS.len(),
                fields.len()
            ));
        }
        let int = |i: usize| -> Result<u64, String> {
            fields[i]
                .parse()
                .map_err(|_| format!("{}: `{}` is not a count", Self::COLUMNS[i], fields[i]))
        };
        let pick = |i: usize, names: &[&str]| -> Result<usize, String> {
            names
                .iter()
                .position(|n| *n == fields[i])
                .ok_or_else(|| format!("{}: unknown `{}`", Self::COLUMNS[i], fields[i]))
        };
        let generations = GpuGeneration::ALL;
        let precisions = [
            Precision::Bf16,
            Precision::Fp16,
            Precision::Fp8,
            Precision::Fp32,
        ];
        let recomputes = [
            RecomputeKind::None,
            RecomputeKind::Selective,
            RecomputeKind::Full,
            RecomputeKind::Partial,
        ];
        Ok(RunTraits {
            generation: generations[pick(0, &generations.map(GpuGeneration::name))?],
            framework: Framework::ALL[pick(1, &Framework::ALL.map(Framework::name))?],
            precision: precisions[pick(2, &precisions.map(precision_name))?],
            gpus: int(3)?,
            dp: int(4)?,
            tp: int(5)?,
            pp: int(6)?,
            cp: int(7)?,
            ep: int(8)?,
            interleave: int(9)?,
            zero: int(10)? as u8,
            offload: int(11)? != 0,
            recompute: recomputes[pick(12, &recomputes.map(RecomputeKind::name))?],
            moe: int(13)? != 0,
            params_b: fields[14]
                .parse()
                .map_err(|_| format!("params_b: `{}` is not a number", fields[14]))?,
            hybrid_sharding: int(15)? != 0,
            mixed_gpus: false,
        })
    }
}

fn precision_name(precision: Precision) -> &'static str {
    match precision {
        Precision::Bf16 => "bf16",
        Precision::Fp16 => "fp16",
        Precision::Fp8 => "fp8",
        Precision::Fp32 => "fp32",
    }
}
