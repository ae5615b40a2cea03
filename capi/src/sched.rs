//! The slack-aware scheduler in the runtime's job path (ABI 1.6).
//!
//! Every runtime (opened in process, or connected to tuttid) installs a [`SchedGate`] in its
//! object store: every layer of every load and store job asks it before it goes to the drives
//! (`tutti_objstore::gate`). The gate is a `tutti_scheduler::Arbiter`: per-drive arbitration
//! (never reads and writes in flight on one drive, reads first) from the start, and, once
//! configured with a slack table (`tutti_sched_configure`, mode `TUTTI_SCHED_SLACK*`), writes
//! only into the compute windows the engine announces with the `tutti_sched_*` timing hooks,
//! the rest deferred to decode steps. A runtime whose engine gives no timings runs with the slack
//! policy off and says so (`tutti_sched_stats_t::policy_off`, and a `tracing` event).
//!
//! Across processes: a runtime connected to tuttid (`tutti_runtime_connect`) takes a slot on the
//! daemon's arbitration board (`tutti_daemon::arbitration`), so the per-drive arbitration holds
//! across every engine process of that daemon (vLLM's tensor-parallel workers are separate
//! clients): the arbiter announces its per-drive counts there, and a layer its own policy lets go
//! starts only when no other client has the other direction in flight on its drives (nor, for a
//! write, a read ready); otherwise it waits (`tutti_sched_stats_t::xproc_waits`) and is asked
//! again on the job's next advance (every `tutti_job_poll`/`wait` pass: the wait loop backs off
//! to 20 µs sleeps, so a layer starts at most about that long after the other process's I/O
//! finished, plus the time until the engine's next poll if it does not wait). A client that dies
//! has its announcements cleared by the daemon; a client whose row blocks I/O without changing
//! for `tutti_daemon::arbitration::DEFAULT_STALE_AFTER` (a stopped peer, garbage) is waited on
//! once and then skipped, on every drive and in both directions, until its row changes
//! (`xproc_stale_words` counts such marks), and impossible words are ignored at once
//! (`xproc_invalid_words`). `TUTTI_SCHED_PASS` ignores the board (a baseline). A runtime opened
//! in process (`tutti_runtime_open`) owns its drives and has no peers.

use crate::error::{guard, CapiError, Result};
use crate::profiler::now_ns;
use crate::ptr::{self, SizePrefixed};
use crate::runtime::{lock, tutti_runtime_t, Runtime};
use crate::status::TUTTI_OK;
use std::ffi::c_char;
use std::path::Path;
use std::sync::OnceLock;
use std::sync::{Arc, Mutex};
use tutti_daemon::arbitration::SharedArbitration;
use tutti_objstore::{Admit, Direction, GateUnit, IoGate, JobId, StoreAdmission};
use tutti_scheduler::{
    Arbiter, ArbiterConfig, ArbiterStats, BacklogFull, Decision, DriveCounts, IoKind, IoRates, Mode,
    OnlineConfig, PeerVerdict, Peers, PolicyOff, RequestShape, SchedError, SlackTable, Unit,
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

/// `tutti_sched_stats_t::policy_off`: the slack policy is on.
pub const TUTTI_SCHED_POLICY_ON: u32 = 0;
/// Off: the mode does not hold writes for slack.
pub const TUTTI_SCHED_POLICY_OFF_MODE: u32 = 1;
/// Off: the engine gave no layer or decode timings (`tutti_sched_layer_start`, ...).
pub const TUTTI_SCHED_POLICY_OFF_NO_TIMINGS: u32 = 2;
/// Off: the engine gave no timings for `idle_ms` (it is idle).
pub const TUTTI_SCHED_POLICY_OFF_IDLE: u32 = 3;

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

/// What the scheduler did. Set `struct_size = sizeof(tutti_sched_stats_t)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct tutti_sched_stats_t {
    pub struct_size: u32,
    /// `TUTTI_SCHED_*` in force.
    pub mode: u32,
    /// 1 when writes are held for slack right now.
    pub slack_active: u32,
    /// `TUTTI_SCHED_POLICY_*`: why not (0 when on).
    pub policy_off: u32,
    /// Layer units handed to the drives.
    pub reads_issued: u64,
    pub writes_issued: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Times a read was held because its drive had writes in flight.
    pub read_waits: u64,
    /// Times a write was held because its drive had reads in flight or waiting.
    pub write_waits_for_reads: u64,
    /// Times a write was held for lack of slack.
    pub write_waits_for_slack: u64,
    /// Writes started inside a decode step.
    pub writes_in_decode: u64,
    /// Writes started because the engine blocked on them or was idle (slack modes).
    pub writes_urgent_or_idle: u64,
    /// Units started on a drive with the other direction in flight (0 unless `TUTTI_SCHED_PASS`).
    pub mixed_issues: u64,
    /// Bytes of engine memory held by stores not yet written, now and at most.
    pub backlog_bytes: u64,
    pub backlog_peak_bytes: u64,
    pub backlog_capacity: u64,
    /// Stores refused (backpressure) or dropped, and the bytes dropped.
    pub stores_refused: u64,
    pub stores_dropped: u64,
    pub bytes_dropped: u64,
    /// Compute windows the engine announced.
    pub prefill_windows: u64,
    pub decode_windows: u64,
    /// 1 when the runtime arbitrates its drives with the other clients of its tuttid (ABI 1.7).
    pub xproc_active: u64,
    /// Times a layer the local policy let go was held because another process (a client of the
    /// same tuttid) had the other direction in flight, or a read ready, on its drives.
    pub xproc_waits: u64,
    /// Times another client was marked stale: its row on the arbitration board blocked I/O
    /// here unchanged past the stale deadline (a stopped or broken peer). Once per stuck client,
    /// whatever the drives, directions and layers it blocked; it is skipped from then on until
    /// its row changes.
    pub xproc_stale_words: u64,
    /// Impossible words of the board that were ignored (garbage).
    pub xproc_invalid_words: u64,
}

