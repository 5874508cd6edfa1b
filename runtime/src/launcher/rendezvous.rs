//! The TCP rendezvous and the hub behind it. Rank 0 listens; every rank (rank 0 included, over
//! loopback) connects with retries and presents the shared token; once all have joined, rank 0
//! hands each the same payload (the NCCL unique id on CUDA). On the CPU backend the hub then
//! relays the collectives: it collects each group round's deposits and returns them to every
//! member, and forwards point-to-point messages. When a rank fails, disconnects or falls
//! silent, the hub tells every rank to abort.

use super::wire::{read_message, write_message, GroupKey, Message, WireTensor};
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// How often each rank tells the hub it is alive.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(500);
/// A rank silent for this long is taken for dead.
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(50);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RendezvousConfig {
    pub addr: SocketAddr,
    pub world_size: usize,
    pub token: String,
    /// How long rank 0 waits for every rank, and each rank for rank 0.
    pub timeout: Duration,
}

/// The rendezvous failed; the message says why and which ranks are concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RendezvousError(pub String);

impl std::fmt::Display for RendezvousError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rendezvous: {}", self.0)
    }
}

impl std::error::Error for RendezvousError {}

/// Rank 0's listening socket, bound before any rank (its own included) tries to connect.
pub struct Hub {
    listener: TcpListener,
    config: RendezvousConfig,
    payload: Vec<u8>,
}

enum Event {
    Message(usize, Message),
    Closed(usize, String),
}

