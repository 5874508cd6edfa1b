//! NCCL collectives as algorithms: how many steps each takes over a group, what each step
//! costs, and how many bytes cross the slowest link.
//!
//! - Ring all-gather and reduce-scatter: `n − 1` steps, each rank sends `(n − 1)/n` of the
//!   (whole) buffer. NCCL runs them only as rings, so a call over thousands of ranks pays
//!   thousands of step latencies however small its buffer: the reason ZeRO-3's per-layer
//!   gathers stop shrinking as a data-parallel group grows. A ring's latency is the sum of its
//!   hops' (the last chunk passes each in turn): a ring over `k` nodes crosses the network
//!   `k` times a pass and NVLink the rest.
//! - All-reduce: NCCL picks the faster of a ring (`2(n − 1)` steps, `2(n − 1)/n` of the buffer)
//!   and, across nodes, a tree (a chain inside each node, a double binary tree between nodes:
//!   `2(g − 1)` NVLink steps and `2⌈log2 k⌉` network steps). Each of the two trees carries half
//!   the buffer, so a node's NICs move `2(k − 1)/k` of it each way where a ring's move
//!   `2(n − 1)/n`: half as much at two nodes, nearly the same at many; but each GPU of a
//!   node's chain forwards the whole buffer up and back down, twice it over NVLink. Two-node
//!   sweeps show both: bus bandwidths above the NICs' line rate, at the NVLink bound (OCI's
//!   A100s 222.9 GB/s on 200 GB/s of NICs a node, GCP A3 Mega's H100s 339 on 225).
//! - All-to-all: every rank exchanges `1/n` of its buffer with each peer, `n − 1` rounds of
//!   paired sends, those with peers in other nodes waiting on the network; the bytes to peers
//!   in other nodes leave through the rank's own NIC.
//! - Point-to-point: one message.
//! - NVLink SHARP (NCCL's NVLS), on the 8-GPU NVSwitch nodes of Hopper and Blackwell: an
//!   all-reduce inside the node is reduced in the switch and multicast back, so each GPU's link
//!   carries the buffer once each way instead of a ring's `2(n − 1)/n` (Together's H100 sweeps:
//!   479 GB/s of bus bandwidth against the ring's 368). Gathers and scatters move the same bytes
//!   either way.
//!
//! Links: inside a node each rank drives its NVLink/NVSwitch port; a ring that crosses nodes
//! runs one channel per member of the group in a node, each through its own NIC, so it moves
//! `members_per_node × NIC` bandwidth, capped by the intra-node link. Each link reaches a
//! calibrated fraction of its rate ([`CollectiveParams`]), and each call pays a fixed launch
//! and synchronisation latency besides its steps.
//!
//! Launches: a benchmark that drives several GPUs from one host thread (nccl-tests' `-g N`)
//! launches the call on each in turn, so no call is shorter than the launches
//! ([`launched_by_one_thread`]); training runs one process per GPU and never pays this.
//!
//! Protocols: NCCL moves small buffers with its low-latency protocol (LL: every 8-byte store
//! carries 4 bytes of data and a 4-byte flag the receiver polls, so a step costs little
//! synchronisation but the wire carries half data) and large ones with its Simple protocol
//! (full bandwidth, a memory fence per step), choosing by its own cost model; a call costs
//! the cheaper of the two ("NCCL_PROTO" in NCCL's environment-variable documentation).

use super::scalar::{c, ceil_log2, exceeds, Scalar};
use crate::cost::GpuGeneration;

/// The share of the wire that carries data under NCCL's LL protocol: 4 bytes of data and a
/// 4-byte flag per 8-byte store.
const LL_DATA_FRACTION: f64 = 0.5;

/// Which collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    SendRecv,
}

impl Collective {
    /// nccl-tests' name (`all_reduce`, ...).
    pub fn from_name(name: &str) -> Option<Collective> {
        Some(match name {
            "all_reduce" => Collective::AllReduce,
            "all_gather" => Collective::AllGather,
            "reduce_scatter" => Collective::ReduceScatter,
            "alltoall" => Collective::AllToAll,
            "sendrecv" => Collective::SendRecv,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllToAll => "alltoall",
            Collective::SendRecv => "sendrecv",
        }
    }

    /// nccl-tests' bus-bandwidth factor: bytes each rank moves per byte of the buffer.
    pub fn bus_factor(self, ranks: f64) -> f64 {
        match self {
            Collective::AllReduce => 2.0 * (ranks - 1.0) / ranks,
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
                (ranks - 1.0) / ranks
            }
            Collective::SendRecv => 1.0,
        }
    }
}