/// Size of `tutti_sched_stats_t` in ABI 1.6 (before the `xproc_*` fields).
const SCHED_STATS_V6: u32 = 16 + 18 * 8;

// SAFETY: repr(C) with `struct_size: u32` first; four u32, then u64s: no padding. 1.7 appended
// the `xproc_*` u64s.
unsafe impl SizePrefixed for tutti_sched_stats_t {
    const NAME: &'static str = "tutti_sched_stats_t";
    const SIZES: &'static [u32] = &[SCHED_STATS_V6, std::mem::size_of::<tutti_sched_stats_t>() as u32];
}

/// The runtime's arbiter, installed as its store's I/O gate.
pub(crate) struct SchedGate {
    arbiter: Mutex<Arbiter>,
    /// The daemon's arbitration board, for a client of tuttid.
    board: OnceLock<Arc<SharedArbitration>>,
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

fn code_of(mode: Mode) -> u32 {
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
fn arbiter_from(c: &tutti_sched_config_t, drives: usize, layers: u32, object_bytes: u64) -> Result<Arbiter> {
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
        Ok(SchedGate { arbiter: Mutex::new(arbiter), board: OnceLock::new() })
    }

    /// Arbitrates with the other clients of a tuttid through its board, from now on.
    pub(crate) fn share(&self, board: Arc<SharedArbitration>) -> Result<()> {
        let drives = self.with(|a| a.config().drives)?;
        if board.drives() != drives {
            return Err(CapiError::Io(format!(
                "the arbitration board covers {} drives, the pool has {drives}",
                board.drives()
            )));
        }
        if self.board.set(board.clone()).is_err() {
            return Err(CapiError::Busy("the runtime arbitrates through a board already".into()));
        }
        self.with(|a| a.set_peers(Some(Arc::new(BoardPeers(board)))))
    }

    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut Arbiter) -> T) -> Result<T> {
        Ok(f(&mut *lock(&self.arbiter, "scheduler")?))
    }
}

impl IoGate for SchedGate {
    fn accept_store(&self, job: JobId, bytes: u64) -> std::result::Result<StoreAdmission, String> {
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
        if let Ok(mut a) = self.arbiter.lock() {
            if let Err(e) = a.complete(job, layer) {
                tracing::debug!(job, layer, error = %e, "completion of a unit the scheduler did not start");
            }
        }
    }

    fn forget(&self, job: JobId) {
        if let Ok(mut a) = self.arbiter.lock() {
            a.forget(job);
        }
    }
}

