//! One rank of a multi-process run: joins the rendezvous (rank 0 also hosts the hub), builds
//! the backend and follows the same executor as the threaded run.

use super::comm::HubLink;
use super::env::WorldEnv;
use super::rendezvous::{join, Hub, RendezvousConfig};
use super::tcp_backend::TcpCpuBackend;
use crate::backend::Backend;
use crate::data::TokenStream;
use crate::error::RuntimeError;
use crate::executor::{run_rank, RankOutput, RunSetup};
use crate::launch::{validate_model, LaunchOptions};
use crate::mesh::Mesh;
use crate::plan::ExecutionPlan;
use std::net::{SocketAddr, ToSocketAddrs};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessel_grammar::ModelSpec;
use tessel_planner::schedule::PipelineSchedule;

/// A worker's exit status when it stopped because another rank failed (not its own fault).
pub const EXIT_ABORTED: i32 = 3;

/// How a worker ended without finishing.
#[derive(Clone, Debug, PartialEq)]
pub enum WorkerError {
    /// This rank failed (bad plan, rendezvous, its own error).
    Failed(String),
    /// Another rank failed first; `rank` and `reason` are that rank's.
    Aborted { rank: u64, reason: String },
}

impl WorkerError {
    /// The process exit status that tells the launcher which of the two it was.
    pub fn exit_code(&self) -> i32 {
        match self {
            WorkerError::Failed(_) => 1,
            WorkerError::Aborted { .. } => EXIT_ABORTED,
        }
    }
}

impl std::fmt::Display for WorkerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkerError::Failed(reason) => write!(f, "{reason}"),
            WorkerError::Aborted { rank, reason } => {
                write!(f, "stopped because rank {rank} failed: {reason}")
            }
        }
    }
}

/// The rendezvous settings of a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerConfig {
    pub env: WorldEnv,
    pub token: String,
    pub timeout: Duration,
}

impl WorkerConfig {
    /// Reads placement, token and timeout from the process environment.
    pub fn from_process_env() -> Result<WorkerConfig, String> {
        let env = super::env::detect(|k| std::env::var(k).ok())?.ok_or(
            "no rank in the environment: set RANK/WORLD_SIZE (or run under srun or `tessel launch`)",
        )?;
        let token = std::env::var(super::env::TOKEN_VAR).unwrap_or_default();
        let timeout = match std::env::var(super::env::TIMEOUT_VAR) {
            Err(_) => Duration::from_secs(300),
            Ok(v) => Duration::from_secs_f64(
                v.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s > 0.0)
                    .ok_or_else(|| {
                        format!("{}={v:?} is not a positive number", super::env::TIMEOUT_VAR)
                    })?,
            ),
        };
        Ok(WorkerConfig {
            env,
            token,
            timeout,
        })
    }

    pub fn rendezvous(&self) -> Result<RendezvousConfig, String> {
        let target = format!("{}:{}", self.env.master_addr, self.env.master_port);
        let addr: SocketAddr = target
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve rank 0's address {target}: {e}"))?
            .next()
            .ok_or_else(|| format!("{target} resolves to no address"))?;
        Ok(RendezvousConfig {
            addr,
            world_size: self.env.world_size,
            token: self.token.clone(),
            timeout: self.timeout,
        })
    }
}

/// Joins the rendezvous as `config.env.rank` and trains on the CPU backend with collectives
/// over TCP. Rank 0 also hosts the hub for the whole run.
pub fn run_cpu_worker(
    model: &ModelSpec,
    plan: &ExecutionPlan,
    options: &LaunchOptions,
    config: &WorkerConfig,
) -> Result<RankOutput, WorkerError> {
    run_worker_with(
        model,
        plan,
        options,
        config,
        || Ok(Vec::new()),
        |_, link| Ok(TcpCpuBackend::new(&Mesh::new(plan), link)),
    )
}

