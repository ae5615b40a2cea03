//! `GioUring`: IOCBs, the rings that carry them to an executor and back, and
//! the NVMe queues the executor drives.
//!
//! Lifecycle of an IOCB: [`GioUring::get_iocb`] hands it out (Filling), the
//! caller fills it ([`GioUring::set_ioctxs`], or [`GioUring::submit_layer`]
//! which fills and issues), [`GioUring::issue`] splits it into parts and
//! pushes them to the submission ring (InFlight); the executor posts its index
//! to the completion ring when every IOCTX has finished; [`GioUring::wait_cqe`]
//! or [`GioUring::poll_cqe`] collect the result and return it to the pool.

mod complete;
mod layout;
mod pairs;
mod recover;
mod staging;
mod submit;
mod table_registry;

use crate::drive::{DriveInfo, DriveQueues};
use crate::error::{GioError, Result};
use crate::executor::{ExecBinding, Executor};
use crate::handle::IocbId;
use crate::iocb::IocbResult;
use crate::mem::{ExecMemory, HostMapping};
use crate::shared_ring::RingView;
use layout::Layout;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tutti_kernels::abi::{Control, Iocb, NvmeQueue, QueueGate};

pub use recover::RecoveryReport;
pub use staging::StagingStats;
pub use submit::pairs_per_iocb;
pub use table_registry::TableInfo;

/// Tunables of a [`GioUring`].
#[derive(Clone, Debug)]
pub struct GioOptions {
    /// IOCBs in the pool (1..=4096).
    pub depth: u32,
    /// A submitted command with no completion after this long fails with
    /// `IoStatus::CompletionTimeout` (and its slot is reused).
    pub command_timeout: Duration,
    /// A command that cannot get a submission slot for this long fails with
    /// `IoStatus::SubmitTimeout` and the queue is declared dead. Must exceed
    /// `command_timeout`: slots held by lost commands free up after that.
    pub submit_timeout: Duration,
    /// Longest sleep of an executor poll loop.
    pub max_backoff: Duration,
    /// Sleep of an idle persistent kernel.
    pub idle_sleep: Duration,
    /// Layer tables that can be registered at once (1..=255).
    pub max_tables: u32,
    /// Pair lists that can be registered at once (1..=65536); each costs
    /// 16 bytes of executor memory while unused.
    pub max_pair_lists: u32,
}

impl Default for GioOptions {
    fn default() -> Self {
        GioOptions {
            depth: 64,
            command_timeout: Duration::from_secs(10),
            submit_timeout: Duration::from_secs(25),
            max_backoff: Duration::from_micros(50),
            idle_sleep: Duration::from_micros(200),
            max_tables: 8,
            max_pair_lists: 64,
        }
    }
}

#[derive(Debug)]
pub(crate) enum SlotState {
    Free,
    Filling,
    InFlight,
    Done(Box<IocbResult>),
}

impl SlotState {
    fn name(&self) -> &'static str {
        match self {
            SlotState::Free => "free",
            SlotState::Filling => "being filled",
            SlotState::InFlight => "in flight",
            SlotState::Done(_) => "completed",
        }
    }
}

#[derive(Debug)]
pub(crate) struct Slot {
    gen: u32,
    state: SlotState,
    /// IOCTXs filled in (explicit IOCBs) or to be expanded (layer IOCBs).
    count: u32,
    /// Sequence number of the current issue.
    seq: u32,
    /// Layer table of a layer IOCB.
    table: Option<u8>,
    /// Registered pair list (slot index) a list layer IOCB expands.
    pair_list: Option<u32>,
}

pub(crate) struct Pool {
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Completed, not yet collected.
    done: Vec<u32>,
}

/// Executor-side statistics of one NVMe queue pair.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueStats {
    pub queue: u32,
    pub drive: u32,
    pub qid: u32,
    pub depth: u32,
    /// Commands that took a ticket (submitted or failed to get a slot).
    pub tickets: u64,
    pub completed: u64,
    /// Completions with a non-success NVMe status.
    pub errors: u64,
    /// Commands expired after the command timeout.
    pub expired: u64,
    /// Completions that matched no command in flight (e.g. after expiry).
    pub stale: u64,
    pub sq_doorbells: u64,
    pub cq_doorbells: u64,
    pub dead: bool,
    /// The host holds the queue for recovery (or its recovery failed): the
    /// executor refuses commands for it with `IoStatus::QueueRecovering`.
    pub recovering: bool,
}

/// Executor-wide counters from the shared control block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecutorStats {
    pub parts_done: u64,
    pub iocbs_done: u64,
    /// Completions the executor could not post (the completion ring was full).
    pub lost_posts: u64,
    /// Blocks inside a persistent kernel.
    pub running: u32,
}

/// An io_uring-like pair of rings between the host and an I/O executor.
pub struct GioUring {
    exec: Arc<dyn Executor>,
    opts: GioOptions,
    layout: Layout,
    sq: RingView,
    cq: RingView,
    control: NonNull<Control>,
    /// One `tt_qgate` per queue pair, in shared memory.
    gates: NonNull<QueueGate>,
    iocbs: NonNull<Iocb>,
    pool: Mutex<Pool>,
    tables: Mutex<Vec<Option<table_registry::TableSlot>>>,
    /// Lock order: `pair_lists`, then `pool`.
    pair_lists: Mutex<Vec<pairs::PairListSlot>>,
    seq: AtomicU32,
    drive_info: Vec<DriveInfo>,
    /// Per drive: serving, or failed to recover. Held for the whole of a recovery,
    /// so recoveries run one at a time.
    recovery: Mutex<Vec<recover::DriveHealth>>,
    // Dropped in this order, after `Drop::drop` stopped the executor: mappings
    // of queue memory, then the memory the executor worked in, then the queue
    // pairs (deleted on the controller) themselves. A stop that failed leaks
    // the mappings and the queue pairs instead.
    _maps: Vec<Box<dyn HostMapping>>,
    _shared: Box<dyn ExecMemory>,
    private: Box<dyn ExecMemory>,
    drives: Vec<DriveQueues>,
}

