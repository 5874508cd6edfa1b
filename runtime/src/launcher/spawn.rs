//! The local launcher: starts one process per rank on this node with the torchrun-style
//! variables and a shared token, forwards their output, and when one fails makes sure every
//! other stops (they abort through the hub; after a grace period the launcher kills the rest).
//! It reports which rank failed first and why.

use super::env::{TIMEOUT_VAR, TOKEN_VAR};
use super::worker::EXIT_ABORTED;
use std::collections::hash_map::RandomState;
use std::ffi::OsString;
use std::hash::{BuildHasher, Hasher};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

const POLL: Duration = Duration::from_millis(20);

/// What to start and how.
#[derive(Clone, Debug)]
pub struct LocalLaunch {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// Processes to start (one per GPU on CUDA).
    pub nproc: usize,
    /// Rendezvous port on 127.0.0.1; 0 picks a free one.
    pub port: u16,
    pub rendezvous_timeout: Duration,
    /// How long the other ranks get to stop on their own after the first failure.
    pub grace: Duration,
    /// Extra environment for every rank.
    pub envs: Vec<(String, String)>,
    /// Forward each rank's stderr lines (prefixed `[rank k]`) to this process's stderr.
    pub forward_stderr: bool,
}

impl LocalLaunch {
    pub fn new(program: impl Into<PathBuf>, nproc: usize) -> Self {
        LocalLaunch {
            program: program.into(),
            args: Vec::new(),
            nproc,
            port: 0,
            rendezvous_timeout: Duration::from_secs(60),
            grace: Duration::from_secs(5),
            envs: Vec::new(),
            forward_stderr: true,
        }
    }
}

/// How one rank ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankExit {
    pub rank: usize,
    pub pid: u32,
    /// `exit status N`, `killed by signal N`, or `killed by the launcher`.
    pub status: String,
    pub success: bool,
    pub stdout: Vec<String>,
    pub last_stderr: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalReport {
    pub ranks: Vec<RankExit>,
    /// The rank that failed first (one that did not merely stop because another failed).
    pub failed: Option<usize>,
    pub elapsed: Duration,
}

impl LocalReport {
    /// `rank 1 failed: exit status 7; last stderr line: ...`, or `None` when all succeeded.
    pub fn failure_message(&self) -> Option<String> {
        let r = &self.ranks[self.failed?];
        let mut m = format!("rank {} failed: {}", r.rank, r.status);
        if let Some(line) = &r.last_stderr {
            m.push_str(&format!("; last stderr line: {line}"));
        }
        Some(m)
    }
}

