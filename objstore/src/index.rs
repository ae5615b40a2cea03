//! The CPU-side index: which GPU file holds which chunk, who is using it,
//! and which file to give up next.
//!
//! A file is `Free`, `Reserved` (being written by a store; not visible to
//! lookups), `Valid` (its key answers lookups) or `Quarantined` (a write into
//! it may still land; never used again in this process). A valid file with no pins
//! and no I/O in flight sits in the LRU list and may be evicted; pinned or
//! busy files are taken out of the list, so eviction never has to skip them.
//! All operations are O(log n) or better in the number of files.

use crate::error::{ObjError, Result};
use crate::hash::{BlockHash, IdentityId};
use std::collections::{BTreeMap, HashMap};

/// A GPU file: one KV block's worth of objects on the drives.
pub type FileId = u32;

/// What a file holds: a chained hash under a cache identity.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, serde::Serialize, serde::Deserialize)]
pub struct Key {
    pub identity: IdentityId,
    pub hash: BlockHash,
}

impl Key {
    /// The key field of records that name no key (invalidations).
    pub const NONE: Key = Key { identity: IdentityId(0), hash: BlockHash(0) };
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Free,
    Reserved(Key),
    Valid(Key),
    /// A write into the file timed out (or otherwise ended without a known
    /// outcome): the device may still execute it. See [`Index::quarantine`].
    Quarantined,
}

#[derive(Clone, Copy, Debug)]
struct FileMeta {
    state: State,
    /// Bumped every time the file is given a new key; recorded in the journal.
    gen: u64,
    pins: u32,
    io: u32,
    /// Last use; the file's position in `lru` while it is there.
    tick: u64,
    /// The journal may hold a live Insert for this file (it was valid, or an
    /// Insert append was attempted). Such a file's data may only be
    /// overwritten after an Invalidate record for it is durable.
    claim: bool,
}

/// The outcome of asking for a file to store `key` in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Reserve {
    /// `key` is already stored (or being stored) in this file: nothing to write.
    Present(FileId),
    /// Write the data into `file`, generation `gen`. `evicted` is the key the
    /// file held until now. If `invalidate` is set, an Invalidate record for
    /// the file must be durable before its data is overwritten.
    New { file: FileId, gen: u64, evicted: Option<Key>, invalidate: bool },
}

/// Counts for stats and error messages.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct IndexStats {
    pub files: u32,
    pub free: u32,
    pub valid: u32,
    pub reserved: u32,
    /// Valid files that could be evicted now.
    pub evictable: u32,
    /// Files withheld from reuse because a write into them may still land
    /// (see [`Index::quarantine`]); they count as used.
    pub quarantined: u32,
    /// Files with at least one pin.
    pub pinned: u32,
    /// Files with I/O in flight.
    pub busy: u32,
    pub evictions: u64,
}

pub struct Index {
    files: Vec<FileMeta>,
    map: HashMap<Key, FileId>,
    pending: HashMap<Key, FileId>,
    lru: BTreeMap<u64, FileId>,
    /// Free files, lowest id on top.
    free: Vec<FileId>,
    tick: u64,
    evictions: u64,
}

impl Index {
    /// An index of `files` free files. The count comes from the drives'
    /// capacity or a superblock, so its memory is allocated fallibly: a
    /// count this process cannot hold is an error, not an abort.
    pub fn new(files: u32) -> Result<Self> {
        let meta = FileMeta { state: State::Free, gen: 0, pins: 0, io: 0, tick: 0, claim: false };
        let oom = |e: std::collections::TryReserveError| {
            ObjError::invalid("files", format!("cannot allocate the index of {files} pool files: {e}"))
        };
        let mut metas = Vec::new();
        metas.try_reserve_exact(files as usize).map_err(oom)?;
        metas.resize(files as usize, meta);
        let mut free = Vec::new();
        free.try_reserve_exact(files as usize).map_err(oom)?;
        free.extend((0..files).rev());
        Ok(Index {
            files: metas,
            map: HashMap::new(),
            pending: HashMap::new(),
            lru: BTreeMap::new(),
            free,
            tick: 0,
            evictions: 0,
        })
    }

    fn meta(&self, file: FileId) -> Result<&FileMeta> {
        self.files.get(file as usize).ok_or(ObjError::Unknown { what: "file", id: file as u64 })
    }
    fn meta_mut(&mut self, file: FileId) -> Result<&mut FileMeta> {
        self.files.get_mut(file as usize).ok_or(ObjError::Unknown { what: "file", id: file as u64 })
    }

    fn next_tick(&mut self) -> u64 {
        self.tick += 1;
        self.tick
    }

