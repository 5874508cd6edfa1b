//! Tempo's activation-saving kernels through the binary: `memory_saving_kernels = auto` turns
//! them on where memory binds (GPT-2 XL on eight V100 16 GB: no recompute with them, selective
//! recompute without), `--explain` says why, a committed plan is current under `plan --check`,
//! exporters say they cannot run them, and `tessel launch` trains the plan with the cost
//! model's states and peak memory.

mod common;

use common::{launch_cpu_scaled, plan_explained_and_current, stdout, tessel};

#[test]
fn auto_turns_the_kernels_on_where_memory_binds_and_the_plan_trains() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let plan = dir.path().join("tempo.json").display().to_string();
    let shown = plan_explained_and_current("specs/gpt2-xl-tempo.tsl", &plan);
    assert!(
        shown.contains("kernels      Tempo's in-place GELU and norms"),
        "{shown}"
    );
    assert!(shown.contains("stages       recompute none"), "{shown}");
    assert!(shown.contains("memory_saving_kernels: on: "), "{shown}");
    let exported = stdout(&tessel(&["export", &plan, "--to", "megatron"]));
    assert!(
        exported.contains("memory_saving_kernels = true"),
        "{exported}"
    );
    let report = launch_cpu_scaled(&plan, "0.015625", "2", &[]);
    let losses = report["losses"].as_array().expect("losses");
    assert!(losses
        .iter()
        .all(|l| l.as_f64().is_some_and(f64::is_finite)));
    for rank in report["ranks"].as_array().expect("ranks") {
        // Equal but for ZeRO's flat buffers padded to a multiple of the replicas.
        for state in ["weights", "grads", "optimizer"] {
            let (measured, predicted) = (
                rank["measured"][state].as_f64().unwrap(),
                rank["predicted"][state].as_f64().unwrap(),
            );
            assert!(
                (measured - predicted).abs() <= 1e-3 * predicted,
                "rank {} {state}: {measured} vs {predicted}",
                rank["rank"]
            );
        }
        let ratio = rank["peak_memory_bytes"].as_f64().unwrap()
            / rank["predicted_peak_memory_bytes"].as_f64().unwrap();
        assert!(
            (0.9..=1.1).contains(&ratio),
            "rank {}: {ratio}",
            rank["rank"]
        );
    }
}
