//! What the store reports about itself: its pool and drives (`KvStore::info`)
//! and its counters since open (`KvStore::stats`).

use crate::geometry::Geometry;
use crate::index::IndexStats;
use crate::journal::ReplayStats;
use crate::registration::DataPath;

/// One drive as the store reports it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DriveReport {
    pub device: String,
    pub serial: String,
    pub nsid: u32,
    pub lba_size: u32,
    pub blocks: u64,
    pub max_transfer: u64,
    pub data_start_lba: u64,
}

/// What the pool is.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PoolInfo {
    pub pool: String,
    pub formatted_now: bool,
    pub geometry: Geometry,
    pub drives: Vec<DriveReport>,
    pub files: u32,
    pub object_bytes: u64,
    pub file_bytes: u64,
    pub chunk_bytes: u64,
    pub chunks: u32,
    pub slots_per_file: u32,
    pub backend: String,
    /// How layers are moved (e.g. whether the executor expands them).
    pub io_mode: String,
    /// Direct or staged, and for staged what direct DMA lacks; `None`
    /// until KV memory is registered.
    pub data_path: Option<DataPath>,
    pub replay: Vec<ReplayStats>,
}

/// Counters since open.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct StoreStats {
    pub index: IndexStats,
    pub lookups: u64,
    pub lookup_hits: u64,
    pub lookup_misses: u64,
    pub jobs: u64,
    pub layers: u64,
    pub commands: u64,
    pub host_calls: u64,
    pub host_built: u64,
    /// (file, block) pairs read or copied by per-layer submissions.
    pub host_pairs: u64,
    /// Jobs whose layers referenced registered pairs (their own list, or
    /// their store session's).
    pub pair_lists: u64,
    /// Pair lists registered with the I/O path: one per load job, one per
    /// store session (or per store job when the session found no free list).
    pub pair_registrations: u64,
    /// Host CPU of job setup (validation, pair registration), ns.
    pub setup_ns: u64,
    /// Host CPU inside per-layer submissions, ns.
    pub submit_ns: u64,
    pub bytes_loaded: u64,
    pub bytes_stored: u64,
    pub failed_blocks: u64,
    pub files_committed: u64,
    pub journal_appends: u64,
    /// Files taken out of service since open because a write into them ended
    /// without a known outcome (also `index.quarantined`).
    pub quarantined_files: u64,
    /// Drives recovered (gio_uring: queue pairs deleted and created again)
    /// after commands of unknown outcome, which made those outcomes definite.
    pub recoveries: u64,
    /// Drive recoveries that failed or could not run (the outcomes stayed unknown).
    pub recovery_failures: u64,
}
