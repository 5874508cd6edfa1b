//! `tessel export PLAN --to vllm|sglang`: a serving plan as the shell commands that start its
//! instances (one per role and instance, with the GPUs each one uses) and the router in front.
//!
//! Flags are those of vLLM's `vllm serve` (`--tensor-parallel-size`, `--pipeline-parallel-size`,
//! `--max-num-seqs`, `--max-num-batched-tokens`, `--gpu-memory-utilization`,
//! `--kv-cache-dtype`; disaggregated prefill through `--kv-transfer-config` with the NIXL
//! connector) and SGLang's `sglang.launch_server` (`--tp-size`, `--pp-size`,
//! `--max-running-requests`, `--chunked-prefill-size`, `--mem-fraction-static`,
//! `--disaggregation-mode prefill|decode`) and `sglang_router.launch_router`
//! (`--worker-urls`, `--pd-disaggregation --prefill … --decode …`), as their documentation
//! gives them (vLLM's "Disaggregated Prefilling" and NixlConnector pages; SGLang's
//! `docs/advanced_features/pd_disaggregation.md` and `router.md`).

use std::fmt::{self, Write};
use std::str::FromStr;

use tessel_grammar::Precision;

use super::ExportOutput;

/// The serving engines `tessel export` writes for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ServingTarget {
    Vllm,
    Sglang,
}

impl ServingTarget {
    pub const ALL: [ServingTarget; 2] = [ServingTarget::Vllm, ServingTarget::Sglang];

    pub fn name(self) -> &'static str {
        match self {
            ServingTarget::Vllm => "vllm",
            ServingTarget::Sglang => "sglang",
        }
    }
}

impl fmt::Display for ServingTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ServingTarget {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        ServingTarget::ALL
            .into_iter()
            .find(|t| t.name() == lower)
            .ok_or_else(|| format!("unknown serving target `{s}`; expected vllm or sglang"))
    }
}

/// The phases an instance runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchRole {
    Both,
    Prefill,
    Decode,
}

/// Instances of one role, as the plan gives them.
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchPhase {
    pub role: LaunchRole,
    pub instances: u64,
    pub tp: u64,
    pub pp: u64,
    pub max_sequences: u64,
    pub max_batched_tokens: u64,
}

/// A serving deployment to launch.
#[derive(Clone, Debug, PartialEq)]
pub struct ServingLaunch {
    /// The spec's model name (the checkpoint is the user's to name).
    pub model: String,
    pub precision: Precision,
    pub kv_precision: Precision,
    pub gpus_per_node: u64,
    pub phases: Vec<LaunchPhase>,
    /// Prefill and decode instances share nodes (the KV cache goes over NVLink).
    pub kv_same_node: bool,
}

/// The fraction of GPU memory the plan's KV cache was sized in (the planner's).
const MEMORY_FRACTION: &str = "0.9";

/// One instance placed on the cluster.
struct Placed {
    role: LaunchRole,
    index: u64,
    phase: LaunchPhase,
    /// First node and first GPU on it.
    node: u64,
    gpu: u64,
    port: u64,
}

/// Instances packed onto nodes in order; with `kv_same_node`, each prefill instance beside a
/// decode one.
fn place(launch: &ServingLaunch, base_port: u64) -> Vec<Placed> {
    let mut queue: Vec<(LaunchRole, u64, &LaunchPhase)> = Vec::new();
    let of = |role: LaunchRole| launch.phases.iter().filter(move |p| p.role == role);
    for phase in of(LaunchRole::Both) {
        queue.extend((0..phase.instances).map(|i| (LaunchRole::Both, i, phase)));
    }
    let prefill: Vec<_> = of(LaunchRole::Prefill)
        .flat_map(|p| (0..p.instances).map(move |i| (LaunchRole::Prefill, i, p)))
        .collect();
    let decode: Vec<_> = of(LaunchRole::Decode)
        .flat_map(|p| (0..p.instances).map(move |i| (LaunchRole::Decode, i, p)))
        .collect();
    if launch.kv_same_node {
        for k in 0..prefill.len().max(decode.len()) {
            queue.extend(prefill.get(k).copied());
            queue.extend(decode.get(k).copied());
        }
    } else {
        queue.extend(prefill);
        queue.extend(decode);
    }
    let per_node = launch.gpus_per_node.max(1);
    let (mut node, mut gpu) = (0u64, 0u64);
    let mut placed = Vec::new();
    for (n, (role, index, phase)) in queue.into_iter().enumerate() {
        let gpus = phase.tp * phase.pp;
        // An instance wider than a node takes whole nodes of its own.
        let spans = gpus > per_node;
        if gpu > 0 && (spans || gpu + gpus > per_node) {
            node += 1;
            gpu = 0;
        }
        placed.push(Placed {
            role,
            index,
            phase: phase.clone(),
            node,
            gpu,
            port: base_port + n as u64,
        });
        if spans {
            node += gpus.div_ceil(per_node);
        } else {
            gpu += gpus;
        }
    }
    placed
}

