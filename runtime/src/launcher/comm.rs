//! A rank's connection to the hub: sends deposits and messages, and a reader thread that files
//! the hub's answers (exchange results, delivered messages, aborts) for the waiting rank.

use super::rendezvous::HEARTBEAT_INTERVAL;
use super::wire::{read_message, write_message, GroupKey, Message, WireTensor};
use crate::error::RuntimeError;
use std::collections::{HashMap, VecDeque};
use std::net::TcpStream;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

const POLL: Duration = Duration::from_millis(20);

#[derive(Default)]
struct Inbox {
    exchanges: HashMap<GroupKey, VecDeque<Vec<Vec<WireTensor>>>>,
    mailboxes: HashMap<(u64, u64), VecDeque<WireTensor>>,
    /// Set when the hub says stop or the connection to it is lost: (rank, reason).
    aborted: Option<(u64, String)>,
    finished: bool,
}

struct Shared {
    inbox: Mutex<Inbox>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One rank's link to the hub.
pub struct HubLink {
    rank: u64,
    writer: Mutex<TcpStream>,
    shared: Arc<Shared>,
}

impl HubLink {
    /// Starts the reader and heartbeat threads on a joined connection.
    pub fn start(rank: u64, stream: TcpStream) -> Result<Arc<HubLink>, RuntimeError> {
        let io_error = |e: std::io::Error| RuntimeError::RankFailed {
            rank: rank as usize,
            reason: format!("connection to rank 0: {e}"),
        };
        let mut reader = stream.try_clone().map_err(io_error)?;
        let shared = Arc::new(Shared {
            inbox: Mutex::new(Inbox::default()),
            changed: Condvar::new(),
        });
        let link = Arc::new(HubLink {
            rank,
            writer: Mutex::new(stream),
            shared: shared.clone(),
        });
        thread::spawn(move || loop {
            let message = read_message(&mut reader);
            let mut inbox = shared.lock();
            match message {
                Ok(Message::ExchangeDone { key, deposits }) => {
                    inbox.exchanges.entry(key).or_default().push_back(deposits)
                }
                Ok(Message::Deliver { from, tag, tensor }) => inbox
                    .mailboxes
                    .entry((from, tag))
                    .or_default()
                    .push_back(tensor),
                Ok(Message::Abort { rank, reason }) => {
                    inbox.aborted.get_or_insert((rank, reason));
                }
                Ok(other) => {
                    inbox
                        .aborted
                        .get_or_insert((0, format!("sent an unexpected message {other:?}")));
                }
                Err(e) => {
                    if !inbox.finished {
                        inbox
                            .aborted
                            .get_or_insert((0, format!("the connection to rank 0 closed ({e})")));
                    }
                    shared.changed.notify_all();
                    return;
                }
            }
            shared.changed.notify_all();
        });
        let weak = Arc::downgrade(&link);
        thread::spawn(move || {
            while let Some(link) = weak.upgrade() {
                if link.shared.lock().finished || link.write(&Message::Heartbeat).is_err() {
                    return;
                }
                drop(link);
                thread::sleep(HEARTBEAT_INTERVAL);
            }
        });
        Ok(link)
    }

    pub fn rank(&self) -> u64 {
        self.rank
    }

    fn send(&self, m: &Message) -> Result<(), RuntimeError> {
        self.check()?;
        self.write(m)
    }

    /// Writes one frame; the lock keeps frames of different threads whole.
    fn write(&self, m: &Message) -> Result<(), RuntimeError> {
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        write_message(&mut *w, m).map_err(|e| RuntimeError::RankFailed {
            rank: self.rank as usize,
            reason: format!("cannot reach rank 0: {e}"),
        })
    }

    /// The failure that stopped the run, if any.
    pub fn abort_reason(&self) -> Option<(u64, String)> {
        self.shared.lock().aborted.clone()
    }

    fn check(&self) -> Result<(), RuntimeError> {
        if self.shared.lock().aborted.is_some() {
            return Err(RuntimeError::Aborted);
        }
        Ok(())
    }

    /// Deposits `parts` as member `index` of the group `key` and returns every member's
    /// deposit, in member order.
    pub fn exchange(
        &self,
        key: &GroupKey,
        index: usize,
        parts: Vec<WireTensor>,
    ) -> Result<Vec<Vec<WireTensor>>, RuntimeError> {
        self.send(&Message::Exchange {
            key: key.clone(),
            index: index as u64,
            parts,
        })?;
        self.wait(|inbox| inbox.exchanges.get_mut(key).and_then(VecDeque::pop_front))
    }

    pub fn send_to(&self, to: u64, tag: u64, tensor: WireTensor) -> Result<(), RuntimeError> {
        self.send(&Message::Send { to, tag, tensor })
    }

    pub fn recv_from(&self, from: u64, tag: u64) -> Result<WireTensor, RuntimeError> {
        self.wait(|inbox| {
            inbox
                .mailboxes
                .get_mut(&(from, tag))
                .and_then(VecDeque::pop_front)
        })
    }

    fn wait<T>(&self, mut take: impl FnMut(&mut Inbox) -> Option<T>) -> Result<T, RuntimeError> {
        let mut inbox = self.shared.lock();
        loop {
            if let Some(v) = take(&mut inbox) {
                return Ok(v);
            }
            if inbox.aborted.is_some() {
                return Err(RuntimeError::Aborted);
            }
            inbox = self
                .shared
                .changed
                .wait_timeout(inbox, POLL)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Tells the hub this rank failed, so that it stops every other rank.
    pub fn fail(&self, reason: &str) {
        let _ = self.write(&Message::Fail {
            reason: reason.to_string(),
        });
    }

    /// Tells the hub this rank finished cleanly.
    pub fn finish(&self) -> Result<(), RuntimeError> {
        self.check()?;
        // Marked first: the hub may close the connection as soon as it reads the `Done`.
        self.shared.lock().finished = true;
        self.write(&Message::Done)
    }
}
