//! GPUs and clusters of the published runs, from datasheets and from what each source states.

use tessel_grammar::{ClusterSpec, GpuEfficiency, GpuSpec, Link, PeakCompute};

use crate::GIB;

const GB: f64 = 1e9;
const TF: f64 = 1e12;

fn gpu(name: &str, memory_gib: f64, peak: PeakCompute, hbm_gb_s: f64) -> GpuSpec {
    GpuSpec {
        name: name.to_string(),
        memory: memory_gib * GIB,
        peak,
        hbm_bandwidth: hbm_gb_s * GB,
        efficiency: GpuEfficiency::default(),
        compute_units: None,
        gemm_tile: None,
    }
}

/// NVIDIA A100 datasheet (2021): 312 TF dense bf16/fp16, 156 TF tf32, 19.5 TF fp32; 80GB SXM
/// 2,039 GB/s, 40GB SXM 1,555 GB/s.
fn a100(memory_gib: f64, hbm_gb_s: f64) -> GpuSpec {
    let peak = PeakCompute {
        bf16: 312.0 * TF,
        fp16: 312.0 * TF,
        fp8: 0.0,
        fp32: 19.5 * TF,
        tf32: 156.0 * TF,
    };
    gpu(
        &format!("A100-SXM4-{memory_gib}GB"),
        memory_gib,
        peak,
        hbm_gb_s,
    )
}

/// NVIDIA H100 SXM datasheet: 989 TF dense bf16, 1,979 TF dense fp8, 67 TF fp32, 3.35 TB/s
/// HBM3 for the 80GB part. The 95–96GB HBM2e parts of the torchtitan runs have no public
/// datasheet: torchtitan's docs/performance.md gives their 2.4 TB/s HBM2e and 500 W power
/// limit; we use the SXM peaks (torchtitan's own MFU does so too).
fn h100(name: &str, memory_gib: f64, hbm_gb_s: f64) -> GpuSpec {
    let peak = PeakCompute {
        bf16: 989.4 * TF,
        fp16: 989.4 * TF,
        fp8: 1978.9 * TF,
        fp32: 67.0 * TF,
        tf32: 494.7 * TF,
    };
    gpu(name, memory_gib, peak, hbm_gb_s)
}

/// A GPU by the `gpu` column of the published runs; `None` for a non-GPU (TPU).
pub fn gpu_for(column: &str) -> Option<GpuSpec> {
    let lower = column.to_ascii_lowercase();
    if lower.contains("tpu") {
        return None;
    }
    if lower.contains("a100") {
        // The Megatron-LM README of Sep 2020 predates the 80GB A100 (Nov 2020): its DGX A100
        // rows ran on 40GB parts.
        if lower.contains("40gb")
            || column == "A100 (DGX A100)"
            || column == "A100 (DGX A100 cluster)"
        {
            return Some(a100(40.0, 1555.0));
        }
        return Some(a100(80.0, 2039.0));
    }
    if lower.contains("h100") {
        if lower.contains("96gb") {
            return Some(h100("H100-SXM-96GB-HBM2e", 96.0, 2400.0));
        }
        if lower.contains("95gb") {
            return Some(h100("H100-SXM-95GB-HBM2e", 95.0, 2400.0));
        }
        return Some(h100("H100-SXM-80GB", 80.0, 3350.0));
    }
    if lower.contains("v100") {
        // V100 SXM3 32GB (DGX-2) datasheet: 125 TF fp16 tensor, 15.7 TF fp32, 900 GB/s; no
        // bf16, so fp16 is the only half precision.
        let peak = PeakCompute {
            bf16: 0.0,
            fp16: 125.0 * TF,
            fp8: 0.0,
            fp32: 15.7 * TF,
            tf32: 0.0,
        };
        return Some(gpu("V100-SXM3-32GB", 32.0, peak, 900.0));
    }
    if lower.contains("l4") {
        // NVIDIA L4 datasheet: 121 TF dense fp16/bf16 (242 with sparsity), 242 TF dense fp8,
        // 30 TF fp32, 24GB GDDR6 at 300 GB/s.
        let peak = PeakCompute {
            bf16: 121.0 * TF,
            fp16: 121.0 * TF,
            fp8: 242.0 * TF,
            fp32: 30.3 * TF,
            tf32: 60.0 * TF,
        };
        return Some(gpu("L4-24GB", 22.5, peak, 300.0));
    }
    None
}