    fn evictable(m: &FileMeta) -> bool {
        matches!(m.state, State::Valid(_)) && m.pins == 0 && m.io == 0
    }

    /// Puts a file back in the LRU list if nothing holds it.
    fn settle(&mut self, file: FileId) {
        let m = self.files[file as usize];
        if Self::evictable(&m) {
            self.lru.insert(m.tick, file);
        }
    }

    /// Marks a use: the file moves to the most-recently-used end.
    fn touch(&mut self, file: FileId) {
        let old = self.files[file as usize].tick;
        self.lru.remove(&old);
        let t = self.next_tick();
        self.files[file as usize].tick = t;
        self.settle(file);
    }

    /// Installs an entry found in the journal at open. Replaying in journal
    /// order leaves the most recently committed files most recently used.
    pub fn restore(&mut self, file: FileId, key: Key, gen: u64) -> Result<()> {
        let m = *self.meta(file)?;
        if m.state != State::Free || self.map.contains_key(&key) {
            tracing::warn!(file, "journal names a file or key twice; keeping the first entry");
            return Ok(());
        }
        self.free.retain(|&f| f != file);
        let t = self.next_tick();
        let m = self.meta_mut(file)?;
        *m = FileMeta { state: State::Valid(key), gen, pins: 0, io: 0, tick: t, claim: true };
        self.map.insert(key, file);
        self.settle(file);
        Ok(())
    }

    /// Files of the longest prefix of `hashes` stored under `identity`; each
    /// hit is pinned (`pin`) and becomes most recently used.
    pub fn lookup(&mut self, identity: IdentityId, hashes: &[BlockHash], pin: bool) -> Vec<FileId> {
        let mut hits = Vec::new();
        for &hash in hashes {
            let Some(&file) = self.map.get(&Key { identity, hash }) else { break };
            hits.push(file);
        }
        for &f in &hits {
            if pin {
                self.files[f as usize].pins += 1;
            }
            self.touch(f);
        }
        hits
    }

    /// Length of the stored prefix of `hashes`, without pinning or counting as a use.
    pub fn peek(&self, identity: IdentityId, hashes: &[BlockHash]) -> usize {
        hashes.iter().take_while(|&&hash| self.map.contains_key(&Key { identity, hash })).count()
    }

    /// The key a valid file holds, with its generation.
    pub fn key_of(&self, file: FileId) -> Option<(Key, u64)> {
        match self.files.get(file as usize)?.state {
            State::Valid(k) => Some((k, self.files[file as usize].gen)),
            _ => None,
        }
    }

    pub fn pin(&mut self, file: FileId) -> Result<()> {
        let m = self.meta_mut(file)?;
        if !matches!(m.state, State::Valid(_)) {
            return Err(ObjError::invalid(
                "file",
                format!("file {file} holds no entry and cannot be pinned"),
            ));
        }
        m.pins += 1;
        let tick = m.tick;
        self.lru.remove(&tick);
        Ok(())
    }

    pub fn unpin(&mut self, file: FileId) -> Result<()> {
        let m = self.meta_mut(file)?;
        if m.pins == 0 {
            return Err(ObjError::invalid("pin", format!("file {file} is not pinned")));
        }
        m.pins -= 1;
        self.settle(file);
        Ok(())
    }

    /// I/O on `file` starts: it cannot be evicted until [`end_io`](Self::end_io).
    pub fn begin_io(&mut self, file: FileId) -> Result<()> {
        let m = self.meta_mut(file)?;
        m.io += 1;
        let tick = m.tick;
        self.lru.remove(&tick);
        Ok(())
    }

    pub fn end_io(&mut self, file: FileId) -> Result<()> {
        let m = self.meta_mut(file)?;
        if m.io == 0 {
            return Err(ObjError::invalid("file", format!("file {file} has no I/O in flight")));
        }
        m.io -= 1;
        self.settle(file);
        Ok(())
    }

    /// A file to store `key` in: the lowest free file, else the least
    /// recently used unpinned idle one. `None` when every file is held.
    pub fn reserve(&mut self, key: Key) -> Option<Reserve> {
        if let Some(&f) = self.map.get(&key).or_else(|| self.pending.get(&key)) {
            return Some(Reserve::Present(f));
        }
        let (file, evicted) = if let Some(f) = self.free.pop() {
            (f, None)
        } else {
            let (&tick, &f) = self.lru.iter().next()?;
            self.lru.remove(&tick);
            let m = self.files[f as usize];
            let State::Valid(old) = m.state else { return None };
            self.map.remove(&old);
            self.evictions += 1;
            (f, Some(old))
        };
        let m = &mut self.files[file as usize];
        m.gen += 1;
        m.state = State::Reserved(key);
        let (gen, invalidate) = (m.gen, m.claim);
        self.pending.insert(key, file);
        Some(Reserve::New { file, gen, evicted, invalidate })
    }