fn dtype(precision: Precision) -> &'static str {
    match precision {
        Precision::Fp16 => "float16",
        Precision::Fp32 => "float32",
        Precision::Bf16 | Precision::Fp8 => "bfloat16",
    }
}

fn role_name(role: LaunchRole) -> &'static str {
    match role {
        LaunchRole::Both => "instance",
        LaunchRole::Prefill => "prefill",
        LaunchRole::Decode => "decode",
    }
}

fn devices(p: &Placed) -> String {
    let gpus = p.phase.tp * p.phase.pp;
    (p.gpu..p.gpu + gpus)
        .map(|g| g.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Writes the launch commands of `launch` for `target`.
pub fn export_serving(launch: &ServingLaunch, target: ServingTarget) -> ExportOutput {
    let mut unsupported = Vec::new();
    let mut notes = vec![format!(
        "set MODEL to the checkpoint of `{}` (a Hugging Face repository or a local path)",
        launch.model
    )];
    let base_port = match target {
        ServingTarget::Vllm => 8100,
        ServingTarget::Sglang => 30000,
    };
    let placed = place(launch, base_port);
    let nodes = placed
        .iter()
        .map(|p| p.node + (p.phase.tp * p.phase.pp).div_ceil(launch.gpus_per_node.max(1)))
        .max()
        .unwrap_or(1);
    let disaggregated = launch.phases.iter().any(|p| p.role != LaunchRole::Both);
    let mut text = String::new();
    let _ = writeln!(
        text,
        "#!/bin/bash\n# {} for `{}`: {} instance(s) on {nodes} node(s), written by `tessel export`.\n\
         # Run each node's commands on that node; NODE<i> is its address.\nset -euo pipefail\n\
         MODEL=${{MODEL:?set MODEL to the checkpoint of {}}}\n",
        target.name(),
        launch.model,
        placed.len(),
        launch.model
    );
    if launch.precision == Precision::Fp8 {
        notes.push(
            "the plan serves FP8 weights: quantize the checkpoint to FP8 (or pass the engine's \
             `--quantization fp8`), which these commands do not do"
                .into(),
        );
    }
    let kv_fp8 = launch.kv_precision == Precision::Fp8;
    for p in &placed {
        let gpus = p.phase.tp * p.phase.pp;
        let _ = writeln!(
            text,
            "# {} {} on NODE{}, GPUs {}",
            role_name(p.role),
            p.index,
            p.node,
            if gpus > launch.gpus_per_node {
                format!("all of {} nodes", gpus.div_ceil(launch.gpus_per_node))
            } else {
                devices(p)
            }
        );
        match target {
            ServingTarget::Vllm => {
                let mut env = if gpus <= launch.gpus_per_node {
                    format!("CUDA_VISIBLE_DEVICES={} ", devices(p))
                } else {
                    String::new()
                };
                if disaggregated {
                    let _ = write!(env, "VLLM_NIXL_SIDE_CHANNEL_PORT={} ", p.port + 500);
                }
                let _ = write!(
                    text,
                    "{env}vllm serve \"$MODEL\" --port {} \\\n  --tensor-parallel-size {} \
                     --pipeline-parallel-size {} \\\n  --max-num-seqs {} \
                     --max-num-batched-tokens {} \\\n  --gpu-memory-utilization \
                     {MEMORY_FRACTION} --dtype {}",
                    p.port,
                    p.phase.tp,
                    p.phase.pp,
                    p.phase.max_sequences,
                    p.phase.max_batched_tokens,
                    dtype(launch.precision)
                );
                if kv_fp8 {
                    text.push_str(" --kv-cache-dtype fp8");
                }
                if disaggregated {
                    text.push_str(
                        " \\\n  --kv-transfer-config \
                         '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_both\"}'",
                    );
                }
                text.push_str(" &\n\n");
            }
            ServingTarget::Sglang => {
                let _ = write!(
                    text,
                    "python -m sglang.launch_server --model-path \"$MODEL\" --host 0.0.0.0 \
                     --port {} \\\n  --tp-size {} --pp-size {} \\\n  --max-running-requests {} \
                     --chunked-prefill-size {} \\\n  --mem-fraction-static {MEMORY_FRACTION} \
                     --dtype {}",
                    p.port,
                    p.phase.tp,
                    p.phase.pp,
                    p.phase.max_sequences,
                    p.phase.max_batched_tokens,
                    dtype(launch.precision)
                );
                if gpus <= launch.gpus_per_node {
                    let _ = write!(text, " --base-gpu-id {}", p.gpu);
                } else {
                    let _ = write!(
                        text,
                        " \\\n  --nnodes {} --node-rank \"$NODE_RANK\" --dist-init-addr \
                         NODE{}:5000",
                        gpus.div_ceil(launch.gpus_per_node),
                        p.node
                    );
                }
                if kv_fp8 {
                    text.push_str(" --kv-cache-dtype fp8_e5m2");
                }
                match p.role {
                    LaunchRole::Both => {}
                    LaunchRole::Prefill => text.push_str(" \\\n  --disaggregation-mode prefill"),
                    LaunchRole::Decode => text.push_str(" \\\n  --disaggregation-mode decode"),
                }
                text.push_str(" &\n\n");
            }
        }
    }
    let url = |p: &Placed| format!("http://NODE{}:{}", p.node, p.port);
    let of = |role: LaunchRole| placed.iter().filter(move |p| p.role == role);
    match target {
        ServingTarget::Vllm => {
            if disaggregated {
                unsupported.push(
                    "the proxy that sends each request to a prefill instance and then a decode \
                     one: vLLM ships only an example (its NixlConnector guide's \
                     `toy_proxy_server.py`); point one at the prefill and decode ports above"
                        .into(),
                );
            } else if placed.len() > 1 {
                unsupported.push(format!(
                    "a load balancer over the {} instances (the plan dispatches round robin): \
                     vLLM has none; put one in front of the ports above",
                    placed.len()
                ));
            }
            if placed
                .iter()
                .any(|p| p.phase.tp * p.phase.pp > launch.gpus_per_node)
            {
                notes.push(
                    "an instance spans nodes: vLLM runs it over a Ray cluster of those nodes; \
                     start `ray start` on each before `vllm serve`"
                        .into(),
                );
            }
        }
        ServingTarget::Sglang => {
            if disaggregated {
                let mut line =
                    String::from("python -m sglang_router.launch_router --pd-disaggregation");
                for p in of(LaunchRole::Prefill) {
                    let _ = write!(line, " \\\n  --prefill {}", url(p));
                }
                for p in of(LaunchRole::Decode) {
                    let _ = write!(line, " \\\n  --decode {}", url(p));
                }
                let _ = writeln!(
                    text,
                    "# the router in front\n{line} \\\n  --host 0.0.0.0 --port 8000\n"
                );
            } else if placed.len() > 1 {
                let urls: Vec<String> = placed.iter().map(url).collect();
                let _ = writeln!(
                    text,
                    "# the router in front, round robin as the plan dispatches\n\
                     python -m sglang_router.launch_router --worker-urls {} \\\n  \
                     --policy round_robin --host 0.0.0.0 --port 8000\n",
                    urls.join(" ")
                );
            }
        }
    }
    text.push_str("wait\n");
    ExportOutput {
        text,
        file_name_hint: format!("{}.{}.sh", launch.model, target.name()),
        unsupported,
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(phases: Vec<LaunchPhase>, same_node: bool) -> ServingLaunch {
        ServingLaunch {
            model: "llama3_8b".into(),
            precision: Precision::Bf16,
            kv_precision: Precision::Bf16,
            gpus_per_node: 8,
            phases,
            kv_same_node: same_node,
        }
    }

    fn phase(role: LaunchRole, instances: u64, tp: u64) -> LaunchPhase {
        LaunchPhase {
            role,
            instances,
            tp,
            pp: 1,
            max_sequences: 256,
            max_batched_tokens: 2048,
        }
    }

    #[test]
    fn disaggregated_pairs_share_nodes_and_sglang_routes_them() {
        let l = launch(
            vec![
                phase(LaunchRole::Prefill, 2, 2),
                phase(LaunchRole::Decode, 2, 2),
            ],
            true,
        );
        let placed = place(&l, 30000);
        let at: Vec<(u64, u64)> = placed.iter().map(|p| (p.node, p.gpu)).collect();
        assert_eq!(at, [(0, 0), (0, 2), (0, 4), (0, 6)]);
        assert_eq!(placed[1].role, LaunchRole::Decode);
        let out = export_serving(&l, ServingTarget::Sglang);
        assert_eq!(out.text.matches("--disaggregation-mode prefill").count(), 2);
        assert!(out.text.contains("--pd-disaggregation"));
        assert!(out.unsupported.is_empty(), "{:?}", out.unsupported);
        let out = export_serving(&l, ServingTarget::Vllm);
        assert_eq!(out.text.matches("NixlConnector").count(), 4);
        assert_eq!(out.unsupported.len(), 1);
    }

    #[test]
    fn instances_that_span_nodes_take_whole_nodes() {
        let l = launch(
            vec![LaunchPhase {
                pp: 2,
                ..phase(LaunchRole::Both, 2, 8)
            }],
            false,
        );
        let placed = place(&l, 8100);
        let at: Vec<u64> = placed.iter().map(|p| p.node).collect();
        assert_eq!(at, [0, 2]);
        let out = export_serving(&l, ServingTarget::Sglang);
        assert!(out.text.contains("--nnodes 2"));
    }
}
