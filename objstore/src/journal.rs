//! The index journal: which file holds which key, durably, one journal per drive.
//!
//! File `f`'s records go to the journal of drive `f mod D`, so every drive
//! replays its own files and no ordering is needed between drives. A
//! journal is two halves of `half_pages` 4-KiB pages. The current half starts
//! with a *snapshot* (the live entries at the time it was started, at least
//! one page) and continues with appended pages. When an append does not
//! fit, the live entries are written as a snapshot into the other half with
//! the next epoch, flushed, and only then used; the old half stays intact
//! until the next switch, so a crash in the middle of a switch falls back to it.
//!
//! Page layout (4096 bytes):
//!
//! ```text
//!  0 magic "TJNL"  4 version u16  6 flags u16 (bit 0: snapshot page)
//!  8 pool tag u64 (low half of the pool id)
//! 16 epoch u64    24 seq u32 (page index in the half)  28 records u16  30 drive u16
//! 32 pages in this page's run u32      36 CRC-32 of the page with this field zero
//! 40 digest of the previous page of this half (0 on page 0) u64
//! 48 nonce u64 (different for every page written)
//! 56 first page of this page's run u32  60 zero
//! 64 records, 56 bytes each:
//!      0 kind u8 (1 insert, 2 invalidate)  4 file u32  8 generation u64
//!     16 identity u128  32 hash u128  48 stamp u64 (commit order across drives)
//! ```
//!
//! A *run* is the pages of one append (or of one snapshot), written with one
//! command; its records count only if every page of the run is valid, so an
//! append is all or nothing. Replay picks the half with the highest epoch
//! whose snapshot run is complete, then reads appended runs until the first
//! page that fails any check (magic, pool, drive, epoch, seq, run, CRC, or
//! the previous-page digest). A torn or corrupt tail is dropped: those
//! entries are misses, never wrong bytes. The digest chain keeps a stale page, left behind a failed append
//! that was later overwritten by a shorter one, from being read as part of
//! the log; the nonce makes two writes of the same records differ.

use crate::codec::crc_with_hole;
use crate::error::{ObjError, Result};
use crate::hash::{BlockHash, Hasher128, IdentityId};
use crate::index::{FileId, Key};
use crate::stripe::META_BYTES;
use std::collections::BTreeMap;
use zerocopy::little_endian::{U128, U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

pub const PAGE: usize = META_BYTES as usize;
const MAGIC: [u8; 4] = *b"TJNL";
const VERSION: u16 = 1;
const HEADER: usize = std::mem::size_of::<RawHeader>();
const RECORD: usize = std::mem::size_of::<RawRecord>();
/// Records in one journal page.
pub const RECORDS_PER_PAGE: usize = (PAGE - HEADER) / RECORD;
const CRC_AT: usize = std::mem::offset_of!(RawHeader, crc);

/// A page header's bytes: the one definition of its layout (module docs).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct RawHeader {
    magic: [u8; 4],
    version: U16,
    flags: U16,
    pool_tag: U64,
    epoch: U64,
    seq: U32,
    records: U16,
    drive: U16,
    run_pages: U32,
    crc: U32,
    prev: U64,
    nonce: U64,
    run_first: U32,
    _zero: [u8; 4],
}

/// A record's bytes (module docs).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct RawRecord {
    kind: u8,
    _zero: [u8; 3],
    file: U32,
    gen: U64,
    identity: U128,
    hash: U128,
    stamp: U64,
}

/// A whole journal page.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct RawPage {
    header: RawHeader,
    records: [RawRecord; RECORDS_PER_PAGE],
}

const _: () = assert!(HEADER == 64 && RECORD == 56 && CRC_AT == 36);
const _: () = assert!(std::mem::offset_of!(RawHeader, run_first) == 56);
const _: () = assert!(std::mem::offset_of!(RawRecord, stamp) == 48);
const _: () = assert!(std::mem::size_of::<RawPage>() == PAGE);
const FLAG_SNAPSHOT: u16 = 1;
/// Pages read per device call during replay.
const READ_BATCH: u32 = 256;

#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize)]
pub enum RecordKind {
    /// `file` holds `key` at generation `gen`; its data is durable.
    Insert,
    /// `file`'s entry of generation `gen` (or older) is gone; its data may be overwritten.
    Invalidate,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize)]
pub struct Record {
    pub kind: RecordKind,
    pub file: FileId,
    pub gen: u64,
    pub key: Key,
    pub stamp: u64,
}