    /// An Insert record for `file` is about to be appended: until an
    /// Invalidate is durable, the journal may claim the file.
    pub fn mark_claimed(&mut self, file: FileId) -> Result<()> {
        self.meta_mut(file)?.claim = true;
        Ok(())
    }

    /// An Invalidate record for `file` is durable: its data may be overwritten.
    pub fn mark_unclaimed(&mut self, file: FileId) -> Result<()> {
        self.meta_mut(file)?.claim = false;
        Ok(())
    }

    /// The reserved file's data and journal entry are durable: make it visible.
    pub fn commit(&mut self, file: FileId) -> Result<()> {
        let State::Reserved(key) = self.meta(file)?.state else {
            return Err(ObjError::invalid("file", format!("file {file} is not reserved")));
        };
        self.pending.remove(&key);
        self.files[file as usize].state = State::Valid(key);
        self.map.insert(key, file);
        self.touch(file);
        Ok(())
    }

    /// A write into the reserved `file` ended without a known outcome (it
    /// timed out, its completion was lost, its queue or controller died):
    /// the drive may still execute it and overwrite whatever the file holds
    /// next ("late DMA"). The file is taken out of service for the rest of
    /// this process — not free, not committed, never evicted (it is not
    /// valid, so it is never in the LRU list) — and counts as used when the
    /// pool is full.
    ///
    /// Nothing is journaled: the file's new generation never got an Insert
    /// record (and if it held an entry before, its Invalidate is already
    /// durable), so a store opened later finds it free. That is safe because
    /// bringing a controller up resets it first (CC.EN = 0, §7.3.2: the
    /// controller stops processing outstanding commands): a new process gets
    /// a reset function from VFIO and `Controller::new` disables the
    /// controller before anything else, and an emulated controller forgets
    /// deferred commands on reset. Reopening a pool in the same process
    /// without bringing its controllers up again would not be safe.
    pub fn quarantine(&mut self, file: FileId) -> Result<()> {
        let State::Reserved(key) = self.meta(file)?.state else {
            return Err(ObjError::invalid("file", format!("file {file} is not reserved")));
        };
        self.pending.remove(&key);
        self.files[file as usize].state = State::Quarantined;
        Ok(())
    }

    /// The store into a reserved file failed: the file is free again.
    pub fn abort(&mut self, file: FileId) -> Result<()> {
        let State::Reserved(key) = self.meta(file)?.state else {
            return Err(ObjError::invalid("file", format!("file {file} is not reserved")));
        };
        self.pending.remove(&key);
        self.files[file as usize].state = State::Free;
        self.free.push(file);
        Ok(())
    }

    pub fn stats(&self) -> IndexStats {
        let mut s =
            IndexStats { files: self.files.len() as u32, evictions: self.evictions, ..Default::default() };
        for m in &self.files {
            match m.state {
                State::Free => s.free += 1,
                State::Reserved(_) => s.reserved += 1,
                State::Valid(_) => s.valid += 1,
                State::Quarantined => s.quarantined += 1,
            }
            s.pinned += (m.pins > 0) as u32;
            s.busy += (m.io > 0) as u32;
        }
        s.evictable = self.lru.len() as u32;
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u128) -> Key {
        Key { identity: IdentityId(1), hash: BlockHash(i) }
    }

    fn store(ix: &mut Index, k: Key) -> FileId {
        match ix.reserve(k).unwrap() {
            Reserve::New { file, .. } => {
                ix.mark_claimed(file).unwrap();
                ix.commit(file).unwrap();
                file
            }
            Reserve::Present(f) => f,
        }
    }

    #[test]
    fn lookup_returns_the_contiguous_prefix() {
        let mut ix = Index::new(8).unwrap();
        for i in [0, 1, 2, 4] {
            store(&mut ix, key(i));
        }
        let hashes: Vec<BlockHash> = (0..5).map(BlockHash).collect();
        assert_eq!(ix.lookup(IdentityId(1), &hashes, false), vec![0, 1, 2]);
        assert_eq!(ix.lookup(IdentityId(2), &hashes, false), Vec::<FileId>::new());
    }