/// The links of a cluster, per GPU and direction, in bytes per second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Links {
    pub intra_bandwidth: f64,
    pub inter_bandwidth: f64,
    /// The node's NVSwitch reduces in the switch (NVLink SHARP, NCCL's NVLS algorithm): an
    /// all-reduce inside the node then moves each byte over a GPU's link once each way instead
    /// of a ring's 2(n − 1)/n.
    pub multicast: bool,
}

impl Links {
    /// A cluster's links: its spec's rates, and NVLink SHARP where its nodes are 8-GPU
    /// NVSwitch nodes of a generation whose NVSwitch has it (Hopper's third-generation
    /// NVSwitch and Blackwell's; NVIDIA's NVLink Switch datasheet).
    pub fn of(cluster: &tessel_grammar::ClusterSpec) -> Links {
        let name = cluster.gpu.name.to_ascii_lowercase();
        let switch_reduces = GpuGeneration::from_name(&name) == GpuGeneration::Hopper
            || ["b200", "b300"]
                .iter()
                .any(|blackwell| name.contains(blackwell));
        Links {
            intra_bandwidth: cluster.intra_node.bandwidth,
            inter_bandwidth: cluster.inter_node.bandwidth,
            multicast: switch_reduces
                && cluster.gpus_per_node >= 8
                && cluster.intra_node.bandwidth >= NVSWITCH_MIN_BANDWIDTH,
        }
    }
}

/// The slowest NVSwitch link of the generations with NVLink SHARP, per GPU and direction:
/// H800's 200 GB/s. GPUs that talk slower share a PCIe switch, not an NVSwitch.
const NVSWITCH_MIN_BANDWIDTH: f64 = 200e9;

/// NCCL's behaviour on those links, calibrated on nccl-tests measurements
/// (`fit::fit_collectives`, table in `docs/VALIDATION.md`).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectiveParams {
    /// Fixed cost of one call: kernel launch, the first synchronisation, seconds.
    pub call_latency_s: f64,
    /// One algorithm step between GPUs of a node (NVLink, NVSwitch) under the Simple
    /// protocol, seconds.
    pub intra_step_s: f64,
    /// One algorithm step across the network under the Simple protocol, seconds.
    pub inter_step_s: f64,
    /// One step between GPUs of a node under the low-latency protocol, seconds.
    pub ll_intra_step_s: f64,
    /// One step across the network under the low-latency protocol, seconds.
    pub ll_inter_step_s: f64,
    /// Bus bandwidth over the intra-node link rate at large messages.
    pub intra_efficiency: f64,
    /// Bus bandwidth over the NIC rate at large messages.
    pub inter_efficiency: f64,
    /// An NVLink SHARP all-reduce's buffer rate over the intra-node link rate at large
    /// messages. Calibration files written before it existed read the committed fit.
    #[serde(default = "committed_nvls_efficiency")]
    pub nvls_efficiency: f64,
    /// One kernel launch by a host thread that drives several GPUs (nccl-tests' `-g N`): it
    /// launches the call on each in turn. Training runs one process per GPU and never pays it.
    #[serde(default = "committed_launch_s")]
    pub launch_s: f64,
}

fn committed_nvls_efficiency() -> f64 {
    CollectiveParams::default().nvls_efficiency
}

fn committed_launch_s() -> f64 {
    CollectiveParams::default().launch_s
}

impl Default for CollectiveParams {
    /// Fitted by `cargo run --release -p tessel-symbolic --example fit_primitives`.
    fn default() -> Self {
        CollectiveParams {
            call_latency_s: 21.38e-6,
            intra_step_s: 10.32e-6,
            inter_step_s: 2.924e-6,
            ll_intra_step_s: 1.083e-6,
            ll_inter_step_s: 30.0e-6,
            intra_efficiency: 0.7789,
            inter_efficiency: 0.7245,
            nvls_efficiency: 0.5489,
            launch_s: 1.966e-6,
        }
    }
}

/// A group of `ranks` GPUs of which `per_node` share a node (`ranks / per_node` nodes, at
/// most `max_nodes`: the cluster's).
#[derive(Clone, Debug)]
pub struct Group<S> {
    pub ranks: S,
    pub per_node: S,
    pub max_nodes: f64,
}

