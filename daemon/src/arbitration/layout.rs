//! The board's layout: the constants, one word per (slot, drive) packed and unpacked, and the
//! mapped memfd both sides read through.

use crate::error::{DaemonError, Result};
use memmap2::{MmapOptions, MmapRaw};
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

/// "TUTTIARB", little endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"TUTTIARB");
/// The board's layout version (the header's second word).
pub const BOARD_VERSION: u64 = 1;
/// Client slots on one daemon's board; a client beyond that many at once is refused a slot.
pub const MAX_SLOTS: usize = 64;
/// Most drives a board covers.
pub const MAX_DRIVES: usize = 1024;
/// A count over this in another client's word is garbage (ignored): a client has far fewer
/// units in flight on one drive.
pub const MAX_PLAUSIBLE: u64 = 4096;
/// How long a metadata write of the daemon waits for the clients' reads in flight to drain
/// before it goes anyway (with a warning).
pub const METADATA_WAIT: Duration = Duration::from_secs(2);
/// The daemon's own slot: its metadata writes (journal, superblocks) are announced there.
pub const DAEMON_SLOT: usize = 0;
/// A word that blocks a unit without changing for this long is ignored until it changes.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(5);

pub(super) const HEADER_WORDS: usize = 8;
const PAGE: usize = 4096;
const FIELD: u64 = 0xFFFF;

/// Bytes of a board for `slots` × `drives` words, whole pages.
pub fn board_len(slots: usize, drives: usize) -> usize {
    ((HEADER_WORDS + slots * drives) * 8).next_multiple_of(PAGE)
}

/// One word of the board, unpacked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Word {
    pub generation: u16,
    pub reads_in_flight: u64,
    pub writes_in_flight: u64,
    pub reads_ready: u64,
}

impl Word {
    pub fn pack(self) -> u64 {
        (u64::from(self.generation) << 48)
            | (self.reads_ready.min(FIELD) << 32)
            | (self.writes_in_flight.min(FIELD) << 16)
            | self.reads_in_flight.min(FIELD)
    }
    pub fn unpack(w: u64) -> Word {
        Word {
            generation: (w >> 48) as u16,
            reads_ready: (w >> 32) & FIELD,
            writes_in_flight: (w >> 16) & FIELD,
            reads_in_flight: w & FIELD,
        }
    }
}

/// The mapped memfd.
pub(super) struct Shm {
    map: MmapRaw,
    pub fd: OwnedFd,
}

impl Shm {
    pub fn words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping is page aligned, a whole number of pages long and lives as long
        // as `self`; every access to it (here and in other processes) is a 64-bit atomic, and
        // the memfd is sealed against shrinking, so the pages stay.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().cast::<AtomicU64>(), self.map.len() / 8) }
    }

    pub fn map(fd: OwnedFd, len: usize) -> Result<Shm> {
        let map = MmapOptions::new()
            .len(len)
            .map_raw(&fd)
            .map_err(|e| DaemonError::io("mapping the arbitration board", e))?;
        Ok(Shm { map, fd })
    }

    /// The words of `slot` on a board of `drives` drives.
    pub fn row(&self, slot: usize, drives: usize) -> &[AtomicU64] {
        let start = HEADER_WORDS + slot * drives;
        &self.words()[start..start + drives]
    }
}

/// Whether a word's counts cannot be right: counts in a free slot, or more than a client has
/// in flight on one drive.
pub(super) fn implausible(w: &Word) -> bool {
    let counts = w.reads_in_flight | w.writes_in_flight | w.reads_ready;
    let plausible = w.reads_in_flight <= MAX_PLAUSIBLE && w.writes_in_flight <= MAX_PLAUSIBLE;
    counts != 0 && (w.generation == 0 || !plausible)
}
