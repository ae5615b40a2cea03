//! The controller thread: CC/CSTS state machine, queues, completions.
//!
//! One thread per controller polls CC and the doorbells of the queues that
//! exist, fetches submission entries between an SQ's head and its tail
//! doorbell, executes them ([`admin`], [`io`]) and posts completion entries
//! with phase tags. Completions that must wait (fault delays, the cost model)
//! sit in a list ordered by due time while other commands keep flowing; so do
//! commands whose execution a fault deferred, which run when they are due.

mod admin;
mod io;
mod queues;
mod service;

use super::faults::FaultAction;
use super::iommu::DmaView;
use super::media::Media;
use crate::shared::Shared;
use queues::{Cq, Done, Pending, QueueMem, Sq};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_driver::spec::registers::offset;
use tutti_driver::spec::status::StatusCodeType;
use tutti_driver::spec::{Aqa, Cap, Cc, Csts, IoOpcode, ShutdownStatus, Status, SubmissionEntry};
use tutti_driver::transport::wake::WAKE_PARKED;

const ADMIN_QID: u16 = 0;
/// NVMe 1.4.0 (§3.1.2).
const VERSION: u32 = 0x0001_0400;
/// The longest a parked controller waits for a wake before it looks at the
/// doorbells anyway: a doorbell written without [`wake_controller`] (a writer
/// that does not know the wake word) is still served, this much later.
///
/// [`wake_controller`]: tutti_driver::transport::wake::wake_controller
const MAX_PARK: Duration = Duration::from_millis(2);
/// The first parked wait of an idle spell; each next one doubles, to [`MAX_PARK`].
const FIRST_PARK: Duration = Duration::from_micros(50);

/// Puts the registers into their state after a power-on reset.
pub(super) fn reset_registers(shared: &Shared) {
    let c = &shared.cfg;
    let mqes = (c.max_queue_entries.clamp(2, 65536) - 1) as u16;
    let cap = Cap::build(mqes, c.contiguous_queues_required, c.timeout_500ms, c.dstrd, c.mps_min, c.mps_max);
    shared.regs.set64(offset::CAP, cap.0);
    shared.regs.set32(offset::VS, VERSION);
    shared.regs.set32(offset::CC, 0);
    shared.regs.set32(offset::CSTS, 0);
}

/// The controller thread's body; returns when `shared.stop` is set.
pub(super) fn run(shared: Arc<Shared>, media: Media) {
    let mut engine = Engine::new(shared, media);
    let mut idle = Backoff::default();
    while !engine.shared.stop.load(Ordering::Acquire) {
        if engine.step() {
            idle.reset();
            continue;
        }
        if let Some(timeout) = idle.wait(engine.next_due()) {
            if engine.park(timeout) {
                idle.reset();
            }
        }
    }
    if let Err(e) = engine.media.flush() {
        tracing::warn!(device = %engine.shared.cfg.name, error = ?e, "flushing media at exit failed");
    }
}

/// Spin briefly, then yield for [`YIELD_WINDOW`], then park on the register
/// file's wake word for growing times up to [`MAX_PARK`]: a busy controller
/// reacts within microseconds (also to a host that comes back after a short
/// gap: a gio executor's next IOCB, a queue pair's next batch), an idle one
/// sleeps until a doorbell write wakes it, and still looks every [`MAX_PARK`].
#[derive(Default)]
struct Backoff {
    idle: u32,
    /// When the current idle spell's yielding began.
    since: Option<Instant>,
    /// Parked waits in this idle spell.
    parks: u32,
}

/// How long an idle controller keeps yielding the core before it parks.
const YIELD_WINDOW: Duration = Duration::from_micros(50);
/// Idle passes that only spin.
const SPINS: u32 = 64;

impl Backoff {
    fn reset(&mut self) {
        self.idle = 0;
        self.since = None;
        self.parks = 0;
    }
    /// Spins or yields once and returns `None`, or says to park for at most the returned time.
    fn wait(&mut self, next_due: Option<Instant>) -> Option<Duration> {
        self.idle = self.idle.saturating_add(1);
        if self.idle <= SPINS {
            std::hint::spin_loop();
            return None;
        }
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        if now.duration_since(since) < YIELD_WINDOW {
            std::thread::yield_now();
            return None;
        }
        let mut park = FIRST_PARK.saturating_mul(1 << self.parks.min(8)).min(MAX_PARK);
        self.parks = self.parks.saturating_add(1);
        // A completion already due but not postable must not turn this into a spin.
        if let Some(left) = next_due.map(|d| d.saturating_duration_since(now)) {
            if !left.is_zero() {
                park = park.min(left);
            }
        }
        Some(park)
    }
}

