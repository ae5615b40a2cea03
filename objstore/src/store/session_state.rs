//! What a store session holds between `begin_store` and its commit or abort
//! (the calls themselves are `session.rs`), and what a store reports.

use crate::control::ReservationId;
use crate::index::FileId;
use crate::io::Pair;
use std::sync::Arc;

pub type StoreId = u64;

#[derive(Clone, Debug)]
pub(super) enum Entry {
    /// Being written into `file`; `layers` bit l = layer l stored.
    New {
        file: FileId,
        block: u32,
        layers: Vec<u64>,
        failed: Option<String>,
        /// A write into the file ended without a known outcome: the drive may
        /// still execute it, so the file is quarantined, never freed.
        outcome_unknown: bool,
    },
    /// Already stored (or being stored by another session): nothing to write.
    Present(FileId),
    Failed(String),
}

pub(crate) struct Session {
    /// The pool's reservation of the session's files.
    pub(super) reservation: ReservationId,
    pub(super) entries: Vec<Entry>,
    pub(super) running_jobs: u32,
    /// The `Entry::New` blocks as of `begin_store`, and their entry indices.
    pub(super) pairs: Arc<[Pair]>,
    pub(super) slots: Arc<[u32]>,
    /// Blocks that got no file at `begin_store`: failed in every job.
    pub(super) unstored: Vec<(u32, String)>,
    /// `Entry::New` blocks whose write failed since `begin_store`: while 0,
    /// a job moves exactly `pairs`.
    pub(super) failed_since_begin: u32,
    /// `pairs` as registered with the I/O path, from the first job that got a
    /// free list until commit or abort.
    pub(super) pair_list: Option<u64>,
    /// `pairs` by file mod drives (`job_state::residues`), once for every job of the session.
    pub(super) residues: Arc<[u32]>,
}

/// What a store achieved, per block of the request.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct StoreReport {
    /// New files made durable and visible.
    pub stored: u32,
    /// Chunks that were already stored.
    pub present: u32,
    /// Blocks not stored, by index in the request, with the reason.
    pub failed: Vec<(u32, String)>,
    /// The file holding each block's chunk, if any.
    pub files: Vec<Option<FileId>>,
}
