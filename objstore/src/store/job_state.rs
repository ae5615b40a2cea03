//! One job's state, the types the store and its job operations share (in a
//! module of their own so that `store` and `jobs` do not depend on each
//! other for them); the operations are in `jobs.rs`.
//!
//! A job is a load or store of many blocks over a range of layers.
//!
//! A job keeps at most [`LAYERS_IN_FLIGHT`] layers submitted to the I/O path
//! and submits the next ones as earlier ones finish (on poll and wait), in
//! layer order, so the executor works on the layers the engine needs first
//! and a cancelled job stops at a layer boundary. Each layer reports which of
//! the job's blocks failed; the union is the job's failure bitmap (bit `i` =
//! the `i`-th block of the submission), which the engine uses to recompute
//! exactly those blocks.
//!
//! A job hands its (file, block) pairs to the I/O path once, when it starts
//! ([`LayerIo::register_pairs`](crate::io::LayerIo::register_pairs)); each
//! layer then refers to them, so the host's work per layer does not grow with
//! the blocks. The registration is dropped when the job's last layer is done.
//! The jobs of a store session share the session's registration instead
//! (see `session.rs`): it outlives each job and is dropped at commit or abort.
//! Host CPU is accounted in two parts: `setup_ns` (validation and the
//! registration, once per job) and `submit_ns` (inside the I/O path's
//! `submit`, per layer), both the calling thread's CPU time.

use crate::index::FileId;
use crate::io::{Direction, FailureKind, LayerOutcome, Pair};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

pub type JobId = u64;

/// Layers of one job submitted to the I/O path at a time.
pub const LAYERS_IN_FLIGHT: usize = 8;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum LayerState {
    Queued,
    Running(u64),
    Done,
}

pub(crate) struct Job {
    pub(super) dir: Direction,
    /// Shared with the store session when the job moves the session's pairs as registered.
    pub(super) pairs: Arc<[Pair]>,
    /// Bitmap index of each pair (stores: the session entry; loads: the pair itself).
    pub(super) slots: Arc<[u32]>,
    pub(super) blocks: u32,
    pub(super) layers: Range<u32>,
    pub(super) state: Vec<LayerState>,
    pub(super) failed: Vec<u64>,
    /// Failed slots whose transfer may still be executed by a drive.
    pub(super) unknown: Vec<u64>,
    pub(super) first_error: Option<String>,
    pub(super) commands: u64,
    pub(super) host_calls: u64,
    pub(super) host_built: u64,
    pub(super) cancelled: bool,
    /// The I/O path's handle of the job's registered pairs, until the job is done.
    pub(super) pair_list: Option<u64>,
    /// Who frees `pair_list`: the job when its last layer is done, or (when
    /// the handle is its store session's) the session at commit or abort.
    pub(super) list_owner: ListOwner,
    pub(super) pairs_registered: bool,
    /// Host CPU of validating and setting up the job, ns.
    pub(super) setup_ns: u64,
    /// Host CPU inside `LayerIo::submit`, per layer, ns.
    pub(super) submit_ns: Vec<u64>,
    pub(super) host_pairs: u64,
    /// Files holding an I/O reference until the job finishes.
    pub(super) io_files: Vec<FileId>,
    /// The store session this job writes for.
    pub session: Option<u64>,
    /// Per finished layer, the pairs that failed and how (stores report these to the session).
    pub layer_failures: Vec<(u32, Vec<(u32, FailureKind)>)>,
    pub(super) session_notified: bool,
    /// Per layer, its bytes per drive, computed when the I/O gate is first asked about it.
    pub(super) drive_bytes: Vec<Option<Vec<u64>>>,
    /// The I/O gate was told the job is done.
    pub(super) gate_forgotten: bool,
}

/// Who registered a job's pair list, and so who frees it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum ListOwner {
    /// `start_job` registers the job's pairs and the job frees them when done.
    Job,
    /// The store session registered them (or found no room); the job neither
    /// registers nor frees a list.
    Session,
}

