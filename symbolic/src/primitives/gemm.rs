//! A GEMM of a given shape on a given GPU: tile and wave quantization on the GPU's SMs, the
//! prologue and epilogue each tile pays beside its main loop, and the memory floor.
//!
//! cuBLAS covers the `m × n` output with tiles, one per SM at a time: a GEMM needs
//! `⌈m/tm⌉·⌈n/tn⌉` tiles, run in `⌈tiles/SMs⌉` waves, and the last wave leaves SMs idle (wave
//! quantization); a dimension that is not a multiple of the tile pads it. A tile's main loop
//! walks `k` and its prologue and epilogue cost about `k_overhead` more steps of it, so short
//! `k` runs below peak. cuBLAS chooses among tile shapes; smaller tiles reuse operands less
//! (`tile_half_area`: a tile of that area reaches half the rate of an unbounded one), so for
//! small outputs it trades throughput per tile for filled SMs. Nothing beats the time to read
//! the operands and write the result from HBM, and every kernel pays a fixed `launch_s`.
//!
//! A device that does not run cuBLAS names its own tile (the spec's `gemm_tile`): a CPU core's
//! GEMM library computes small blocks of the output in registers (matrixmultiply's sgemm
//! micro-kernel is 16 × 16 with AVX-512, 8 × 8 with AVX2), so its shapes pad to those and not
//! to 256 × 128.

use super::scalar::{c, Scalar};
use crate::cost::GpuGeneration;

/// A GPU generation's GEMM behaviour, fitted on published GEMM measurements
/// (`fit::fit_gemm_primitive`).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmParams {
    /// Fraction of dense peak the largest tile reaches in its main loop.
    pub efficiency: f64,
    /// Main-loop steps a tile's prologue and epilogue cost, in units of `k`.
    pub k_overhead: f64,
    /// Output area (elements) at which a tile runs at half the rate of an unbounded one.
    pub tile_half_area: f64,
    /// Fixed GPU time of one kernel, seconds.
    pub launch_s: f64,
}

impl GemmParams {
    /// The committed fit for a GPU generation (`fit::fit_gemm_primitive`); generations
    /// without GEMM measurements take Ampere's.
    pub fn for_generation(generation: GpuGeneration) -> GemmParams {
        match generation {
            GpuGeneration::Hopper => GemmParams {
                efficiency: 0.8501,
                k_overhead: 157.1,
                tile_half_area: 1208.0,
                launch_s: 5.79e-6,
            },
            _ => GemmParams {
                efficiency: 0.8414,
                k_overhead: 169.9,
                tile_half_area: 1736.0,
                launch_s: 8.74e-6,
            },
        }
    }
}

/// The rate of a GEMM timed at the GPU's power cap, relative to [`GemmParams::efficiency`]
/// (fitted with the Hopper primitive, `fit::fit_gemm_primitive`). Published GEMM benchmarks
/// time short bursts; this project's sweeps run back to back for minutes, holding their
/// H100 and H200 at the 700 W cap with the SM clock at 1,470–1,545 MHz against 1,980 at most
/// (`data/microbench/measured-h200/sustained_gemm.csv`). The same 8192³ product ran at
/// 769–798 TFLOP/s over ten back-to-back calls and at 674–694 sustained on those GPUs, 0.87
/// of it. A training step holds the GPU under load like the sweeps
/// (`KernelEfficiency::sustained_fraction`).
pub const POWER_CAPPED_GEMM_RATE: f64 = 0.8476;

/// How many times faster an FP8 GEMM with one scale per tensor runs than a bf16 GEMM of the
/// same shape on the same GPU. Hopper's is measured by this project on an H100: the median over
/// 52 shapes (a Llama 3 8B and 70B layer's forward, input-gradient and weight-gradient GEMMs at
/// tensor parallelism 1 and 8, and squares) of cuBLASLt's FP8 GEMM (`torch._scaled_mm`) against
/// `torch.matmul` (`data/microbench/measured-h100/fp8/gemm.csv`, 1.10 at 2048³ to 2.22); the
/// GEMMs of a profiled torchao float8 layer ran 1.75–1.90 times faster than in bf16
/// (`fp8/kernels.csv`). Other generations take a prior of 1.6: Ada's fp8 tensor cores are
/// unmeasured here, and Ampere and Volta have none.
pub fn fp8_speedup(generation: GpuGeneration) -> f64 {
    match generation {
        GpuGeneration::Hopper => 1.78,
        _ => 1.6,
    }
}

