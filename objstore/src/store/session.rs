//! Storing blocks: reserve files, write layers, commit durably.
//!
//! The order of durable steps is what makes a crash safe at any point:
//!
//! 1. `begin_store` reserves a file per new chunk. A file the journal may
//!    still name (an evicted entry, or an Insert whose append failed) first
//!    gets an Invalidate record, appended and flushed, before anything
//!    overwrites its data — so a crash mid-rewrite finds no entry for it.
//! 2. `submit_store` writes the objects (any number of jobs, any layer order).
//! 3. `commit_store` flushes every drive (§6.8: completed writes reach
//!    non-volatile media), then appends and flushes Insert records, and only
//!    then makes the entries visible to lookups. A crash before the Insert
//!    is durable leaves the chunk a miss; after, a hit with exactly those bytes.
//!
//! An engine typically submits one job per layer as the layer is computed,
//! so per-job setup is paid once per layer. The session therefore fixes its
//! (file, block) pairs at `begin_store` and registers them with the I/O path
//! at the first `submit_store`; every job whose pairs are still exactly those
//! (no block of the session has failed yet) shares both the pairs and the
//! registered list. The list is freed when the session is committed or
//! aborted, which both refuse while a job of the session has layers running.

use super::job_state::{thread_cpu_ns, Job, JobId};
use super::session_state::{Entry, Session, StoreId, StoreReport};
use super::{lock, KvStore};
use crate::control::{Reserved, Verdict};
use crate::error::{ObjError, Result};
use crate::hash::BlockHash;
use crate::io::{Direction, FailureKind, Pair};
use std::ops::Range;
use std::sync::atomic::Ordering;
use std::time::Duration;

