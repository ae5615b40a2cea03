//! `GioUring`: IOCBs, the rings that carry them to an executor and back, and
//! the NVMe queues the executor drives.
//!
//! Lifecycle of an IOCB: [`GioUring::get_iocb`] hands it out (Filling), the
//! caller fills it ([`GioUring::set_ioctxs`], or [`GioUring::submit_layer`]
//! which fills and issues), [`GioUring::issue`] splits it into parts and
//! pushes them to the submission ring (InFlight); the executor posts its index
//! to the completion ring when every IOCTX has finished; [`GioUring::wait_cqe`]
//! or [`GioUring::poll_cqe`] collect the result and return it to the pool.
//!
//! The `GioUring` struct and its construction are here; what it holds is in
//! `options.rs`, `layout.rs` (where everything lives in memory) and `state.rs`
//! (pool, registries, drive health); each sibling file adds the operations of
//! one area (submit, complete, layer tables, pair lists, staging, recovery)
//! on top of those. This file names none of the operation files (only
//! re-exports from them), so no file here imports one that imports it back.

mod complete;
mod layout;
mod options;
mod pairs;
mod recover;
mod staging;
mod state;
mod submit;
mod table_registry;

use crate::drive::{DriveInfo, DriveQueues};
use crate::error::{GioError, Result};
use crate::executor::{ExecBinding, Executor};
use crate::handle::IocbId;
use crate::mem::{ExecMemory, HostMapping, HostRange, MemKind};
use crate::shared_ring::RingView;
use layout::{check, Layout};
use state::{DriveHealth, PairListSlot, Pool, Slot, SlotState, TableSlot};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex, MutexGuard};
use tutti_driver::spec::SglSupport;
use tutti_kernels::abi::{self, Control, DriveDesc, ExecCtx, Iocb, NvmeQueue, QueueGate};

pub use options::GioOptions;
pub use recover::RecoveryReport;
pub use state::{StagingStats, TableInfo};
pub use submit::pairs_per_iocb;

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
    tables: Mutex<Vec<Option<TableSlot>>>,
    /// Lock order: `pair_lists`, then `pool`.
    pair_lists: Mutex<Vec<PairListSlot>>,
    seq: AtomicU32,
    drive_info: Vec<DriveInfo>,
    /// Per drive: serving, or failed to recover. Held for the whole of a recovery,
    /// so recoveries run one at a time.
    recovery: Mutex<Vec<DriveHealth>>,
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
        let ring = build(&opts, drives, exec)?;
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