/// A job's progress as the engine sees it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct JobStatus {
    pub job: JobId,
    pub direction: Direction,
    pub first_layer: u32,
    pub layers: u32,
    /// `layer_done[l - first_layer]`: layer `l` has finished (successfully or not).
    pub layer_done: Vec<bool>,
    pub layers_done: u32,
    pub done: bool,
    pub cancelled: bool,
    /// Blocks the job covers; bit `i` of `failed_blocks` is block `i` of the submission.
    pub blocks: u32,
    pub failed_blocks: Vec<u64>,
    pub failed: u32,
    /// The failed blocks (a subset of `failed_blocks`, same bit order) of
    /// which a command ended without a known outcome — it timed out, or its
    /// queue or controller died — so the drive may still execute it:
    ///
    /// - load: the drive may still write that engine block, until the drive
    ///   is reset. Recompute it, but be aware that a late read can overwrite
    ///   the recomputed KV; nothing on this side can prevent that. Resetting
    ///   the drive (a new process) bounds it.
    /// - store: the block was not stored, and its file is quarantined (never
    ///   reused in this process; see `StoreStats::quarantined_files`).
    ///
    /// The failure text of such a block says "outcome unknown".
    ///
    /// The gio_uring path recovers the drives of such commands before it
    /// reports the layer (see `io::gio`): the commands were then completed
    /// or aborted, so their blocks fail with a known outcome and are not in
    /// this bitmap (`StoreStats::recoveries`). A block is here only when
    /// that recovery failed or could not run (`recovery_failures`), or on
    /// the direct path, which does not recover drives.
    pub unknown_blocks: Vec<u64>,
    pub first_error: Option<String>,
    pub commands: u64,
    /// Calls the host made into the I/O path (see `LayerOutcome::host_calls`).
    pub host_calls: u64,
    /// Commands whose fields the host wrote itself (0 when the executor expands them).
    pub host_built: u64,
    /// (file, block) pairs the host read or copied in per-layer submissions
    /// (0 when every layer used the pairs registered for the job).
    pub host_pairs: u64,
    /// Every layer referenced the job's pairs as registered with the I/O path
    /// once: at the job's start, or (stores) once for the whole store session.
    pub pairs_registered: bool,
    /// Host CPU (the submitting thread's CPU time) of the job's setup:
    /// validation, I/O references, pair registration. Once per job.
    pub setup_ns: u64,
    /// Host CPU of the per-layer submissions so far (sum of `layer_submit_ns`).
    pub submit_ns: u64,
    /// `layer_submit_ns[l - first_layer]`: host CPU inside the I/O path's
    /// submit for layer `l` (retries when the path was full included).
    pub layer_submit_ns: Vec<u64>,
}

impl JobStatus {
    pub fn block_failed(&self, i: u32) -> bool {
        self.failed_blocks.get(i as usize / 64).is_some_and(|w| w >> (i % 64) & 1 == 1)
    }
    /// Block `i` failed and a drive may still act on its transfer (see `unknown_blocks`).
    pub fn block_outcome_unknown(&self, i: u32) -> bool {
        self.unknown_blocks.get(i as usize / 64).is_some_and(|w| w >> (i % 64) & 1 == 1)
    }
    pub fn layer_is_done(&self, layer: u32) -> bool {
        layer
            .checked_sub(self.first_layer)
            .and_then(|i| self.layer_done.get(i as usize).copied())
            .unwrap_or(false)
    }
}

#[derive(Default)]
pub(crate) struct Jobs {
    pub(super) map: HashMap<JobId, Job>,
}

impl Jobs {
    /// Jobs with a layer not yet finished.
    pub fn running(&self) -> usize {
        self.map.values().filter(|j| !j.is_done()).count()
    }
}

impl Job {
    pub fn new(
        dir: Direction,
        pairs: Arc<[Pair]>,
        slots: Arc<[u32]>,
        blocks: u32,
        layers: Range<u32>,
    ) -> Self {
        let n = layers.len();
        Job {
            dir,
            pairs,
            slots,
            blocks,
            layers,
            state: vec![LayerState::Queued; n],
            failed: vec![0; (blocks as usize).div_ceil(64)],
            unknown: vec![0; (blocks as usize).div_ceil(64)],
            first_error: None,
            commands: 0,
            host_calls: 0,
            host_built: 0,
            cancelled: false,
            pair_list: None,
            list_owner: ListOwner::Job,
            pairs_registered: false,
            setup_ns: 0,
            submit_ns: vec![0; n],
            host_pairs: 0,
            io_files: Vec::new(),
            session: None,
            layer_failures: Vec::new(),
            session_notified: false,
            drive_bytes: vec![None; n],
            gate_forgotten: false,
        }
    }

    pub(super) fn is_done(&self) -> bool {
        self.state.iter().all(|s| *s == LayerState::Done)
    }

