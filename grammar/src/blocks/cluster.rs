//! `cluster` blocks, and the defaults of what a cluster may leave out.

use std::path::Path;

use crate::ast::{Name, POOL_PREFIX};
use crate::blocks::gpu::GpuDef;
use crate::calibration_file::read_calibration_file;
use crate::diagnostic::Problem;
use crate::eval::Value;
use crate::fields::Fields;
use crate::spec::{ClusterSpec, Link};
use crate::units::Dim;

pub const FIELDS: &[&str] = &[
    "gpu",
    "nodes",
    "gpus_per_node",
    "intra_node",
    "inter_node",
    "host_link",
    "host_memory",
    "calibration",
];

const LINK_FIELDS: &[&str] = &["bandwidth", "latency"];

/// Per-message latency of an intra-node link (NVLink/NVSwitch) when not given: NCCL's
/// small-message latency inside a DGX-class node is a few microseconds.
pub const DEFAULT_INTRA_NODE_LATENCY: f64 = 3e-6;
/// Per-message latency between nodes (InfiniBand/RoCE) when not given: wire, switch and NCCL
/// protocol overhead come to 5-10 us.
pub const DEFAULT_INTER_NODE_LATENCY: f64 = 8e-6;
/// Host-to-device bandwidth per GPU when neither the cluster nor its GPU says: PCIe gen4 x16.
pub const DEFAULT_HOST_LINK: f64 = 25e9;
/// Host memory per node when not given, as a multiple of the node's GPU memory (DGX A100 and
/// DGX H100 carry 2 TB for 640 GB of GPU memory, about 3x; 2x is a conservative floor).
pub const DEFAULT_HOST_MEMORY_PER_GPU_MEMORY: f64 = 2.0;

/// Far beyond any cluster; keeps GPU counts and their products exact in `u64`.
pub const MAX_GPUS: u64 = 1 << 32;

/// What a cluster refers to: the GPU named by its `gpu` field.
pub enum GpuLookup<'a> {
    Found(&'a GpuDef),
    /// Defined, but its own errors are already reported.
    Broken,
    Unknown(Problem),
}

/// What a cluster made of pools may set beside its `pool` blocks.
pub const POOLED_FIELDS: &[&str] = &["between_pools"];

/// A cluster: of one GPU type, or made of `pool NAME { … }` blocks, each read as a cluster of
/// its own (the same fields, defaults and errors), with `between_pools` the link between them
/// (when not given: the slowest of the pools' inter-node links).
pub fn lower<'a>(
    name: &str,
    f: &mut Fields,
    find_gpu: &dyn Fn(&Name) -> GpuLookup<'a>,
    spec_dir: &Path,
) -> Option<ClusterSpec> {
    let pools = f.take_pools();
    if pools.is_empty() {
        return lower_one(name, f, find_gpu, spec_dir);
    }
    let before = f.problems.len();
    for key in FIELDS {
        if let Some(value) = f.get(key) {
            let span = value.span;
            f.problems.push(
                Problem::new(
                    span,
                    format!("`{key}` is set per pool in cluster `{name}`, which is made of pools"),
                )
                .with_help(format!("move `{key}` into each `pool` block that needs it")),
            );
        }
    }
    let own: Vec<&str> = POOLED_FIELDS.iter().chain(FIELDS).copied().collect();
    f.reject_unknown(&own);
    let between = link(f, "between_pools", DEFAULT_INTER_NODE_LATENCY, Some(false));
    let mut lowered = Vec::with_capacity(pools.len());
    for pool in &pools {
        let Some((pool_name, mut record)) = Fields::part(
            pool,
            POOL_PREFIX,
            &format!("cluster `{name}`"),
            "{ gpu = H100_SXM; nodes = 2; gpus_per_node = 8 }",
            f.problems,
        ) else {
            continue;
        };
        lowered.push(lower_one(pool_name, &mut record, find_gpu, spec_dir));
    }
    if f.problems.len() > before {
        return None;
    }
    let pools: Vec<ClusterSpec> = lowered.into_iter().collect::<Option<_>>()?;
    if pools.len() == 1 {
        return Some(ClusterSpec {
            name: name.to_string(),
            ..pools[0].clone()
        });
    }
    let between_pools = between.unwrap_or_else(|| Link {
        bandwidth: pools
            .iter()
            .map(|p| p.inter_node.bandwidth)
            .fold(f64::INFINITY, f64::min),
        latency: pools
            .iter()
            .map(|p| p.inter_node.latency)
            .fold(0.0, f64::max),
    });
    Some(ClusterSpec::of_pools(name, pools, between_pools))
}

