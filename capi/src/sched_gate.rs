//! The scheduler's gate: the runtime's `tutti_scheduler::Arbiter` installed as its object
//! store's I/O gate, the C configuration (`tutti_sched_config_t`) that builds an arbiter, and the
//! daemon's arbitration board as the arbiter's peers. The C calls that configure, time and read
//! it are in `sched`; this file knows nothing of runtime handles.

use crate::clock::now_ns;
use crate::error::{lock, CapiError, Result};
use crate::ptr::{self, SizePrefixed};
use std::ffi::c_char;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use tutti_daemon::arbitration::SharedArbitration;
use tutti_objstore::report::GateWaits;
use tutti_objstore::{Admit, Direction, GateUnit, IoGate, JobId, StoreAdmission};
use tutti_scheduler::{
    Arbiter, ArbiterConfig, BacklogFull, Decision, DriveCounts, IoKind, IoRates, Mode, OnlineConfig,
    PeerVerdict, Peers, SchedError, SlackTable, Unit,
};

/// Layers go as they are asked for: reads and writes may share a drive (a baseline).
pub const TUTTI_SCHED_PASS: u32 = 1;
/// Per-drive arbitration, reads first; writes are not held for slack (the default).
pub const TUTTI_SCHED_ARBITRATE: u32 = 2;
/// Arbitration, and writes only into the slack of announced compute windows (`slack_table`).
pub const TUTTI_SCHED_SLACK: u32 = 3;
/// As `TUTTI_SCHED_SLACK`, the table's windows corrected online from the observed ones.
pub const TUTTI_SCHED_SLACK_ONLINE: u32 = 4;

/// A store that does not fit the backlog bound is refused with `TUTTI_E_BUSY` (the default).
pub const TUTTI_BACKLOG_BACKPRESSURE: u32 = 1;
/// A store that does not fit is dropped: its job reports every block failed ("dropped"), the
/// blocks are not committed and are later misses; counted in `tutti_sched_stats_t`.
pub const TUTTI_BACKLOG_DROP: u32 = 2;

const DEFAULT_READ_BPS: u64 = 3_000_000_000;
const DEFAULT_WRITE_BPS: u64 = 1_500_000_000;
const DEFAULT_LATENCY_NS: u64 = 20_000;
const DEFAULT_BACKLOG_BYTES: u64 = 1 << 30;
const DEFAULT_IDLE_MS: u32 = 200;
/// Bounds on configured values (a typo must not become a week-long idle timeout).
const MAX_IDLE_MS: u32 = 60_000;

/// The scheduler's settings. Set `struct_size = sizeof(tutti_sched_config_t)`; 0 in a numeric
/// field means its default.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tutti_sched_config_t {
    pub struct_size: u32,
    /// `TUTTI_SCHED_*` (required).
    pub mode: u32,
    /// `TUTTI_BACKLOG_*` (0 = backpressure).
    pub backlog_full: u32,
    /// No timing hook for this long means the engine is idle: deferred writes go (0 = 200 ms).
    pub idle_ms: u32,
    /// Bytes of engine memory that stores not yet written may hold (0 = 1 GiB).
    pub backlog_bytes: u64,
    /// One drive's read bandwidth with no writes, bytes/s (0 = 3 GB/s).
    pub read_bytes_per_sec: u64,
    /// One drive's write bandwidth with no reads, bytes/s (0 = 1.5 GB/s).
    pub write_bytes_per_sec: u64,
    /// Per-command latency, ns (0 = 20 µs).
    pub latency_ns: u64,
    /// Bytes of one IOCB of the slack table's budgets (0 = one KV object of the pool).
    pub iocb_bytes: u64,
    /// Fraction of every window withheld from writes, in [0, 1).
    pub write_guard: f64,
    /// Slack table file (`tutti profile`, `tutti_profile_save_slack_table`); required by the
    /// slack modes, NULL otherwise. Its layer count must be the pool's.
    pub slack_table: *const c_char,
}

impl Default for tutti_sched_config_t {
    fn default() -> Self {
        tutti_sched_config_t {
            struct_size: std::mem::size_of::<tutti_sched_config_t>() as u32,
            mode: TUTTI_SCHED_ARBITRATE,
            backlog_full: 0,
            idle_ms: 0,
            backlog_bytes: 0,
            read_bytes_per_sec: 0,
            write_bytes_per_sec: 0,
            latency_ns: 0,
            iocb_bytes: 0,
            write_guard: 0.0,
            slack_table: std::ptr::null(),
        }
    }
}

// SAFETY: repr(C) with `struct_size: u32` first; four u32, then 8-byte fields: no padding.
unsafe impl SizePrefixed for tutti_sched_config_t {
    const NAME: &'static str = "tutti_sched_config_t";
}

