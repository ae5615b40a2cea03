//! Counters of a runtime: bytes, hits, misses, evictions, queue depths.

use crate::error::{guard, Result};
use crate::ptr::{self, SizePrefixed};
use crate::runtime::{lock, tutti_runtime_t, Runtime};
use crate::status::TUTTI_OK;
use std::sync::atomic::Ordering;

/// Counters since the runtime opened. Set `struct_size = sizeof(tutti_stats_t)`.
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
    /// Block-layers that failed.
    pub failed_blocks: u64,
    /// Chunks made durable and visible by commits.
    pub files_committed: u64,
    /// Queue depth: live jobs not yet seen finished.
    pub jobs_in_flight: u64,
    /// Queue depth: the unfinished layers of those jobs.
    pub layers_in_flight: u64,
    /// Store sessions neither committed nor given up.
    pub stores_open: u64,
}

// SAFETY: repr(C) with `struct_size: u32` first.
unsafe impl SizePrefixed for tutti_stats_t {
    const NAME: &'static str = "tutti_stats_t";
}

fn collect(rt: &Runtime, struct_size: u32) -> Result<tutti_stats_t> {
    let s = rt.store.stats();
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
        failed_blocks: s.failed_blocks,
        files_committed: s.files_committed,
        jobs_in_flight,
        layers_in_flight,
        stores_open: rt.stores_open.load(Ordering::Relaxed),
    })
}

/// Fills `out` with the runtime's counters.
///
/// # Safety
/// `rt` is a runtime handle (checked); `out` is NULL or points to a
/// `tutti_stats_t` with `struct_size` set.
#[no_mangle]
pub unsafe extern "C" fn tutti_get_stats(rt: *mut tutti_runtime_t, out: *mut tutti_stats_t) -> i32 {
    guard("tutti_get_stats", || {
        let rt = Runtime::get(rt)?;
        // SAFETY: forwarded from the caller.
        let out = unsafe { ptr::sized_out(out)? };
        *out = collect(&rt, out.struct_size)?;
        Ok(TUTTI_OK)
    })
}