impl<S: Scalar> Group<S> {
    /// `ranks` placed `stride` GPUs apart on nodes of `gpus_per_node`, in a cluster of
    /// `max_nodes`.
    pub fn placed(ranks: S, stride: S, gpus_per_node: f64, max_nodes: f64) -> Group<S> {
        let per_node = ranks
            .clone()
            .min_of(c::<S>(gpus_per_node) / stride)
            .max_of(c(1.0));
        Group {
            ranks,
            per_node,
            max_nodes,
        }
    }

    fn nodes(&self) -> S {
        self.ranks.clone() / self.per_node.clone()
    }

    /// 1 when the group spans more than one node.
    fn crosses(&self) -> S {
        exceeds(self.ranks.clone() - self.per_node.clone(), 0.0)
    }
}

/// Bytes per second one NCCL channel moves: a DGX with 8 NICs reaching 190 GB/s runs 16
/// channels, a single 12–24 GB/s NIC 2 (NVIDIA/nccl#689).
const CHANNEL_RATE: f64 = 190e9 / 16.0;
/// NCCL's most channels per communicator (`MAXCHANNELS`, 32).
const MAX_CHANNELS: f64 = 32.0;

/// SMs NCCL's kernels hold while a ring over `group` runs: one per channel ("NCCL CTAs won't
/// share an SM with compute kernels", NVIDIA/nccl#689), as many channels as the ring's
/// bottleneck rate needs.
pub fn ring_sms<S: Scalar>(group: &Group<S>, links: &Links, params: &CollectiveParams) -> S {
    let crosses = group.crosses();
    let rate = (c::<S>(1.0) - crosses.clone()) * c(intra_rate(links, params))
        + crosses * ring_rate_across(group, links, params);
    (rate * c(1.0 / CHANNEL_RATE))
        .min_of(c(MAX_CHANNELS))
        .max_of(c(1.0))
}

/// How much longer compute takes while a ring over `group` runs beside it on a GPU of `sms`
/// SMs: the compute gets the SMs NCCL leaves ([`ring_sms`]). A device with no more compute
/// units than NCCL's channels is not a GPU running NCCL (a CPU rank, whose collectives run
/// on host threads) and pays nothing.
pub fn nccl_compute_share<S: Scalar>(
    group: &Group<S>,
    links: &Links,
    params: &CollectiveParams,
    sms: f64,
) -> S {
    if sms <= MAX_CHANNELS {
        return c(0.0);
    }
    let held = ring_sms(group, links, params);
    held.clone() / (c::<S>(sms) - held)
}

fn intra_rate(links: &Links, params: &CollectiveParams) -> f64 {
    links.intra_bandwidth * params.intra_efficiency
}

fn nic_rate(links: &Links, params: &CollectiveParams) -> f64 {
    links.inter_bandwidth * params.inter_efficiency
}

/// A ring that crosses nodes runs one channel per member of the group in a node, each through
/// its own NIC, capped by the intra-node link.
fn ring_rate_across<S: Scalar>(group: &Group<S>, links: &Links, params: &CollectiveParams) -> S {
    (group.per_node.clone() * c(nic_rate(links, params))).min_of(c(intra_rate(links, params)))
}

/// One way NCCL can run a call: its latency-bound steps inside and between nodes, and the
/// seconds its bytes take on its bottleneck link.
struct Algorithm<S> {
    intra_steps: S,
    inter_steps: S,
    wire: S,
}

