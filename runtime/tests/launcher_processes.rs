//! The multi-process launcher with real processes: this test binary starts copies of itself
//! as ranks (the `worker_entry` test, which does nothing unless `TESSEL_TEST_WORKER` is set),
//! talking over TCP on 127.0.0.1.

mod common;

use common::tiny_model;
use std::time::Duration;
use tessel_grammar::Strategy;
use tessel_runtime::launcher::{
    join, launch_local, run_cpu_worker, Hub, LocalLaunch, LocalReport, RendezvousConfig,
    WorkerConfig, EXIT_ABORTED,
};
use tessel_runtime::{launch_cpu, DataSource, ExecutionPlan, LaunchOptions, TokenWidth};

const STEPS: u64 = 3;

/// `tp×pp×dp`, as the `TESSEL_TEST_PLAN` variable spells it (`2x1x1`).
fn plan(degrees: &str) -> ExecutionPlan {
    let d: Vec<u64> = degrees.split('x').map(|v| v.parse().unwrap()).collect();
    let strategy = Strategy {
        name: "s".into(),
        dp: d[2],
        tp: d[0],
        pp: d[1],
        ..Strategy::default()
    };
    ExecutionPlan::from_strategy(&tiny_model(), &strategy, 4, 8).unwrap()
}

/// One rank, when started by a test below; a no-op otherwise.
#[test]
fn worker_entry() {
    if std::env::var("TESSEL_TEST_WORKER").is_err() {
        return;
    }
    let config = WorkerConfig::from_process_env().unwrap();
    let rank = config.env.rank.to_string();
    if std::env::var("TESSEL_TEST_ABSENT_RANK").ok() == Some(rank.clone()) {
        // Never joins; the launcher has to kill it.
        std::thread::sleep(Duration::from_secs(120));
    }
    let mut options = LaunchOptions::new(STEPS);
    if std::env::var("TESSEL_TEST_CRASH_RANK").ok() == Some(rank.clone()) {
        // Dies mid-run without a word (as a crash would), while all ranks train a long run.
        options.steps = 100_000;
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(500));
            eprintln!("crashing now");
            std::process::exit(9);
        });
    } else if std::env::var("TESSEL_TEST_CRASH_RANK").is_ok() {
        options.steps = 100_000;
    }
    if std::env::var("TESSEL_TEST_FAIL_RANK").ok() == Some(rank) {
        // Joins, then fails reading its data: the others are already waiting in collectives.
        options.data = DataSource::TokenFile {
            path: "/nonexistent/tokens.bin".into(),
            width: TokenWidth::U16,
        };
    }
    let plan = plan(&std::env::var("TESSEL_TEST_PLAN").unwrap());
    match run_cpu_worker(&tiny_model(), &plan, &options, &config) {
        Ok(output) => {
            let losses: Vec<String> = output.losses.iter().map(|l| format!("{l:?}")).collect();
            // On its own line: libtest has printed `test worker_entry ... ` without a newline.
            println!("\nlosses {}", losses.join(" "));
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(e.exit_code());
        }
    }
}

fn launch(nproc: usize, degrees: &str, extra: &[(&str, &str)], timeout_s: u64) -> LocalReport {
    let mut spec = LocalLaunch::new(std::env::current_exe().unwrap(), nproc);
    spec.args = ["--exact", "worker_entry", "--nocapture", "--test-threads=1"]
        .map(Into::into)
        .to_vec();
    spec.rendezvous_timeout = Duration::from_secs(timeout_s);
    spec.grace = Duration::from_secs(2);
    spec.envs = [("TESSEL_TEST_WORKER", "1"), ("TESSEL_TEST_PLAN", degrees)]
        .iter()
        .chain(extra)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let report = launch_local(&spec).unwrap();
    for r in &report.ranks {
        assert!(
            !std::path::Path::new(&format!("/proc/{}", r.pid)).exists(),
            "rank {} (pid {}) was left behind",
            r.rank,
            r.pid
        );
    }
    report
}

fn losses_of(report: &LocalReport, rank: usize) -> Vec<f64> {
    let line = report.ranks[rank]
        .stdout
        .iter()
        .find_map(|l| l.strip_prefix("losses "))
        .unwrap_or_else(|| panic!("rank {rank} printed no losses: {report:?}"));
    line.split(' ').map(|v| v.parse().unwrap()).collect()
}