/// The runtime's arbiter, installed as its store's I/O gate.
pub(crate) struct SchedGate {
    arbiter: Mutex<Arbiter>,
    /// The daemon's arbitration board, for a client of tuttid.
    /// A client that reconnected arbitrates through its new daemon's board.
    board: RwLock<Option<Arc<SharedArbitration>>>,
    /// The waits of arbiters that `tutti_sched_configure` replaced, so that
    /// [`IoGate::waits`] never goes down (tuttid adds up its clients' reports).
    retired: Mutex<GateWaits>,
    /// Jobs with ids below this are of connections gone for good (a client that reconnected):
    /// the arbiter dropped them, and they are not let back in (see [`SchedGate::abandon_before`]).
    floor: AtomicU64,
}

/// An arbiter's waits, as reports count them.
fn arbiter_waits(a: &Arbiter) -> GateWaits {
    let s = a.stats();
    GateWaits {
        reads_for_writes: s.read_waits,
        writes_for_reads: s.write_waits_for_reads,
        writes_for_slack: s.write_waits_for_slack,
        cross_process: s.xproc_waits,
        ..GateWaits::default()
    }
}

/// Adds the arbiter waits of `from` to `into` (the board's counts are not the arbiter's).
fn add_waits(into: &mut GateWaits, from: &GateWaits) {
    into.reads_for_writes += from.reads_for_writes;
    into.writes_for_reads += from.writes_for_reads;
    into.writes_for_slack += from.writes_for_slack;
    into.cross_process += from.cross_process;
}

/// The other clients of the daemon, as the arbiter sees them: its counts go to this process's
/// row of the board, and their rows are read before a unit starts.
#[derive(Debug)]
struct BoardPeers(Arc<SharedArbitration>);

impl Peers for BoardPeers {
    fn publish(&self, drive: usize, c: DriveCounts) {
        self.0.publish(drive, c.reads_in_flight, c.writes_in_flight, c.reads_ready);
    }
    fn check(&self, kind: IoKind, drives: &[usize], now_ns: u64) -> PeerVerdict {
        if self.0.clear(kind == IoKind::Write, drives, now_ns) {
            PeerVerdict::Clear
        } else {
            PeerVerdict::Blocked
        }
    }
}

fn mode_of(code: u32) -> Result<Mode> {
    Ok(match code {
        TUTTI_SCHED_PASS => Mode::Pass,
        TUTTI_SCHED_ARBITRATE => Mode::Arbitrate,
        TUTTI_SCHED_SLACK => Mode::Slack,
        TUTTI_SCHED_SLACK_ONLINE => Mode::SlackOnline,
        _ => {
            return Err(CapiError::invalid(
                "mode",
                format!("{code} is not a TUTTI_SCHED_* mode (1 pass, 2 arbitrate, 3 slack, 4 slack-online)"),
            ))
        }
    })
}

pub(crate) fn code_of(mode: Mode) -> u32 {
    match mode {
        Mode::Pass => TUTTI_SCHED_PASS,
        Mode::Arbitrate => TUTTI_SCHED_ARBITRATE,
        Mode::Slack => TUTTI_SCHED_SLACK,
        Mode::SlackOnline => TUTTI_SCHED_SLACK_ONLINE,
    }
}

fn or(v: u64, default: u64) -> u64 {
    if v == 0 {
        default
    } else {
        v
    }
}

