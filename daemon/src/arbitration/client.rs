//! A client's side of the board: its own row, where it announces its units, and its checks of
//! the other rows, which it trusts only as far as they are plausible and moving.

use super::layout::{
    board_len, implausible, Shm, Word, BOARD_VERSION, DEFAULT_STALE_AFTER, MAGIC, MAX_DRIVES, MAX_SLOTS,
};
use super::stats::BoardStats;
use crate::error::{DaemonError, Result};
use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Another client's row as this one watches it, from the first check it blocked.
#[derive(Debug)]
struct PeerWatch {
    /// Its words on every drive when the clock started: any change (progress, or the client
    /// left and the slot went to another) restarts it.
    row: Vec<u64>,
    since_ns: u64,
    /// Marked stale: skipped by every check, of either direction on any drive, until the row changes.
    stale: bool,
}

/// A client's side: its slot on the daemon's board. Its announcements go in its own row; the
/// other rows are read, checked and, when stuck, ignored after a deadline (module docs).
pub struct SharedArbitration {
    shm: Shm,
    slots: usize,
    drives: usize,
    slot: usize,
    generation: u16,
    stale_after_ns: AtomicU64,
    /// The daemon took the slot back (its row no longer carries this generation).
    lost: AtomicBool,
    /// The other clients that blocked this one, by slot: one clock per client.
    watch: Mutex<HashMap<usize, PeerWatch>>,
    /// Impossible words seen, by (slot, drive), to count each once while it stays.
    garbage: Mutex<HashMap<(usize, usize), u64>>,
    invalid: AtomicU64,
    stale: AtomicU64,
    stale_skips: AtomicU64,
}

impl std::fmt::Debug for SharedArbitration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedArbitration")
            .field("slots", &self.slots)
            .field("drives", &self.drives)
            .field("slot", &self.slot)
            .field("generation", &self.generation)
            .finish()
    }
}

impl SharedArbitration {
    /// Maps the board the daemon sent (`fd`, with the slot and sizes of its reply) after
    /// checking it is what the reply says: a sealed memfd of the right length, whose header
    /// names this layout, with `drives` drives (the pool's).
    pub fn attach(
        fd: OwnedFd,
        reply: &crate::proto::ArbitrationReply,
        drives: usize,
    ) -> Result<SharedArbitration> {
        let bad = |what: String| DaemonError::Unexpected(format!("arbitration board: {what}"));
        let (slots, slot) = (reply.slots as usize, reply.slot as usize);
        if slots == 0 || slots > MAX_SLOTS || slot >= slots || reply.generation == 0 {
            return Err(bad(format!(
                "slot {slot} of {slots} (generation {}); want a slot below at most {MAX_SLOTS}, generation not 0",
                reply.generation
            )));
        }
        if reply.drives as usize != drives || drives == 0 || drives > MAX_DRIVES {
            return Err(bad(format!("covers {} drives, the pool has {drives}", reply.drives)));
        }
        let len = board_len(slots, drives);
        tutti_driver::memfd::check_sealed(fd.as_fd(), len).map_err(bad)?;
        let shm = Shm::map(fd, len)?;
        let w = shm.words();
        let header: Vec<u64> = (0..4).map(|i| w[i].load(Ordering::SeqCst)).collect();
        if header != [MAGIC, BOARD_VERSION, slots as u64, drives as u64] {
            return Err(bad(format!(
                "header {header:x?}; want magic {MAGIC:x}, version {BOARD_VERSION}, {slots} slots, {drives} drives"
            )));
        }
        let me = SharedArbitration {
            shm,
            slots,
            drives,
            slot,
            generation: reply.generation,
            stale_after_ns: AtomicU64::new(DEFAULT_STALE_AFTER.as_nanos() as u64),
            lost: AtomicBool::new(false),
            watch: Mutex::new(HashMap::new()),
            garbage: Mutex::new(HashMap::new()),
            invalid: AtomicU64::new(0),
            stale: AtomicU64::new(0),
            stale_skips: AtomicU64::new(0),
        };
        if me.row(slot).iter().any(|w| Word::unpack(w.load(Ordering::SeqCst)).generation != reply.generation)
        {
            return Err(bad(format!("slot {slot} does not carry generation {}", reply.generation)));
        }
        Ok(me)
    }

    fn row(&self, slot: usize) -> &[AtomicU64] {
        self.shm.row(slot, self.drives)
    }

    pub fn slot(&self) -> usize {
        self.slot
    }
    pub fn slots(&self) -> usize {
        self.slots
    }
    pub fn drives(&self) -> usize {
        self.drives
    }

