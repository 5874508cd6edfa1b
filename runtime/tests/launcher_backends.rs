//! The same single-rank training run through the worker entry point of every backend, against
//! the threaded CPU run. The CUDA run needs a GPU (and the `cuda` feature); without one it
//! prints why and is skipped.

mod common;

use common::tiny_model;
use std::time::Duration;
use tessel_grammar::{MlpKind, ModelSpec, NormKind, PositionKind};
use tessel_runtime::backend::cuda;
use tessel_runtime::launcher::{run_cpu_worker, WorkerConfig, WorldEnv};
use tessel_runtime::{launch_cpu, ExecutionPlan, LaunchOptions};

/// The launch tests' tiny model with gelu, layernorm, biases and learned positions.
fn model() -> ModelSpec {
    ModelSpec {
        mlp: MlpKind::Gelu,
        norm: NormKind::Layernorm,
        tie_embeddings: false,
        bias: true,
        max_seq_len: Some(8),
        position: PositionKind::Learned,
        ..tiny_model()
    }
}

fn single_rank_config() -> WorkerConfig {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    WorkerConfig {
        env: WorldEnv {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            node_rank: 0,
            master_addr: "127.0.0.1".into(),
            master_port: port,
            source: "torchrun",
        },
        token: "t".into(),
        timeout: Duration::from_secs(20),
    }
}

#[test]
fn every_backend_trains_like_the_threaded_cpu_run() {
    let m = model();
    let plan = ExecutionPlan::single_rank(&m, 2, 8).unwrap();
    let options = LaunchOptions::new(3);
    let reference = launch_cpu(&m, &plan, &options).unwrap().losses;
    let cpu = run_cpu_worker(&m, &plan, &options, &single_rank_config()).unwrap();
    assert_eq!(cpu.losses, reference);
    match cuda::run_cuda_worker(&m, &plan, &options, &single_rank_config()) {
        Err(e) => match cuda::probe() {
            Err(why) => eprintln!("skipped the CUDA run: {why}"),
            Ok(_) => panic!("the CUDA run failed on a machine with a GPU: {e}"),
        },
        Ok(gpu) => {
            // cuBLAS and NCCL sum in their own order: equal to rounding, not bit for bit.
            for (g, r) in gpu.losses.iter().zip(&reference) {
                assert!(
                    (g - r).abs() <= 1e-4 * r.abs(),
                    "{:?} vs {reference:?}",
                    gpu.losses
                );
            }
        }
    }
}

#[test]
fn the_cuda_probe_says_what_is_missing_instead_of_panicking() {
    match cuda::probe() {
        Ok(found) => eprintln!("found {} GPU(s)", found.devices),
        Err(why) => {
            assert!(
                why == "built without the cuda feature; rebuild with --features cuda"
                    || why.contains("was not found: install")
                    || why.contains("found no GPU"),
                "{why}"
            );
            eprintln!("no CUDA here: {why}");
        }
    }
}