impl Record {
    fn encode(&self) -> RawRecord {
        RawRecord {
            kind: if self.kind == RecordKind::Insert { 1 } else { 2 },
            _zero: [0; 3],
            file: self.file.into(),
            gen: self.gen.into(),
            identity: self.key.identity.0.into(),
            hash: self.key.hash.0.into(),
            stamp: self.stamp.into(),
        }
    }
    fn decode(r: &RawRecord) -> Option<Record> {
        let kind = match r.kind {
            1 => RecordKind::Insert,
            2 => RecordKind::Invalidate,
            _ => return None,
        };
        Some(Record {
            kind,
            file: r.file.get(),
            gen: r.gen.get(),
            key: Key { identity: IdentityId(r.identity.get()), hash: BlockHash(r.hash.get()) },
            stamp: r.stamp.get(),
        })
    }
}

/// Block access the journal needs; implemented over the drives' queue pairs
/// and, in tests, over memory.
pub trait MetaDev {
    fn read(&mut self, drive: u32, lba: u64, bytes: usize) -> Result<Vec<u8>>;
    fn write(&mut self, drive: u32, lba: u64, data: &[u8]) -> Result<()>;
    fn flush(&mut self, drive: u32) -> Result<()>;
}

/// Where one drive's journal lives.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct JournalPlace {
    pub drive: u32,
    pub lba_size: u32,
    /// First LBA of half 0 and half 1.
    pub half_lba: [u64; 2],
    pub half_pages: u32,
}

impl JournalPlace {
    fn page_lba(&self, half: u32, page: u32) -> u64 {
        self.half_lba[half as usize] + page as u64 * (PAGE as u64 / self.lba_size as u64)
    }
}

/// What replay found on one drive.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct ReplayStats {
    pub epoch: u64,
    pub pages: u32,
    pub records: u64,
    /// Pages of this pool and epoch that failed a check: a torn or corrupt tail.
    pub dropped_pages: u32,
    /// Records naming files that do not belong to this drive's journal.
    pub foreign_records: u64,
}

/// One drive's journal: where the next page goes and what is durable.
pub struct DriveJournal {
    place: JournalPlace,
    pool_tag: u64,
    half: u32,
    epoch: u64,
    next: u32,
    prev_digest: u64,
    /// Durable entries of this drive's files (inserts only).
    live: BTreeMap<FileId, Record>,
    nonce: u64,
    /// A switch failed: the other half may hold a complete snapshot of a
    /// higher epoch (a write reported as failed may still have landed), so
    /// appending to the current half could be shadowed by it. The next
    /// append switches again, rewriting that half.
    must_switch: bool,
}

fn digest(page: &[u8]) -> u64 {
    let mut h = Hasher128::new();
    h.write(page);
    h.finish() as u64
}

struct PageHeader {
    flags: u16,
    pool_tag: u64,
    epoch: u64,
    seq: u32,
    count: u16,
    drive: u16,
    run_pages: u32,
    run_first: u32,
    prev: u64,
    /// Decoded pages only: the stored CRC matches the page.
    crc_ok: bool,
}

impl DriveJournal {
    /// A fresh journal: an empty snapshot at page 0 of half 0, epoch 1.
    pub fn format(dev: &mut dyn MetaDev, place: JournalPlace, pool_tag: u64, nonce: u64) -> Result<Self> {
        let mut j = DriveJournal {
            place,
            pool_tag,
            half: 1,
            epoch: 0,
            next: 0,
            prev_digest: 0,
            live: BTreeMap::new(),
            nonce,
            must_switch: false,
        };
        j.switch_half(dev)?;
        Ok(j)
    }

    pub fn live(&self) -> &BTreeMap<FileId, Record> {
        &self.live
    }
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
    /// Pages still free in the current half.
    pub fn free_pages(&self) -> u32 {
        self.place.half_pages - self.next
    }

    fn next_nonce(&mut self) -> u64 {
        self.nonce = self.nonce.wrapping_mul(0x5851_f42d_4c95_7f2d).wrapping_add(0x1405_7b7e_f767_814f);
        self.nonce
    }

    fn encode_page(&mut self, h: &PageHeader, records: &[Record]) -> Vec<u8> {
        let nonce = self.next_nonce();
        let mut page = RawPage::new_zeroed();
        page.header = RawHeader {
            magic: MAGIC,
            version: VERSION.into(),
            flags: h.flags.into(),
            pool_tag: h.pool_tag.into(),
            epoch: h.epoch.into(),
            seq: h.seq.into(),
            records: (records.len() as u16).into(),
            drive: h.drive.into(),
            run_pages: h.run_pages.into(),
            crc: 0.into(),
            prev: h.prev.into(),
            nonce: nonce.into(),
            run_first: h.run_first.into(),
            _zero: [0; 4],
        };
        for (dst, r) in page.records.iter_mut().zip(records) {
            *dst = r.encode();
        }
        page.header.crc = crc_with_hole(page.as_bytes(), CRC_AT).into();
        page.as_bytes().to_vec()
    }