/// Seconds of one call of `kind` on a buffer of `bytes` (nccl-tests' size: the whole gathered
/// or reduced buffer; for all-to-all each rank's buffer) over `group`.
pub fn collective_time<S: Scalar>(
    kind: Collective,
    bytes: S,
    group: &Group<S>,
    links: &Links,
    params: &CollectiveParams,
) -> S {
    let n = group.ranks.clone();
    let nodes = group.nodes();
    let crosses = group.crosses();
    let single = c::<S>(1.0) - crosses.clone();
    let intra_rate = intra_rate(links, params);
    let nic_rate = nic_rate(links, params);
    let across = ring_rate_across(group, links, params);
    // Seconds per byte on the ring's bottleneck.
    let per_byte = single.clone() * c(1.0 / intra_rate) + crosses.clone() / across.clone();
    let spread = (n.clone() - c(1.0)) / n.clone();
    // A ring's latency is the sum of its hops': the last chunk passes each in turn, and its
    // path around `nodes` node-contiguous blocks crosses between nodes `nodes` times a pass.
    let ring = |passes: f64, wire: S| {
        let steps = c::<S>(passes) * (n.clone() - c(1.0));
        let crossings = crosses.clone() * nodes.clone() * c(passes);
        Algorithm {
            intra_steps: steps - crossings.clone(),
            inter_steps: crossings,
            wire,
        }
    };
    let algorithms = match kind {
        Collective::AllGather | Collective::ReduceScatter => {
            vec![ring(1.0, spread * bytes.clone() * per_byte)]
        }
        Collective::AllReduce => {
            // Across nodes NCCL's tree: a chain through each node and a double binary tree
            // between nodes, each tree carrying half the buffer. A node's NICs then move
            // 2(k − 1)/k of the buffer each way over k nodes where a ring's move 2(n − 1)/n:
            // half as much at two nodes, nearly the same at many. Each GPU of a chain
            // forwards both halves up (reduce) and back down (broadcast): twice the buffer
            // over its NVLink, where a ring sends 2(n − 1)/n of it.
            let node_spread = (nodes.clone() - c(1.0)) / nodes.clone();
            let tree_wire = (c::<S>(2.0) * node_spread * bytes.clone() / across)
                .max_of(bytes.clone() * c(2.0 / intra_rate));
            let tree = Algorithm {
                intra_steps: c::<S>(2.0) * (group.per_node.clone() - c(1.0)),
                inter_steps: c::<S>(2.0) * ceil_log2(nodes.clone(), group.max_nodes),
                // Inside one node there is no tree to take (a max, not a sum, so that the
                // large constant never absorbs the wire's digits).
                wire: tree_wire.max_of(single.clone() * c(UNAVAILABLE_S)),
            };
            vec![
                ring(2.0, c::<S>(2.0) * spread * bytes.clone() * per_byte),
                tree,
            ]
        }
        Collective::AllToAll => {
            // Peers in other nodes go through this rank's NIC, those in its node over NVLink,
            // at the same time.
            let off_node = (n.clone() - group.per_node.clone()) / n.clone();
            let on_node = (group.per_node.clone() - c(1.0)) / n.clone();
            let wire = (bytes.clone() * off_node * c(1.0 / nic_rate))
                .max_of(bytes.clone() * on_node * c(1.0 / intra_rate));
            // One round per peer: those with peers in other nodes wait on the network.
            vec![Algorithm {
                intra_steps: group.per_node.clone() - c(1.0),
                inter_steps: n.clone() - group.per_node.clone(),
                wire,
            }]
        }
        Collective::SendRecv => {
            let rate = single.clone() * c(1.0 / intra_rate) + crosses.clone() * c(1.0 / nic_rate);
            vec![Algorithm {
                intra_steps: single.clone(),
                inter_steps: crosses.clone(),
                wire: bytes.clone() * rate,
            }]
        }
    };
    // Bus bandwidth falls with message size because every step's latency is paid whatever
    // the bytes; NCCL takes the cheaper algorithm and protocol.
    let protocols = [
        (params.intra_step_s, params.inter_step_s, 1.0),
        (
            params.ll_intra_step_s,
            params.ll_inter_step_s,
            1.0 / LL_DATA_FRACTION,
        ),
    ];
    let mut best: Option<S> = None;
    for algorithm in &algorithms {
        for &(intra, inter, wire_factor) in &protocols {
            let time = algorithm.intra_steps.clone() * c(intra)
                + algorithm.inter_steps.clone() * c(inter)
                + algorithm.wire.clone() * c(wire_factor);
            best = Some(match best {
                None => time,
                Some(best) => best.min_of(time),
            });
        }
    }
    let mut best = best.expect("every collective has an algorithm");
    if kind == Collective::AllReduce && links.multicast {
        // NVLink SHARP inside a node, under the Simple protocol: the switch reduces what the
        // GPUs load (one step) and multicasts what they store (another). Across nodes NCCL
        // pairs it with a tree (NVLS-tree), not modelled: such groups keep the ring and tree.
        let nvls = c::<S>(2.0 * params.intra_step_s)
            + bytes / c(links.intra_bandwidth * params.nvls_efficiency);
        best = best.min_of(nvls + crosses * c(UNAVAILABLE_S));
    }
    c::<S>(params.call_latency_s) + best
}

