//! The CUDA backend (cargo feature `cuda`): one process per GPU, cudarc with dynamic loading
//! (so it builds without CUDA), cuBLAS matmuls, NVRTC-compiled kernels, NCCL communicators per
//! process group. See docs/CUDA.md for what has and has not run on a GPU.

mod backend;
mod collectives;
mod device;
mod probe;

pub use backend::{CudaBackend, CudaTensor};
pub use probe::{probe, CudaProbe};

use crate::executor::RankOutput;
use crate::launch::LaunchOptions;
use crate::launcher::worker::run_worker_with;
use crate::launcher::{WorkerConfig, WorkerError};
use crate::mesh::Mesh;
use crate::plan::ExecutionPlan;
use collectives::{make_ids, Communicators};
use device::Device;
use tessel_grammar::ModelSpec;

/// One rank on the GPU `config.env.local_rank`: probes the libraries and the device first,
/// then joins the rendezvous (rank 0 hands out the NCCL unique ids), builds the communicators
/// and trains.
pub fn run_cuda_worker(
    model: &ModelSpec,
    plan: &ExecutionPlan,
    options: &LaunchOptions,
    config: &WorkerConfig,
) -> Result<RankOutput, WorkerError> {
    let found = probe().map_err(WorkerError::Failed)?;
    let gpu = config.env.local_rank;
    if gpu >= found.devices {
        return Err(WorkerError::Failed(format!(
            "local rank {gpu} needs GPU {gpu} but this node has {}",
            found.devices
        )));
    }
    let mesh = Mesh::new(plan);
    let rank = config.env.rank as u64;
    run_worker_with(
        model,
        plan,
        options,
        config,
        || make_ids(&mesh),
        |ids, link| {
            let dev = Device::open(gpu)?;
            let comms = Communicators::new(&mesh, rank, &ids, &dev.reduce, link)?;
            Ok(CudaBackend::new(dev, comms))
        },
    )
}