    fn decode_header(page: &[u8]) -> Option<PageHeader> {
        let (raw, _) = RawPage::ref_from_prefix(page).ok()?;
        let h = &raw.header;
        if h.magic != MAGIC || h.version.get() != VERSION {
            return None;
        }
        Some(PageHeader {
            flags: h.flags.get(),
            pool_tag: h.pool_tag.get(),
            epoch: h.epoch.get(),
            seq: h.seq.get(),
            count: h.records.get(),
            drive: h.drive.get(),
            run_pages: h.run_pages.get(),
            run_first: h.run_first.get(),
            prev: h.prev.get(),
            crc_ok: h.crc.get() == crc_with_hole(raw.as_bytes(), CRC_AT),
        })
    }

    /// Encodes `records` as one run at pages `first..` (of the next epoch for
    /// a snapshot), chained from `prev`.
    fn encode_run(
        &mut self,
        records: &[Record],
        first: u32,
        snapshot: bool,
        mut prev: u64,
    ) -> (Vec<u8>, u64) {
        let mut out = Vec::new();
        let chunks: Vec<&[Record]> =
            if records.is_empty() { vec![&[]] } else { records.chunks(RECORDS_PER_PAGE).collect() };
        let run_pages = chunks.len() as u32;
        for (i, chunk) in chunks.into_iter().enumerate() {
            let h = PageHeader {
                flags: if snapshot { FLAG_SNAPSHOT } else { 0 },
                pool_tag: self.pool_tag,
                epoch: self.epoch_for(snapshot),
                seq: first + i as u32,
                count: chunk.len() as u16,
                drive: self.place.drive as u16,
                run_pages,
                run_first: first,
                prev,
                crc_ok: true,
            };
            let page = self.encode_page(&h, chunk);
            prev = digest(&page);
            out.extend_from_slice(&page);
        }
        (out, prev)
    }

    fn epoch_for(&self, snapshot: bool) -> u64 {
        if snapshot {
            self.epoch + 1
        } else {
            self.epoch
        }
    }

    fn pages_for(records: usize) -> u32 {
        records.div_ceil(RECORDS_PER_PAGE).max(1) as u32
    }

    /// Writes the live entries as a snapshot into the other half, flushes,
    /// and makes that half current.
    fn switch_half(&mut self, dev: &mut dyn MetaDev) -> Result<()> {
        let records: Vec<Record> = self.live.values().copied().collect();
        let pages = Self::pages_for(records.len());
        if pages > self.place.half_pages {
            return Err(ObjError::drive(
                format!("pool drive {}", self.place.drive),
                format!(
                    "journal half of {} pages cannot hold a snapshot of {} entries",
                    self.place.half_pages,
                    records.len()
                ),
            ));
        }
        let other = 1 - self.half;
        let (bytes, last) = self.encode_run(&records, 0, true, 0);
        self.must_switch = true;
        dev.write(self.place.drive, self.place.page_lba(other, 0), &bytes)?;
        dev.flush(self.place.drive)?;
        self.must_switch = false;
        self.half = other;
        self.epoch += 1;
        self.next = pages;
        self.prev_digest = last;
        tracing::debug!(drive = self.place.drive, epoch = self.epoch, pages, "journal switched halves");
        Ok(())
    }

    /// Appends `records` durably (written and flushed). On error the records
    /// are not applied here, but may have landed: until the next successful
    /// append (which overwrites or shadows them) a replay may or may not see
    /// them. Callers treat a failed Insert as a possible claim and a failed
    /// Invalidate as not done.
    pub fn append(&mut self, dev: &mut dyn MetaDev, records: &[Record]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let pages = Self::pages_for(records.len());
        if self.must_switch || self.next + pages > self.place.half_pages {
            self.switch_half(dev)?;
            if self.next + pages > self.place.half_pages {
                return Err(ObjError::drive(
                    format!("pool drive {}", self.place.drive),
                    format!(
                        "{} journal records do not fit a {}-page journal half",
                        records.len(),
                        self.place.half_pages
                    ),
                ));
            }
        }
        let (bytes, last) = self.encode_run(records, self.next, false, self.prev_digest);
        dev.write(self.place.drive, self.place.page_lba(self.half, self.next), &bytes)?;
        dev.flush(self.place.drive)?;
        self.next += pages;
        self.prev_digest = last;
        for r in records {
            apply(&mut self.live, *r);
        }
        Ok(())
    }