/// Links of a cluster: per GPU and direction.
struct Fabric {
    gpus_per_node: u64,
    /// GB/s per GPU per direction inside a node.
    intra: f64,
    /// GB/s per GPU per direction across nodes.
    inter: f64,
    /// GB/s host-to-device.
    host: f64,
}

/// The fabric a run used, from its source and GPU column:
/// - DGX A100 / Selene: NVLink3 300 GB/s per direction, 8 × HDR 200 Gb/s (25 GB/s) per GPU;
/// - DGX H100: NVLink4 450 GB/s, 8 × NDR 400 Gb/s (50 GB/s) per GPU;
/// - Jean Zay A100 nodes: NVLink 300 GB/s, 4 × 100 Gb/s Omni-Path per 8-GPU node (6.25 GB/s
///   per GPU);
/// - MosaicML: 1600 Gb/s RoCE per 8-GPU node (25 GB/s per GPU) as the README states;
/// - torchtitan's Grand Teton H100: NVLink 450 GB/s, RDMA 400 Gb/s per GPU;
/// - DGX-2 V100: NVSwitch 150 GB/s, 8 × EDR 100 Gb/s per 16 GPUs (6.25 GB/s per GPU);
/// - GCP L4: PCIe 4.0 x16 (32 GB/s), no NVLink.
fn fabric(source: &str, gpu_column: &str) -> Fabric {
    let lower = gpu_column.to_ascii_lowercase();
    let hopper = lower.contains("h100");
    if lower.contains("jean zay") {
        return Fabric {
            gpus_per_node: 8,
            intra: 300.0,
            inter: 6.25,
            host: 25.0,
        };
    }
    if lower.contains("v100") {
        return Fabric {
            gpus_per_node: 16,
            intra: 150.0,
            inter: 6.25,
            host: 12.0,
        };
    }
    if lower.contains("l4") {
        return Fabric {
            gpus_per_node: 8,
            intra: 32.0,
            inter: 12.5,
            host: 25.0,
        };
    }
    if source.starts_with("MPT") {
        return Fabric {
            gpus_per_node: 8,
            intra: if hopper { 450.0 } else { 300.0 },
            inter: 25.0,
            host: if hopper { 50.0 } else { 25.0 },
        };
    }
    if hopper {
        return Fabric {
            gpus_per_node: 8,
            intra: 450.0,
            inter: 50.0,
            host: 50.0,
        };
    }
    Fabric {
        gpus_per_node: 8,
        intra: 300.0,
        inter: 25.0,
        host: 25.0,
    }
}

/// The cluster of one run with `gpus` GPUs.
pub fn cluster_for(source: &str, gpu_column: &str, gpu: GpuSpec, gpus: u64) -> ClusterSpec {
    let fabric = fabric(source, gpu_column);
    let per_node = fabric.gpus_per_node.min(gpus.max(1));
    ClusterSpec {
        name: gpu_column.to_string(),
        gpu,
        nodes: (gpus / per_node).max(1),
        gpus_per_node: per_node,
        intra_node: Link {
            bandwidth: fabric.intra * GB,
            latency: 5e-6,
        },
        inter_node: Link {
            bandwidth: fabric.inter * GB,
            latency: 10e-6,
        },
        host_link: fabric.host * GB,
        host_memory: 1024.0 * GIB,
        calibration: None,
        pools: Vec::new(),
        between_pools: None,
    }
}
