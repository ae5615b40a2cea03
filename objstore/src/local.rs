//! [`LocalPool`]: the pool's control path in the process that owns its
//! drives (an in-process runtime, or the daemon serving engine processes).
//!
//! It holds the index, the journals, the pins and the open reservations.
//! Lock order: index, then journal (taken alone where possible); pins and
//! reservations are leaf locks.

use crate::control::{ControlStats, Lookup, PoolControl, PoolShape, ReservationId, Reserved, Verdict};
use crate::drives::{Drive, DriveMeta, DriveSpec};
use crate::error::{ObjError, Result};
use crate::hash::{BlockHash, IdentityId};
use crate::index::{FileId, Index, Key, Reserve};
use crate::journal::{DriveJournal, Record, RecordKind, ReplayStats};
use crate::pool::{Pool, PoolOptions};
use crate::stripe::StripeMap;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// The journals and the commit stamp, under one lock.
struct Meta {
    journals: Vec<DriveJournal>,
    stamp: u64,
}

/// An open reservation: the keys of its new files.
struct Resv {
    /// (key, file, gen) of each `Reserved::New`, in order.
    news: Vec<(Key, FileId, u64)>,
}

#[derive(Default)]
struct Counters {
    journal_appends: AtomicU64,
    files_committed: AtomicU64,
    quarantined_files: AtomicU64,
}

pub struct LocalPool {
    id: u128,
    name: String,
    shape: PoolShape,
    drives: Vec<Drive>,
    map: StripeMap,
    meta: Mutex<Meta>,
    index: Mutex<Index>,
    pins: Mutex<HashMap<u64, Vec<FileId>>>,
    reservations: Mutex<HashMap<ReservationId, Resv>>,
    next_id: AtomicU64,
    counters: Counters,
}

fn lock<'a, T>(m: &'a Mutex<T>, what: &'static str) -> Result<MutexGuard<'a, T>> {
    m.lock().map_err(|_| ObjError::Poisoned(what))
}

impl LocalPool {
    /// Opens (or formats, per `opts.mode`) the pool on `drives`, given in
    /// pool order, and replays its journals into the index.
    pub fn open(drives: Vec<DriveSpec>, opts: &PoolOptions) -> Result<LocalPool> {
        let pool = Pool::open(drives, opts)?;
        let records = pool.live_records();
        let mut index = Index::new(pool.map.files())?;
        let mut stamp = 0;
        for r in &records {
            index.restore(r.file, r.key, r.gen)?;
            stamp = stamp.max(r.stamp);
        }
        let name = pool.name();
        let Pool { id, drives, map, journals, replay, formatted } = pool;
        let shape = PoolShape {
            id,
            geometry: opts.geometry,
            journal_pages: map.journal_pages(),
            files: map.files(),
            data_start_lba: map.drives().iter().map(|d| d.data_start_lba).collect(),
            formatted,
            replay,
        };
        tracing::info!(pool = %name, entries = records.len(), "pool open");
        Ok(LocalPool {
            id,
            name,
            shape,
            drives,
            map,
            meta: Mutex::new(Meta { journals, stamp: stamp + 1 }),
            index: Mutex::new(index),
            pins: Mutex::new(HashMap::new()),
            reservations: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            counters: Counters::default(),
        })
    }

    pub fn id(&self) -> u128 {
        self.id
    }
    /// The pool's name in messages (`pool-<id>`).
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn shape(&self) -> &PoolShape {
        &self.shape
    }
    pub fn replay(&self) -> &[ReplayStats] {
        &self.shape.replay
    }
    pub fn stripe_map(&self) -> &StripeMap {
        &self.map
    }
    /// Open reservations and pins (for status reports).
    pub fn open_counts(&self) -> (usize, usize) {
        let r = self.reservations.lock().map_or(0, |r| r.len());
        let p = self.pins.lock().map_or(0, |p| p.len());
        (r, p)
    }

