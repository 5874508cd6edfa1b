//! `gpu` blocks.

use crate::fields::{to_fraction, Fields};
use crate::spec::{GpuEfficiency, GpuSpec, PeakCompute};
use crate::units::Dim;

pub const FIELDS: &[&str] = &[
    "memory",
    "bf16",
    "fp16",
    "fp8",
    "fp32",
    "tf32",
    "hbm_bandwidth",
    "host_link",
    "efficiency",
    "compute_units",
    "gemm_tile",
];

const EFFICIENCY_FIELDS: &[&str] = &["matmul", "attention", "memory"];

/// A GPU and the language-only facts about it that the typed spec does not carry.
pub struct GpuDef {
    pub spec: GpuSpec,
    /// Host-to-device bandwidth of the GPU's bus, the default for clusters built from it.
    pub host_link: Option<f64>,
}

pub fn lower(name: &str, f: &mut Fields) -> Option<GpuDef> {
    let before = f.problems.len();
    f.reject_unknown(FIELDS);
    let memory = f.required_quantity("memory", Dim::SIZE, true);
    let bf16 = f.required_quantity("bf16", Dim::COMPUTE, false);
    let fp16 = f.required_quantity("fp16", Dim::COMPUTE, false);
    let fp8 = f.quantity("fp8", Dim::COMPUTE, false).unwrap_or(0.0);
    let fp32 = f.required_quantity("fp32", Dim::COMPUTE, true);
    let tf32 = f.quantity("tf32", Dim::COMPUTE, false).unwrap_or(0.0);
    let hbm_bandwidth = f.required_quantity("hbm_bandwidth", Dim::BANDWIDTH, true);
    let host_link = f.quantity("host_link", Dim::BANDWIDTH, true);
    let compute_units = f.count("compute_units", 1);
    let gemm_tile = f.count("gemm_tile", 1);
    let efficiency = match f.get("efficiency").cloned() {
        None => GpuEfficiency::default(),
        Some(value) => {
            let mut record = Fields::record("efficiency", &value, "{ matmul = 0.8 }", f.problems)?;
            record.reject_unknown(EFFICIENCY_FIELDS);
            let mut read = |key: &str| -> Option<f64> {
                let v = record.get(key)?.clone();
                let fraction = to_fraction(key, &v, record.problems)?;
                if fraction == 0.0 {
                    record.problems.push(crate::diagnostic::Problem::new(
                        v.span,
                        format!("`{key}` efficiency must be above 0"),
                    ));
                    return None;
                }
                Some(fraction)
            };
            GpuEfficiency {
                matmul: read("matmul"),
                attention: read("attention"),
                memory: read("memory"),
            }
        }
    };
    if f.problems.len() > before {
        return None;
    }
    Some(GpuDef {
        spec: GpuSpec {
            name: name.to_string(),
            memory: memory?,
            peak: PeakCompute {
                bf16: bf16?,
                fp16: fp16?,
                fp8,
                fp32: fp32?,
                tf32,
            },
            hbm_bandwidth: hbm_bandwidth?,
            efficiency,
            compute_units,
            gemm_tile,
        },
        host_link,
    })
}