// SAFETY: the raw pointers name shared memory owned by `shared`; it is accessed
// through atomics (rings, status words) or under the pool lock (IOCB contents
// the executor is not using).
unsafe impl Send for GioUring {}
// SAFETY: as above.
unsafe impl Sync for GioUring {}

impl GioUring {
    /// A ring of `depth` IOCBs over `drives`, run by `exec`, with default timeouts.
    pub fn init(depth: u32, drives: Vec<DriveQueues>, exec: Arc<dyn Executor>) -> Result<Self> {
        GioUring::init_with(GioOptions { depth, ..Default::default() }, drives, exec)
    }

    pub fn init_with(opts: GioOptions, drives: Vec<DriveQueues>, exec: Arc<dyn Executor>) -> Result<Self> {
        let ring = layout::build(&opts, drives, exec)?;
        let binding = ExecBinding { ctx: ring.private.exec_at(ring.layout.ctx), control: ring.control };
        ring.exec.start(binding)?;
        tracing::info!(
            executor = ring.exec.name(),
            depth = ring.opts.depth,
            drives = ring.drives.len(),
            queues = ring.layout.queues.len(),
            "gio_uring ready"
        );
        Ok(ring)
    }

    pub fn depth(&self) -> u32 {
        self.opts.depth
    }
    pub fn options(&self) -> &GioOptions {
        &self.opts
    }
    pub fn executor(&self) -> &Arc<dyn Executor> {
        &self.exec
    }
    /// The drives, in the order given to `init` (the `drive` of an IOCTX indexes this).
    pub fn drives(&self) -> &[DriveInfo] {
        &self.drive_info
    }

    /// Counters of every NVMe queue pair, read from executor memory.
    pub fn queue_stats(&self) -> Result<Vec<QueueStats>> {
        self.layout
            .queues
            .iter()
            .enumerate()
            .map(|(i, q)| {
                let s: NvmeQueue = self.private.read_obj(q.desc)?;
                Ok(QueueStats {
                    queue: i as u32,
                    drive: s.drive,
                    qid: s.qid,
                    depth: s.depth,
                    tickets: s.ticket,
                    completed: s.completed,
                    errors: s.errors,
                    expired: s.expired,
                    stale: s.stale,
                    sq_doorbells: s.sq_doorbells,
                    cq_doorbells: s.cq_doorbells,
                    dead: s.dead != 0,
                    recovering: self.gate(i).recovering.load(std::sync::atomic::Ordering::Acquire) != 0,
                })
            })
            .collect()
    }

    pub fn executor_stats(&self) -> ExecutorStats {
        use std::sync::atomic::{AtomicU64, Ordering};
        let c = self.control.as_ptr();
        // SAFETY: the control block lives in `shared`; the executor updates it atomically.
        unsafe {
            ExecutorStats {
                parts_done: AtomicU64::from_ptr(&raw mut (*c).parts_done).load(Ordering::Relaxed),
                iocbs_done: AtomicU64::from_ptr(&raw mut (*c).iocbs_done).load(Ordering::Relaxed),
                lost_posts: AtomicU64::from_ptr(&raw mut (*c).lost_posts).load(Ordering::Relaxed),
                running: AtomicU32::from_ptr(&raw mut (*c).running).load(Ordering::Relaxed),
            }
        }
    }

    fn pool(&self) -> Result<MutexGuard<'_, Pool>> {
        self.pool.lock().map_err(|_| GioError::invalid("IOCB pool lock poisoned by a panic"))
    }

    fn iocb_ptr(&self, index: u32) -> *mut Iocb {
        // SAFETY: callers pass indices < depth; the pool holds `depth` IOCBs.
        unsafe { self.iocbs.as_ptr().add(index as usize) }
    }

    /// The slot of `id` if the handle is current.
    fn slot(pool: &mut Pool, id: IocbId) -> Result<&mut Slot> {
        let stale = || GioError::WrongState { id, state: "stale (reused since)", expected: "current" };
        let slot = pool.slots.get_mut(id.index as usize).ok_or_else(stale)?;
        if slot.gen != id.gen {
            return Err(stale());
        }
        Ok(slot)
    }
}

impl Drop for GioUring {
    fn drop(&mut self) {
        if let Err(e) = self.exec.stop() {
            // Kernels may still read the queues' entries and ring their doorbells: the
            // queue pairs stay open on the controllers and their memory and mappings are
            // leaked (the executor leaks its own memory once poisoned).
            tracing::error!(
                executor = self.exec.name(),
                error = %e,
                queue_pairs = self.drives.iter().map(|d| d.queues.len()).sum::<usize>(),
                "stopping the executor failed: leaking its queue pairs and their memory"
            );
            for d in self.drives.drain(..) {
                std::mem::forget(d);
            }
            for m in self._maps.drain(..) {
                std::mem::forget(m);
            }
        }
    }
}