/// The shared body of every worker: checks, rendezvous (rank 0 hosts the hub and hands out
/// `payload()`), `backend(payload, link)`, then the executor. Panics while building the
/// backend or training become this rank's failure.
pub fn run_worker_with<B: Backend>(
    model: &ModelSpec,
    plan: &ExecutionPlan,
    options: &LaunchOptions,
    config: &WorkerConfig,
    payload: impl FnOnce() -> Result<Vec<u8>, String>,
    backend: impl FnOnce(Vec<u8>, Arc<HubLink>) -> Result<B, String>,
) -> Result<RankOutput, WorkerError> {
    let failed = |e: String| WorkerError::Failed(e);
    validate_model(model).map_err(|e| failed(e.to_string()))?;
    plan.validate(model).map_err(|e| failed(e.to_string()))?;
    if plan.world_size() as usize != config.env.world_size {
        return Err(failed(format!(
            "the plan needs {} ranks but the job has {}",
            plan.world_size(),
            config.env.world_size
        )));
    }
    let rdzv = config.rendezvous().map_err(failed)?;
    let rank = config.env.rank;
    let hub = if rank == 0 {
        let hub = Hub::bind(rdzv.clone(), payload().map_err(failed)?)
            .map_err(|e| failed(e.to_string()))?;
        Some(std::thread::spawn(move || hub.serve()))
    } else {
        None
    };
    let result = join(&rdzv, rank as u64)
        .map_err(|e| failed(e.to_string()))
        .and_then(|(stream, payload)| {
            let link = HubLink::start(rank as u64, stream).map_err(|e| failed(e.to_string()))?;
            let built = catch_unwind(AssertUnwindSafe(|| backend(payload, link.clone())))
                .unwrap_or_else(|p| {
                    Err(format!("setting up the backend {}", panic_text(p.as_ref())))
                });
            match built {
                Ok(b) => train(&b, model, plan, options, rank, &link),
                Err(reason) => {
                    link.fail(&reason);
                    Err(failed(reason))
                }
            }
        });
    if let Some(hub) = hub {
        // The hub ends when every rank is done or it has broadcast a failure; its own failure
        // (a rendezvous timeout) is the more telling message.
        match hub.join() {
            Ok(Err(e)) => return Err(failed(e.to_string())),
            Ok(Ok(_)) => {}
            Err(_) => return Err(failed("the rendezvous hub panicked".into())),
        }
    }
    result
}

fn train<B: Backend>(
    backend: &B,
    model: &ModelSpec,
    plan: &ExecutionPlan,
    options: &LaunchOptions,
    rank: usize,
    link: &HubLink,
) -> Result<RankOutput, WorkerError> {
    let prepared = (|| {
        let schedule = PipelineSchedule::interleaved(plan.pp, plan.microbatches, plan.interleave)
            .map_err(|e| RuntimeError::invalid_plan(e.to_string()))?;
        let stream = TokenStream::new(
            &options.data,
            options.seed,
            model.vocab,
            plan.seq_len as usize,
            plan.global_batch() as usize,
        )?;
        Ok::<_, RuntimeError>((schedule, stream))
    })();
    let outcome = prepared.and_then(|(schedule, stream)| {
        let setup = RunSetup {
            model,
            plan,
            schedule: &schedule,
            stream: &stream,
            steps: options.steps as usize,
            resume: None,
            checkpoint_to: None,
            snapshot_every: None,
            fail_at: None,
            adam: options.adam,
            collect_parameters: options.collect_parameters,
            start: Instant::now(),
        };
        catch_unwind(AssertUnwindSafe(|| run_rank(backend, rank, &setup))).unwrap_or_else(|p| {
            Err(RuntimeError::RankFailed {
                rank,
                reason: panic_text(p.as_ref()),
            })
        })
    });
    match outcome {
        Ok(output) => {
            link.finish().map_err(|_| aborted(link))?;
            Ok(output)
        }
        Err(RuntimeError::Aborted) => Err(aborted(link)),
        Err(e) => {
            let reason = e.to_string();
            link.fail(&reason);
            Err(WorkerError::Failed(reason))
        }
    }
}

fn aborted(link: &HubLink) -> WorkerError {
    let (rank, reason) = link
        .abort_reason()
        .unwrap_or((0, "the run was aborted".into()));
    WorkerError::Aborted { rank, reason }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned());
    match text {
        Some(t) => format!("panicked: {t}"),
        None => "panicked".into(),
    }
}