#[test]
fn processes_train_exactly_like_threads() {
    for (nproc, degrees) in [(2, "2x1x1"), (4, "1x2x2")] {
        let report = launch(nproc, degrees, &[], 30);
        assert_eq!(report.failed, None, "{:?}", report.failure_message());
        let threaded = launch_cpu(&tiny_model(), &plan(degrees), &LaunchOptions::new(STEPS))
            .unwrap()
            .losses;
        assert_eq!(threaded.len(), STEPS as usize);
        for rank in 0..nproc {
            assert_eq!(losses_of(&report, rank), threaded, "{degrees}, rank {rank}");
        }
    }
}

#[test]
fn a_failing_rank_stops_every_rank_and_is_named() {
    let report = launch(2, "2x1x1", &[("TESSEL_TEST_FAIL_RANK", "1")], 30);
    let message = report.failure_message().unwrap();
    assert_eq!(report.failed, Some(1), "{message}");
    assert!(
        message.starts_with("rank 1 failed: exit status 1"),
        "{message}"
    );
    assert!(message.contains("/nonexistent/tokens.bin"), "{message}");
    // Rank 0 stopped on its own, told by the hub, well before the launcher's kill.
    let rank0 = &report.ranks[0];
    assert_eq!(rank0.status, format!("exit status {EXIT_ABORTED}"));
    assert!(
        rank0
            .last_stderr
            .as_deref()
            .unwrap()
            .contains("stopped because rank 1 failed"),
        "{rank0:?}"
    );
    assert!(
        report.elapsed < Duration::from_secs(20),
        "{:?}",
        report.elapsed
    );
}

#[test]
fn a_crashing_rank_stops_every_rank_and_is_named() {
    let report = launch(2, "2x1x1", &[("TESSEL_TEST_CRASH_RANK", "1")], 30);
    let message = report.failure_message().unwrap();
    assert_eq!(report.failed, Some(1), "{message}");
    assert_eq!(
        message,
        "rank 1 failed: exit status 9; last stderr line: crashing now"
    );
    let rank0 = &report.ranks[0];
    assert_eq!(
        rank0.status,
        format!("exit status {EXIT_ABORTED}"),
        "{rank0:?}"
    );
    assert!(
        rank0
            .last_stderr
            .as_deref()
            .unwrap()
            .contains("stopped because rank 1 failed: lost its connection"),
        "{rank0:?}"
    );
    assert!(
        report.elapsed < Duration::from_secs(20),
        "{:?}",
        report.elapsed
    );
}

#[test]
fn a_rank_that_never_joins_times_out_and_is_killed() {
    let report = launch(2, "2x1x1", &[("TESSEL_TEST_ABSENT_RANK", "1")], 2);
    let message = report.failure_message().unwrap();
    assert_eq!(report.failed, Some(0), "{message}");
    assert!(message.contains("timed out after 2.0 s"), "{message}");
    assert!(message.contains("rank 1 to join"), "{message}");
    assert_eq!(report.ranks[1].status, "killed by the launcher");
    assert!(
        report.elapsed < Duration::from_secs(20),
        "{:?}",
        report.elapsed
    );
}

#[test]
fn a_wrong_token_is_rejected() {
    let config = RendezvousConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        world_size: 1,
        token: "right".into(),
        timeout: Duration::from_secs(10),
    };
    let hub = Hub::bind(config.clone(), vec![7, 8]).unwrap();
    let addr = hub.local_addr();
    let served = std::thread::spawn(move || hub.serve());
    let wrong = RendezvousConfig {
        addr,
        token: "wrong".into(),
        ..config.clone()
    };
    let err = join(&wrong, 0).unwrap_err().to_string();
    assert!(
        err.contains("rejected rank 0: wrong rendezvous token"),
        "{err}"
    );
    let right = RendezvousConfig { addr, ..config };
    let (stream, payload) = join(&right, 0).unwrap();
    assert_eq!(payload, vec![7, 8]);
    let link = tessel_runtime::launcher::comm::HubLink::start(0, stream).unwrap();
    link.finish().unwrap();
    assert_eq!(served.join().unwrap(), Ok(None));
}

#[test]
fn joining_without_rank_zero_times_out() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let config = RendezvousConfig {
        addr: port,
        world_size: 2,
        token: "t".into(),
        timeout: Duration::from_millis(500),
    };
    let err = join(&config, 1).unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "rank 1 could not reach rank 0 at {port} within 0.5 s"
        )),
        "{err}"
    );
}