/// An FP8 GEMM with a scale per row of A and per column of B (torchao's row-wise recipe) over
/// the same GEMM with one scale per tensor, on the same 52 shapes and H100 as
/// [`fp8_speedup`]: the median, from 0.75 to 1.03 (PyTorch 2.11, cuBLAS's outer-vector
/// scaling). Fitted on torchtitan's row-wise runs of 2025 instead, it comes out at 0.88.
pub const FP8_ROWWISE_RATE: f64 = 0.913;

/// Streaming multiprocessors of a GPU, from its name (NVIDIA's architecture whitepapers and
/// datasheets: V100 80, A100/A800 108, H100 SXM/H800/H200/GH200 132, H100 PCIe 114, L4 58,
/// L40S 142, RTX 4090 128, RTX 3090 82, B200 148, T4 40; AMD MI300X 304 compute units). Unknown
/// GPUs get 108: a GEMM's waves then quantize as on an A100.
pub fn sm_count(name: &str) -> f64 {
    let upper = name.to_ascii_uppercase();
    let has = |needle: &str| upper.contains(needle);
    if has("H100") && has("PCIE") {
        114.0
    } else if has("H100") || has("H800") || has("H200") || has("SM_90") || has("H20") {
        132.0
    } else if has("V100") {
        80.0
    } else if has("L40") {
        142.0
    } else if has("L4") {
        58.0
    } else if has("4090") {
        128.0
    } else if has("3090") {
        82.0
    } else if has("B200") {
        148.0
    } else if has("MI300") {
        304.0
    } else if upper == "T4" {
        40.0
    } else {
        108.0
    }
}

/// The compute units a GEMM spreads its tiles over: the spec's `compute_units` where it
/// gives them (a CPU rank multiplies on 1), else the GPU's SMs from its name.
pub fn compute_units(gpu: &tessel_grammar::GpuSpec) -> f64 {
    gpu.compute_units
        .map_or_else(|| sm_count(&gpu.name), |units| units as f64)
}

/// The side of the square output tile `gpu`'s GEMMs compute, where the spec gives one (the
/// spec's `gemm_tile`); `None`: cuBLAS's [`TILES`].
pub fn gemm_tile(gpu: &tessel_grammar::GpuSpec) -> Option<f64> {
    gpu.gemm_tile.map(|side| side as f64)
}

/// The tile shapes cuBLAS chooses among (rows × columns of the output), largest first.
pub const TILES: [(f64, f64); 2] = [(256.0, 128.0), (64.0, 64.0)];

/// The GPU a GEMM runs on: its dense peak at the GEMM's precision, HBM bandwidth reached by a
/// streaming kernel, SM count, and the side of its own square output tile where its GEMMs do
/// not run cuBLAS's [`TILES`] (a CPU core's micro-kernel: the spec's `gemm_tile`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmDevice {
    pub peak_flops: f64,
    pub memory_bandwidth: f64,
    pub sms: f64,
    pub tile: Option<f64>,
}

impl GemmDevice {
    /// `gpu`'s GEMM device at a dense peak of `peak_flops` and a streaming bandwidth of
    /// `memory_bandwidth`.
    pub fn of(gpu: &tessel_grammar::GpuSpec, peak_flops: f64, memory_bandwidth: f64) -> Self {
        GemmDevice {
            peak_flops,
            memory_bandwidth,
            sms: compute_units(gpu),
            tile: gemm_tile(gpu),
        }
    }
}

