//! Published runs on clusters of two GPU types (`data/hetero/runs.csv`), written as specs with
//! pools and predicted the way `tessel plan` costs a pipeline across pools.
//!
//! The rows used are AMP's (Li et al., NeurIPS 2022) committed real trials: GPT-2 345M under
//! DeepSpeed's pipeline engine on Megatron-LM v1.1.5, on three AWS p3.8xlarge nodes (4 V100 16 GB
//! each) and one g4dn.12xlarge node (4 T4), and for comparison on four g4dn.12xlarge nodes (16
//! T4). A heterogeneous row is costed when the T4 node holds whole pipeline stages, the last
//! ones (a pipeline across pools in Tessel's terms); a row whose T4 node holds one data-parallel
//! replica of a stage mixes GPU types inside a stage, which Tessel does not place, and is left
//! out. What the run used and the rows leave unsaid comes from the artifact: fp16 with loss
//! scaling, no activation checkpointing (`examples/ds_pretrain_gpt2_pipe.sh` passes no
//! `--checkpoint-activations`), no ZeRO (`examples/ds_config.json`), no fused attention, dropout
//! 0.1; the links are AMP's own cluster description (`het_cluster.py`: 170 Gb/s inside and
//! 10 Gb/s between the V100 nodes, 50 and 50 Gb/s on the T4 node), the link between the pools
//! the V100 nodes' 10 Gb/s.

use std::path::{Path, PathBuf};

use tessel_grammar::Spec;

use super::csv::Table;
use crate::cost::{CostModel, PooledCostModel};

/// One costed row.
#[derive(Clone, Debug)]
pub struct HeteroCase {
    /// Line in the CSV file (1-based, the header is line 1).
    pub line: usize,
    /// Whether the cluster has both GPU types (else the 16-T4 comparison).
    pub mixed: bool,
    /// `tp2 pp8 dp1 mb2`.
    pub label: String,
    pub spec_text: String,
    pub spec: Spec,
    pub measured_s: f64,
}

/// A case's prediction.
#[derive(Clone, Debug)]
pub struct HeteroOutcome {
    pub case: HeteroCase,
    pub predicted_s: f64,
    /// Predicted over measured step time, minus one.
    pub error: f64,
}

/// `data/hetero/runs.csv` in this repository.
pub fn default_hetero_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("data")
        .join("hetero")
        .join("runs.csv")
}

/// Reads the table and writes each costable AMP row as a spec.
pub fn load_hetero_cases(path: &Path) -> Result<Vec<HeteroCase>, String> {
    let mut cases = Vec::new();
    for (line, get) in Table::read(path)?.rows() {
        if let Some(case) = amp_case(line, &get)? {
            cases.push(case);
        }
    }
    Ok(cases)
}

