//! Published microbenchmarks, read into typed measurements: `shared/data/microbench/` (the
//! gathered set) and the project's own `data/microbench/` (gathered for the primitives; each
//! row cited in its `source` column, each source described in that folder's README).
//!
//! Each measurement keeps its source, so that every primitive can be scored on the sources
//! its fit never saw. Rows the primitives cannot use are left out here, with the reason in
//! the code: sizes printed only as labels, DeepEP's own bandwidth metric, Triton kernels (a
//! GEMM primitive describes cuBLAS), FP8 GEMMs, Blackwell GEMMs (no generation of the cost
//! model yet).

use std::path::{Path, PathBuf};

use super::collective::{Collective, Links};
use super::gemm::GemmDevice;
use crate::validation::parse_csv;

/// One nccl-tests style measurement.
#[derive(Clone, Debug)]
pub struct CollectiveMeasurement {
    pub source: String,
    pub system: String,
    pub kind: Collective,
    pub ranks: f64,
    pub per_node: f64,
    pub bytes: f64,
    pub links: Links,
    pub seconds: f64,
    /// GPUs one host thread launched the call on: nccl-tests' `-g N`; 1 where each GPU has
    /// its own process, as in training.
    pub gpus_per_thread: f64,
    /// Posted as a performance problem (a GitHub issue reporting a system below its
    /// expected rate), or replaced by its source's own later run on the same machines:
    /// scored, never fitted.
    pub never_fitted: bool,
}

/// Sources that are bug reports about a system running below its expected rate (the shared
/// data's README: "use them as data points for that system, not as expectations").
const DEGRADED_REPORTS: [&str; 4] = [
    "NVIDIA/nccl issue #1161",
    "NVIDIA/nccl issue #1244",
    "NVIDIA/nccl-tests issue #232",
    "NVIDIA/nccl-tests issue #290",
];

/// Runs their own source replaced (the copy it was read from, the machines): Oracle Japan's
/// GPU-cluster tutorial first printed a 2-node all-reduce sweep at 71.5 GB/s of bus bandwidth
/// (the Horovod page, 64 B-8 GiB); its later version runs the same two BM.GPU4.8 nodes again
/// after updating the container's NCCL to 2.15.5 and measures 222.9 GB/s at 10 GiB
/// (`data/microbench/README.md`).
const SUPERSEDED_RUNS: [(&str, &str); 1] =
    [("search-index file id 7310580171", "2x OCI BM.GPU4.8")];

/// Measurements published in more than one repository: the file that holds them, and the one
/// measurement its copies are. OpenXLA's `sm_90` matmul table is read from its tensorflow copy
/// (the shared rows) and its ROCm/xla mirror (the rest of the grid): each copy weighs as a
/// source in the fit, but holding out one copy while fitting on the other would hold nothing
/// out, so both are held out together.
const MIRRORED_SOURCES: [(&str, &str); 1] = [(
    "matmul_interpolator_data.h",
    "OpenXLA xla/service/gpu/model/matmul_interpolator_data.h, kDefaultMatmulPTable \"sm_90\" (tensorflow and ROCm/xla copies)",
)];

/// The measurement a row's source is a copy of: its own, or the one its copies share.
fn measurement_of(source: &str) -> String {
    MIRRORED_SOURCES
        .iter()
        .find(|(file, _)| source.contains(file))
        .map_or_else(|| source.to_string(), |(_, name)| name.to_string())
}

/// One GEMM measurement (fp16/bf16, cuBLAS or XLA).
#[derive(Clone, Debug)]
pub struct GemmMeasurement {
    pub source: String,
    /// The measurement the source is a copy of, held out as one (`MIRRORED_SOURCES`).
    pub measurement: String,
    pub gpu: String,
    pub m: f64,
    pub n: f64,
    pub k: f64,
    pub device: GemmDevice,
    pub seconds: f64,
    /// Timed in a sweep that held the GPU at its power cap
    /// ([`super::gemm::POWER_CAPPED_GEMM_RATE`]), not in a short burst.
    pub power_capped: bool,
}