/// A token that lets only this job's ranks join its rendezvous (not a secret against local
/// users who can read the processes' environment; it keeps stray or mismatched jobs out).
pub fn fresh_token() -> String {
    let mut h = RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    let a = h.finish();
    let mut h2 = RandomState::new().build_hasher();
    h2.write_u64(a);
    format!("{a:016x}{:016x}", h2.finish())
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

struct Running {
    child: Child,
    exit: Option<(String, bool, Option<i32>)>,
    stdout: JoinHandle<Vec<String>>,
    stderr: JoinHandle<Option<String>>,
}

/// Starts `nproc` ranks and waits for all of them. Errors only when a process cannot be
/// started at all; rank failures are in the report.
pub fn launch_local(spec: &LocalLaunch) -> Result<LocalReport, String> {
    if spec.nproc == 0 {
        return Err("nothing to launch: 0 processes per node".into());
    }
    let start = Instant::now();
    let port = if spec.port == 0 {
        free_port().map_err(|e| format!("cannot find a free port on 127.0.0.1: {e}"))?
    } else {
        spec.port
    };
    let token = fresh_token();
    let stderr_lock = Arc::new(Mutex::new(()));
    let mut group: Option<i32> = None;
    let mut ranks: Vec<Running> = Vec::with_capacity(spec.nproc);
    for rank in 0..spec.nproc {
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", spec.nproc.to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("GROUP_RANK", "0")
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .env(TOKEN_VAR, &token)
            .env(
                TIMEOUT_VAR,
                spec.rendezvous_timeout.as_secs_f64().to_string(),
            )
            .envs(spec.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // All ranks share one new process group, so that one signal reaches every rank
            // and anything they start.
            .process_group(group.unwrap_or(0));
        // SAFETY: prctl is async-signal-safe; it makes the kernel kill the rank if this
        // launcher dies, so no rank outlives it.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                kill_group(group);
                for r in &mut ranks {
                    let _ = r.child.wait();
                }
                return Err(format!(
                    "cannot start rank {rank} ({}): {e}",
                    spec.program.display()
                ));
            }
        };
        group.get_or_insert(child.id() as i32);
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let forward = spec.forward_stderr;
        let lock = stderr_lock.clone();
        ranks.push(Running {
            child,
            exit: None,
            stdout: thread::spawn(move || read_lines(stdout)),
            stderr: thread::spawn(move || {
                let mut last = None;
                for line in read_lines(stderr) {
                    if forward {
                        let _guard = lock.lock().unwrap_or_else(|p| p.into_inner());
                        let _ = writeln!(std::io::stderr(), "[rank {rank}] {line}");
                    }
                    if !line.trim().is_empty() {
                        last = Some(line);
                    }
                }
                last
            }),
        });
    }
    // (rank, when, whether it merely stopped because another rank failed)
    let mut first_failure: Option<(usize, Instant, bool)> = None;
    let mut killed = false;
    while ranks.iter().any(|r| r.exit.is_none()) {
        for (rank, r) in ranks.iter_mut().enumerate() {
            if r.exit.is_some() {
                continue;
            }
            if let Ok(Some(status)) = r.child.try_wait() {
                let (text, ok, code) = describe(status, killed);
                if !ok {
                    let aborted = code == Some(EXIT_ABORTED);
                    match first_failure {
                        None => first_failure = Some((rank, Instant::now(), aborted)),
                        // A rank that failed on its own outranks one that was told to stop.
                        Some((_, since, true)) if !aborted => {
                            first_failure = Some((rank, since, false))
                        }
                        _ => {}
                    }
                }
                r.exit = Some((text, ok, code));
            }
        }
        if let Some((_, since, _)) = first_failure {
            if !killed && since.elapsed() >= spec.grace {
                kill_group(group);
                killed = true;
            }
        }
        thread::sleep(POLL);
    }
    let ranks: Vec<RankExit> = ranks
        .into_iter()
        .enumerate()
        .map(|(rank, r)| {
            let (status, success, _) = r.exit.expect("every rank exited");
            RankExit {
                rank,
                pid: r.child.id(),
                status,
                success,
                stdout: r.stdout.join().unwrap_or_default(),
                last_stderr: r.stderr.join().unwrap_or_default(),
            }
        })
        .collect();
    let failed = first_failure.map(|(rank, _, _)| rank);
    Ok(LocalReport {
        ranks,
        failed,
        elapsed: start.elapsed(),
    })
}

fn read_lines(stream: impl Read) -> Vec<String> {
    BufReader::new(stream)
        .lines()
        .map_while(Result::ok)
        .collect()
}

fn describe(status: ExitStatus, killed: bool) -> (String, bool, Option<i32>) {
    match (status.code(), status.signal()) {
        (Some(c), _) => (format!("exit status {c}"), c == 0, Some(c)),
        (None, Some(libc::SIGKILL)) if killed => ("killed by the launcher".into(), false, None),
        (None, Some(s)) => (format!("killed by signal {s}"), false, None),
        (None, None) => ("ended without a status".into(), false, None),
    }
}

fn kill_group(group: Option<i32>) {
    if let Some(pgid) = group {
        // SAFETY: signals only the process group this launcher created.
        unsafe {
            libc::killpg(pgid, libc::SIGKILL);
        }
    }
}