/// Adds to a counter only this thread writes (others read it): a load and a
/// store, not a locked read-modify-write per command.
fn bump(counter: &std::sync::atomic::AtomicU64, n: u64) {
    counter.store(counter.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

/// Errors in what the host sent will fail again if retried, so they carry DNR
/// (§4.6.1); transfer, media and abort statuses may succeed on a retry.
fn with_dnr_if_permanent(s: Status) -> Status {
    let retryable = s.sct() == StatusCodeType::MediaDataIntegrity
        || [Status::DATA_TRANSFER_ERROR, Status::INTERNAL_ERROR, Status::ABORTED_SQ_DELETION]
            .contains(&s.with_dnr(false));
    if s.is_success() || retryable {
        s
    } else {
        s.with_dnr(true)
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Disabled,
    Enabling(Instant),
    Running,
    /// CSTS.SHST = complete: no commands until a reset.
    ShutDown,
    /// CSTS.CFS = 1: no commands until a reset.
    Fatal,
}

/// Feature values that Set Features changes and a reset restores.
struct Features {
    /// I/O SQs and CQs the host may create (Number of Queues, §5.21.1.7).
    sq_granted: u16,
    cq_granted: u16,
    write_cache: bool,
    /// An I/O queue was created since the last reset: Number of Queues is fixed from then on.
    queues_created: bool,
}

struct Engine {
    shared: Arc<Shared>,
    media: Media,
    phase: Phase,
    /// CC.EN as last seen.
    enabled: bool,
    rdy: bool,
    cfs: bool,
    shst: ShutdownStatus,
    /// log2 of the memory page size (CC.MPS) chosen at enable.
    page_shift: u32,
    sqs: Vec<Option<Sq>>,
    cqs: Vec<Option<Cq>>,
    /// Ordered by due time.
    pending: Vec<Pending>,
    features: Features,
    /// The cost model's transfer clocks: when the paced channels are next free.
    cost: crate::cost::CostClock,
    /// The configuration has no cost model ([`CostModel::is_free`](crate::CostModel::is_free)).
    cost_free: bool,
    /// The IOMMU as the I/O command being executed sees it: scoped to the
    /// owner of its submission queue's memory.
    dma: DmaView,
    /// The IOMMU as queue memory (SQ fetches, CQ posts) is reached through.
    qmem: DmaView,
    /// The data pieces of the command being executed, reused from command to command.
    pieces: Vec<super::walk::SglPiece>,
}

impl Engine {
    fn new(shared: Arc<Shared>, media: Media) -> Engine {
        let queues = shared.cfg.max_io_queue_pairs as usize + 1;
        let features = Self::default_features(&shared);
        Engine {
            media,
            phase: Phase::Disabled,
            enabled: false,
            rdy: false,
            cfs: false,
            shst: ShutdownStatus::Normal,
            page_shift: 12,
            sqs: (0..queues).map(|_| None).collect(),
            cqs: (0..queues).map(|_| None).collect(),
            pending: Vec::new(),
            features,
            cost: crate::cost::CostClock::new(Instant::now()),
            cost_free: shared.cfg.cost.is_free(),
            dma: DmaView::new(&shared.iommu),
            qmem: DmaView::new(&shared.iommu),
            pieces: Vec::with_capacity(16),
            shared,
        }
    }

    fn default_features(shared: &Shared) -> Features {
        let n = shared.cfg.max_io_queue_pairs;
        Features {
            sq_granted: n,
            cq_granted: n,
            write_cache: shared.cfg.volatile_write_cache,
            queues_created: false,
        }
    }

    fn name(&self) -> &str {
        &self.shared.cfg.name
    }

    fn page_size(&self) -> u64 {
        1 << self.page_shift
    }

    fn dstrd(&self) -> u8 {
        self.shared.cfg.dstrd
    }

    fn write_csts(&self) {
        self.shared.regs.set32(offset::CSTS, Csts::build(self.rdy, self.cfs, self.shst).0);
    }

    /// When something is due that no doorbell will announce: the oldest
    /// held-back completion, or the end of the enabling delay.
    fn next_due(&self) -> Option<Instant> {
        let ready = match self.phase {
            Phase::Enabling(at) => Some(at),
            _ => None,
        };
        match (self.pending.first().map(|p| p.due), ready) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Parks the thread on the register file's wake word for at most
    /// `timeout`, after one more look at the registers with the word set (a
    /// doorbell written before the word was set is seen by that look, one
    /// written after it wakes us). Returns whether that look found work.
    fn park(&mut self, timeout: Duration) -> bool {
        let shared = self.shared.clone();
        let wake = shared.regs.wake();
        wake.store(WAKE_PARKED, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        if shared.stop.load(Ordering::Acquire) || self.step() {
            wake.store(0, Ordering::Relaxed);
            return true;
        }
        bump(&shared.counters.parks, 1);
        tutti_driver::futex::wait(wake, WAKE_PARKED, timeout);
        // A writer that saw the word set swapped it to 0 (and woke us).
        if wake.swap(0, Ordering::Relaxed) != WAKE_PARKED {
            bump(&shared.counters.woken, 1);
        }
        false
    }

    /// One pass over registers and queues; returns whether anything happened.
    fn step(&mut self) -> bool {
        let cc = Cc(self.shared.regs.get32(offset::CC));
        if cc.enabled() != self.enabled {
            self.enabled = cc.enabled();
            if self.enabled {
                self.enable(cc);
            } else {
                self.reset();
            }
            return true;
        }
        if self.phase != Phase::Fatal && self.shared.fatal.load(Ordering::Acquire) {
            self.enter_fatal("fatal status requested by the host");
            return true;
        }
        if self.enabled && cc.shutdown() != 0 && self.shst == ShutdownStatus::Normal {
            self.shutdown();
            return true;
        }
        match self.phase {
            Phase::Enabling(ready_at) if Instant::now() >= ready_at => {
                self.rdy = true;
                self.phase = Phase::Running;
                self.write_csts();
                tracing::debug!(device = %self.name(), "controller ready");
                true
            }
            Phase::Running => self.service(),
            _ => false,
        }
    }

    /// What is wrong with the configuration the host enabled us with, if anything (§7.6.1).
    fn check_enable(&self, cc: Cc) -> Result<(Aqa, u64, u64), String> {
        let cfg = &self.shared.cfg;
        if cc.css() != 0 {
            return Err(format!("CC.CSS = {} selects a command set other than NVM", cc.css()));
        }
        let (min, max) = (12 + cfg.mps_min as u32, 12 + cfg.mps_max as u32);
        if !(min..=max).contains(&cc.page_shift()) {
            return Err(format!(
                "CC.MPS page 2^{} is outside CAP.MPSMIN..MPSMAX (2^{min}..2^{max})",
                cc.page_shift()
            ));
        }
        if cc.iosqes() != 6 || cc.iocqes() != 4 {
            return Err(format!(
                "CC.IOSQES/IOCQES = {}/{} but entries are 2^6/2^4 bytes",
                cc.iosqes(),
                cc.iocqes()
            ));
        }
        let aqa = Aqa(self.shared.regs.get32(offset::AQA));
        let limit = cfg.max_queue_entries;
        for (what, n) in [("ASQS", aqa.sq_entries()), ("ACQS", aqa.cq_entries())] {
            if n < 2 || n > limit {
                return Err(format!("AQA.{what} gives {n} entries; allowed 2..={limit}"));
            }
        }
        let (asq, acq) = (self.shared.regs.get64(offset::ASQ), self.shared.regs.get64(offset::ACQ));
        let mask = (1u64 << cc.page_shift()) - 1;
        if asq & mask != 0 || acq & mask != 0 {
            return Err(format!("ASQ {asq:#x} / ACQ {acq:#x} not aligned to the {}-byte page", mask + 1));
        }
        Ok((aqa, asq, acq))
    }

    /// CC.EN 0 → 1.
    fn enable(&mut self, cc: Cc) {
        if self.shared.fatal.load(Ordering::Acquire) {
            self.enter_fatal("enabled while in fatal status");
            return;
        }
        match self.check_enable(cc) {
            Err(why) => {
                tracing::warn!(device = %self.name(), "refusing CC.EN = 1: {why}; reporting CSTS.CFS");
                self.cfs = true;
                self.phase = Phase::Fatal;
                self.write_csts();
            }
            Ok((aqa, asq, acq)) => {
                self.page_shift = cc.page_shift();
                self.zero_sq_doorbell(ADMIN_QID);
                self.zero_cq_doorbell(ADMIN_QID);
                self.cqs[0] = Some(Cq::new(QueueMem::Contiguous(acq), aqa.cq_entries(), 1));
                self.sqs[0] = Some(Sq::new(QueueMem::Contiguous(asq), aqa.sq_entries(), 0));
                self.phase = Phase::Enabling(Instant::now() + self.shared.cfg.ready_delay);
            }
        }
    }

    /// CC.EN 1 → 0: controller reset (§7.3.2). Queues, pending completions and
    /// feature values are forgotten; CSTS returns to all zeroes.
    fn reset(&mut self) {
        self.sqs.iter_mut().for_each(|q| *q = None);
        self.cqs.iter_mut().for_each(|q| *q = None);
        self.pending.clear();
        self.features = Self::default_features(&self.shared);
        for qid in 0..self.sqs.len() as u16 {
            self.zero_sq_doorbell(qid);
            self.zero_cq_doorbell(qid);
        }
        self.shared.fatal.store(false, Ordering::Release);
        self.rdy = false;
        self.cfs = false;
        self.shst = ShutdownStatus::Normal;
        self.phase = Phase::Disabled;
        self.write_csts();
        tracing::debug!(device = %self.name(), "controller reset");
    }

    /// CSTS.CFS = 1 and stop processing commands until a reset.
    fn enter_fatal(&mut self, why: &str) {
        tracing::warn!(device = %self.name(), "controller fatal status: {why}");
        self.cfs = true;
        self.phase = Phase::Fatal;
        self.write_csts();
    }

    /// CC.SHN written (§7.6.2): finish what is outstanding, flush, report complete.
    fn shutdown(&mut self) {
        self.shst = ShutdownStatus::Occurring;
        self.write_csts();
        if self.phase == Phase::Running {
            self.post_due(true);
        }
        if let Err(e) = self.media.flush() {
            tracing::warn!(device = %self.name(), error = ?e, "flushing media during shutdown failed");
        }
        self.shst = ShutdownStatus::Complete;
        if self.phase != Phase::Fatal {
            self.phase = Phase::ShutDown;
        }
        self.write_csts();
    }

    /// An I/O command of SQ `qid`, its data moved through the IOMMU view of
    /// the SQ's owner: a client's command reaches only that client's memory.
    /// (`crate::LOCAL_OWNER`'s queues are the owner process's own.)
    fn io_command_of(&mut self, qid: u16, sqe: &SubmissionEntry) -> Done {
        // The owner's own queues (in its own memory) reach every region: it
        // moves data for clients that have no queue pair of their own.
        let owner = self.sqs.get(qid as usize).and_then(Option::as_ref).and_then(|sq| sq.owner);
        self.dma.set_scope(owner.filter(|&o| o != crate::LOCAL_OWNER));
        self.io_command(sqe)
    }

    /// Runs one command, applying fault rules; `None` when its completion is to be lost.
    fn execute(&mut self, qid: u16, sqe: &SubmissionEntry) -> Option<Done> {
        let opcode = sqe.opcode();
        let counters = &self.shared.counters;
        let slba = if qid == ADMIN_QID {
            counters.admin_commands.fetch_add(1, Ordering::Relaxed);
            None
        } else {
            bump(&counters.commands, 1);
            matches!(
                IoOpcode::from_raw(opcode),
                Some(IoOpcode::Read | IoOpcode::Write | IoOpcode::WriteZeroes)
            )
            .then(|| sqe.slba())
        };
        let action = self.shared.faults.check(qid, opcode, slba);
        let mut done = match &action {
            Some(FaultAction::Fail(status)) => Done::err(*status),
            Some(FaultAction::DelayExecution(by)) => {
                tracing::debug!(device = %self.name(), qid, cid = sqe.cid(), opcode, ?by, "fault: execution deferred");
                return Some(Done::deferred(Instant::now() + *by, *sqe));
            }
            _ => {
                let mut d =
                    if qid == ADMIN_QID { self.admin_command(sqe) } else { self.io_command_of(qid, sqe) };
                d.status = with_dnr_if_permanent(d.status);
                d
            }
        };
        match action {
            Some(FaultAction::Delay(by)) => done.due = Some(done.due.unwrap_or_else(Instant::now) + by),
            Some(FaultAction::DropCompletion) => {
                self.shared.counters.dropped_completions.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(device = %self.name(), qid, cid = sqe.cid(), opcode, "fault: completion dropped");
                return None;
            }
            _ => {}
        }
        if !done.status.is_success() {
            self.shared.counters.errors.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(device = %self.name(), qid, cid = sqe.cid(), ?sqe, status = %done.status, "command failed");
        }
        Some(done)
    }
}