/// Seconds of `batch` GEMMs of `m × k` by `k × n` with `bytes_per_element` operands.
pub fn gemm_time<S: Scalar>(
    m: S,
    n: S,
    k: S,
    batch: S,
    bytes_per_element: f64,
    device: &GemmDevice,
    params: &GemmParams,
) -> S {
    let own = device.tile.map(|side| [(side, side)]);
    let tiles: &[(f64, f64)] = own.as_ref().map_or(&TILES, |own| own);
    let largest = tiles[0].0 * tiles[0].1;
    let tile_rate = |area: f64| {
        let relative =
            (area / (area + params.tile_half_area)) / (largest / (largest + params.tile_half_area));
        device.peak_flops * params.efficiency * relative / device.sms
    };
    let loop_steps = k.clone() + c(params.k_overhead);
    let compute = tiles
        .iter()
        .map(|&(tm, tn)| {
            let tiles =
                (m.clone() / c(tm)).ceil_of() * (n.clone() / c(tn)).ceil_of() * batch.clone();
            let waves = (tiles / c(device.sms)).ceil_of();
            waves * loop_steps.clone() * c(2.0 * tm * tn / tile_rate(tm * tn))
        })
        .reduce(|a, b| a.min_of(b))
        .unwrap_or_else(|| c(0.0));
    let bytes = (m.clone() * k.clone() + k * n.clone() + m * n) * batch * c(bytes_per_element);
    let memory = bytes / c(device.memory_bandwidth);
    c::<S>(params.launch_s) + compute.max_of(memory)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Expr;

    const DEVICE: GemmDevice = GemmDevice {
        peak_flops: 312e12,
        memory_bandwidth: 1.8e12,
        sms: 108.0,
        tile: None,
    };
    const PARAMS: GemmParams = GemmParams {
        efficiency: 0.9,
        k_overhead: 0.0,
        tile_half_area: 0.0,
        launch_s: 0.0,
    };

    fn tflops(m: f64, n: f64, k: f64) -> f64 {
        2.0 * m * n * k / gemm_time(m, n, k, 1.0, 2.0, &DEVICE, &PARAMS) / 1e12
    }

    #[test]
    fn full_waves_reach_the_fitted_fraction() {
        // 108 SMs × 2 waves of 256 × 128 tiles = 216 tiles = 18 × 12.
        let rate = tflops(18.0 * 256.0, 12.0 * 128.0, 8192.0);
        assert!((rate - 0.9 * 312.0).abs() < 1e-6, "{rate}");
    }

    #[test]
    fn a_device_with_its_own_tile_pads_outputs_to_it_not_to_cublas_tiles() {
        // One CPU core at AVX-512's fp32 peak, with matrixmultiply's 16 × 16 micro-kernel.
        let cpu = GemmDevice {
            peak_flops: 166.4e9,
            memory_bandwidth: 20e9,
            sms: 1.0,
            tile: Some(16.0),
        };
        let params = GemmParams {
            efficiency: 0.4,
            tile_half_area: 1736.0,
            ..PARAMS
        };
        let rate = |device: &GemmDevice, m: f64, n: f64| {
            2.0 * m * n * 4096.0 / gemm_time(m, n, 4096.0, 1.0, 4.0, device, &params)
        };
        let level = 0.4 * 166.4e9;
        // Twelve tiles a side: nothing pads, whatever the tile's area.
        assert!((rate(&cpu, 192.0, 192.0) / level - 1.0).abs() < 1e-12);
        // 200 rows pad to 208, thirteen tiles.
        let padded = rate(&cpu, 200.0, 192.0) / level;
        assert!((padded - 200.0 / 208.0).abs() < 1e-12, "{padded}");
        // cuBLAS's tiles would pad 192 to 256 × 128 tiles or run the smaller, slower 64 × 64.
        let cublas = GemmDevice { tile: None, ..cpu };
        assert!(rate(&cublas, 192.0, 192.0) < 0.8 * level);
    }

    #[test]
    fn one_row_more_than_full_waves_costs_a_partial_wave() {
        // With Ampere's fitted tiles, the extra row spills into smaller tiles or a third wave.
        let params = GemmParams::for_generation(GpuGeneration::Ampere);
        let time = |m: f64| gemm_time(m, 12.0 * 128.0, 4096.0, 1.0, 2.0, &DEVICE, &params);
        let (full, over) = (time(18.0 * 256.0), time(18.0 * 256.0 + 1.0));
        assert!(over > 1.1 * full, "{over} vs {full}");
    }

    #[test]
    fn skinny_gemms_hit_the_memory_floor() {
        let t = gemm_time(16.0, 8192.0, 8192.0, 1.0, 2.0, &DEVICE, &PARAMS);
        let floor = 2.0 * (16.0 * 8192.0 * 2.0 + 8192.0 * 8192.0) / 1.8e12;
        assert!(t >= floor * 0.999, "{t} vs {floor}");
    }

    #[test]
    fn expression_matches_numbers() {
        let m = Expr::symbol("m");
        let e = gemm_time(
            m,
            Expr::from(1536.0),
            Expr::from(12288.0),
            Expr::from(1.0),
            2.0,
            &DEVICE,
            &PARAMS,
        );
        for rows in [128.0, 2048.0, 4097.0] {
            let numeric = gemm_time(rows, 1536.0, 12288.0, 1.0, 2.0, &DEVICE, &PARAMS);
            assert!((e.eval(&|_| rows) - numeric).abs() <= 1e-12 * numeric);
        }
    }
}