impl KvStore {
    /// Reserves a file for each `(hashes[i], blocks[i])` not yet stored
    /// (evicting least-recently-used unpinned files if needed) and makes
    /// every reused file safe to overwrite. Chunks that cannot get a file are
    /// reported at commit; the call fails only on bad arguments.
    pub fn begin_store(&self, hashes: &[BlockHash], blocks: &[u32]) -> Result<StoreId> {
        self.check_owner()?;
        let reg = self.registration()?;
        if hashes.len() != blocks.len() {
            return Err(ObjError::invalid(
                "blocks",
                format!("{} hashes but {} blocks", hashes.len(), blocks.len()),
            ));
        }
        self.check_blocks(blocks, reg.layout.num_blocks())?;
        let words = (self.geometry.layers as usize).div_ceil(64);
        let (reservation, reserved) = self.control.reserve(reg.identity_id, hashes)?;
        if reserved.len() != hashes.len() {
            // Only a broken pool owner answers so; give its files back.
            let news = reserved.iter().filter(|r| matches!(r, Reserved::New { .. })).count();
            let _ = self.control.settle(reservation, &vec![Verdict::GiveUp; news]);
            return Err(ObjError::invalid(
                "reservation",
                format!("{} chunks asked for, {} answered", hashes.len(), reserved.len()),
            ));
        }
        let entries: Vec<Entry> = reserved
            .into_iter()
            .zip(blocks)
            .map(|(r, &block)| match r {
                Reserved::New { file, .. } => {
                    Entry::New { file, block, layers: vec![0; words], failed: None, outcome_unknown: false }
                }
                Reserved::Present(f) => Entry::Present(f),
                Reserved::Failed(why) => Entry::Failed(why),
            })
            .collect();
        let mut pairs = Vec::new();
        let mut slots = Vec::new();
        let mut unstored = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            match e {
                Entry::New { file, block, .. } => {
                    pairs.push(Pair { file: *file, block: *block });
                    slots.push(i as u32);
                }
                Entry::Failed(why) => unstored.push((i as u32, why.clone())),
                Entry::Present(_) => {}
            }
        }
        let residues = super::job_state::residues(&pairs, self.map.drive_count());
        let session = Session {
            reservation,
            entries,
            running_jobs: 0,
            residues,
            pairs: pairs.into(),
            slots: slots.into(),
            unstored,
            failed_since_begin: 0,
            pair_list: None,
        };
        let id = self.next_id();
        lock(&self.sessions, "sessions")?.insert(id, session);
        Ok(id)
    }

    /// Writes layers `layers` of the session's new blocks from engine memory
    /// (paper Algorithm 1, `store_layer`, for a range). The job's failure
    /// bitmap is indexed like the request given to [`begin_store`](Self::begin_store).
    pub fn submit_store(&self, store: StoreId, layers: Range<u32>) -> Result<JobId> {
        self.check_owner()?;
        let cpu0 = thread_cpu_ns();
        // The registration and the blocks were checked by `begin_store`, and the
        // registration cannot be dropped while the session is open (`ensure_idle`).
        self.check_layers(&layers)?;
        let mut job = {
            let mut sessions = lock(&self.sessions, "sessions")?;
            let s = sessions.get_mut(&store).ok_or(ObjError::Unknown { what: "store", id: store })?;
            let job = if s.failed_since_begin == 0 {
                self.session_job(s, layers)?
            } else {
                self.reduced_job(s, layers)
            };
            s.running_jobs += 1;
            job
        };
        job.session = Some(store);
        self.start_job(job, Vec::new(), cpu0)
    }

    /// A job of every block `begin_store` gave a file, on the session's
    /// registered list (registered now if it is not yet). Without a free
    /// list the job registers its own pairs or copies them, as a load does.
    fn session_job(&self, s: &mut Session, layers: Range<u32>) -> Result<Job> {
        if s.pair_list.is_none() && !s.pairs.is_empty() {
            self.release_pair_lists(None)?;
            match lock(&self.io, "io")?.register_pairs(&s.pairs) {
                Ok(handle) => {
                    s.pair_list = handle;
                    self.counters.pair_registrations.fetch_add(handle.is_some() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "registering a store session's pairs failed; its jobs register their own")
                }
            }
        }
        let residues = s.residues.clone();
        let mut job = Job::new(
            Direction::Store,
            s.pairs.clone(),
            s.slots.clone(),
            residues,
            s.entries.len() as u32,
            layers,
        );
        if s.pair_list.is_some() {
            job.use_session_list(s.pair_list);
        }
        for (i, why) in &s.unstored {
            job.fail_all_slots(&[*i], why);
        }
        Ok(job)
    }

    /// A job of the blocks not failed so far: fewer pairs than the session's
    /// list, so it carries (and registers) its own.
    fn reduced_job(&self, s: &Session, layers: Range<u32>) -> Job {
        let mut pairs = Vec::new();
        let mut slots = Vec::new();
        for (i, e) in s.entries.iter().enumerate() {
            if let Entry::New { file, block, failed: None, .. } = e {
                pairs.push(Pair { file: *file, block: *block });
                slots.push(i as u32);
            }
        }
        let residues = super::job_state::residues(&pairs, self.map.drive_count());
        let mut job =
            Job::new(Direction::Store, pairs.into(), slots.into(), residues, s.entries.len() as u32, layers);
        for (i, e) in s.entries.iter().enumerate() {
            if let Entry::Failed(why) | Entry::New { failed: Some(why), .. } = e {
                job.fail_all_slots(&[i as u32], why);
            }
        }
        job
    }

    /// Frees `ended` (the pair list of a session whose jobs have all finished)
    /// and any list whose release was refused before. The I/O path refuses
    /// while an IOCB still references the list (e.g. a layer whose handover
    /// broke midway, so its IOCBs may still run): such a list is kept and
    /// retried when the next session ends or registers.
    fn release_pair_lists(&self, ended: Option<u64>) -> Result<()> {
        let mut retired = lock(&self.retired_lists, "retired pair lists")?;
        retired.extend(ended);
        if retired.is_empty() {
            return Ok(());
        }
        let mut io = lock(&self.io, "io")?;
        retired.retain(|&handle| match io.unregister_pairs(handle) {
            Ok(()) => false,
            Err(e) => {
                tracing::warn!(handle, error = %e, "a store session's pair list is still referenced; freed later");
                true
            }
        });
        Ok(())
    }

    /// A store job finished some layers: record which blocks now have them.
    pub(super) fn session_layers_done(
        &self,
        store: StoreId,
        slots: &[u32],
        layers: &[(u32, Vec<(u32, FailureKind)>)],
        job_finished: bool,
    ) -> Result<()> {
        let mut sessions = lock(&self.sessions, "sessions")?;
        let Some(s) = sessions.get_mut(&store) else { return Ok(()) };
        for (layer, bad) in layers {
            for (p, &slot) in slots.iter().enumerate() {
                let Some(Entry::New { layers: bits, failed, outcome_unknown, .. }) =
                    s.entries.get_mut(slot as usize)
                else {
                    continue;
                };
                if let Some(&(_, kind)) = bad.iter().find(|(q, _)| *q == p as u32) {
                    if failed.is_none() {
                        s.failed_since_begin += 1;
                    }
                    if kind == FailureKind::Unknown && !*outcome_unknown {
                        *outcome_unknown = true;
                        *failed = Some(format!(
                            "writing layer {layer} ended without a known outcome (the drive may still execute it); \
                             file quarantined"
                        ));
                    }
                    failed.get_or_insert_with(|| format!("writing layer {layer} failed"));
                } else {
                    bits[*layer as usize / 64] |= 1 << (layer % 64);
                }
            }
        }
        if job_finished {
            s.running_jobs = s.running_jobs.saturating_sub(1);
        }
        Ok(())
    }

    /// Makes every block whose layers were all written durable and visible;
    /// the rest are given up (their files freed). Fails, leaving the session
    /// open, while one of its jobs is still running.
    pub fn commit_store(&self, store: StoreId) -> Result<StoreReport> {
        self.check_owner()?;
        let session = self.take_session(store)?;
        // Every job of the session has finished: none of its layers references the list.
        self.release_pair_lists(session.pair_list)?;
        let layers = self.geometry.layers;
        let complete = |bits: &[u64]| (0..layers).all(|l| bits[l as usize / 64] >> (l % 64) & 1 == 1);
        let mut report = StoreReport { files: vec![None; session.entries.len()], ..Default::default() };
        // One verdict per new file, in order; `news[k]` is its entry.
        let mut verdicts = Vec::new();
        let mut news = Vec::new();
        for (i, e) in session.entries.iter().enumerate() {
            match e {
                Entry::New { outcome_unknown: true, failed, .. } => {
                    let why = failed.clone().unwrap_or_else(|| "a write's outcome is unknown".into());
                    report.failed.push((i as u32, why.clone()));
                    verdicts.push(Verdict::Quarantine(why));
                    news.push(i);
                }
                Entry::Present(f) => {
                    report.present += 1;
                    report.files[i] = Some(*f);
                }
                Entry::Failed(why) => report.failed.push((i as u32, why.clone())),
                Entry::New { failed: Some(why), .. } => {
                    report.failed.push((i as u32, why.clone()));
                    verdicts.push(Verdict::GiveUp);
                    news.push(i);
                }
                Entry::New { layers: bits, .. } if complete(bits) => {
                    verdicts.push(Verdict::Commit);
                    news.push(i);
                }
                Entry::New { .. } => {
                    report.failed.push((i as u32, "not every layer was written".into()));
                    verdicts.push(Verdict::GiveUp);
                    news.push(i);
                }
            }
        }
        self.offer_report();
        let results = self.control.settle(session.reservation, &verdicts)?;
        for ((&i, v), res) in news.iter().zip(&verdicts).zip(results) {
            match (v, res) {
                (Verdict::Commit, Ok(())) => {
                    if let Entry::New { file, .. } = session.entries[i] {
                        report.stored += 1;
                        report.files[i] = Some(file);
                    }
                }
                (Verdict::Commit, Err(why)) => report.failed.push((i as u32, why)),
                (Verdict::Quarantine(_), _) => {
                    self.counters.quarantined_files.fetch_add(1, Ordering::Relaxed);
                }
                _ => {}
            }
        }
        report.failed.sort_by_key(|f| f.0);
        self.counters.files_committed.fetch_add(report.stored as u64, Ordering::Relaxed);
        Ok(report)
    }

    /// Gives up a store: every reserved file is freed (or quarantined, if a
    /// write into it may still land).
    pub fn abort_store(&self, store: StoreId) -> Result<()> {
        let session = self.take_session(store)?;
        self.release_pair_lists(session.pair_list)?;
        if self.owner_gone().is_some() {
            // The reservation went with the owner: nothing of it can be committed, and no file
            // is quarantined for the owner's death (the next owner resets the drives first).
            tracing::debug!(store, "store given up after the pool's owner went");
            return Ok(());
        }
        let verdicts: Vec<Verdict> = session
            .entries
            .into_iter()
            .filter_map(|e| match e {
                Entry::New { outcome_unknown: true, failed, .. } => {
                    self.counters.quarantined_files.fetch_add(1, Ordering::Relaxed);
                    Some(Verdict::Quarantine(failed.unwrap_or_default()))
                }
                Entry::New { .. } => Some(Verdict::GiveUp),
                _ => None,
            })
            .collect();
        self.offer_report();
        self.control.settle(session.reservation, &verdicts)?;
        Ok(())
    }

    fn take_session(&self, store: StoreId) -> Result<Session> {
        let mut sessions = lock(&self.sessions, "sessions")?;
        let s = sessions.get(&store).ok_or(ObjError::Unknown { what: "store", id: store })?;
        if s.running_jobs > 0 {
            return Err(ObjError::invalid(
                "store",
                format!("store {store} has {} jobs still running; wait for them first", s.running_jobs),
            ));
        }
        sessions.remove(&store).ok_or(ObjError::Unknown { what: "store", id: store })
    }

    /// Stores a whole request: reserve, write every layer, commit.
    pub fn store_request(
        &self,
        hashes: &[BlockHash],
        blocks: &[u32],
        timeout: Duration,
    ) -> Result<StoreReport> {
        let store = self.begin_store(hashes, blocks)?;
        let job = match self.submit_store(store, 0..self.geometry.layers) {
            Ok(j) => j,
            Err(e) => {
                self.abort_store(store)?;
                return Err(e);
            }
        };
        // On a timeout the job stays until its layers drain, and the reserved files with it.
        self.finish(job, timeout)?;
        self.commit_store(store)
    }

    /// Paper Algorithm 1 `store_layer`: one layer of a store session, waited for.
    pub fn store_layer(&self, store: StoreId, layer: u32, timeout: Duration) -> Result<super::JobStatus> {
        let job = self.submit_store(store, layer..layer + 1)?;
        self.finish(job, timeout)
    }
}