    /// Whether every file in `files` is a new file of one of `reservations`
    /// (what a client may write into).
    pub fn reserved_by(&self, reservations: &[ReservationId], files: &[FileId]) -> bool {
        let Ok(all) = self.reservations.lock() else { return false };
        let mine: std::collections::HashSet<FileId> = reservations
            .iter()
            .filter_map(|id| all.get(id))
            .flat_map(|r| r.news.iter().map(|&(_, f, _)| f))
            .collect();
        files.iter().all(|f| mine.contains(f))
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Appends records to their drives' journals (file `f` → drive `f mod D`),
    /// each drive written and flushed; returns each record's outcome.
    fn append(&self, mut recs: Vec<Record>) -> Result<Vec<std::result::Result<(), String>>> {
        let d = self.map.drive_count();
        let mut meta = lock(&self.meta, "journal")?;
        let Meta { journals, stamp } = &mut *meta;
        for r in &mut recs {
            r.stamp = *stamp;
            *stamp += 1;
        }
        let mut by_drive: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (i, r) in recs.iter().enumerate() {
            by_drive.entry(r.file % d).or_default().push(i);
        }
        let mut out: Vec<std::result::Result<(), String>> = vec![Ok(()); recs.len()];
        let mut dev = DriveMeta(&self.drives);
        for (drive, idx) in by_drive {
            let batch: Vec<Record> = idx.iter().map(|&i| recs[i]).collect();
            self.counters.journal_appends.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = journals[drive as usize].append(&mut dev, &batch) {
                tracing::warn!(drive, error = %e, "journal append failed");
                let why = e.to_string();
                for &i in &idx {
                    out[i] = Err(why.clone());
                }
            }
        }
        Ok(out)
    }

    /// Takes files a write of unknown outcome may still land in out of
    /// service for the rest of the process (see [`Index::quarantine`]).
    fn quarantine(&self, ix: &mut Index, files: Vec<(FileId, u64, String)>) -> Result<()> {
        // Object j of a file lives on drive (file + j) mod D: every drive holds some of it;
        // the reason names the drive and LBA of the command that timed out.
        let drives: Vec<&str> = self.drives.iter().map(|d| d.name()).collect();
        for (file, gen, why) in files {
            ix.quarantine(file)?;
            self.counters.quarantined_files.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(file, gen, ?drives, reason = %why,
                "file quarantined: a write into it may still be executed by the drive; not reused until the pool is reopened");
        }
        Ok(())
    }
}

impl PoolControl for LocalPool {
    fn lookup(&self, identity: IdentityId, hashes: &[BlockHash]) -> Result<Lookup> {
        let files = lock(&self.index, "index")?.lookup(identity, hashes, true);
        if files.is_empty() {
            return Ok(Lookup { pin: 0, files });
        }
        let pin = self.next_id();
        lock(&self.pins, "pins")?.insert(pin, files.clone());
        Ok(Lookup { pin, files })
    }

    fn contains(&self, identity: IdentityId, hashes: &[BlockHash]) -> Result<usize> {
        Ok(lock(&self.index, "index")?.peek(identity, hashes))
    }

    fn unpin(&self, pin: u64) -> Result<()> {
        if pin == 0 {
            return Ok(());
        }
        let files =
            lock(&self.pins, "pins")?.remove(&pin).ok_or(ObjError::Unknown { what: "pin", id: pin })?;
        let mut ix = lock(&self.index, "index")?;
        for f in files {
            ix.unpin(f)?;
        }
        Ok(())
    }

