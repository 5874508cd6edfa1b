//! Multi-process runs: where this process sits in the job (`env`), the TCP rendezvous with a
//! shared token and timeout (`rendezvous`), the hub link every rank keeps to rank 0 for
//! heartbeats, aborts and the CPU backend's collectives (`comm`, `tcp_backend`), one rank's
//! whole run (`worker`), and the local launcher that starts and watches one process per rank
//! (`spawn`).

pub mod comm;
pub mod env;
pub mod rendezvous;
pub mod spawn;
pub mod tcp_backend;
pub mod wire;
pub mod worker;

pub use env::{detect, WorldEnv};
pub use rendezvous::{join, Hub, RendezvousConfig, RendezvousError};
pub use spawn::{fresh_token, launch_local, LocalLaunch, LocalReport, RankExit};
pub use worker::{run_cpu_worker, WorkerConfig, WorkerError, EXIT_ABORTED};