    #[test]
    fn eviction_follows_lru_and_skips_pins() {
        let mut ix = Index::new(3).unwrap();
        let f: Vec<FileId> = (0..3).map(|i| store(&mut ix, key(i))).collect();
        // Use key 0 again: key 1 becomes the oldest.
        ix.lookup(IdentityId(1), &[BlockHash(0)], false);
        // Pin key 1: key 2 becomes the victim.
        assert_eq!(ix.lookup(IdentityId(1), &[BlockHash(1)], true), vec![f[1]]);
        ix.lookup(IdentityId(1), &[BlockHash(0)], false);
        match ix.reserve(key(10)).unwrap() {
            Reserve::New { file, evicted: Some(old), invalidate: true, .. } => {
                assert_eq!((file, old), (f[2], key(2)));
                ix.commit(file).unwrap();
            }
            r => panic!("{r:?}"),
        }
        // Next victim is key 0 (key 1 still pinned), then after unpin key 1.
        assert!(matches!(ix.reserve(key(11)), Some(Reserve::New { evicted: Some(k), .. }) if k == key(0)));
        assert_eq!(ix.lookup(IdentityId(1), &[BlockHash(10)], true), vec![f[2]]);
        assert!(
            ix.reserve(key(12)).is_none(),
            "keys 1 and 10 pinned, key 11 being written: nothing to evict"
        );
        ix.unpin(f[1]).unwrap();
        assert!(matches!(ix.reserve(key(12)), Some(Reserve::New { evicted: Some(k), .. }) if k == key(1)));
        assert!(ix.unpin(f[1]).is_err(), "double unpin is an error");
    }

    #[test]
    fn io_refs_block_eviction_and_reservations_dedupe() {
        let mut ix = Index::new(1).unwrap();
        let f = store(&mut ix, key(1));
        ix.begin_io(f).unwrap();
        assert!(ix.reserve(key(2)).is_none());
        ix.end_io(f).unwrap();
        let Some(Reserve::New { file, gen, evicted, invalidate }) = ix.reserve(key(2)) else { panic!() };
        assert_eq!((file, gen, evicted, invalidate), (f, 2, Some(key(1)), true));
        assert_eq!(ix.reserve(key(2)), Some(Reserve::Present(f)), "a key being stored is not stored twice");
        assert!(ix.lookup(IdentityId(1), &[BlockHash(2)], false).is_empty(), "reserved files are invisible");
        ix.mark_unclaimed(file).unwrap(); // the Invalidate is durable
        ix.abort(file).unwrap();
        assert_eq!(ix.stats().free, 1);
        let Some(Reserve::New { file, invalidate: false, .. }) = ix.reserve(key(3)) else { panic!() };
        ix.mark_claimed(file).unwrap(); // an Insert append was tried and failed
        ix.abort(file).unwrap();
        let Some(Reserve::New { invalidate, .. }) = ix.reserve(key(4)) else { panic!() };
        assert!(invalidate, "a file the journal may claim needs an Invalidate before reuse");
        assert!(ix.lookup(IdentityId(1), &[BlockHash(1)], false).is_empty(), "the evicted key is gone");
    }

    #[test]
    fn quarantined_files_are_never_reused_nor_evicted() {
        let mut ix = Index::new(2).unwrap();
        let Some(Reserve::New { file: q, .. }) = ix.reserve(key(1)) else { panic!() };
        ix.quarantine(q).unwrap();
        assert!(ix.lookup(IdentityId(1), &[BlockHash(1)], false).is_empty(), "a quarantined key is a miss");
        assert!(ix.abort(q).is_err() && ix.commit(q).is_err() && ix.pin(q).is_err());
        let s = ix.stats();
        assert_eq!((s.quarantined, s.free, s.reserved, s.valid), (1, 1, 0, 0));
        // The key may be stored again, in another file.
        let other = store(&mut ix, key(1));
        assert_ne!(other, q);
        // The pool is full: the only candidate is the valid file, never the quarantined one.
        let Some(Reserve::New { file, evicted: Some(old), .. }) = ix.reserve(key(2)) else { panic!() };
        assert_eq!((file, old), (other, key(1)));
        ix.commit(file).unwrap();
        ix.pin(file).unwrap();
        assert!(ix.reserve(key(3)).is_none(), "one file pinned, one quarantined: nothing to give");
    }

    #[test]
    fn restore_rebuilds_entries() {
        let mut ix = Index::new(4).unwrap();
        ix.restore(2, key(7), 5).unwrap();
        ix.restore(3, key(7), 6).unwrap(); // duplicate key ignored
        assert_eq!(ix.lookup(IdentityId(1), &[BlockHash(7)], false), vec![2]);
        assert_eq!(ix.key_of(2), Some((key(7), 5)));
        assert_eq!(ix.stats().free, 3);
        assert!(matches!(ix.reserve(key(8)), Some(Reserve::New { file: 0, .. })));
    }
}
