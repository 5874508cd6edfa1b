//! A cluster made of pools through the binary: `plan` places the work and records where, `plan
//! --check` re-predicts it under that placement, and the commands that cost or export one GPU
//! type refuse a cluster of pools with exit 1 (a plan across pools launches: tests/replan.rs).

mod common;

use common::{stdout, tessel};

const SPEC: &str = "specs/mixed-a100-l40s.tsl";

fn plan_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("mixed.json");
    let output = tessel(&["plan", SPEC, "-o", path.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stdout(&output));
    path
}

#[test]
fn the_plan_says_which_ranks_run_on_which_pool() {
    let dir = tempfile::tempdir().unwrap();
    let path = plan_file(dir.path());
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let placement = &plan["placement"];
    let gpus = plan["gpus"].as_u64().unwrap();
    assert_eq!(gpus, 96);
    let pools = placement["pools"].as_array().unwrap();
    // Every rank on exactly one pool, pools back to back, stages likewise.
    let mut next_rank = 0;
    let mut next_stage = 0;
    for pool in pools {
        assert_eq!(pool["ranks"][0].as_u64().unwrap(), next_rank);
        assert_eq!(pool["stages"][0].as_u64().unwrap(), next_stage);
        next_rank = pool["ranks"][1].as_u64().unwrap();
        next_stage = pool["stages"][1].as_u64().unwrap();
    }
    assert_eq!(next_rank, gpus);
    assert_eq!(next_stage, plan["config"]["pp"].as_u64().unwrap());
    // The plan (ranked by its interval's high end) is here also the fastest placement predicted.
    let step = plan["prediction"]["step_time_s"].as_f64().unwrap();
    let tried = placement["tried"].as_array().unwrap();
    // Across, each pool alone, and each pool's shape as replicas on both.
    assert_eq!(tried.len(), 5);
    for other in tried {
        if let Some(time) = other["step_time_s"].as_f64() {
            assert!(step <= time, "{other}");
        }
    }
    let table = stdout(&tessel(&["plan", SPEC]));
    assert!(table.contains("  pools        "), "{table}");
    assert!(
        table.contains("  placements   pipeline across pools"),
        "{table}"
    );
}

#[test]
fn check_re_predicts_the_placement_the_plan_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = plan_file(dir.path());
    let output = tessel(&["plan", SPEC, "--check", path.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stdout(&output));
    assert!(stdout(&output).starts_with("current:"));
}

#[test]
fn one_gpu_type_commands_refuse_pools() {
    let dir = tempfile::tempdir().unwrap();
    let path = plan_file(dir.path());
    let plan = path.to_str().unwrap();
    for args in [
        vec!["estimate", SPEC, "--tp", "1", "--pp", "3", "--dp", "32"],
        vec!["export", plan, "--to", "megatron"],
        vec!["plan", SPEC, "--gpus", "32"],
    ] {
        let output = tessel(&args);
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("made of pools"), "{args:?}: {stderr}");
    }
}

/// Llama 3 8B on 16 H100 and 16 A100 with one pipeline stage: no pipeline can span the pools,
/// so data-parallel replicas on both, with the batch split by their speed, are the mixed plan.
const REPLICAS_SPEC: &str = "model llama3_8b {
  layers = 32; hidden = 4096; heads = 32; kv_heads = 8; ffn_hidden = 14336
  vocab = 128256; mlp = swiglu; norm = rmsnorm; tie_embeddings = false
}
cluster mixed {
  pool h100 {
    gpu = H100_SXM; nodes = 2; gpus_per_node = 8
    intra_node = { bandwidth = 450 GB/s }; inter_node = { bandwidth = 400 Gb/s }
  }
  pool a100 {
    gpu = A100_80GB; nodes = 2; gpus_per_node = 8
    intra_node = { bandwidth = 300 GB/s }; inter_node = { bandwidth = 200 Gb/s }
  }
  between_pools = { bandwidth = 200 Gb/s }
}
train { model = llama3_8b; cluster = mixed; seq_len = 4096; global_batch = 256; precision = bf16 }
search { pp = 1 }
";

#[test]
fn replicas_across_pools_split_the_batch_by_speed() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("replicas.tsl");
    std::fs::write(&spec, REPLICAS_SPEC).unwrap();
    let path = dir.path().join("replicas.json");
    let (spec, path) = (spec.to_str().unwrap(), path.to_str().unwrap());
    stdout(&tessel(&["plan", spec, "-o", path]));
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let placement = &plan["placement"];
    assert!(
        placement["placement"]
            .as_str()
            .unwrap()
            .starts_with("replicas across pools"),
        "{placement}"
    );
    let microbatch = plan["config"]["microbatch"].as_u64().unwrap();
    let pools = placement["pools"].as_array().unwrap();
    let share = |p: &serde_json::Value| {
        let [first, last] = [0, 1].map(|i| p["replicas"][i].as_u64().unwrap());
        (last - first, p["microbatches"].as_u64().unwrap())
    };
    // Every sequence of the batch is trained once, the faster GPUs taking more of them.
    let sequences: u64 = pools
        .iter()
        .map(|p| share(p).0 * share(p).1 * microbatch)
        .sum();
    assert_eq!(sequences, 256);
    let (h100, a100) = (share(&pools[0]), share(&pools[1]));
    assert_eq!(pools[0]["name"], "h100");
    assert!(h100.1 > a100.1, "{h100:?} {a100:?}");
    // Faster than either pool alone, and current for `plan --check`.
    let step = plan["prediction"]["step_time_s"].as_f64().unwrap();
    for tried in placement["tried"].as_array().unwrap() {
        if tried["placement"].as_str().unwrap().starts_with("pool ") {
            assert!(step < tried["step_time_s"].as_f64().unwrap(), "{tried}");
        }
    }
    assert!(stdout(&tessel(&["plan", spec, "--check", path])).starts_with("current:"));
    // The runtime runs one micro-batch count for every replica.
    let out = tessel(&["launch", path, "--backend", "cpu", "--steps", "1"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("different micro-batch counts"), "{stderr}");
}
