//! Jobs: a load or store of many blocks over a range of layers.
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

use super::{lock, KvStore};
use crate::error::{ObjError, Result};
use crate::index::FileId;
use crate::io::{Direction, FailureKind, LayerOutcome, Pair, PairFailure};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_driver::queue::backoff;

pub type JobId = u64;

/// Layers of one job submitted to the I/O path at a time.
pub const LAYERS_IN_FLIGHT: usize = 8;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum LayerState {
    Queued,
    Running(u64),
    Done,
}

pub(crate) struct Job {
    dir: Direction,
    /// Shared with the store session when the job moves the session's pairs as registered.
    pairs: Arc<[Pair]>,
    /// Bitmap index of each pair (stores: the session entry; loads: the pair itself).
    slots: Arc<[u32]>,
    blocks: u32,
    layers: Range<u32>,
    state: Vec<LayerState>,
    failed: Vec<u64>,
    /// Failed slots whose transfer may still be executed by a drive.
    unknown: Vec<u64>,
    first_error: Option<String>,
    commands: u64,
    host_calls: u64,
    host_built: u64,
    cancelled: bool,
    /// The I/O path's handle of the job's registered pairs, until the job is done.
    pair_list: Option<u64>,
    /// Who frees `pair_list`: the job when its last layer is done, or (when
    /// the handle is its store session's) the session at commit or abort.
    list_owner: ListOwner,
    pairs_registered: bool,
    /// Host CPU of validating and setting up the job, ns.
    setup_ns: u64,
    /// Host CPU inside `LayerIo::submit`, per layer, ns.
    submit_ns: Vec<u64>,
    host_pairs: u64,
    /// Files holding an I/O reference until the job finishes.
    io_files: Vec<FileId>,
    /// The store session this job writes for.
    pub session: Option<u64>,
    /// Per finished layer, the pairs that failed and how (stores report these to the session).
    pub layer_failures: Vec<(u32, Vec<(u32, FailureKind)>)>,
    session_notified: bool,
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
    map: HashMap<JobId, Job>,
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
        }
    }

    fn is_done(&self) -> bool {
        self.state.iter().all(|s| *s == LayerState::Done)
    }

    fn fail_slot(&mut self, slot: u32, why: &str) {
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

    fn status(&self, id: JobId) -> JobStatus {
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

    fn record(&mut self, i: usize, outcome: LayerOutcome) {
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
            let why = match (f.kind, self.dir) {
                (FailureKind::Definite, _) => format!("layer {layer}: {}", f.why),
                (FailureKind::Unknown, Direction::Load) => format!(
                    "layer {layer}: {}; outcome unknown: the drive may still write engine block {} until it is reset",
                    f.why, pair.block
                ),
                (FailureKind::Unknown, Direction::Store) => format!(
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

impl KvStore {
    /// Starts a job; `io_files` get an I/O reference until it finishes.
    /// `cpu0` is the thread CPU time when the caller started validating, so
    /// the job's `setup_ns` covers its whole setup.
    pub(super) fn start_job(&self, mut job: Job, io_files: Vec<FileId>, cpu0: u64) -> Result<JobId> {
        {
            let mut ix = lock(&self.index, "index")?;
            for (n, &f) in io_files.iter().enumerate() {
                if let Err(e) = ix.begin_io(f) {
                    for &g in &io_files[..n] {
                        let _ = ix.end_io(g);
                    }
                    return Err(e);
                }
            }
        }
        job.io_files = io_files;
        if !job.pairs.is_empty() && job.list_owner == ListOwner::Job {
            // O(blocks) once per job, so that no layer has to copy the pairs again.
            match lock(&self.io, "io")?.register_pairs(&job.pairs) {
                Ok(handle) => {
                    job.pair_list = handle;
                    self.counters.pair_registrations.fetch_add(handle.is_some() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "registering a job's pairs failed; its layers carry them")
                }
            }
        }
        job.pairs_registered = job.pair_list.is_some();
        job.setup_ns = thread_cpu_ns().saturating_sub(cpu0);
        let id = self.next_id();
        let c = &self.counters;
        c.jobs.fetch_add(1, Ordering::Relaxed);
        c.setup_ns.fetch_add(job.setup_ns, Ordering::Relaxed);
        c.pair_lists.fetch_add(job.pairs_registered as u64, Ordering::Relaxed);
        let mut jobs = lock(&self.jobs, "jobs")?;
        jobs.map.insert(id, job);
        self.advance(&mut jobs, id)?;
        Ok(id)
    }

    /// One pass over a job without blocking: reaps finished layers and
    /// submits queued ones, in layer order, up to the window.
    fn advance(&self, jobs: &mut Jobs, id: JobId) -> Result<()> {
        let job = jobs.map.get_mut(&id).ok_or(ObjError::Unknown { what: "job", id })?;
        let obj = self.map.object_bytes();
        {
            let mut io = lock(&self.io, "io")?;
            for i in 0..job.state.len() {
                if let LayerState::Running(token) = job.state[i] {
                    if let Some(outcome) = io.poll(token)? {
                        self.account(job, &outcome, obj);
                        job.record(i, outcome);
                    }
                }
            }
            let running = job.state.iter().filter(|s| matches!(s, LayerState::Running(_))).count();
            let mut room = LAYERS_IN_FLIGHT.saturating_sub(running);
            for i in 0..job.state.len() {
                if room == 0 {
                    break;
                }
                if job.state[i] != LayerState::Queued {
                    continue;
                }
                if job.cancelled {
                    let slots = job.slots.clone();
                    job.fail_all_slots(&slots, "cancelled");
                    job.state[i] = LayerState::Done;
                    continue;
                }
                let layer = job.layers.start + i as u32;
                let cpu0 = thread_cpu_ns();
                let submitted = io.submit(layer, &job.pairs, job.dir, job.pair_list);
                let spent = thread_cpu_ns().saturating_sub(cpu0);
                job.submit_ns[i] += spent;
                self.counters.submit_ns.fetch_add(spent, Ordering::Relaxed);
                match submitted {
                    Ok(Some(token)) => job.state[i] = LayerState::Running(token),
                    // The I/O path is full: try again once something finishes.
                    Ok(None) => {
                        io.progress()?;
                        break;
                    }
                    Err(e) => {
                        let why = e.to_string();
                        // Refused up front, or the path broke while handing the layer
                        // over (e.g. gio_uring's `issue` after some IOCBs reached the
                        // executor): only the former has a known outcome.
                        let refused = matches!(e, ObjError::NotRegistered | ObjError::Invalid { .. });
                        let f = if refused { PairFailure::definite(why) } else { PairFailure::unknown(why) };
                        let all: Vec<(u32, PairFailure)> =
                            (0..job.pairs.len() as u32).map(|p| (p, f.clone())).collect();
                        job.record(i, LayerOutcome { failed: all, ..Default::default() });
                    }
                }
                room -= 1;
            }
            // Every layer is done, so none of its transfers is in flight: the pairs can go
            // (a session's list stays until the session ends).
            if job.is_done() && job.list_owner == ListOwner::Job {
                if let Some(handle) = job.pair_list.take() {
                    if let Err(e) = io.unregister_pairs(handle) {
                        tracing::error!(job = id, error = %e, "unregistering a job's pairs failed");
                    }
                }
            }
        }
        if job.is_done() && !job.io_files.is_empty() {
            let files = std::mem::take(&mut job.io_files);
            let mut ix = lock(&self.index, "index")?;
            for f in files {
                ix.end_io(f)?;
            }
        }
        if let Some(sid) = job.session {
            let layers: Vec<(u32, Vec<(u32, FailureKind)>)> = std::mem::take(&mut job.layer_failures);
            let finished = job.is_done() && !job.session_notified;
            if !layers.is_empty() || finished {
                job.session_notified |= finished;
                self.session_layers_done(sid, &job.slots, &layers, finished)?;
            }
        }
        Ok(())
    }

    fn account(&self, job: &Job, outcome: &LayerOutcome, obj: u64) {
        let ok = job.pairs.len().saturating_sub(outcome.failed.len()) as u64 * 2 * obj;
        let c = &self.counters;
        c.layers.fetch_add(1, Ordering::Relaxed);
        c.commands.fetch_add(outcome.commands, Ordering::Relaxed);
        c.host_calls.fetch_add(outcome.host_calls, Ordering::Relaxed);
        c.host_built.fetch_add(outcome.host_built, Ordering::Relaxed);
        c.host_pairs.fetch_add(outcome.host_pairs, Ordering::Relaxed);
        c.failed_blocks.fetch_add(outcome.failed.len() as u64, Ordering::Relaxed);
        c.recoveries.fetch_add(outcome.recoveries, Ordering::Relaxed);
        c.recovery_failures.fetch_add(outcome.recovery_failures, Ordering::Relaxed);
        match job.dir {
            Direction::Load => c.bytes_loaded.fetch_add(ok, Ordering::Relaxed),
            Direction::Store => c.bytes_stored.fetch_add(ok, Ordering::Relaxed),
        };
    }

    /// Loads `files[i]` (from a [`super::Lookup`]) into engine block `blocks[i]`
    /// for layers `layers`. The files get an I/O reference until the job ends,
    /// so they cannot be evicted under it even if unpinned meanwhile.
    pub fn submit_load(&self, files: &[FileId], blocks: &[u32], layers: Range<u32>) -> Result<JobId> {
        let cpu0 = thread_cpu_ns();
        let reg = self.registration()?;
        self.check_layers(&layers)?;
        if files.len() != blocks.len() {
            return Err(ObjError::invalid(
                "blocks",
                format!("{} files but {} blocks", files.len(), blocks.len()),
            ));
        }
        self.check_blocks(blocks, reg.layout.num_blocks())?;
        {
            let ix = lock(&self.index, "index")?;
            for &f in files {
                match ix.key_of(f) {
                    Some((k, _)) if k.identity == reg.identity_id => {}
                    Some(_) => {
                        return Err(ObjError::invalid(
                            "files",
                            format!("file {f} was stored under another cache identity"),
                        ))
                    }
                    None => {
                        return Err(ObjError::invalid(
                            "files",
                            format!("file {f} holds no entry (evicted or never stored)"),
                        ))
                    }
                }
            }
        }
        let pairs: Arc<[Pair]> =
            files.iter().zip(blocks).map(|(&file, &block)| Pair { file, block }).collect();
        let n = pairs.len() as u32;
        let job = Job::new(Direction::Load, pairs, (0..n).collect(), n, layers);
        self.start_job(job, files.to_vec(), cpu0)
    }

    pub(super) fn check_layers(&self, layers: &Range<u32>) -> Result<()> {
        if layers.is_empty() || layers.end > self.geometry.layers {
            return Err(ObjError::invalid(
                "layers",
                format!(
                    "{}..{} is not a non-empty range within 0..{}",
                    layers.start, layers.end, self.geometry.layers
                ),
            ));
        }
        Ok(())
    }

    pub(super) fn check_blocks(&self, blocks: &[u32], num_blocks: u32) -> Result<()> {
        if let Some(b) = blocks.iter().find(|&&b| b >= num_blocks) {
            return Err(ObjError::invalid(
                "blocks",
                format!("engine block {b} is outside the {num_blocks} registered"),
            ));
        }
        // One bit per registered block: cheaper than hashing each block of a long request.
        let mut seen = vec![0u64; (num_blocks as usize).div_ceil(64)];
        for &b in blocks {
            let (word, bit) = (b as usize / 64, 1u64 << (b % 64));
            if seen[word] & bit != 0 {
                return Err(ObjError::invalid("blocks", format!("engine block {b} appears twice")));
            }
            seen[word] |= bit;
        }
        Ok(())
    }

    /// Advances the job until `wait` is satisfied (a layer index, or the whole
    /// job) or its deadline passes; without `wait`, once. The jobs lock is
    /// taken per pass, so other callers are not held up by a long wait.
    fn with_job<T>(
        &self,
        id: JobId,
        wait: Option<(Instant, Option<usize>)>,
        f: impl FnOnce(&Job) -> T,
    ) -> Result<T> {
        let mut spins = 0u32;
        loop {
            let mut jobs = lock(&self.jobs, "jobs")?;
            self.advance(&mut jobs, id)?;
            let job = jobs.map.get(&id).ok_or(ObjError::Unknown { what: "job", id })?;
            let satisfied = match wait {
                None => true,
                Some((deadline, target)) => {
                    let done = match target {
                        Some(i) => job.state[i] == LayerState::Done,
                        None => job.is_done(),
                    };
                    done || Instant::now() >= deadline
                }
            };
            if satisfied {
                return Ok(f(job));
            }
            drop(jobs);
            backoff(&mut spins);
        }
    }

    /// Progress without blocking (submits further layers as earlier ones finish).
    pub fn poll(&self, id: JobId) -> Result<JobStatus> {
        self.with_job(id, None, |j| j.status(id))
    }

    /// Waits until every layer of the job has finished, or `timeout`.
    /// Returns the status either way; `done` tells which.
    pub fn wait(&self, id: JobId, timeout: Duration) -> Result<JobStatus> {
        let deadline = Instant::now() + timeout;
        self.with_job(id, Some((deadline, None)), |j| j.status(id))
    }

    /// Waits until layer `layer` of the job has finished, or `timeout`.
    pub fn wait_layer(&self, id: JobId, layer: u32, timeout: Duration) -> Result<JobStatus> {
        let deadline = Instant::now() + timeout;
        let index = {
            let jobs = lock(&self.jobs, "jobs")?;
            let job = jobs.map.get(&id).ok_or(ObjError::Unknown { what: "job", id })?;
            if !job.layers.contains(&layer) {
                return Err(ObjError::invalid(
                    "layer",
                    format!("layer {layer} is not in the job's {}..{}", job.layers.start, job.layers.end),
                ));
            }
            (layer - job.layers.start) as usize
        };
        self.with_job(id, Some((deadline, Some(index))), |j| j.status(id))
    }

    /// Stops submitting the job's remaining layers; their blocks are reported
    /// failed ("cancelled"). Layers already handed to the I/O path finish.
    pub fn cancel(&self, id: JobId) -> Result<JobStatus> {
        {
            let mut jobs = lock(&self.jobs, "jobs")?;
            jobs.map.get_mut(&id).ok_or(ObjError::Unknown { what: "job", id })?.cancelled = true;
        }
        self.poll(id)
    }

    /// Forgets a finished job and returns its final status. A job still
    /// running is an error (cancel it and wait first).
    pub fn release(&self, id: JobId) -> Result<JobStatus> {
        let st = self.poll(id)?;
        if !st.done {
            return Err(ObjError::invalid(
                "job",
                format!("job {id} still has {} layers running", st.layers - st.layers_done),
            ));
        }
        lock(&self.jobs, "jobs")?.map.remove(&id);
        Ok(st)
    }

    /// Paper Algorithm 1 `retrieve_layer`: one layer of `files` into `blocks`, waited for.
    pub fn retrieve_layer(
        &self,
        layer: u32,
        files: &[FileId],
        blocks: &[u32],
        timeout: Duration,
    ) -> Result<JobStatus> {
        let id = self.submit_load(files, blocks, layer..layer + 1)?;
        self.finish(id, timeout)
    }

    /// Loads every layer of a lookup's files into `blocks` and waits.
    pub fn load_request(&self, files: &[FileId], blocks: &[u32], timeout: Duration) -> Result<JobStatus> {
        let id = self.submit_load(files, blocks, 0..self.geometry.layers)?;
        self.finish(id, timeout)
    }

    /// Waits for a job and releases it; on timeout the job is cancelled and
    /// the error says so (it stays in the table until its layers drain).
    pub(super) fn finish(&self, id: JobId, timeout: Duration) -> Result<JobStatus> {
        let st = self.wait(id, timeout)?;
        if !st.done {
            self.cancel(id)?;
            return Err(ObjError::Timeout { job: id, waited: timeout });
        }
        self.release(id)
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