fn amp_case(line: usize, get: &dyn Fn(&str) -> String) -> Result<Option<HeteroCase>, String> {
    if !get("source").starts_with("Li D.") {
        return Ok(None);
    }
    let whole = |name: &str| get(name).parse::<u64>().ok();
    let (Some(tp), Some(pp), Some(dp), Some(microbatch), Some(measured_s)) = (
        whole("tp"),
        whole("pp"),
        whole("dp"),
        whole("micro_batch"),
        get("measured_iteration_s").parse::<f64>().ok(),
    ) else {
        return Ok(None);
    };
    let split = get("stage_split");
    let Some(stages) = layers_per_stage(&split) else {
        return Err(format!("line {line}: no layers per stage in `{split}`"));
    };
    let mixed = get("gpus_b") != "0";
    if mixed && !t4_holds_last_whole_stages(&split, pp, dp) {
        return Ok(None);
    }
    let cluster = if mixed {
        "pool p3 {\n    gpu = V100_16GB; nodes = 3; gpus_per_node = 4\n    intra_node = { bandwidth = 170 Gb/s }; inter_node = { bandwidth = 10 Gb/s }\n  }\n  pool g4 {\n    gpu = T4; nodes = 1; gpus_per_node = 4\n    intra_node = { bandwidth = 50 Gb/s }; inter_node = { bandwidth = 50 Gb/s }\n  }\n  between_pools = { bandwidth = 10 Gb/s }"
    } else {
        "gpu = T4; nodes = 4; gpus_per_node = 4\n  intra_node = { bandwidth = 50 Gb/s }; inter_node = { bandwidth = 50 Gb/s }"
    };
    let stage_list: Vec<String> = stages.iter().map(u64::to_string).collect();
    let spec_text = format!(
        "# AMP (Li et al. 2022), {table}, line {line}\nmodel gpt2 {{\n  layers = 24; hidden = 1024; heads = 16; ffn_hidden = 4096; vocab = 52256\n  mlp = gelu; norm = layernorm; position = learned; max_seq_len = 1024; bias = true; tie_embeddings = true\n}}\ncluster amp {{\n  {cluster}\n}}\ntrain {{\n  model = gpt2; cluster = amp; seq_len = 1024; global_batch = 32\n  precision = fp16; framework = deepspeed; flash_attention = false; dropout = 0.1\n}}\nstrategy s {{\n  tp = {tp}; pp = {pp}; dp = {dp}; microbatch = {microbatch}; recompute = none\n  stages = [{}]\n}}\n",
        stage_list.join(", "),
        table = get("table"),
    );
    let spec =
        tessel_grammar::load_str(&format!("hetero.csv:{line}"), &spec_text).map_err(|d| {
            let messages: Vec<String> = d
                .iter()
                .map(|e| format!("{}:{}: {}", e.line, e.column, e.message))
                .collect();
            format!("line {line}: {}\n{spec_text}", messages.join("; "))
        })?;
    Ok(Some(HeteroCase {
        line,
        mixed,
        label: format!("tp{tp} pp{pp} dp{dp} mb{microbatch}"),
        spec_text,
        spec,
        measured_s,
    }))
}

/// `… transformer layers per stage 5/7/6/6; …` as numbers.
fn layers_per_stage(split: &str) -> Option<Vec<u64>> {
    let after = split.split("transformer layers per stage ").nth(1)?;
    let list = after.split(';').next()?.trim();
    list.split('/').map(|n| n.trim().parse().ok()).collect()
}

/// Whether `… T4 node (ranks 12-15) holds stage(s) [6, 7] (data-parallel replica(s) [0, 1] …`
/// names the last stages with every data-parallel replica of each.
fn t4_holds_last_whole_stages(split: &str, pp: u64, dp: u64) -> bool {
    let list = |after: &str| -> Option<Vec<u64>> {
        let rest = split.split(after).nth(1)?;
        let inner = rest.split(']').next()?;
        inner.split(',').map(|n| n.trim().parse().ok()).collect()
    };
    let (Some(stages), Some(replicas)) = (list("holds stage(s) ["), list("replica(s) [")) else {
        return false;
    };
    let first = pp.saturating_sub(stages.len() as u64);
    replicas.len() as u64 == dp && stages == (first..pp).collect::<Vec<u64>>()
}

/// Predicts every case with the committed calibration: a pipeline across the pools for the
/// mixed rows, one GPU type for the others.
pub fn evaluate_hetero(cases: &[HeteroCase]) -> Result<Vec<HeteroOutcome>, String> {
    cases
        .iter()
        .map(|case| {
            let strategy = &case.spec.strategies[0];
            let estimate = if case.mixed {
                PooledCostModel::new(&case.spec).and_then(|m| m.estimate(strategy))
            } else {
                CostModel::new(&case.spec).and_then(|m| m.estimate(strategy))
            }
            .map_err(|e| format!("line {}: {e}", case.line))?;
            Ok(HeteroOutcome {
                case: case.clone(),
                predicted_s: estimate.step_time_s,
                error: estimate.step_time_s / case.measured_s - 1.0,
            })
        })
        .collect()
}