/// One fused-attention measurement.
#[derive(Clone, Debug)]
pub struct AttentionMeasurement {
    /// The published figure or table it was read from.
    pub source: String,
    pub gpu: String,
    pub kernel: String,
    pub seq_len: f64,
    pub head_dim: f64,
    pub causal: bool,
    /// `fwd`, `bwd` or `fwd_bwd`.
    pub direction: String,
    pub peak_flops: f64,
    pub tflops: f64,
}

/// One STREAM-style device-memory measurement.
#[derive(Clone, Debug)]
pub struct MemoryMeasurement {
    pub source: String,
    pub gpu: String,
    pub datasheet_bandwidth: f64,
    pub bandwidth: f64,
}

/// The smallest copy a memory-bound pass is fitted on.
const STREAM_MIN_BYTES: f64 = 64.0 * 1024.0 * 1024.0;

/// The shortest GEMM time a fit reads, seconds. Only the project's sweeps print times, and
/// they time one call at a time (an event pair around each call, then a wait for it), so a
/// call costs at least the host's launch of it: their smallest products took 24 µs (H100)
/// and 32 µs (H200) whatever their size. Rows under this time the launch, not the GEMM, and
/// are left out, as copies under [`STREAM_MIN_BYTES`] are.
const GEMM_MIN_TIMED_S: f64 = 50e-6;

/// Everything read.
#[derive(Clone, Debug, Default)]
pub struct Microbenchmarks {
    pub collectives: Vec<CollectiveMeasurement>,
    pub gemms: Vec<GemmMeasurement>,
    pub attention: Vec<AttentionMeasurement>,
    pub memory: Vec<MemoryMeasurement>,
}

/// The project's own sweeps on lent GPUs (`scripts/gpu/primitives.py`, `data/microbench/`'s
/// folders of these names). They run back to back for minutes, so their GPUs sit at the
/// power cap from the first second (`sustained_gemm.csv` in each), and their GEMMs are fitted
/// at the capped rate ([`GemmMeasurement::power_capped`]). Their attention calls stay a test:
/// PyTorch 2.11's kernels ran faster than the 2023-2025 kernels of the training runs, and
/// folded into the fit they made the H100 runs' fit worse (MPT on H100 5.0 → 5.6 %).
pub const MEASURED_DIRS: [&str; 2] = ["measured-h100", "measured-h200"];

fn own_microbench_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("data")
        .join("microbench")
}

/// One of this project's sweep folders ([`MEASURED_DIRS`]) or its data sets no fit reads
/// (`multinode`, `two-nodes`).
pub fn project_microbench_dir(name: &str) -> PathBuf {
    own_microbench_dir().join(name)
}

/// The two folders of published measurements: shared (beside the published runs) and the
/// project's own.
pub fn default_microbench_dirs() -> Vec<PathBuf> {
    let shared = crate::validation::default_data_path()
        .parent()
        .map(|dir| dir.join("microbench"))
        .unwrap_or_default();
    vec![shared, own_microbench_dir()]
}

/// What the primitives are fitted on: every measurement in [`default_microbench_dirs`], and
/// the GEMMs and copies of the project's sweeps ([`MEASURED_DIRS`]) except the one named
/// `leave_out` (a GPU held out).
pub fn load_fit_microbenchmarks(leave_out: Option<&str>) -> Result<Microbenchmarks, String> {
    let mut all = load_microbenchmarks(&default_microbench_dirs())?;
    for name in MEASURED_DIRS
        .iter()
        .filter(|&&name| Some(name) != leave_out)
    {
        let sweep = load_microbenchmarks(&[project_microbench_dir(name)])?;
        all.gemms.extend(sweep.gemms);
        all.memory.extend(sweep.memory);
    }
    Ok(all)
}