/// Seconds of a call that one host thread launches on `gpus_per_thread` GPUs in turn
/// (nccl-tests' `-g N`): no rank finishes before the last launch, so a call whose own time is
/// shorter takes the launches' time.
pub fn launched_by_one_thread<S: Scalar>(
    call: S,
    gpus_per_thread: f64,
    params: &CollectiveParams,
) -> S {
    let launches = params.call_latency_s + (gpus_per_thread - 1.0).max(0.0) * params.launch_s;
    call.max_of(c(launches))
}

/// Keeps an algorithm a group cannot run out of the minimum.
const UNAVAILABLE_S: f64 = 1e9;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Expr;

    const LINKS: Links = Links {
        intra_bandwidth: 300e9,
        inter_bandwidth: 25e9,
        multicast: false,
    };

    fn params() -> CollectiveParams {
        CollectiveParams {
            call_latency_s: 10e-6,
            intra_step_s: 1e-6,
            inter_step_s: 5e-6,
            ll_intra_step_s: 1e-6,
            ll_inter_step_s: 5e-6,
            intra_efficiency: 1.0,
            inter_efficiency: 1.0,
            nvls_efficiency: 0.6,
            launch_s: 3e-6,
        }
    }

    #[test]
    fn ring_all_gather_in_a_node_is_steps_plus_bytes() {
        let group = Group::placed(8.0, 1.0, 8.0, 1024.0);
        let t = collective_time(Collective::AllGather, 8e9, &group, &LINKS, &params());
        let expected = 10e-6 + 7.0 * 1e-6 + 7.0 / 8.0 * 8e9 / 300e9;
        assert!((t - expected).abs() < 1e-12, "{t} vs {expected}");
    }

    #[test]
    fn nvlink_sharp_all_reduces_move_the_buffer_once_inside_a_node_only() {
        let sharp = Links {
            multicast: true,
            ..LINKS
        };
        let node = Group::placed(8.0, 1.0, 8.0, 1024.0);
        let big = 8e9;
        let ring = collective_time(Collective::AllReduce, big, &node, &LINKS, &params());
        let nvls = collective_time(Collective::AllReduce, big, &node, &sharp, &params());
        assert!(
            (nvls - (10e-6 + 2e-6 + big / (300e9 * 0.6))).abs() < 1e-12,
            "{nvls}"
        );
        assert!(nvls < ring, "{nvls} vs {ring}");
        // Gathers and scatters move the same bytes either way: only all-reduce gains.
        let gather = |links| collective_time(Collective::AllGather, big, &node, links, &params());
        assert_eq!(gather(&sharp), gather(&LINKS));
        // Across nodes the all-reduce keeps its ring and tree.
        let across = Group::placed(16.0, 1.0, 8.0, 1024.0);
        let reduce = |links| collective_time(Collective::AllReduce, big, &across, links, &params());
        assert_eq!(reduce(&sharp), reduce(&LINKS));
    }

    #[test]
    fn small_gathers_over_thousands_of_ranks_are_latency_bound() {
        // 192 nodes: the ring crosses the network 192 times and NVLink 1,343 times.
        let group = Group::placed(1536.0, 1.0, 8.0, 1024.0);
        let t = collective_time(Collective::AllGather, 1e6, &group, &LINKS, &params());
        let hops = 10e-6 + 192.0 * 5e-6 + 1343.0 * 1e-6;
        let wire = 1535.0 / 1536.0 * 1e6 / (8.0 * 25e9);
        assert!((t - (hops + wire)).abs() < 1e-12, "{t}");
        let small = Group::placed(16.0, 1.0, 8.0, 1024.0);
        let t16 = collective_time(Collective::AllGather, 1e6, &small, &LINKS, &params());
        assert!(t > 50.0 * t16, "{t} vs {t16}");
    }

    #[test]
    fn all_reduce_across_nodes_takes_the_tree_when_it_is_shorter() {
        let group = Group::placed(1024.0, 8.0, 8.0, 1024.0); // one rank per node: 1024 nodes
        let t = collective_time(Collective::AllReduce, 1024.0, &group, &LINKS, &params());
        let tree = 10e-6 + 2.0 * 10.0 * 5e-6;
        assert!((t - tree).abs() < 1e-7 + 2.0 * 1023.0 / 1024.0 * 1024.0 / 25e9);
    }

    #[test]
    fn a_two_node_tree_moves_half_the_bytes_of_a_ring_over_the_network() {
        let group = Group::placed(16.0, 1.0, 8.0, 1024.0);
        let big = 16e9;
        let t = collective_time(Collective::AllReduce, big, &group, &LINKS, &params());
        // Half a ring's bytes through the NICs, twice the buffer through each GPU's NVLink:
        // here NVLink binds.
        let tree_wire = (big / (8.0 * 25e9)).max(2.0 * big / 300e9);
        assert_eq!(tree_wire, 2.0 * big / 300e9);
        let tree = 10e-6 + 14.0 * 1e-6 + 2.0 * 5e-6 + tree_wire;
        assert!((t - tree).abs() < 1e-12, "{t} vs {tree}");
        let ring_wire = 2.0 * 15.0 / 16.0 * big / (8.0 * 25e9);
        assert!(t < 0.75 * ring_wire, "{t} vs {ring_wire}");
        // Over many nodes the two move nearly the same bytes.
        let many = Group::placed(1024.0, 1.0, 8.0, 1024.0);
        let t = collective_time(Collective::AllReduce, big, &many, &LINKS, &params());
        let ring_wire = 2.0 * 1023.0 / 1024.0 * big / (8.0 * 25e9);
        assert!(
            t > 0.99 * ring_wire && t < 1.01 * ring_wire,
            "{t} vs {ring_wire}"
        );
    }

    #[test]
    fn one_thread_launching_eight_gpus_bounds_small_calls_only() {
        let node = Group::placed(8.0, 1.0, 8.0, 1024.0);
        let time =
            |bytes: f64| collective_time(Collective::AllGather, bytes, &node, &LINKS, &params());
        let small = launched_by_one_thread(time(1e3), 8.0, &params());
        assert!((small - (10e-6 + 7.0 * 3e-6)).abs() < 1e-12, "{small}");
        assert_eq!(launched_by_one_thread(time(1e3), 1.0, &params()), time(1e3));
        assert_eq!(
            launched_by_one_thread(time(1e10), 8.0, &params()),
            time(1e10)
        );
    }

    #[test]
    fn a_ring_across_nodes_uses_one_nic_per_member() {
        let group = Group::placed(16.0, 1.0, 8.0, 1024.0);
        let big = 16e9;
        let t = collective_time(Collective::AllGather, big, &group, &LINKS, &params());
        let bandwidth_part = 15.0 / 16.0 * big / (8.0 * 25e9);
        assert!((t - bandwidth_part).abs() < 1e-3, "{t} vs {bandwidth_part}");
    }

    #[test]
    fn nccl_holds_one_sm_per_twelve_gigabytes_a_second_and_at_most_32() {
        // Across nodes: 8 NICs of 25 GB/s drive the ring, 200 GB/s, 16.8 channels.
        let across = Group::placed(64.0, 1.0, 8.0, 1024.0);
        let held = ring_sms(&across, &LINKS, &params());
        assert!((held - 200e9 / (190e9 / 16.0)).abs() < 1e-9, "{held}");
        let share: f64 = nccl_compute_share(&across, &LINKS, &params(), 108.0);
        assert!((share - held / (108.0 - held)).abs() < 1e-12, "{share}");
        // NVLink at 450 GB/s would need 38: NCCL stops at 32.
        let nvlink = Links {
            intra_bandwidth: 450e9,
            ..LINKS
        };
        let node = Group::placed(8.0, 1.0, 8.0, 1024.0);
        assert_eq!(ring_sms(&node, &nvlink, &params()), 32.0);
        // A CPU rank (one compute unit) runs its collectives on host threads.
        assert_eq!(nccl_compute_share(&node, &nvlink, &params(), 1.0), 0.0);
    }

    #[test]
    fn expression_matches_numbers() {
        let n = Expr::symbol("n");
        let group = Group::placed(n, Expr::from(2.0), 8.0, 1024.0);
        for kind in [
            Collective::AllReduce,
            Collective::AllGather,
            Collective::AllToAll,
            Collective::SendRecv,
        ] {
            let e = collective_time(kind, Expr::from(1e7), &group, &LINKS, &params());
            for ranks in [2.0, 4.0, 64.0, 512.0] {
                let numeric = collective_time(
                    kind,
                    1e7,
                    &Group::placed(ranks, 2.0, 8.0, 1024.0),
                    &LINKS,
                    &params(),
                );
                let symbolic = e.eval(&|_| ranks);
                assert!(
                    (numeric - symbolic).abs() <= 1e-12 * numeric,
                    "{kind:?} {ranks}"
                );
            }
        }
    }
}