impl Hub {
    pub fn bind(config: RendezvousConfig, payload: Vec<u8>) -> Result<Hub, RendezvousError> {
        let listener = TcpListener::bind(config.addr).map_err(|e| {
            RendezvousError(format!("rank 0 cannot listen on {}: {e}", config.addr))
        })?;
        Ok(Hub {
            listener,
            config,
            payload,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Runs the rendezvous and then serves the ranks until all are done or one fails. Returns
    /// the failure it broadcast, if any.
    pub fn serve(self) -> Result<Option<(u64, String)>, RendezvousError> {
        let streams = self.accept_all()?;
        for s in &streams {
            let mut w = s;
            // A rank that cannot receive its welcome will fail its own rendezvous.
            let _ = write_message(
                &mut w,
                &Message::Welcome {
                    payload: self.payload.clone(),
                },
            );
        }
        Ok(serve_ranks(streams))
    }

    fn accept_all(&self) -> Result<Vec<TcpStream>, RendezvousError> {
        let n = self.config.world_size;
        let deadline = Instant::now() + self.config.timeout;
        let mut joined: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
        self.listener
            .set_nonblocking(true)
            .map_err(|e| RendezvousError(format!("rank 0 cannot poll its socket: {e}")))?;
        while joined.iter().any(Option::is_none) {
            if Instant::now() >= deadline {
                let missing: Vec<String> = (0..n)
                    .filter(|&r| joined[r].is_none())
                    .map(|r| r.to_string())
                    .collect();
                let reason = format!(
                    "timed out after {:.1} s waiting for rank{} {} to join {}",
                    self.config.timeout.as_secs_f64(),
                    if missing.len() == 1 { "" } else { "s" },
                    missing.join(", "),
                    self.config.addr
                );
                for mut s in joined.iter().flatten() {
                    let _ = write_message(
                        &mut s,
                        &Message::Reject {
                            reason: reason.clone(),
                        },
                    );
                }
                return Err(RendezvousError(reason));
            }
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if let Some((rank, stream)) = self.admit(stream, deadline) {
                        if joined[rank].is_some() {
                            let mut s = &stream;
                            let _ = write_message(
                                &mut s,
                                &Message::Reject {
                                    reason: format!("rank {rank} has already joined"),
                                },
                            );
                        } else {
                            joined[rank] = Some(stream);
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => thread::sleep(POLL / 5),
                Err(e) => return Err(RendezvousError(format!("rank 0 cannot accept: {e}"))),
            }
        }
        Ok(joined.into_iter().map(|s| s.expect("all joined")).collect())
    }

    /// Reads a connection's hello; rejects a wrong token or rank (and keeps waiting for the
    /// right ranks).
    fn admit(&self, stream: TcpStream, deadline: Instant) -> Option<(usize, TcpStream)> {
        stream.set_nonblocking(false).ok()?;
        let wait = deadline.saturating_duration_since(Instant::now()).max(POLL);
        stream.set_read_timeout(Some(wait)).ok()?;
        let mut r = &stream;
        let hello = read_message(&mut r).ok()?;
        let reject = |reason: String| {
            let mut w = &stream;
            let _ = write_message(&mut w, &Message::Reject { reason });
            None
        };
        match hello {
            Message::Hello { token, .. } if token != self.config.token => {
                reject("wrong rendezvous token".into())
            }
            Message::Hello { rank, .. } if rank as usize >= self.config.world_size => {
                reject(format!(
                    "rank {rank} is outside a world of {}",
                    self.config.world_size
                ))
            }
            Message::Hello { rank, .. } => {
                stream.set_read_timeout(None).ok()?;
                Some((rank as usize, stream))
            }
            _ => reject("expected a hello".into()),
        }
    }
}

/// Serves joined ranks: relays exchanges and messages, watches heartbeats, broadcasts aborts.
fn serve_ranks(streams: Vec<TcpStream>) -> Option<(u64, String)> {
    let (tx, rx) = mpsc::channel();
    for (rank, s) in streams.iter().enumerate() {
        let tx = tx.clone();
        let mut reader = s.try_clone().ok()?;
        thread::spawn(move || loop {
            match read_message(&mut reader) {
                Ok(m) => {
                    let done = m == Message::Done;
                    if tx.send(Event::Message(rank, m)).is_err() || done {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Event::Closed(rank, e.to_string()));
                    return;
                }
            }
        });
    }
    drop(tx);
    let n = streams.len();
    let mut last_seen = vec![Instant::now(); n];
    let mut done = vec![false; n];
    let mut rounds: HashMap<GroupKey, BTreeMap<u64, Vec<WireTensor>>> = HashMap::new();
    let send = |rank: usize, m: &Message| {
        let mut w = &streams[rank];
        let _ = write_message(&mut w, m);
    };
    let abort = |rank: u64, reason: String| {
        for r in 0..n {
            send(
                r,
                &Message::Abort {
                    rank,
                    reason: reason.clone(),
                },
            );
        }
        Some((rank, reason))
    };
    while done.iter().any(|d| !d) {
        let event = match rx.recv_timeout(POLL) {
            Ok(e) => e,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if let Some(r) =
                    (0..n).find(|&r| !done[r] && last_seen[r].elapsed() > HEARTBEAT_TIMEOUT)
                {
                    return abort(
                        r as u64,
                        format!("no heartbeat for {} s", HEARTBEAT_TIMEOUT.as_secs()),
                    );
                }
                continue;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return None,
        };
        match event {
            Event::Closed(rank, why) => {
                if !done[rank] {
                    return abort(rank as u64, format!("lost its connection ({why})"));
                }
            }
            Event::Message(rank, m) => {
                last_seen[rank] = Instant::now();
                match m {
                    Message::Heartbeat => {}
                    Message::Done => done[rank] = true,
                    Message::Fail { reason } => return abort(rank as u64, reason),
                    Message::Exchange { key, index, parts } => {
                        let size = key.1.len();
                        let round = rounds.entry(key.clone()).or_default();
                        round.insert(index, parts);
                        if round.len() == size {
                            let deposits: Vec<Vec<WireTensor>> =
                                std::mem::take(round).into_values().collect();
                            let reply = Message::ExchangeDone {
                                key: key.clone(),
                                deposits,
                            };
                            for &member in &key.1 {
                                send(member as usize, &reply);
                            }
                        }
                    }
                    Message::Send { to, tag, tensor } if (to as usize) < n => send(
                        to as usize,
                        &Message::Deliver {
                            from: rank as u64,
                            tag,
                            tensor,
                        },
                    ),
                    other => {
                        return abort(rank as u64, format!("sent an unexpected message {other:?}"))
                    }
                }
            }
        }
    }
    None
}

/// Connects to rank 0 with retries until the timeout, presents the token and waits for the
/// welcome. Returns the connection and the payload.
pub fn join(config: &RendezvousConfig, rank: u64) -> Result<(TcpStream, Vec<u8>), RendezvousError> {
    let deadline = Instant::now() + config.timeout;
    let stream = loop {
        match TcpStream::connect_timeout(&config.addr, POLL.max(Duration::from_millis(200))) {
            Ok(s) => break s,
            Err(e) => {
                if Instant::now() >= deadline {
                    return Err(RendezvousError(format!(
                        "rank {rank} could not reach rank 0 at {} within {:.1} s: {e}",
                        config.addr,
                        config.timeout.as_secs_f64()
                    )));
                }
                thread::sleep(POLL * 2);
            }
        }
    };
    let _ = stream.set_nodelay(true);
    let mut w = &stream;
    write_message(
        &mut w,
        &Message::Hello {
            rank,
            token: config.token.clone(),
        },
    )
    .map_err(|e| RendezvousError(format!("rank {rank} cannot greet rank 0: {e}")))?;
    // Rank 0 answers once every rank has joined, or when its own timeout expires.
    let wait = deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(2);
    stream
        .set_read_timeout(Some(wait))
        .map_err(|e| RendezvousError(e.to_string()))?;
    let mut r = &stream;
    match read_message(&mut r) {
        Ok(Message::Welcome { payload }) => {
            stream
                .set_read_timeout(None)
                .map_err(|e| RendezvousError(e.to_string()))?;
            Ok((stream, payload))
        }
        Ok(Message::Reject { reason }) => Err(RendezvousError(format!(
            "rank 0 rejected rank {rank}: {reason}"
        ))),
        Ok(other) => Err(RendezvousError(format!(
            "rank {rank} expected a welcome, got {other:?}"
        ))),
        Err(e) => Err(RendezvousError(format!(
            "rank {rank} got no welcome from rank 0 at {}: {e}",
            config.addr
        ))),
    }
}