/// Reads every `collectives.csv`, `gemm.csv`, `attention.csv` and `memory.csv` in `dirs`. A
/// folder that is missing is an error: the committed primitives are the fit of all of them,
/// and a fit of some would silently differ.
pub fn load_microbenchmarks(dirs: &[PathBuf]) -> Result<Microbenchmarks, String> {
    let mut all = Microbenchmarks::default();
    for dir in dirs {
        if !dir.is_dir() {
            return Err(format!("microbenchmark folder {} not found", dir.display()));
        }
        let read = |name: &str| -> Result<Vec<Row>, String> {
            let path = dir.join(name);
            if !path.exists() {
                return Ok(Vec::new());
            }
            let text = std::fs::read_to_string(&path)
                .map_err(|err| format!("cannot read {}: {err}", path.display()))?;
            Ok(rows(&text))
        };
        all.collectives
            .extend(read("collectives.csv")?.iter().filter_map(collective));
        let power_capped = MEASURED_DIRS.iter().any(|name| dir.ends_with(name));
        all.gemms.extend(
            read("gemm.csv")?
                .iter()
                .filter_map(|row| gemm(row, power_capped)),
        );
        all.attention
            .extend(read("attention.csv")?.iter().filter_map(attention));
        all.memory
            .extend(read("memory.csv")?.iter().filter_map(memory));
    }
    if all.collectives.is_empty() && all.gemms.is_empty() && all.attention.is_empty() {
        return Err(format!(
            "no microbenchmarks found in {}",
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(all)
}

struct Row {
    header: std::rc::Rc<Vec<String>>,
    values: Vec<String>,
}

impl Row {
    fn get(&self, column: &str) -> &str {
        self.header
            .iter()
            .position(|h| h == column)
            .and_then(|i| self.values.get(i))
            .map(|s| s.trim())
            .unwrap_or("")
    }

    fn number(&self, column: &str) -> Option<f64> {
        self.get(column)
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite())
    }
}

fn rows(text: &str) -> Vec<Row> {
    let mut records = parse_csv(text).into_iter();
    let Some(header) = records.next() else {
        return Vec::new();
    };
    let header = std::rc::Rc::new(header);
    records
        .filter(|r| r.len() > 1)
        .map(|values| Row {
            header: header.clone(),
            values,
        })
        .collect()
}

const GB: f64 = 1e9;

/// Per-GPU links of the systems in the collective data (bytes/s per direction), and whether
/// their NVSwitch reduces in the switch (NVLink SHARP: the 8-GPU NVSwitch nodes of Hopper and
/// Blackwell). NVLink rates per GPU and direction: A100 (NVLink 3) 300 GB/s, H100/H200/H20
/// (NVLink 4) 450 GB/s, B200 (NVLink 5) 900 GB/s, H100 PCIe bridge pair 300 GB/s (NVIDIA
/// datasheets); a 4-GPU HGX H100 pairs GPUs with 6 links, 150 GB/s, and has no NVSwitch. NICs
/// per GPU as each source states its fabric, else as its cloud's instance page does.
fn links_of(system: &str) -> Option<Links> {
    let has = |needle: &str| system.contains(needle);
    let (intra, inter, multicast) = if has("p6-b200") {
        (900.0, 50.0, true) // 8 x EFA v4, 400 Gb/s each
    } else if has("p5.48xlarge") || has("A3 Ultra") || has("node005,node007") {
        // 400 Gb/s per GPU: AWS P5's 32 x 100 Gb/s EFA (instance page), GCP A3 Ultra's
        // 8 x 400 Gb/s RDMA NICs (machine-type page), 8 ConnectX-7 NDR as the issue states.
        (450.0, 50.0, true)
    } else if has("p4d.24xlarge") || has("p4de.24xlarge") {
        (300.0, 400.0 / 8.0 / 8.0, false) // 4 x 100 Gb/s EFA for 8 A100s (AWS P4d page)
    } else if has("ND96amsr_A100_v4") {
        (300.0, 25.0, false) // 8 x 200 Gb/s HDR InfiniBand (Azure NDm A100 v4 page)
    } else if has("gpu-dp-2jvzl") || has("cnode3-002") || has("node47") {
        (450.0, 0.0, true) // one 8-GPU H100 node (HGX)
    } else if has("H20") {
        (450.0, 50.0, true) // 16 CX7 NDR NICs for 16 GPUs
    } else if has("H100 PCIe with NVLink bridge") {
        (300.0, 0.0, false)
    } else if has("2 nodes x 1 H100") {
        (450.0, 200.0, false) // four 400 Gb/s NICs for one GPU
    } else if has("Kestrel") {
        (150.0, 12.5, false) // 2 Slingshot 200 Gb/s NICs per 4-GPU node
    } else if has("2 GCP VMs x 8 H100") || has("A3 Mega") {
        (450.0, 1800.0 / 8.0 / 8.0, true) // GPUDirect-TCPXO, 1,800 Gb/s per VM
    } else if has("A3 High") {
        (450.0, 1000.0 / 8.0 / 8.0, true) // GPUDirect-TCPX, 1,000 Gb/s per VM
    } else if has("8 A100 NVLink") || has("OCI BM.GPU4.8") {
        (300.0, 25.0, false) // OCI: 16 x 100 Gb/s RoCE ports per node
    } else if has("XE9680") {
        (450.0, 50.0, true) // 8 ConnectX-7 400 Gb/s per host (nccl-tests issue #309)
    } else if has("gj-aion") {
        // One 400 Gb/s InfiniBand NIC per GPU: the NIC count is not stated, but the printed
        // 320-391 GB/s of all-reduce bus bandwidth across nodes needs one per GPU.
        (450.0, 50.0, true)
    } else if has("ABCI") {
        (300.0, 100.0 / 8.0, false) // ABCI's A node: 4 HDR 200 Gb/s HCAs for 8 A100s
    } else if has("4 H100") {
        (450.0, 0.0, false)
    } else if has("sm_90") {
        // XLA's table is a ring's: its 8-GPU all-reduce peaks at 402 GB/s of bus bandwidth,
        // where NVLink SHARP reaches 470-480 on the same kind of node (Together's and
        // stas00's sweeps).
        (450.0, 0.0, false)
    } else {
        return None;
    };
    // Single-node systems never use the NIC; its rate is the NVLink's so that no 0 divides.
    let inter = if inter > 0.0 { inter } else { intra };
    Some(Links {
        intra_bandwidth: intra * GB,
        inter_bandwidth: inter * GB,
        multicast,
    })
}

fn collective(row: &Row) -> Option<CollectiveMeasurement> {
    if row.get("library").contains("DeepEP") {
        return None; // DeepEP's dispatch/combine bandwidth is not an nccl-tests figure
    }
    let kind = Collective::from_name(row.get("collective"))?;
    let system = row.get("system").to_string();
    let mut links = links_of(&system)?;
    // A sweep run with NVLink SHARP turned off measures the ring.
    links.multicast &= !["library", "table", "notes"]
        .iter()
        .any(|column| row.get(column).contains("NCCL_NVLS_ENABLE=0"));
    let ranks = row.number("ranks")?;
    let nodes = row.number("nodes").unwrap_or(1.0);
    let bytes = row.number("message_bytes")?;
    let seconds = match row.number("time_us") {
        Some(us) if us > 0.0 => us * 1e-6,
        _ => {
            let (column, factor) = if row.number("algbw_gbps").is_some() {
                ("algbw_gbps", 1.0)
            } else {
                ("busbw_gbps", kind.bus_factor(ranks))
            };
            // A rate printed to one significant digit (`0.01`) is only known to ±5-50 %.
            if significant_digits(row.get(column)) < 2 {
                return None;
            }
            let algbw = row.number(column)? / factor;
            if algbw <= 0.0 {
                return None;
            }
            bytes / (algbw * GB)
        }
    };
    let source = row.get("source").to_string();
    Some(CollectiveMeasurement {
        never_fitted: DEGRADED_REPORTS.iter().any(|r| source.starts_with(r))
            || SUPERSEDED_RUNS
                .iter()
                .any(|(run, machines)| source.contains(run) && system.starts_with(machines)),
        source,
        system,
        kind,
        ranks,
        per_node: ranks / nodes,
        bytes,
        links,
        seconds,
        gpus_per_thread: gpus_per_thread(row),
    })
}

/// Significant digits of a number as printed: `0.01` has one, `1.20` three.
fn significant_digits(printed: &str) -> usize {
    printed
        .chars()
        .filter(char::is_ascii_digit)
        .skip_while(|d| *d == '0')
        .count()
}

/// nccl-tests' `-g N` where a row's system, library or table states it, else 1.
fn gpus_per_thread(row: &Row) -> f64 {
    ["system", "library", "table"]
        .iter()
        .find_map(|column| {
            let text = row.get(column);
            let mut words = text.split(|c: char| c.is_whitespace() || c == ';' || c == ',');
            words.find(|w| *w == "-g")?;
            words.next()?.parse::<f64>().ok()
        })
        .unwrap_or(1.0)
}

/// Dense fp16/bf16 peak and datasheet HBM bandwidth of the GPUs in the data (NVIDIA
/// datasheets), with their SM count. `sm_90` rows (XLA's table names no SKU) are taken as
/// H100 SXM.
pub fn device_of(gpu: &str) -> Option<GemmDevice> {
    let upper = gpu.to_ascii_uppercase();
    let has = |needle: &str| upper.contains(needle);
    let (peak, hbm) = if has("A100") && (has("40GB") || has("40G")) {
        (312.0, 1555.0)
    } else if has("A100") {
        (312.0, 2039.0)
    } else if has("H100") && has("PCIE") {
        (756.0, 2000.0)
    } else if has("H200") {
        (989.0, 4800.0)
    } else if has("H100") || has("H800") || has("SM_90") {
        (989.0, 3350.0)
    } else {
        return None;
    };
    Some(GemmDevice {
        peak_flops: peak * 1e12,
        memory_bandwidth: hbm * GB,
        sms: super::gemm::sm_count(gpu),
        tile: None,
    })
}

fn gemm(row: &Row, power_capped: bool) -> Option<GemmMeasurement> {
    let dtype = row.get("dtype");
    if dtype != "fp16" && dtype != "bf16" {
        return None;
    }
    let library = row.get("library");
    if !(library.contains("cuBLAS") || library.contains("XLA")) {
        return None;
    }
    let gpu = row.get("gpu").to_string();
    let device = device_of(&gpu)?;
    let (m, n, k) = (row.number("m")?, row.number("n")?, row.number("k")?);
    let tflops = row.number("tflops")?;
    if row
        .number("time_us")
        .is_some_and(|us| us * 1e-6 < GEMM_MIN_TIMED_S)
    {
        return None;
    }
    Some(GemmMeasurement {
        source: row.get("source").to_string(),
        measurement: measurement_of(row.get("source")),
        gpu,
        m,
        n,
        k,
        device,
        seconds: 2.0 * m * n * k / (tflops * 1e12),
        power_capped,
    })
}

fn attention(row: &Row) -> Option<AttentionMeasurement> {
    let gpu = row.get("gpu").to_string();
    let device = device_of(&gpu)?;
    let direction = row.get("direction").to_string();
    if direction.is_empty() {
        return None; // Azure's rows do not say what they timed
    }
    Some(AttentionMeasurement {
        source: format!("{} {}", row.get("source"), row.get("table")),
        gpu,
        kernel: row.get("kernel").to_string(),
        seq_len: row.number("seq_len")?,
        head_dim: row.number("head_dim")?,
        causal: row.get("causal") == "yes",
        direction,
        peak_flops: device.peak_flops,
        tflops: row.number("tflops")?,
    })
}

fn memory(row: &Row) -> Option<MemoryMeasurement> {
    if !row.get("test").starts_with("hbm_") {
        return None;
    }
    // Copies under 64 MiB time the launch, not the memory (STREAM sizes its arrays well past
    // the caches); rows that do not give their size are STREAM's.
    if row
        .number("bytes")
        .is_some_and(|bytes| bytes < STREAM_MIN_BYTES)
    {
        return None;
    }
    let gpu = row.get("gpu").to_string();
    let device = device_of(&gpu)?;
    Some(MemoryMeasurement {
        source: row.get("source").to_string(),
        gpu,
        datasheet_bandwidth: device.memory_bandwidth,
        bandwidth: row.number("gbps")? * GB,
    })
}