    /// Whether the daemon took the slot back (the connection ended); announcements stopped.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    /// How long a blocking word may stay unchanged before it is ignored.
    pub fn set_stale_after(&self, d: Duration) {
        self.stale_after_ns.store(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    pub fn stats(&self) -> BoardStats {
        BoardStats {
            invalid_words: self.invalid.load(Ordering::Relaxed),
            stale_words: self.stale.load(Ordering::Relaxed),
            stale_skips: self.stale_skips.load(Ordering::Relaxed),
        }
    }

    /// The other clients marked stale now: (slot, the caller's clock when its row was first seen
    /// blocking, unchanged since).
    pub fn stale_peers(&self) -> Vec<(usize, u64)> {
        let watch = self.watch.lock().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<(usize, u64)> =
            watch.iter().filter(|(_, w)| w.stale).map(|(&s, w)| (s, w.since_ns)).collect();
        v.sort_unstable();
        v
    }

    /// Announces this client's counts on `drive` (a CAS that keeps its generation: if the
    /// daemon took the slot back meanwhile, nothing is written and the slot counts as lost).
    pub fn publish(&self, drive: usize, reads_in_flight: u32, writes_in_flight: u32, reads_ready: u32) {
        let Some(word) = self.row(self.slot).get(drive) else { return };
        if self.is_lost() {
            return;
        }
        let new = Word {
            generation: self.generation,
            reads_in_flight: u64::from(reads_in_flight),
            writes_in_flight: u64::from(writes_in_flight),
            reads_ready: u64::from(reads_ready),
        }
        .pack();
        let mut cur = word.load(Ordering::SeqCst);
        // Only this process writes its row (and the daemon, once, when it takes it back), so
        // the CAS fails only when the generation changed; the bound is for a hostile writer.
        for _ in 0..64 {
            if Word::unpack(cur).generation != self.generation {
                break;
            }
            match word.compare_exchange(cur, new, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return,
                Err(now) => cur = now,
            }
        }
        if !self.lost.swap(true, Ordering::Relaxed) {
            tracing::error!(slot = self.slot, generation = self.generation, found = cur,
                "the arbitration slot was taken back (the connection to tuttid ended?); arbitrating within this process only");
        }
    }

    /// After announcing a unit (`write`: a write, else a read) on `drives`: whether no other
    /// client forbids it. Garbage is ignored and counted. A client whose row blocks a unit is
    /// watched with one clock (not one per drive or direction): once its row has stayed
    /// unchanged for the stale deadline it is marked stale, counted once, and skipped by every
    /// later check, of either direction on any drive, until its row changes.
    pub fn clear(&self, write: bool, drives: &[usize], now_ns: u64) -> bool {
        if self.is_lost() {
            return true;
        }
        let stale_after = self.stale_after_ns.load(Ordering::Relaxed);
        let mut watch = self.watch.lock().unwrap_or_else(|p| p.into_inner());
        let mut clear = true;
        for s in (0..self.slots).filter(|&s| s != self.slot) {
            let row = self.row(s);
            let mut blocks = false;
            for &d in drives {
                let Some(word) = row.get(d) else { continue };
                let raw = word.load(Ordering::SeqCst);
                let w = Word::unpack(raw);
                if implausible(&w) {
                    self.note_garbage(s, d, raw);
                    continue;
                }
                blocks |=
                    if write { w.reads_in_flight > 0 || w.reads_ready > 0 } else { w.writes_in_flight > 0 };
            }
            // A watched row that changed is a live peer again (or another client in its slot).
            if let Some(seen) = watch.get(&s) {
                if row.iter().zip(&seen.row).any(|(w, &old)| w.load(Ordering::SeqCst) != old) {
                    if seen.stale {
                        tracing::info!(
                            slot = s,
                            "a client marked stale changed its arbitration row; it counts again"
                        );
                    }
                    watch.remove(&s);
                }
            }
            if !blocks {
                continue;
            }
            let seen = watch.entry(s).or_insert_with(|| PeerWatch {
                row: row.iter().map(|w| w.load(Ordering::SeqCst)).collect(),
                since_ns: now_ns,
                stale: false,
            });
            if !seen.stale && now_ns.saturating_sub(seen.since_ns) >= stale_after {
                seen.stale = true;
                self.stale.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(slot = s, stale_ms = stale_after / 1_000_000,
                    "a client's arbitration row blocked I/O unchanged past the deadline; ignoring it until it changes");
            }
            if seen.stale {
                self.stale_skips.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            clear = false;
        }
        clear
    }

    /// Counts an impossible word once while it stays the same.
    fn note_garbage(&self, slot: usize, drive: usize, raw: u64) {
        let mut garbage = self.garbage.lock().unwrap_or_else(|p| p.into_inner());
        if garbage.insert((slot, drive), raw) != Some(raw) {
            self.invalid.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(slot, drive, word = raw, "ignoring an impossible word on the arbitration board");
        }
    }

    /// For tests: the raw word of `slot` on `drive` (anything may be written there by any
    /// client; this is how a test plays a broken one).
    #[doc(hidden)]
    pub fn raw_word(&self, slot: usize, drive: usize) -> Option<&AtomicU64> {
        if slot >= self.slots {
            return None;
        }
        self.row(slot).get(drive)
    }
}