/// A cluster of one GPU type (or one pool of a cluster).
fn lower_one<'a>(
    name: &str,
    f: &mut Fields,
    find_gpu: &dyn Fn(&Name) -> GpuLookup<'a>,
    spec_dir: &Path,
) -> Option<ClusterSpec> {
    let before = f.problems.len();
    f.reject_unknown(FIELDS);
    let gpu_name = if f.has("gpu") {
        f.reference("gpu", "a GPU")
    } else {
        f.missing("gpu", "H100_SXM");
        None
    };
    let gpu = match gpu_name.as_ref().map(find_gpu) {
        Some(GpuLookup::Found(g)) => Some(g),
        Some(GpuLookup::Unknown(problem)) => {
            f.problems.push(problem);
            None
        }
        Some(GpuLookup::Broken) | None => None,
    };
    let nodes = f.required_count("nodes", 1, "4");
    let gpus_per_node = f.required_count("gpus_per_node", 1, "8");
    let intra_node = link(
        f,
        "intra_node",
        DEFAULT_INTRA_NODE_LATENCY,
        gpus_per_node.map(|g| g > 1),
    );
    let inter_node = link(
        f,
        "inter_node",
        DEFAULT_INTER_NODE_LATENCY,
        nodes.map(|n| n > 1),
    );
    let host_link = f.quantity("host_link", Dim::BANDWIDTH, true);
    let host_memory = f.quantity("host_memory", Dim::SIZE, true);
    let calibration = f.get("calibration").cloned().and_then(|v| match &v.value {
        Value::Str(written) => read_calibration_file(written, spec_dir)
            .map_err(|message| {
                f.problems.push(Problem::new(v.span, message).with_help(
                    "write it with `tessel calibrate TRACE... --spec SPEC -o cluster.cal.json`; \
                     the path is relative to the spec",
                ))
            })
            .ok(),
        Value::Invalid => None,
        _ => {
            f.problems.push(
                Problem::new(v.span, "`calibration` takes a file name in quotes")
                    .with_help("calibration = \"cluster.cal.json\""),
            );
            None
        }
    });
    if let (Some(n), Some(g)) = (nodes, gpus_per_node) {
        if u128::from(n) * u128::from(g) > u128::from(MAX_GPUS) {
            f.problems.push(Problem::new(
                f.anchor,
                format!("cluster `{name}` has {n}·{g} GPUs, more than the {MAX_GPUS} supported"),
            ));
        }
    }
    if f.problems.len() > before {
        return None;
    }
    let gpu = gpu?;
    let (nodes, gpus_per_node) = (nodes?, gpus_per_node?);
    let host_link = host_link.or(gpu.host_link).unwrap_or(DEFAULT_HOST_LINK);
    // A link the cluster never uses (one node, or one GPU per node) costs nothing to leave out;
    // it is filled with the host link so that every number stays finite.
    let unused = Link {
        bandwidth: host_link,
        latency: DEFAULT_INTER_NODE_LATENCY,
    };
    Some(ClusterSpec {
        name: name.to_string(),
        nodes,
        gpus_per_node,
        intra_node: intra_node.unwrap_or_else(|| unused.clone()),
        inter_node: inter_node.unwrap_or(unused),
        host_link,
        host_memory: host_memory
            .unwrap_or(DEFAULT_HOST_MEMORY_PER_GPU_MEMORY * gpus_per_node as f64 * gpu.spec.memory),
        gpu: gpu.spec.clone(),
        calibration,
        pools: Vec::new(),
        between_pools: None,
    })
}

/// Reads a `{ bandwidth = .., latency = .. }` record; `needed` says whether leaving it out is an
/// error (`None`: unknown, because the count it depends on is itself wrong).
fn link(f: &mut Fields, key: &str, default_latency: f64, needed: Option<bool>) -> Option<Link> {
    let Some(value) = f.get(key).cloned() else {
        if needed == Some(true) {
            f.missing(key, "{ bandwidth = 400 GB/s }");
        }
        return None;
    };
    let mut record = Fields::record(key, &value, "{ bandwidth = 400 GB/s }", f.problems)?;
    record.reject_unknown(LINK_FIELDS);
    let bandwidth = record.required_quantity("bandwidth", Dim::BANDWIDTH, true);
    let latency = record.quantity("latency", Dim::TIME, false);
    Some(Link {
        bandwidth: bandwidth?,
        latency: latency.unwrap_or(default_latency),
    })
}