/// Configures the runtime's scheduler (see `tutti_sched_config_t`). Only while no job of the
/// runtime is unfinished (`TUTTI_E_BUSY` otherwise): the counters start again.
///
/// # Safety
/// `rt` is a runtime handle (checked); `config` points to a `tutti_sched_config_t` with
/// `struct_size` set whose `slack_table` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn tutti_sched_configure(
    rt: *mut tutti_runtime_t,
    config: *const tutti_sched_config_t,
) -> i32 {
    guard("tutti_sched_configure", || {
        let rt = Runtime::get(rt)?;
        // SAFETY: forwarded from the caller.
        let c = unsafe { ptr::sized_in(config)? };
        let drives = rt.store.stripe_map().drive_count() as usize;
        let arbiter = arbiter_from(c, drives, rt.geometry.layers, rt.store.stripe_map().object_bytes())?;
        let jobs = lock(&rt.in_flight, "jobs")?.len();
        if jobs > 0 {
            return Err(CapiError::Busy(format!(
                "{jobs} jobs are unfinished; configure the scheduler when none runs"
            )));
        }
        let mode = arbiter.config().mode;
        let mut arbiter = arbiter;
        rt.sched.with(|a| {
            // The board slot stays with the runtime (no unit in flight: its counts are 0).
            arbiter.set_peers(a.peers().cloned());
            *a = arbiter
        })?;
        tracing::info!(%mode, "scheduler configured");
        Ok(TUTTI_OK)
    })
}

fn hook(rt: *const tutti_runtime_t, f: impl FnOnce(&mut Arbiter, u64) -> Result<()>) -> Result<i32> {
    let rt = Runtime::get(rt)?;
    rt.sched.with(|a| f(a, now_ns()))??;
    // Writes the new window allows start now, even if no one polls their job.
    rt.store.progress()?;
    Ok(TUTTI_OK)
}

fn check_layer(rt: *const tutti_runtime_t, layer: u32) -> Result<()> {
    let layers = Runtime::get(rt)?.geometry.layers;
    if layer >= layers {
        return Err(CapiError::invalid("layer", format!("{layer} but the model has {layers} layers")));
    }
    Ok(())
}

/// The engine starts computing layer `layer` of a prefill of `input_tokens` new tokens over
/// `prefix_tokens` cached ones (vLLM: `wait_for_layer_load`). Opens a window for writes.
///
/// # Safety
/// `rt` is a runtime handle (checked).
#[no_mangle]
pub unsafe extern "C" fn tutti_sched_layer_start(
    rt: *mut tutti_runtime_t,
    input_tokens: u32,
    prefix_tokens: u32,
    layer: u32,
) -> i32 {
    guard("tutti_sched_layer_start", || {
        check_layer(rt, layer)?;
        hook(rt, |a, now| Ok(a.layer_start(RequestShape::new(input_tokens, prefix_tokens), layer, now)?))
    })
}

/// The engine finished computing layer `layer` (vLLM: `save_kv_layer`). Closes the window; its
/// length corrects the slack online (`TUTTI_SCHED_SLACK_ONLINE`).
///
/// # Safety
/// `rt` is a runtime handle (checked).
#[no_mangle]
pub unsafe extern "C" fn tutti_sched_layer_end(rt: *mut tutti_runtime_t, layer: u32) -> i32 {
    guard("tutti_sched_layer_end", || {
        check_layer(rt, layer)?;
        hook(rt, |a, now| Ok(a.layer_end(layer, now)?))
    })
}

/// A decode step over `context_tokens` of KV starts: deferred writes fill its slack.
///
/// # Safety
/// `rt` is a runtime handle (checked).
#[no_mangle]
pub unsafe extern "C" fn tutti_sched_decode_start(rt: *mut tutti_runtime_t, context_tokens: u32) -> i32 {
    guard("tutti_sched_decode_start", || hook(rt, |a, now| Ok(a.decode_start(context_tokens, now)?)))
}

/// The decode step ended.
///
/// # Safety
/// `rt` is a runtime handle (checked).
#[no_mangle]
pub unsafe extern "C" fn tutti_sched_decode_end(rt: *mut tutti_runtime_t) -> i32 {
    guard("tutti_sched_decode_end", || {
        hook(rt, |a, now| {
            a.decode_end(now);
            Ok(())
        })
    })
}