    fn begin_load(&self, identity: IdentityId, files: &[FileId]) -> Result<()> {
        let mut ix = lock(&self.index, "index")?;
        for &f in files {
            match ix.key_of(f) {
                Some((k, _)) if k.identity == identity => {}
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
        for (n, &f) in files.iter().enumerate() {
            if let Err(e) = ix.begin_io(f) {
                for &g in &files[..n] {
                    let _ = ix.end_io(g);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    fn end_load(&self, files: &[FileId]) -> Result<()> {
        let mut ix = lock(&self.index, "index")?;
        for &f in files {
            ix.end_io(f)?;
        }
        Ok(())
    }

    fn reserve(&self, identity: IdentityId, hashes: &[BlockHash]) -> Result<(ReservationId, Vec<Reserved>)> {
        let mut out = Vec::with_capacity(hashes.len());
        let mut news = Vec::new();
        let mut invalidate = Vec::new();
        {
            let mut ix = lock(&self.index, "index")?;
            for (i, &hash) in hashes.iter().enumerate() {
                let key = Key { identity, hash };
                out.push(match ix.reserve(key) {
                    None => {
                        let s = ix.stats();
                        Reserved::Failed(format!(
                            "pool full: all {} files are pinned, in flight, being written or quarantined ({} quarantined)",
                            s.files, s.quarantined
                        ))
                    }
                    Some(Reserve::Present(f)) => Reserved::Present(f),
                    Some(Reserve::New { file, gen, invalidate: inv, .. }) => {
                        if inv {
                            invalidate.push((i, file, gen));
                        }
                        Reserved::New { file, gen }
                    }
                });
            }
        }
        if !invalidate.is_empty() {
            let recs: Vec<Record> = invalidate
                .iter()
                .map(|&(_, file, gen)| Record {
                    kind: RecordKind::Invalidate,
                    file,
                    gen,
                    key: Key::NONE,
                    stamp: 0,
                })
                .collect();
            let results = self.append(recs)?;
            let mut ix = lock(&self.index, "index")?;
            for (&(i, file, _), res) in invalidate.iter().zip(results) {
                match res {
                    Ok(()) => ix.mark_unclaimed(file)?,
                    Err(why) => {
                        ix.abort(file)?;
                        out[i] = Reserved::Failed(format!("invalidating the evicted entry failed: {why}"));
                    }
                }
            }
        }
        for (i, r) in out.iter().enumerate() {
            if let Reserved::New { file, gen } = r {
                news.push((Key { identity, hash: hashes[i] }, *file, *gen));
            }
        }
        let id = self.next_id();
        lock(&self.reservations, "reservations")?.insert(id, Resv { news });
        Ok((id, out))
    }

    fn settle(
        &self,
        id: ReservationId,
        verdicts: &[Verdict],
    ) -> Result<Vec<std::result::Result<(), String>>> {
        let resv = {
            let mut all = lock(&self.reservations, "reservations")?;
            let r = all.get(&id).ok_or(ObjError::Unknown { what: "reservation", id })?;
            if r.news.len() != verdicts.len() {
                return Err(ObjError::invalid(
                    "verdicts",
                    format!(
                        "reservation {id} has {} new files, {} verdicts given",
                        r.news.len(),
                        verdicts.len()
                    ),
                ));
            }
            all.remove(&id).ok_or(ObjError::Unknown { what: "reservation", id })?
        };
        let mut out: Vec<std::result::Result<(), String>> = vec![Ok(()); verdicts.len()];
        let mut commit: Vec<usize> = Vec::new();
        let mut give_up: Vec<FileId> = Vec::new();
        let mut quarantine = Vec::new();
        for (i, (v, &(_, file, gen))) in verdicts.iter().zip(&resv.news).enumerate() {
            match v {
                Verdict::Commit => commit.push(i),
                Verdict::GiveUp => give_up.push(file),
                Verdict::Quarantine(why) => quarantine.push((file, gen, why.clone())),
            }
        }
        if !commit.is_empty() {
            // Data first: §6.8 Flush makes every completed write non-volatile,
            // whichever queue pair (and process) wrote it.
            let flushed: Vec<Result<()>> = self.drives.iter().map(|d| d.flush()).collect();
            if let Some(Err(e)) = flushed.into_iter().find(|r| r.is_err()) {
                let why = format!("flushing the data failed: {e}");
                for &i in &commit {
                    out[i] = Err(why.clone());
                    give_up.push(resv.news[i].1);
                }
                commit.clear();
            }
        }
        if !commit.is_empty() {
            {
                let mut ix = lock(&self.index, "index")?;
                for &i in &commit {
                    ix.mark_claimed(resv.news[i].1)?;
                }
            }
            let recs: Vec<Record> = commit
                .iter()
                .map(|&i| {
                    let (key, file, gen) = resv.news[i];
                    Record { kind: RecordKind::Insert, file, gen, key, stamp: 0 }
                })
                .collect();
            let results = self.append(recs)?;
            let mut ix = lock(&self.index, "index")?;
            for (&i, res) in commit.iter().zip(results) {
                let file = resv.news[i].1;
                match res {
                    Ok(()) => {
                        ix.commit(file)?;
                        self.counters.files_committed.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(why) => {
                        out[i] = Err(format!("journal append failed: {why}"));
                        give_up.push(file);
                    }
                }
            }
        }
        let mut ix = lock(&self.index, "index")?;
        for f in give_up {
            ix.abort(f)?;
        }
        self.quarantine(&mut ix, quarantine)?;
        Ok(out)
    }

    fn stats(&self) -> Result<ControlStats> {
        let c = &self.counters;
        Ok(ControlStats {
            index: lock(&self.index, "index")?.stats(),
            journal_appends: c.journal_appends.load(Ordering::Relaxed),
            files_committed: c.files_committed.load(Ordering::Relaxed),
            quarantined_files: c.quarantined_files.load(Ordering::Relaxed),
        })
    }
}

impl Drop for LocalPool {
    fn drop(&mut self) {
        // Nothing is written on the way out: every durable state was reached
        // by an explicit commit, so dropping the pool is a crash-equivalent stop.
        tracing::debug!(pool = %self.name, "pool closed");
    }
}