    pub(super) fn fail_slot(&mut self, slot: u32, why: &str) {
        if let Some(w) = self.failed.get_mut(slot as usize / 64) {
            *w |= 1 << (slot % 64);
        }
        if self.first_error.is_none() {
            self.first_error = Some(why.to_string());
        }
    }

    /// Layers reference `handle`, a list of exactly this job's pairs that its
    /// store session registered and frees.
    pub fn use_session_list(&mut self, handle: Option<u64>) {
        self.pair_list = handle;
        self.list_owner = ListOwner::Session;
    }

    pub fn fail_all_slots(&mut self, slots: &[u32], why: &str) {
        for &s in slots {
            self.fail_slot(s, why);
        }
    }

    pub(super) fn status(&self, id: JobId) -> JobStatus {
        let layer_done: Vec<bool> = self.state.iter().map(|s| *s == LayerState::Done).collect();
        JobStatus {
            job: id,
            direction: self.dir,
            first_layer: self.layers.start,
            layers: self.layers.len() as u32,
            layers_done: layer_done.iter().filter(|d| **d).count() as u32,
            layer_done,
            done: self.is_done(),
            cancelled: self.cancelled,
            blocks: self.blocks,
            failed: self.failed.iter().map(|w| w.count_ones()).sum(),
            failed_blocks: self.failed.clone(),
            unknown_blocks: self.unknown.clone(),
            first_error: self.first_error.clone(),
            commands: self.commands,
            host_calls: self.host_calls,
            host_built: self.host_built,
            host_pairs: self.host_pairs,
            pairs_registered: self.pairs_registered,
            setup_ns: self.setup_ns,
            submit_ns: self.submit_ns.iter().sum(),
            layer_submit_ns: self.submit_ns.clone(),
        }
    }

    /// Records layer `i`'s outcome. `owner_gone`: why the pool's owner is gone, when it is: a
    /// store's failure then says nothing of quarantine (the reservation went with the owner,
    /// nothing of it is committed, and no drive is recovered or blamed).
    pub(super) fn record(&mut self, i: usize, outcome: LayerOutcome, owner_gone: Option<&str>) {
        self.state[i] = LayerState::Done;
        self.commands += outcome.commands;
        self.host_calls += outcome.host_calls;
        self.host_built += outcome.host_built;
        self.host_pairs += outcome.host_pairs;
        let layer = self.layers.start + i as u32;
        let mut bad = Vec::with_capacity(outcome.failed.len());
        for (p, f) in &outcome.failed {
            let (Some(&slot), Some(pair)) = (self.slots.get(*p as usize), self.pairs.get(*p as usize)) else {
                continue;
            };
            let why = match (f.kind, self.dir, owner_gone) {
                (_, Direction::Store, Some(gone)) => format!("layer {layer} not stored: {gone}; {}", f.why),
                (FailureKind::Unknown, Direction::Load, Some(gone)) => format!(
                    "layer {layer} not loaded: {gone}; {}; outcome unknown: the drive may still write engine block {} \
                     until it is reset",
                    f.why, pair.block
                ),
                (FailureKind::Definite, Direction::Load, Some(gone)) => {
                    format!("layer {layer} not loaded: {gone}; {}", f.why)
                }
                (FailureKind::Definite, _, None) => format!("layer {layer}: {}", f.why),
                (FailureKind::Unknown, Direction::Load, None) => format!(
                    "layer {layer}: {}; outcome unknown: the drive may still write engine block {} until it is reset",
                    f.why, pair.block
                ),
                (FailureKind::Unknown, Direction::Store, None) => format!(
                    "layer {layer}: {}; outcome unknown: the drive may still write file {}, which is quarantined",
                    f.why, pair.file
                ),
            };
            if f.kind == FailureKind::Unknown {
                if let Some(w) = self.unknown.get_mut(slot as usize / 64) {
                    *w |= 1 << (slot % 64);
                }
                if self.dir == Direction::Load {
                    tracing::warn!(layer, file = pair.file, block = pair.block, reason = %f.why,
                        "load of unknown outcome: the drive may still write this engine block until it is reset");
                }
            }
            self.fail_slot(slot, &why);
            bad.push((*p, f.kind));
        }
        if self.session.is_some() {
            self.layer_failures.push((layer, bad));
        }
    }
}

/// CPU time of the calling thread, ns (0 if the clock cannot be read): the
/// clock of `JobStatus::setup_ns` and `submit_ns`, for callers that measure
/// around the store with the same clock.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; Linux always provides this clock.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