/// Time in nanoseconds, saturated to u64.
fn ns(d: std::time::Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

/// Allocates the memory `layout.rs` computes for `opts` and `drives`, writes its
/// initial contents, and maps the queue memory for `exec`.
fn build(opts: &GioOptions, drives: Vec<DriveQueues>, exec: Arc<dyn Executor>) -> Result<GioUring> {
    check(opts, &drives)?;
    let layout = Layout::new(opts, &drives);
    let shared = exec.alloc(MemKind::Shared, layout.shared_len)?;
    let private = exec.alloc(MemKind::Private, layout.private_len)?;
    let host = shared.host_ptr().ok_or_else(|| GioError::Executor {
        executor: exec.name().into(),
        what: "shared memory has no host address".into(),
    })?;
    let at = |off: usize| -> Result<NonNull<u8>> {
        // SAFETY: every offset comes from `layout`, inside the `shared_len` bytes allocated.
        NonNull::new(unsafe { host.as_ptr().add(off) }).ok_or_else(|| GioError::invalid("null shared memory"))
    };
    // SAFETY: fresh zeroed memory of the sizes the layout computed, owned by the GioUring.
    let sq = unsafe { RingView::init(at(layout.sq)?, layout.sq_cap)? };
    // SAFETY: as above.
    let cq = unsafe { RingView::init(at(layout.cq)?, layout.cq_cap)? };
    let control = at(layout.control)?.cast::<Control>();
    let iocbs = at(layout.iocbs)?.cast::<Iocb>();
    let gates = at(layout.gates)?.cast::<QueueGate>();
    for i in 0..opts.depth {
        // SAFETY: IOCB `i` lies inside the pool; no executor runs yet.
        unsafe {
            let hdr = &raw mut (*iocbs.as_ptr().add(i as usize)).hdr;
            (*hdr).id = i;
            (*hdr).first_error = abi::NO_ERROR;
        }
    }

    let mut maps = Vec::new();
    let mut drive_info = Vec::new();
    let mut qi = 0usize;
    for (di, d) in drives.iter().enumerate() {
        let first = qi as u32;
        for q in &d.queues {
            let depth = q.depth();
            let ql = &layout.queues[qi];
            let kind = q.doorbell_kind();
            let doorbell = |p: *mut u32| NonNull::new(p).ok_or_else(|| GioError::invalid("null doorbell"));
            // SAFETY: the queue memory and doorbells belong to `q`, which the GioUring owns
            // and drops after these mappings (field order).
            let (sqm, cqm, sdb, cdb) = unsafe {
                (
                    exec.map_host(q.sq_ptr(), depth as usize * 64, HostRange::Memory)?,
                    exec.map_host(q.cq_ptr(), depth as usize * 16, HostRange::Memory)?,
                    exec.map_doorbell(doorbell(q.sq_doorbell_ptr())?, kind)?,
                    exec.map_doorbell(doorbell(q.cq_doorbell_ptr())?, kind)?,
                )
            };
            let wake = match q.sq_doorbell().wake_ptr() {
                // SAFETY: the wake word lives in the same register file as the doorbells
                // (mapped above), which `q` keeps mapped for as long.
                Some(w) => unsafe { exec.map_wake(w)? }.unwrap_or(0),
                None => 0,
            };
            let desc = NvmeQueue {
                sq: sqm.exec_addr(),
                cq: cqm.exec_addr(),
                sq_db: sdb.exec_addr(),
                cq_db: cdb.exec_addr(),
                wake,
                slot_owner: private.exec_at(ql.owner),
                slot_time: private.exec_at(ql.time),
                slot_ready: private.exec_at(ql.ready),
                slot_turn: private.exec_at(ql.turn),
                slot_late: private.exec_at(ql.late),
                depth,
                qid: q.qid() as u32,
                drive: di as u32,
                cid_shift: depth.next_power_of_two().trailing_zeros(),
                gate: shared.exec_at(layout.gates + qi * size_of::<QueueGate>()),
                hole: u64::MAX,
                ..Default::default()
            };
            private.write_obj(ql.desc, &desc)?;
            ql.reset_slots(&*private, depth as usize)?;
            maps.extend([sqm, cqm, sdb, cdb]);
            qi += 1;
        }
        let mut flags = 0;
        match d.sgl {
            SglSupport::None => {}
            SglSupport::Supported => flags |= abi::DRIVE_SGL,
            SglSupport::DwordAligned => flags |= abi::DRIVE_SGL | abi::DRIVE_SGL_DWORD,
        }
        let desc = DriveDesc {
            first_queue: first,
            nqueues: d.queues.len() as u32,
            nsid: d.nsid,
            lba_shift: d.lba_size.trailing_zeros(),
            max_lbas: d.max_lbas(),
            flags,
            rsvd: 0,
        };
        private.write_obj(layout.drives + di * size_of::<DriveDesc>(), &desc)?;
        drive_info.push(DriveInfo {
            name: d.name.clone(),
            nsid: d.nsid,
            lba_size: d.lba_size,
            blocks: d.blocks,
            max_lbas: d.max_lbas(),
            sgl: d.sgl,
            queues: first..qi as u32,
        });
    }

    let ctx = ExecCtx {
        sq_ring: shared.exec_at(layout.sq),
        cq_ring: shared.exec_at(layout.cq),
        control: shared.exec_at(layout.control),
        iocbs: shared.exec_at(layout.iocbs),
        queues: private.exec_at(layout.queues.first().map_or(0, |q| q.desc)),
        drives: private.exec_at(layout.drives),
        tables: private.exec_at(layout.tables),
        niocbs: opts.depth,
        nqueues: layout.queues.len() as u32,
        ndrives: drives.len() as u32,
        ntables: opts.max_tables,
        command_timeout_ns: ns(opts.command_timeout),
        submit_timeout_ns: ns(opts.submit_timeout),
        max_backoff_ns: ns(opts.max_backoff).clamp(32, u32::MAX as u64) as u32,
        idle_sleep_ns: ns(opts.idle_sleep).clamp(256, u32::MAX as u64) as u32,
        pair_lists: private.exec_at(layout.pair_lists),
        npair_lists: opts.max_pair_lists,
        rsvd0: 0,
    };
    private.write_obj(layout.ctx, &ctx)?;

    let slots = (0..opts.depth)
        .map(|_| Slot { gen: 0, state: SlotState::Free, count: 0, seq: 0, table: None, pair_list: None })
        .collect();
    let pool = Pool { slots, free: (0..opts.depth).rev().collect(), done: Vec::new() };
    Ok(GioUring {
        exec,
        opts: opts.clone(),
        layout,
        sq,
        cq,
        control,
        gates,
        iocbs,
        pool: Mutex::new(pool),
        tables: Mutex::new((0..opts.max_tables).map(|_| None).collect()),
        pair_lists: Mutex::new((0..opts.max_pair_lists).map(|_| Default::default()).collect()),
        seq: AtomicU32::new(0),
        drive_info,
        recovery: Mutex::new(vec![DriveHealth::Serving; drives.len()]),
        _maps: maps,
        _shared: shared,
        private,
        drives,
    })
}
