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

use crate::clock::now_ns;
use crate::error::{guard, lock, CapiError, Result};
use crate::ptr::{self, SizePrefixed};
use crate::runtime::{tutti_runtime_t, Runtime};
use crate::sched_gate::{arbiter_from, code_of, tutti_sched_config_t};
use crate::status::TUTTI_OK;
use std::sync::Arc;
use tutti_daemon::arbitration::SharedArbitration;
use tutti_scheduler::{Arbiter, ArbiterStats, PolicyOff, RequestShape};

/// `tutti_sched_stats_t::policy_off`: the slack policy is on.
pub const TUTTI_SCHED_POLICY_ON: u32 = 0;
/// Off: the mode does not hold writes for slack.
pub const TUTTI_SCHED_POLICY_OFF_MODE: u32 = 1;
/// Off: the engine gave no layer or decode timings (`tutti_sched_layer_start`, ...).
pub const TUTTI_SCHED_POLICY_OFF_NO_TIMINGS: u32 = 2;
/// Off: the engine gave no timings for `idle_ms` (it is idle).
pub const TUTTI_SCHED_POLICY_OFF_IDLE: u32 = 3;

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
        let store = rt.current().store;
        let drives = store.stripe_map().drive_count() as usize;
        let arbiter = arbiter_from(c, drives, rt.geometry.layers, store.stripe_map().object_bytes())?;
        let jobs = lock(&rt.in_flight, "jobs")?.len();
        if jobs > 0 {
            return Err(CapiError::Busy(format!(
                "{jobs} jobs are unfinished; configure the scheduler when none runs"
            )));
        }
        let mode = arbiter.config().mode;
        rt.sched.replace(arbiter)?;
        tracing::info!(%mode, "scheduler configured");
        Ok(TUTTI_OK)
    })
}

fn hook(rt: *const tutti_runtime_t, f: impl FnOnce(&mut Arbiter, u64) -> Result<()>) -> Result<i32> {
    let rt = Runtime::get(rt)?;
    rt.sched.with(|a| f(a, now_ns()))??;
    // Writes the new window allows start now, even if no one polls their job.
    rt.current().store.progress()?;
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
    // The counters both structs name alike.
    macro_rules! copy {
        ($($f:ident),+) => { $(out.$f = s.$f;)+ };
    }
    copy!(reads_issued, writes_issued, read_bytes, write_bytes, read_waits, write_waits_for_reads);
    copy!(write_waits_for_slack, writes_in_decode, writes_urgent_or_idle, mixed_issues, backlog_bytes);
    copy!(backlog_peak_bytes, stores_refused, stores_dropped, bytes_dropped, prefill_windows, decode_windows);
    copy!(xproc_waits);
    out.backlog_capacity = a.config().backlog_bytes;
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
        rt.current().store.progress()?;
        let board = rt.sched.board();
        rt.sched.with(|a| fill(&mut out.val, a, board.as_ref(), now_ns()))?;
        out.commit();
        Ok(TUTTI_OK)
    })
}

/// For tests in and of this crate: the arbitration board of runtime `rt` (a client of tuttid),
/// if it has one. Not part of the C ABI.
#[cfg(feature = "fault-injection")]
#[doc(hidden)]
pub fn sched_board(rt: *mut tutti_runtime_t) -> Result<Option<Arc<SharedArbitration>>> {
    Ok(Runtime::get(rt)?.sched.board())
}

/// For tests in and of this crate: starts (or stops) recording the scheduler's decisions of
/// runtime `rt` and returns what was recorded so far. Not part of the C ABI.
#[cfg(feature = "fault-injection")]
#[doc(hidden)]
pub fn sched_record(rt: *mut tutti_runtime_t, on: bool) -> Result<Vec<tutti_scheduler::Event>> {
    let rt = Runtime::get(rt)?;
    rt.current().store.progress()?;
    rt.sched.with(|a| a.record(on))
}
