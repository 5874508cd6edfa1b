//! Hybrid sharding (FSDP's HSDP, `dp_shard` below `dp`) through the binary: written, checked,
//! estimated, planned and exported to torchtitan as replicate × shard degrees.

mod common;

use common::{stdout, tessel};

const SPEC: &str = "tests/specs/qwen2-72b-hsdp.tsl";

#[test]
fn check_and_estimate_show_the_sharding_group() {
    let text = stdout(&tessel(&["check", SPEC]));
    assert!(
        text.contains("ZeRO 3 over 4 of 8 data-parallel ranks"),
        "{text}"
    );
    assert!(text.contains("dp_shard          8"), "{text}");
    let text = stdout(&tessel(&["estimate", SPEC, "--strategy", "hsdp"]));
    assert!(
        text.contains("| ZeRO 3 over 4 of 8 data-parallel ranks"),
        "{text}"
    );
    assert!(text.contains("(fits)"), "{text}");
}

#[test]
fn the_planned_hybrid_exports_to_torchtitan_as_replicas_of_shards() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let plan = dir.path().join("hsdp.json");
    let plan = plan.to_str().expect("utf-8 path");
    let text = stdout(&tessel(&["plan", SPEC, "-o", plan]));
    assert!(text.contains("ZeRO 3 over 8 of "), "{text}");
    let output = tessel(&["export", plan, "--to", "torchtitan"]);
    let config = stdout(&output);
    assert!(!config.contains("Not expressible"), "{config}");
    let doc: toml_edit::DocumentMut = config.parse().expect("valid TOML");
    let degree = |key: &str| doc["parallelism"][key].as_integer().expect(key);
    assert_eq!(degree("data_parallel_shard_degree"), 8);
    let dp = degree("data_parallel_shard_degree") * degree("data_parallel_replicate_degree");
    let model = degree("tensor_parallel_degree") * degree("pipeline_parallel_degree");
    assert_eq!(dp * model, 256, "{config}");
    assert!(dp > 8, "{config}");
}