    /// Reads a drive's journal back. Never fails on bad contents (they are
    /// dropped and counted); fails only when the device does, or when no
    /// half holds a complete snapshot.
    pub fn replay(
        dev: &mut dyn MetaDev,
        place: JournalPlace,
        pool_tag: u64,
        drives: u32,
        files: u32,
        nonce: u64,
    ) -> Result<(Self, ReplayStats)> {
        let mut heads = Vec::new();
        for half in 0..2u32 {
            let page = dev.read(place.drive, place.page_lba(half, 0), PAGE)?;
            if let Some(h) = Self::decode_header(&page) {
                if h.pool_tag == pool_tag
                    && h.drive as u32 == place.drive
                    && h.seq == 0
                    && h.flags & FLAG_SNAPSHOT != 0
                {
                    heads.push((h.epoch, half));
                }
            }
        }
        heads.sort_unstable_by(|a, b| b.cmp(a));
        for (epoch, half) in heads {
            if let Some(found) = Self::read_half(dev, place, pool_tag, drives, files, half, epoch)? {
                let (live, next, prev_digest, stats) = found;
                let j = DriveJournal {
                    place,
                    pool_tag,
                    half,
                    epoch,
                    next,
                    prev_digest,
                    live,
                    nonce,
                    must_switch: false,
                };
                return Ok((j, stats));
            }
            tracing::warn!(
                drive = place.drive,
                half,
                epoch,
                "journal half has an incomplete snapshot; trying the other"
            );
        }
        Err(ObjError::drive(
            format!("pool drive {}", place.drive),
            "no journal half holds a complete snapshot: the journal is lost (reformat the pool)",
        ))
    }

    #[allow(clippy::type_complexity)]
    fn read_half(
        dev: &mut dyn MetaDev,
        place: JournalPlace,
        pool_tag: u64,
        drives: u32,
        files: u32,
        half: u32,
        epoch: u64,
    ) -> Result<Option<(BTreeMap<FileId, Record>, u32, u64, ReplayStats)>> {
        let mut live = BTreeMap::new();
        let mut stats = ReplayStats { epoch, ..Default::default() };
        // Applied state: pages 0..seq are complete runs ending with digest `prev`.
        let (mut seq, mut prev) = (0u32, 0u64);
        // The run being read: its pages so far, their records, the last digest.
        let mut run: Vec<Record> = Vec::new();
        let (mut run_first, mut run_pages, mut run_prev) = (0u32, 0u32, 0u64);
        let mut pos = 0u32;
        'outer: while pos < place.half_pages {
            let n = READ_BATCH.min(place.half_pages - pos);
            let buf = dev.read(place.drive, place.page_lba(half, pos), n as usize * PAGE)?;
            for page in buf.chunks_exact(PAGE) {
                let starts_run = pos == seq;
                let expect_prev = if starts_run { prev } else { run_prev };
                let ok = Self::decode_header(page).filter(|h| {
                    h.pool_tag == pool_tag
                        && h.drive as u32 == place.drive
                        && h.epoch == epoch
                        && h.seq == pos
                        && h.prev == expect_prev
                        && h.count as usize <= RECORDS_PER_PAGE
                        && (h.flags & FLAG_SNAPSHOT != 0) == (seq == 0)
                        && if starts_run {
                            h.run_first == pos && h.run_pages >= 1
                        } else {
                            h.run_first == run_first && h.run_pages == run_pages
                        }
                        && h.crc_ok
                });
                let Some(h) = ok else {
                    // Pages of this pool and epoch that fail a check, and the valid
                    // pages of the run they cut short, are a torn or corrupt tail.
                    let ours =
                        Self::decode_header(page).is_some_and(|h| h.pool_tag == pool_tag && h.epoch == epoch);
                    stats.dropped_pages += ours as u32 + (pos - seq);
                    break 'outer;
                };
                if starts_run {
                    run.clear();
                    (run_first, run_pages) = (h.run_first, h.run_pages);
                }
                let (raw, _) = RawPage::ref_from_prefix(page).map_err(|_| {
                    ObjError::drive(format!("pool drive {}", place.drive), "short journal page read")
                })?;
                run.extend(raw.records.iter().take(h.count as usize).filter_map(Record::decode));
                run_prev = digest(page);
                pos += 1;
                if pos == run_first + run_pages {
                    for r in run.drain(..) {
                        if r.file >= files || r.file % drives != place.drive {
                            stats.foreign_records += 1;
                            continue;
                        }
                        apply(&mut live, r);
                        stats.records += 1;
                    }
                    stats.pages += pos - seq;
                    (seq, prev) = (pos, run_prev);
                }
            }
        }
        if seq == 0 {
            // The snapshot run is incomplete: this half is not usable.
            return Ok(None);
        }
        Ok(Some((live, seq, prev, stats)))
    }
}

fn apply(live: &mut BTreeMap<FileId, Record>, r: Record) {
    match r.kind {
        RecordKind::Insert => {
            if live.get(&r.file).is_none_or(|old| old.gen <= r.gen) {
                live.insert(r.file, r);
            }
        }
        RecordKind::Invalidate => {
            if live.get(&r.file).is_some_and(|old| old.gen <= r.gen) {
                live.remove(&r.file);
            }
        }
    }
}

#[cfg(test)]
#[path = "journal_tests.rs"]
mod tests;