/// The arbiter a C config describes, for a pool of `drives` drives, `layers` layers and
/// `object_bytes` objects. Everything is checked before anything changes.
pub(crate) fn arbiter_from(
    c: &tutti_sched_config_t,
    drives: usize,
    layers: u32,
    object_bytes: u64,
) -> Result<Arbiter> {
    let mode = mode_of(c.mode)?;
    let on_full = match c.backlog_full {
        0 | TUTTI_BACKLOG_BACKPRESSURE => BacklogFull::Backpressure,
        TUTTI_BACKLOG_DROP => BacklogFull::Drop,
        v => {
            return Err(CapiError::invalid(
                "backlog_full",
                format!("{v} is not TUTTI_BACKLOG_BACKPRESSURE (1) or TUTTI_BACKLOG_DROP (2)"),
            ))
        }
    };
    let idle_ms = if c.idle_ms == 0 { DEFAULT_IDLE_MS } else { c.idle_ms };
    if idle_ms > MAX_IDLE_MS {
        return Err(CapiError::invalid("idle_ms", format!("{idle_ms} is over {MAX_IDLE_MS}")));
    }
    if !(c.write_guard.is_finite() && (0.0..1.0).contains(&c.write_guard)) {
        return Err(CapiError::invalid("write_guard", format!("{} is not in [0, 1)", c.write_guard)));
    }
    let table = if c.slack_table.is_null() {
        None
    } else {
        // SAFETY: the caller's NUL-terminated path (struct docs).
        let path = unsafe { ptr::str_in(c.slack_table, "slack_table", 4096)? };
        let t = SlackTable::load_unchecked(Path::new(path))?;
        if t.layers() != layers {
            return Err(CapiError::invalid(
                "slack_table",
                format!("{path} is for {} layers, the pool's model has {layers}", t.layers()),
            ));
        }
        Some(t)
    };
    if matches!(mode, Mode::Slack | Mode::SlackOnline) && table.is_none() {
        return Err(CapiError::invalid("slack_table", "NULL, but the slack modes need a slack table"));
    }
    let config = ArbiterConfig {
        mode,
        drives,
        rates: IoRates {
            read_bytes_per_sec: or(c.read_bytes_per_sec, DEFAULT_READ_BPS) as f64,
            write_bytes_per_sec: or(c.write_bytes_per_sec, DEFAULT_WRITE_BPS) as f64,
            command_latency_ns: or(c.latency_ns, DEFAULT_LATENCY_NS),
            iocb_bytes: or(c.iocb_bytes, object_bytes.max(1)),
        },
        backlog_bytes: or(c.backlog_bytes, DEFAULT_BACKLOG_BYTES),
        on_full,
        write_guard: c.write_guard,
        idle_after_ns: u64::from(idle_ms) * 1_000_000,
        online: OnlineConfig::default(),
    };
    Arbiter::new(config, table).map_err(|e| match e {
        SchedError::InvalidConfig(what) => CapiError::invalid("config", what),
        e => e.into(),
    })
}

impl SchedGate {
    /// The default: arbitration only, until the engine configures more.
    pub(crate) fn new(drives: usize, layers: u32, object_bytes: u64) -> Result<SchedGate> {
        let arbiter = arbiter_from(&tutti_sched_config_t::default(), drives, layers, object_bytes)?;
        Ok(SchedGate {
            arbiter: Mutex::new(arbiter),
            board: RwLock::new(None),
            retired: Mutex::default(),
            floor: AtomicU64::new(0),
        })
    }

    /// Arbitrates with the other clients of a tuttid through its board, from now on.
    pub(crate) fn share(&self, board: Arc<SharedArbitration>) -> Result<()> {
        if self.board().is_some() {
            return Err(CapiError::Busy("the runtime arbitrates through a board already".into()));
        }
        self.reshare(board)
    }

    /// As [`share`](Self::share), in place of the board of an earlier connection (a client
    /// that reconnected: the old daemon's board is gone with it). The arbiter publishes its
    /// counts on the new board from its next change on (they are absolute, not increments).
    pub(crate) fn reshare(&self, board: Arc<SharedArbitration>) -> Result<()> {
        let drives = self.with(|a| a.config().drives)?;
        if board.drives() != drives {
            return Err(CapiError::Io(format!(
                "the arbitration board covers {} drives, the pool has {drives}",
                board.drives()
            )));
        }
        *self.board.write().map_err(|_| CapiError::Poisoned("scheduler"))? = Some(board.clone());
        self.with(|a| a.set_peers(Some(Arc::new(BoardPeers(board)))))
    }

    /// The daemon's arbitration board, for a client of tuttid.
    pub(crate) fn board(&self) -> Option<Arc<SharedArbitration>> {
        self.board.read().ok().and_then(|b| b.clone())
    }

    /// Puts `arbiter` in place of the current one (no unit may be in flight: the caller checks
    /// that no job is unfinished). The board slot stays with the runtime, and the old arbiter's
    /// waits are kept, so that [`IoGate::waits`] never goes down.
    pub(crate) fn replace(&self, mut arbiter: Arbiter) -> Result<()> {
        let old = self.with(|a| {
            // No unit in flight: the board slot's counts are 0.
            arbiter.set_peers(a.peers().cloned());
            let old = arbiter_waits(a);
            *a = arbiter;
            old
        })?;
        add_waits(&mut *lock(&self.retired, "scheduler")?, &old);
        Ok(())
    }

    /// The connection of `epoch` is now the runtime's: the jobs of every earlier one are dropped
    /// from the arbiter (their units in flight will never complete: the old daemon took their
    /// queue pairs with it, so they would hold their drives' reads or writes forever), and
    /// their later calls pass the arbiter by (those jobs fail at their dead store).
    pub(crate) fn abandon_before(&self, epoch: u64) -> Result<usize> {
        let bound = epoch_base(epoch);
        self.floor.fetch_max(bound, Ordering::AcqRel);
        self.with(|a| a.abandon_before(bound))
    }

    fn stale(&self, job: JobId) -> bool {
        job < self.floor.load(Ordering::Acquire)
    }

    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut Arbiter) -> T) -> Result<T> {
        Ok(f(&mut *lock(&self.arbiter, "scheduler")?))
    }
}

