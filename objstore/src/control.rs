//! The pool's control operations, apart from the data path.
//!
//! A [`crate::KvStore`] moves KV bytes itself (its registration, its I/O
//! path, its jobs) and asks a [`PoolControl`] for everything that belongs to
//! the pool: which files hold which chunks (lookup, pins, I/O references),
//! which files a store may write (reservations), and making stored files
//! durable and visible (flush, journal, index). In one process that is a
//! [`crate::local::LocalPool`]; in an engine process that is a client of a
//! daemon owning the pool, the daemon's answer over its socket. Either way
//! the same rules hold: a reservation is visible to no lookup until its
//! commit is durable, and a file with an I/O reference or a pin is never
//! given to another store.

use crate::error::Result;
use crate::geometry::Geometry;
use crate::hash::{BlockHash, IdentityId};
use crate::index::{FileId, IndexStats};
use crate::journal::ReplayStats;

/// A pinned lookup result: the files of the longest stored prefix.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Lookup {
    /// Pass to `KvStore::unpin` when the files have been loaded (0 if nothing was pinned).
    pub pin: u64,
    /// `files[i]` holds chunk `i` of the request.
    pub files: Vec<FileId>,
}

impl Lookup {
    /// Chunks (blocks) of the request found.
    pub fn hits(&self) -> usize {
        self.files.len()
    }
}

/// A store's reservation of files, from [`PoolControl::reserve`].
pub type ReservationId = u64;

/// What a reservation got for one chunk.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Reserved {
    /// Write the chunk into `file` (generation `gen`).
    New { file: FileId, gen: u64 },
    /// Already stored, or being stored by another reservation: nothing to write.
    Present(FileId),
    /// No file for it (why).
    Failed(String),
}

/// What to do with one `Reserved::New` file when its reservation ends.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Verdict {
    /// Every layer was written: make it durable and visible.
    Commit,
    /// Not (completely) written: the file is free again.
    GiveUp,
    /// A write into it ended without a known outcome (why): the drive may
    /// still execute it, so the file is taken out of service.
    Quarantine(String),
}

/// Counters the pool keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ControlStats {
    pub index: IndexStats,
    pub journal_appends: u64,
    pub files_committed: u64,
    pub quarantined_files: u64,
}

/// What an engine needs to know about a pool to move its bytes: enough to
/// build the same stripe map the pool's owner uses.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolShape {
    pub id: u128,
    pub geometry: Geometry,
    pub journal_pages: u32,
    pub files: u32,
    /// First data LBA of each drive, in pool order (checked against the
    /// map the engine builds from the drives it sees).
    pub data_start_lba: Vec<u64>,
    /// The pool was formatted when it was opened.
    pub formatted: bool,
    pub replay: Vec<ReplayStats>,
}

/// The pool's control path. Every method is safe to call from any thread.
pub trait PoolControl: Send + Sync {
    /// The longest stored prefix of `hashes` under `identity`, pinned.
    fn lookup(&self, identity: IdentityId, hashes: &[BlockHash]) -> Result<Lookup>;
    /// How many leading chunks are stored; pins nothing.
    fn contains(&self, identity: IdentityId, hashes: &[BlockHash]) -> Result<usize>;
    /// Releases a pin from [`lookup`](Self::lookup) (0 does nothing).
    fn unpin(&self, pin: u64) -> Result<()>;
    /// Checks that every file holds an entry of `identity`, and takes an I/O
    /// reference on each (none is taken if any check fails).
    fn begin_load(&self, identity: IdentityId, files: &[FileId]) -> Result<()>;
    /// Drops the I/O references of [`begin_load`](Self::begin_load).
    fn end_load(&self, files: &[FileId]) -> Result<()>;
    /// Reserves a file for each chunk not yet stored (evicting if needed),
    /// each made safe to overwrite (durable Invalidate first).
    fn reserve(&self, identity: IdentityId, hashes: &[BlockHash]) -> Result<(ReservationId, Vec<Reserved>)>;
    /// Ends a reservation. `verdicts[i]` is for the i-th `Reserved::New` of
    /// it, in order. Files to commit are flushed, journaled and published;
    /// the result for each is `Ok(())` or why it was not stored (results of
    /// other verdicts are `Ok(())`: done as asked).
    fn settle(&self, id: ReservationId, verdicts: &[Verdict])
        -> Result<Vec<std::result::Result<(), String>>>;
    fn stats(&self) -> Result<ControlStats>;
    /// Why the pool's owner can no longer be reached, once it cannot (a daemon that stopped,
    /// died, or broke the connection); `None` while it can. Cheap, and without waiting for a
    /// call in progress: asked before jobs are advanced. An owner in this process is never gone.
    fn gone(&self) -> Option<String> {
        None
    }
    /// Whether the owner collects the store's data-path counters: a client's store then
    /// hands its [`DataPathReport`](crate::report::DataPathReport) to
    /// [`report`](Self::report) just before each `end_load` and `settle` (once per finished
    /// load job and per store). An owner in this process sees the store itself: no.
    fn wants_reports(&self) -> bool {
        false
    }
    /// The store's counters as of now, to go to the owner with the next call.
    fn report(&self, _report: crate::report::DataPathReport) {}
}
