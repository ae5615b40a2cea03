//! The store's job operations: submit, poll, wait, cancel and release loads
//! and stores (the job state is in `job_state.rs`).

use super::job_state::{thread_cpu_ns, Job, JobId, JobStatus, Jobs, LayerState, ListOwner, LAYERS_IN_FLIGHT};
use super::{lock, KvStore};
use crate::error::{ObjError, Result};
use crate::gate::{Admit, GateUnit, IoGate, StoreAdmission};
use crate::index::FileId;
use crate::io::{Direction, FailureKind, LayerOutcome, LayerRequest, Pair, PairFailure};
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_driver::queue::backoff;

impl KvStore {
    /// Starts a job; `io_files` hold an I/O reference (taken by the caller
    /// with `PoolControl::begin_load`), dropped when the job finishes.
    /// `cpu0` is the thread CPU time when the caller started validating, so
    /// the job's `setup_ns` covers its whole setup.
    pub(super) fn start_job(&self, mut job: Job, io_files: Vec<FileId>, cpu0: u64) -> Result<JobId> {
        let id = self.next_id();
        let gate = self.gate();
        let mut dropped = None;
        if let (Some(g), Direction::Store) = (&gate, job.dir) {
            let bytes = job.pairs.len() as u64 * job.layers.len() as u64 * 2 * self.map.object_bytes();
            match g.accept_store(id, bytes) {
                Ok(StoreAdmission::Accepted) => {}
                Ok(StoreAdmission::Dropped(why)) => dropped = Some(why),
                Err(why) => {
                    // Refused before anything was done; a load's references go back.
                    if !io_files.is_empty() {
                        if let Err(e) = self.control.end_load(&io_files) {
                            tracing::warn!(error = %e, "dropping the I/O references of a refused job failed");
                        }
                    }
                    return Err(ObjError::Backpressure(why));
                }
            }
        }
        if let Some(why) = dropped {
            // Nothing of it goes to the drives: every layer fails, so no block is committed.
            let all: Vec<(u32, PairFailure)> =
                (0..job.pairs.len() as u32).map(|p| (p, PairFailure::definite(why.clone()))).collect();
            for i in 0..job.state.len() {
                job.record(i, LayerOutcome { failed: all.clone(), ..Default::default() }, None);
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
        let c = &self.counters;
        c.jobs.fetch_add(1, Ordering::Relaxed);
        c.setup_ns.fetch_add(job.setup_ns, Ordering::Relaxed);
        c.pair_lists.fetch_add(job.pairs_registered as u64, Ordering::Relaxed);
        let mut jobs = match lock(&self.jobs, "jobs") {
            Ok(j) => j,
            Err(e) => {
                // Never started: its files' I/O references go now.
                if let Err(e2) = self.control.end_load(&job.io_files) {
                    tracing::warn!(error = %e2, "dropping the I/O references of a job that did not start failed");
                }
                return Err(e);
            }
        };
        jobs.map.insert(id, job);
        self.advance_gated(&mut jobs, id, false)?;
        Ok(id)
    }

    /// Advances job `id`; with a gate, every other job too (loads first), so that layers that
    /// finished are reported to the gate and layers it held back go as soon as it allows,
    /// whichever job the engine happens to poll. `urgent`: the engine blocks on `id`.
    fn advance_gated(&self, jobs: &mut Jobs, id: JobId, urgent: bool) -> Result<()> {
        let Some(gate) = self.gate() else {
            return self.advance(jobs, id, None, false);
        };
        let mut ids: Vec<(bool, JobId)> =
            jobs.map.iter().map(|(&j, job)| (job.dir != Direction::Load, j)).collect();
        ids.sort_unstable();
        for (_, j) in ids {
            if j == id {
                self.advance(jobs, j, Some(&gate), urgent)?;
            } else if let Err(e) = self.advance(jobs, j, Some(&gate), false) {
                tracing::warn!(job = j, error = %e, "advancing a job for the I/O gate failed");
            }
        }
        Ok(())
    }

    /// Bytes of `layer` of `job` on each drive (object j = 2·layer + kv of each pair's file).
    fn layer_drive_bytes(&self, job: &Job, layer: u32) -> Vec<u64> {
        let mut bytes = vec![0u64; self.map.drive_count() as usize];
        let obj = self.map.object_bytes();
        for p in job.pairs.iter() {
            for j in [2 * layer, 2 * layer + 1] {
                if let Some(b) = bytes.get_mut(self.map.drive_of(p.file, j) as usize) {
                    *b += obj;
                }
            }
        }
        bytes
    }

    /// One pass over a job without blocking: reaps finished layers and
    /// submits queued ones, in layer order, up to the window.
    fn advance(
        &self,
        jobs: &mut Jobs,
        id: JobId,
        gate: Option<&Arc<dyn IoGate>>,
        urgent: bool,
    ) -> Result<()> {
        let job = jobs.map.get_mut(&id).ok_or(ObjError::Unknown { what: "job", id })?;
        let obj = self.map.object_bytes();
        {
            let mut io = lock(&self.io, "io")?;
            self.tell_io(&mut **io);
            let gone = self.gone.get().map(String::as_str);
            for i in 0..job.state.len() {
                if let LayerState::Running(token) = job.state[i] {
                    if let Some(outcome) = io.poll(token)? {
                        self.account(job, i, &outcome, obj);
                        job.record(i, outcome, gone);
                        if let Some(g) = gate {
                            g.finished(id, job.layers.start + i as u32);
                        }
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
                let layer = job.layers.start + i as u32;
                if job.cancelled || gone.is_some() {
                    let slots = job.slots.clone();
                    let why = match gone {
                        Some(why) => format!("layer {layer} not submitted: {why}"),
                        None => "cancelled".to_string(),
                    };
                    job.fail_all_slots(&slots, &why);
                    job.state[i] = LayerState::Done;
                    continue;
                }
                if let Some(g) = gate {
                    if job.drive_bytes[i].is_none() {
                        job.drive_bytes[i] = Some(self.layer_drive_bytes(job, layer));
                    }
                    let drive_bytes = job.drive_bytes[i].as_deref().unwrap_or(&[]);
                    let unit = GateUnit { job: id, layer, dir: job.dir, drive_bytes };
                    if g.admit(&unit, urgent) == Admit::Wait {
                        // Layer order: the later layers wait with it.
                        break;
                    }
                }
                let cpu0 = thread_cpu_ns();
                let submitted = io.submit(LayerRequest {
                    layer,
                    pairs: &job.pairs,
                    dir: job.dir,
                    registered: job.pair_list,
                });
                let spent = thread_cpu_ns().saturating_sub(cpu0);
                job.submit_ns[i] += spent;
                self.counters.submit_ns.fetch_add(spent, Ordering::Relaxed);
                if let (Some(g), false) = (gate, matches!(submitted, Ok(Some(_)))) {
                    // Admitted but not handed over: the gate must not count it in flight.
                    g.finished(id, layer);
                }
                match submitted {
                    Ok(Some(token)) => {
                        job.state[i] = LayerState::Running(token);
                        job.submitted[i] = Some(Instant::now());
                    }
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
                        job.record(i, LayerOutcome { failed: all, ..Default::default() }, gone);
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
        if let (Some(g), true, false) = (gate, job.is_done(), job.gate_forgotten) {
            job.gate_forgotten = true;
            g.forget(id);
        }
        if job.is_done() && !job.io_files.is_empty() {
            let files = std::mem::take(&mut job.io_files);
            // The owner holds the references; gone, it holds nothing any more.
            if self.gone.get().is_none() {
                self.offer_report();
                self.control.end_load(&files)?;
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

    /// Counts layer `i` of `job`, which just finished with `outcome`.
    fn account(&self, job: &Job, i: usize, outcome: &LayerOutcome, obj: u64) {
        let ok = job.pairs.len().saturating_sub(outcome.failed.len()) as u64 * 2 * obj;
        let c = &self.counters;
        let ns = job.submitted[i].map_or(0, |t| t.elapsed().as_nanos().min(u64::MAX as u128) as u64);
        let (layers, latency, per_drive) = match job.dir {
            Direction::Load => (&c.layers_loaded, &c.load_latency, &c.drive_loaded),
            Direction::Store => (&c.layers_stored, &c.store_latency, &c.drive_stored),
        };
        layers.fetch_add(1, Ordering::Relaxed);
        latency.observe(ns);
        // The layer's K and V objects of every pair, by drive, less those of failed pairs:
        // O(drives + failures), not O(pairs).
        let d = per_drive.len();
        if d > 0 && job.residues.len() == d {
            let layer = job.layers.start + i as u32;
            // Drive `at` holds the K objects of the pairs whose file ≡ at - 2·layer (mod d), and
            // the V objects of those whose file ≡ at - 2·layer - 1.
            let (k, v) = ((2 * layer as usize) % d, (2 * layer as usize + 1) % d);
            let of =
                |at: usize| job.residues[(at + d - k) % d] as u64 + job.residues[(at + d - v) % d] as u64;
            if outcome.failed.is_empty() {
                for (at, counter) in per_drive.iter().enumerate() {
                    counter.fetch_add(of(at) * obj, Ordering::Relaxed);
                }
            } else {
                let mut objects: Vec<u64> = (0..d).map(of).collect();
                for (p, _) in &outcome.failed {
                    if let Some(pair) = job.pairs.get(*p as usize) {
                        for j in [2 * layer, 2 * layer + 1] {
                            let at = self.map.drive_of(pair.file, j) as usize;
                            objects[at] = objects[at].saturating_sub(1);
                        }
                    }
                }
                for (counter, n) in per_drive.iter().zip(objects) {
                    counter.fetch_add(n * obj, Ordering::Relaxed);
                }
            }
        }
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
        self.check_owner()?;
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
        // Checks that every file holds an entry of this identity, and keeps
        // each from eviction until the job ends.
        self.control.begin_load(reg.identity_id, files)?;
        let pairs: Arc<[Pair]> =
            files.iter().zip(blocks).map(|(&file, &block)| Pair { file, block }).collect();
        let n = pairs.len() as u32;
        let residues = super::job_state::residues(&pairs, self.map.drive_count());
        let job = Job::new(Direction::Load, pairs, (0..n).collect(), residues, n, layers);
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
    /// `strict`: fail at once (each pass) when the pool's owner is gone; cleanup is not strict.
    fn with_job<T>(
        &self,
        id: JobId,
        wait: Option<(Instant, Option<usize>)>,
        strict: bool,
        f: impl FnOnce(&Job) -> T,
    ) -> Result<T> {
        let mut spins = 0u32;
        loop {
            if strict {
                self.check_owner()?;
            } else {
                // Learnt here too, so that the I/O path recovers no drive for the owner's death.
                self.owner_gone();
            }
            let mut jobs = lock(&self.jobs, "jobs")?;
            self.advance_gated(&mut jobs, id, wait.is_some())?;
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

    /// One pass over every job without blocking: finished layers are reaped and, with a gate,
    /// layers it now allows go to the drives (an engine's timing hooks call this, so deferred
    /// writes start in the window that allows them even if no one polls their job).
    pub fn progress(&self) -> Result<()> {
        // Timing hooks and counters go on without the owner; the I/O path learns it is gone.
        self.owner_gone();
        let mut jobs = lock(&self.jobs, "jobs")?;
        let ids: Vec<JobId> = jobs.map.keys().copied().collect();
        if self.gate().is_some() {
            // One gated advance covers every job.
            return match ids.first() {
                Some(&first) => self.advance_gated(&mut jobs, first, false),
                None => Ok(()),
            };
        }
        for id in ids {
            self.advance(&mut jobs, id, None, false)?;
        }
        Ok(())
    }

    /// Progress without blocking (submits further layers as earlier ones finish).
    pub fn poll(&self, id: JobId) -> Result<JobStatus> {
        self.with_job(id, None, true, |j| j.status(id))
    }

    /// As [`poll`](Self::poll), also when the pool's owner is gone: what happened to the job
    /// (its failures and their reasons), for reports and cleanup.
    pub fn status(&self, id: JobId) -> Result<JobStatus> {
        self.with_job(id, None, false, |j| j.status(id))
    }

    /// Waits until every layer of the job has finished, or `timeout`.
    /// Returns the status either way; `done` tells which.
    pub fn wait(&self, id: JobId, timeout: Duration) -> Result<JobStatus> {
        let deadline = Instant::now() + timeout;
        self.with_job(id, Some((deadline, None)), true, |j| j.status(id))
    }

    /// Cleanup: cancels what the job has not submitted yet and waits (up to `timeout`) for the
    /// layers already on the drives, even when the pool's owner is gone (a command in flight may
    /// still move data into the job's blocks until it ends). Returns the status either way.
    pub fn drain(&self, id: JobId, timeout: Duration) -> Result<JobStatus> {
        {
            let mut jobs = lock(&self.jobs, "jobs")?;
            let job = jobs.map.get_mut(&id).ok_or(ObjError::Unknown { what: "job", id })?;
            if !job.is_done() {
                job.cancelled = true;
            }
        }
        let deadline = Instant::now() + timeout;
        self.with_job(id, Some((deadline, None)), false, |j| j.status(id))
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
        self.with_job(id, Some((deadline, Some(index))), true, |j| j.status(id))
    }

    /// Stops submitting the job's remaining layers; their blocks are reported
    /// failed ("cancelled"). Layers already handed to the I/O path finish.
    pub fn cancel(&self, id: JobId) -> Result<JobStatus> {
        {
            let mut jobs = lock(&self.jobs, "jobs")?;
            jobs.map.get_mut(&id).ok_or(ObjError::Unknown { what: "job", id })?.cancelled = true;
        }
        self.status(id)
    }

    /// Forgets a finished job and returns its final status. A job still
    /// running is an error (cancel it and wait first).
    pub fn release(&self, id: JobId) -> Result<JobStatus> {
        let st = self.status(id)?;
        if !st.done {
            return Err(ObjError::invalid(
                "job",
                format!("job {id} still has {} layers running", st.layers - st.layers_done),
            ));
        }
        let removed = lock(&self.jobs, "jobs")?.map.remove(&id);
        if let (Some(g), Some(job)) = (self.gate(), removed) {
            if !job.gate_forgotten {
                g.forget(id);
            }
        }
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