impl IoGate for SchedGate {
    fn accept_store(&self, job: JobId, bytes: u64) -> std::result::Result<StoreAdmission, String> {
        if self.stale(job) {
            return Err("the tuttid connection this store was made on is gone".into());
        }
        let mut a = self.arbiter.lock().map_err(|_| "the scheduler's lock is poisoned".to_string())?;
        match a.accept_store(bytes) {
            Ok(Some(key)) => {
                a.bind_store(key, job).map_err(|e| e.to_string())?;
                Ok(StoreAdmission::Accepted)
            }
            Ok(None) => Ok(StoreAdmission::Dropped(format!(
                "dropped: the write backlog ({} bytes) was full; the blocks were not stored",
                a.config().backlog_bytes
            ))),
            Err(e) => Err(e.to_string()),
        }
    }

    fn admit(&self, unit: &GateUnit<'_>, urgent: bool) -> Admit {
        if self.stale(unit.job) {
            // Its store's daemon is gone: the unit fails there, holding no drive here.
            return Admit::Go;
        }
        let Ok(mut a) = self.arbiter.lock() else {
            tracing::error!("the scheduler's lock is poisoned; I/O goes unscheduled");
            return Admit::Go;
        };
        let kind = match unit.dir {
            Direction::Load => IoKind::Read,
            Direction::Store => IoKind::Write,
        };
        let u = Unit { job: unit.job, layer: unit.layer, kind, drive_bytes: unit.drive_bytes.to_vec() };
        match a.request(&u, urgent, now_ns()) {
            Ok(Decision::Go) => Admit::Go,
            Ok(Decision::Wait) => Admit::Wait,
            Err(e) => {
                tracing::error!(job = unit.job, layer = unit.layer, error = %e, "scheduler refused a unit; it goes unscheduled");
                Admit::Go
            }
        }
    }

    fn finished(&self, job: JobId, layer: u32) {
        if self.stale(job) {
            return;
        }
        if let Ok(mut a) = self.arbiter.lock() {
            if let Err(e) = a.complete(job, layer) {
                tracing::debug!(job, layer, error = %e, "completion of a unit the scheduler did not start");
            }
        }
    }

    fn forget(&self, job: JobId) {
        if self.stale(job) {
            return;
        }
        if let Ok(mut a) = self.arbiter.lock() {
            a.forget(job);
        }
    }

    fn waits(&self) -> GateWaits {
        let mut w = self.arbiter.lock().map(|a| arbiter_waits(&a)).unwrap_or_default();
        if let Ok(r) = self.retired.lock() {
            add_waits(&mut w, &r);
        }
        if let Some(b) = self.board() {
            let bs = b.stats();
            w.stale_marks = bs.stale_words;
            w.stale_skips = bs.stale_skips;
        }
        w
    }
}

pub(crate) fn install(store: &tutti_objstore::KvStore, gate: &Arc<SchedGate>, epoch: u64) -> Result<()> {
    let gate: Arc<dyn IoGate> = if epoch == 0 {
        gate.clone()
    } else {
        Arc::new(EpochGate { gate: gate.clone(), base: epoch_base(epoch) })
    };
    store.set_gate(Some(gate))?;
    Ok(())
}

/// Where the connection's epoch sits in the job ids the scheduler sees.
const EPOCH_SHIFT: u32 = 48;

/// The first job id the scheduler sees from the connection of `epoch`.
fn epoch_base(epoch: u64) -> u64 {
    epoch << EPOCH_SHIFT
}

/// The runtime's one scheduler as the store of a later connection (a client that reconnected)
/// sees it: that store numbers its jobs from 1 again, so its ids are moved past those of the
/// stores before it, whose jobs may still be finishing.
struct EpochGate {
    gate: Arc<SchedGate>,
    base: u64,
}

impl EpochGate {
    fn id(&self, job: JobId) -> JobId {
        self.base | (job & ((1 << EPOCH_SHIFT) - 1))
    }
}

impl IoGate for EpochGate {
    fn accept_store(&self, job: JobId, bytes: u64) -> std::result::Result<StoreAdmission, String> {
        self.gate.accept_store(self.id(job), bytes)
    }
    fn admit(&self, unit: &GateUnit<'_>, urgent: bool) -> Admit {
        self.gate.admit(&GateUnit { job: self.id(unit.job), ..*unit }, urgent)
    }
    fn finished(&self, job: JobId, layer: u32) {
        self.gate.finished(self.id(job), layer)
    }
    fn forget(&self, job: JobId) {
        self.gate.forget(self.id(job))
    }
    fn waits(&self) -> GateWaits {
        self.gate.waits()
    }
}
