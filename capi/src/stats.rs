//! Counters of a runtime: bytes, hits, misses, evictions, failed blocks, queue
//! depths, the host's work on the control path (ABI 1.1), and quarantined
//! files (ABI 1.2).

use crate::error::{guard, lock, Result};
use crate::ptr::{self, SizePrefixed};
use crate::runtime::{add_counters, tutti_runtime_t, Runtime};
use crate::status::TUTTI_OK;
use std::sync::atomic::Ordering;

/// Counters since the runtime opened. Set `struct_size = sizeof(tutti_stats_t)`
/// (136 for a caller built against ABI 1.0, which gets the fields up to
/// `stores_open`; 184 for ABI 1.1, which gets them up to `submit_ns`; 192
/// for ABI 1.2 to 1.9; 224 since ABI 1.11, with the reconnect counters).
///
/// For a client of tuttid that reconnected, the counters of its earlier connections are
/// included (they never go down); the pool's own (`files*`, `evictions`) are the current
/// daemon's, and 0 while it is away.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct tutti_stats_t {
    pub struct_size: u32,
    /// Pool files (one KV block each).
    pub files: u32,
    /// Files holding a stored chunk.
    pub files_valid: u32,
    pub files_free: u32,
    /// Files pinned by a lookup.
    pub files_pinned: u32,
    /// Files with I/O in flight.
    pub files_busy: u32,
    pub bytes_loaded: u64,
    pub bytes_stored: u64,
    pub lookups: u64,
    /// Chunks found by lookups.
    pub lookup_hits: u64,
    /// Chunks looked up and not found.
    pub lookup_misses: u64,
    /// Stored chunks evicted to make room.
    pub evictions: u64,
    pub jobs: u64,
    /// Layers moved by jobs.
    pub layers: u64,
    /// NVMe commands issued by jobs.
    pub commands: u64,
    /// Blocks jobs reported failed, each once per job however often it is
    /// polled: device errors, cancellations, and a load's blocks not stored
    /// under the cache identity. Counted when a poll or wait sees the failure,
    /// or when the job is destroyed.
    pub failed_blocks: u64,
    /// Chunks made durable and visible by commits.
    pub files_committed: u64,
    /// Queue depth: live jobs not yet seen finished.
    pub jobs_in_flight: u64,
    /// Queue depth: the unfinished layers of those jobs.
    pub layers_in_flight: u64,
    /// Store sessions neither committed nor given up.
    pub stores_open: u64,
    /// ABI 1.1: calls the host made into the I/O path (one per submitted
    /// layer, or per filled IOCB, plus issues).
    pub host_calls: u64,
    /// ABI 1.1: commands whose fields the host wrote itself (0 when the executor expands them).
    pub host_built: u64,
    /// ABI 1.1: (file, block) pairs the host read or copied in per-layer
    /// submissions (0 when every job's pairs were registered once).
    pub host_pairs: u64,
    /// ABI 1.1: jobs whose (file, block) pairs were registered with the I/O path once, at their start.
    pub pairs_registered: u64,
    /// ABI 1.1: host CPU (the submitting thread's CPU time) of job setup:
    /// validation, I/O references, pair registration; ns.
    pub setup_ns: u64,
    /// ABI 1.1: host CPU inside the per-layer submissions, ns.
    pub submit_ns: u64,
    /// ABI 1.2: pool files taken out of service because a write into them
    /// ended without a known outcome (it timed out, or its queue or drive
    /// died): the drive may still execute it, so the file is never reused by
    /// this runtime. They count as used, not free, and come back only when the
    /// drives are reset (the pool reopened, e.g. in a new process). On the
    /// gio_uring executors a drive recovery settles the outcome first, so a
    /// file is quarantined only when that recovery failed.
    pub quarantined_files: u64,
    /// ABI 1.11, a client of tuttid: times it reconnected to a daemon that came back (the same
    /// pool), each one back in its state (queues, KV registration, board slot).
    pub reconnects: u64,
    /// ABI 1.11: reconnect attempts, those that failed included (a daemon not there yet, or
    /// one refused: another geometry or pool).
    pub reconnect_attempts: u64,
    /// ABI 1.11: time spent disconnected, from when each outage was first seen to the
    /// reconnect (the current outage included), ns.
    pub disconnected_ns: u64,
    /// ABI 1.11: 1 while the client is disconnected (its daemon gone and not reconnected).
    pub disconnected: u64,
}

// SAFETY: repr(C) with `struct_size: u32` first.
unsafe impl SizePrefixed for tutti_stats_t {
    const NAME: &'static str = "tutti_stats_t";
    const SIZES: &'static [u32] = &[
        std::mem::offset_of!(tutti_stats_t, host_calls) as u32,
        std::mem::offset_of!(tutti_stats_t, quarantined_files) as u32,
        std::mem::offset_of!(tutti_stats_t, reconnects) as u32,
        std::mem::size_of::<tutti_stats_t>() as u32,
    ];
}

fn collect(rt: &Runtime, struct_size: u32) -> Result<tutti_stats_t> {
    // A reconnect is tried first (a client whose daemon is back reports the new one's pool).
    let store = rt.store().unwrap_or_else(|_| rt.current().store);
    let mut s = store.stats();
    if let Ok(r) = rt.retired.lock() {
        add_counters(&mut s, &r);
    }
    let link = rt.link.as_ref().map(|l| l.stats()).unwrap_or_default();
    let (jobs_in_flight, layers_in_flight) = {
        let m = lock(&rt.in_flight, "jobs")?;
        (m.len() as u64, m.values().map(|&l| l as u64).sum())
    };
    Ok(tutti_stats_t {
        struct_size,
        files: s.index.files,
        files_valid: s.index.valid,
        files_free: s.index.free,
        files_pinned: s.index.pinned,
        files_busy: s.index.busy,
        bytes_loaded: s.bytes_loaded,
        bytes_stored: s.bytes_stored,
        lookups: s.lookups,
        lookup_hits: s.lookup_hits,
        lookup_misses: s.lookup_misses,
        evictions: s.index.evictions,
        jobs: s.jobs,
        layers: s.layers,
        commands: s.commands,
        failed_blocks: rt.failed_blocks.load(Ordering::Relaxed),
        files_committed: s.files_committed,
        jobs_in_flight,
        layers_in_flight,
        stores_open: rt.stores_open.load(Ordering::Relaxed),
        host_calls: s.host_calls,
        host_built: s.host_built,
        host_pairs: s.host_pairs,
        pairs_registered: s.pair_lists,
        setup_ns: s.setup_ns,
        submit_ns: s.submit_ns,
        quarantined_files: s.quarantined_files,
        reconnects: link.reconnects,
        reconnect_attempts: link.attempts,
        disconnected_ns: link.disconnected_ns,
        disconnected: link.disconnected as u64,
    })
}

/// Fills `out` with the runtime's counters, as many as its `struct_size` covers.
///
/// # Safety
/// `rt` is a runtime handle (checked); `out` is NULL or points to a
/// `tutti_stats_t` of any ABI-1 minor version with `struct_size` set.
#[no_mangle]
pub unsafe extern "C" fn tutti_runtime_stats(rt: *mut tutti_runtime_t, out: *mut tutti_stats_t) -> i32 {
    guard("tutti_runtime_stats", || {
        let rt = Runtime::get(rt)?;
        // SAFETY: forwarded from the caller.
        let mut out = unsafe { ptr::sized_out_prefix(out)? };
        out.val = collect(&rt, out.val.struct_size)?;
        out.commit();
        Ok(TUTTI_OK)
    })
}
