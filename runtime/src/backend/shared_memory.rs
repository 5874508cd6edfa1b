//! Shared-memory communication for ranks that are threads of one process: one exchange per
//! process group (every member deposits, every member reads all deposits) and tagged
//! mailboxes for point-to-point messages. Waits poll an abort flag so that when one rank
//! fails the others stop instead of hanging.

use crate::error::RuntimeError;
use crate::mesh::{GroupKind, Mesh};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::cpu::CpuTensor;

const POLL: Duration = Duration::from_millis(20);

type Deposit = Arc<Vec<CpuTensor>>;

#[derive(Default)]
struct ExchangeState {
    deposits: Vec<Option<Deposit>>,
    arrived: usize,
    read: usize,
    reading: bool,
}

/// One round-based all-to-all exchange among the members of a group.
pub struct Exchange {
    size: usize,
    state: Mutex<ExchangeState>,
    changed: Condvar,
}

impl Exchange {
    fn new(size: usize) -> Self {
        Exchange {
            size,
            state: Mutex::new(ExchangeState {
                deposits: vec![None; size],
                ..Default::default()
            }),
            changed: Condvar::new(),
        }
    }

    /// Deposits `parts` as member `index` and returns every member's deposit, in member order.
    fn exchange(
        &self,
        index: usize,
        parts: Vec<CpuTensor>,
        abort: &AtomicBool,
    ) -> Result<Vec<Deposit>, RuntimeError> {
        let mut s = self.lock();
        while s.reading {
            s = self.wait(s, abort)?;
        }
        s.deposits[index] = Some(Arc::new(parts));
        s.arrived += 1;
        if s.arrived == self.size {
            s.reading = true;
            self.changed.notify_all();
        } else {
            while !s.reading {
                s = self.wait(s, abort)?;
            }
        }
        let all: Vec<Deposit> = s
            .deposits
            .iter()
            .map(|d| d.clone().expect("every member deposited"))
            .collect();
        s.read += 1;
        if s.read == self.size {
            s.deposits.iter_mut().for_each(|d| *d = None);
            s.arrived = 0;
            s.read = 0;
            s.reading = false;
            self.changed.notify_all();
        }
        Ok(all)
    }

    fn lock(&self) -> MutexGuard<'_, ExchangeState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(
        &self,
        guard: MutexGuard<'a, ExchangeState>,
        abort: &AtomicBool,
    ) -> Result<MutexGuard<'a, ExchangeState>, RuntimeError> {
        if abort.load(Ordering::SeqCst) {
            return Err(RuntimeError::Aborted);
        }
        let (g, _) = self
            .changed
            .wait_timeout(guard, POLL)
            .unwrap_or_else(|p| p.into_inner());
        Ok(g)
    }
}

/// Every group and mailbox of one run.
pub struct World {
    pub mesh: Mesh,
    exchanges: BTreeMap<(GroupKind, Vec<u64>), Arc<Exchange>>,
    mailboxes: Mutex<HashMap<(usize, usize, u64), VecDeque<CpuTensor>>>,
    delivered: Condvar,
    abort: AtomicBool,
}

pub const ALL_GROUP_KINDS: [GroupKind; 9] = [
    GroupKind::World,
    GroupKind::Tensor,
    GroupKind::Context,
    GroupKind::Data,
    GroupKind::Pipeline,
    GroupKind::DataContext,
    GroupKind::Expert,
    GroupKind::ExpertData,
    GroupKind::Embedding,
];

impl World {
    pub fn new(mesh: Mesh) -> Arc<Self> {
        let mut exchanges = BTreeMap::new();
        for rank in 0..mesh.world_size() {
            for kind in ALL_GROUP_KINDS {
                let members = mesh.group(kind, rank);
                let size = members.len();
                exchanges
                    .entry((kind, members))
                    .or_insert_with(|| Arc::new(Exchange::new(size)));
            }
        }
        Arc::new(World {
            mesh,
            exchanges,
            mailboxes: Mutex::new(HashMap::new()),
            delivered: Condvar::new(),
            abort: AtomicBool::new(false),
        })
    }

    /// Tells every waiting rank to stop.
    pub fn abort(&self) {
        self.abort.store(true, Ordering::SeqCst);
        self.delivered.notify_all();
    }

    pub fn aborted(&self) -> bool {
        self.abort.load(Ordering::SeqCst)
    }

    /// This rank's handle on the group of `kind`.
    pub fn group(&self, kind: GroupKind, rank: u64) -> GroupHandle {
        let members = self.mesh.group(kind, rank);
        let index = members
            .iter()
            .position(|&m| m == rank)
            .expect("member of own group");
        let exchange = self.exchanges[&(kind, members.clone())].clone();
        GroupHandle {
            members,
            index,
            exchange,
        }
    }

    pub fn exchange(
        &self,
        group: &GroupHandle,
        parts: Vec<CpuTensor>,
    ) -> Result<Vec<Deposit>, RuntimeError> {
        group.exchange.exchange(group.index, parts, &self.abort)
    }

    pub fn send(&self, from: usize, to: usize, tag: u64, t: CpuTensor) {
        let mut boxes = self.mailboxes.lock().unwrap_or_else(|p| p.into_inner());
        boxes.entry((from, to, tag)).or_default().push_back(t);
        self.delivered.notify_all();
    }

    pub fn recv(&self, from: usize, to: usize, tag: u64) -> Result<CpuTensor, RuntimeError> {
        let mut boxes = self.mailboxes.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(t) = boxes.get_mut(&(from, to, tag)).and_then(|q| q.pop_front()) {
                return Ok(t);
            }
            if self.aborted() {
                return Err(RuntimeError::Aborted);
            }
            boxes = self
                .delivered
                .wait_timeout(boxes, POLL)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// A rank's view of one group.
#[derive(Clone)]
pub struct GroupHandle {
    pub members: Vec<u64>,
    pub index: usize,
    exchange: Arc<Exchange>,
}