fn fill(out: &mut tutti_sched_stats_t, a: &Arbiter, board: Option<&Arc<SharedArbitration>>, now: u64) {
    let s: ArbiterStats = a.stats();
    let p = a.policy(now);
    out.mode = code_of(p.mode);
    out.slack_active = p.slack_active as u32;
    out.policy_off = match p.off {
        None => TUTTI_SCHED_POLICY_ON,
        Some(PolicyOff::Mode) => TUTTI_SCHED_POLICY_OFF_MODE,
        Some(PolicyOff::NoTimings) => TUTTI_SCHED_POLICY_OFF_NO_TIMINGS,
        Some(PolicyOff::Idle) => TUTTI_SCHED_POLICY_OFF_IDLE,
    };
    out.reads_issued = s.reads_issued;
    out.writes_issued = s.writes_issued;
    out.read_bytes = s.read_bytes;
    out.write_bytes = s.write_bytes;
    out.read_waits = s.read_waits;
    out.write_waits_for_reads = s.write_waits_for_reads;
    out.write_waits_for_slack = s.write_waits_for_slack;
    out.writes_in_decode = s.writes_in_decode;
    out.writes_urgent_or_idle = s.writes_urgent_or_idle;
    out.mixed_issues = s.mixed_issues;
    out.backlog_bytes = s.backlog_bytes;
    out.backlog_peak_bytes = s.backlog_peak_bytes;
    out.backlog_capacity = a.config().backlog_bytes;
    out.stores_refused = s.stores_refused;
    out.stores_dropped = s.stores_dropped;
    out.bytes_dropped = s.bytes_dropped;
    out.prefill_windows = s.prefill_windows;
    out.decode_windows = s.decode_windows;
    out.xproc_waits = s.xproc_waits;
    if let Some(b) = board {
        let bs = b.stats();
        out.xproc_active = u64::from(!b.is_lost());
        out.xproc_stale_words = bs.stale_words;
        out.xproc_invalid_words = bs.invalid_words;
    }
}

/// The scheduler's state and counters. `struct_size` may be the size of ABI 1.6 (without the
/// `xproc_*` fields) or 1.7.
///
/// # Safety
/// `rt` is a runtime handle (checked); `out` points to a `tutti_sched_stats_t` with
/// `struct_size` set.
#[no_mangle]
pub unsafe extern "C" fn tutti_sched_stats(rt: *mut tutti_runtime_t, out: *mut tutti_sched_stats_t) -> i32 {
    guard("tutti_sched_stats", || {
        let rt = Runtime::get(rt)?;
        // SAFETY: forwarded from the caller.
        let mut out = unsafe { ptr::sized_out_prefix(out)? };
        // Reap finished layers first, so the counts are current.
        rt.store.progress()?;
        rt.sched.with(|a| fill(&mut out.val, a, rt.sched.board.get(), now_ns()))?;
        out.commit();
        Ok(TUTTI_OK)
    })
}

/// For tests in and of this crate: the arbitration board of runtime `rt` (a client of tuttid),
/// if it has one. Not part of the C ABI.
#[cfg(feature = "fault-injection")]
#[doc(hidden)]
pub fn sched_board(rt: *mut tutti_runtime_t) -> Result<Option<Arc<SharedArbitration>>> {
    Ok(Runtime::get(rt)?.sched.board.get().cloned())
}

/// For tests in and of this crate: starts (or stops) recording the scheduler's decisions of
/// runtime `rt` and returns what was recorded so far. Not part of the C ABI.
#[cfg(feature = "fault-injection")]
#[doc(hidden)]
pub fn sched_record(rt: *mut tutti_runtime_t, on: bool) -> Result<Vec<tutti_scheduler::Event>> {
    let rt = Runtime::get(rt)?;
    rt.store.progress()?;
    rt.sched.with(|a| a.record(on))
}

pub(crate) fn install(store: &tutti_objstore::KvStore, gate: &Arc<SchedGate>) -> Result<()> {
    store.set_gate(Some(gate.clone() as Arc<dyn IoGate>))?;
    Ok(())
}
