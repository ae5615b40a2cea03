//! Per-drive read/write arbitration across the engine processes of one tuttid.
//!
//! Every client moves its own bytes on its own queue pairs, so no single arbiter sees all the
//! I/O on a drive. The daemon therefore exports a small shared-memory board: a sealed memfd
//! holding, per client slot and per pool drive, one 64-bit word
//!
//! ```text
//! bits 63..48  generation of the slot's holder (0: the slot is free)
//! bits 47..32  reads ready (asked for, not started)
//! bits 31..16  writes in flight
//! bits 15..0   reads in flight
//! ```
//!
//! after a header (magic, version, slots, drives). Each client gets the fd and its slot
//! ([`crate::proto::Request::Arbitration`]) and maps it; it writes only its own row, and reads
//! the others' before each unit starts. No daemon round trip per layer.
//!
//! **Why it is race-free.** To start a unit a client first *announces* it in its own row (its
//! in-flight count raised, a compare-and-swap, sequentially consistent), then *checks* the other
//! rows (sequentially consistent loads): a read goes when no other row has a write in flight on
//! its drives, a write when no other row has a read in flight or ready there; otherwise the
//! announcement is taken back and the unit waits. Of two conflicting units of two clients, the
//! one whose announcement comes second in the single order of sequentially consistent
//! operations sees the other's announcement, so they never both start (both may wait and try
//! again: a read that waits stays announced as ready, so writes defer to it and it goes next).
//! Within one process the arbiter's lock orders the units, as before.
//!
//! **The daemon's own writes** (journal appends at a store's commit or an eviction) are
//! announced in slot [`DAEMON_SLOT`] the same way ([`Board::hold_for_metadata`]): clients' reads
//! wait while one is held, and it waits (bounded by [`METADATA_WAIT`]) for their reads in
//! flight to finish.
//!
//! **A client that dies** (crash, SIGKILL) has its connection closed by the kernel; the daemon
//! then zeroes its row (generation 0) before the slot can be given again, so nothing it held
//! blocks a drive. A later slot holder gets a new generation: a client that lives on after its
//! connection ended (its row was zeroed) sees its generation gone and stops announcing.
//!
//! **Untrusted contents.** Any client can write anywhere in the board (it maps it read-write).
//! Everything read from it is checked: counts in a free slot's row, or over [`MAX_PLAUSIBLE`],
//! are ignored and counted; and a word that blocks a unit without changing for
//! [`DEFAULT_STALE_AFTER`] (a peer that is stopped or hung, or garbage that looks plausible) is
//! ignored from then on until it changes, and counted. So a hostile or broken peer can cost
//! at most that deadline once per word, never a hang. (A client of tuttid can already write
//! any block of the pool; the board gives it no more power over data than that.)

use crate::error::{DaemonError, Result};
use memmap2::{MmapOptions, MmapRaw};
use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
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

const HEADER_WORDS: usize = 8;
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
struct Shm {
    map: MmapRaw,
    fd: OwnedFd,
}

impl Shm {
    fn words(&self) -> &[AtomicU64] {
        // SAFETY: the mapping is page aligned, a whole number of pages long and lives as long
        // as `self`; every access to it (here and in other processes) is a 64-bit atomic, and
        // the memfd is sealed against shrinking, so the pages stay.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().cast::<AtomicU64>(), self.map.len() / 8) }
    }

    fn map(fd: OwnedFd, len: usize) -> Result<Shm> {
        let map = MmapOptions::new()
            .len(len)
            .map_raw(&fd)
            .map_err(|e| DaemonError::io("mapping the arbitration board", e))?;
        Ok(Shm { map, fd })
    }
}

/// The daemon's side: the board, and which slot each client holds.
pub(crate) struct Board {
    shm: Shm,
    slots: usize,
    drives: usize,
    /// Per slot: the holder's generation (0: free), and the last generation given.
    held: Mutex<(Vec<u16>, Vec<u16>)>,
    /// Serializes the daemon's metadata holds (its row is one for all its threads).
    meta: Mutex<()>,
    /// Slots of clients blocked in a request that holds the drives for metadata: they cannot
    /// reap their reads meanwhile, so a hold does not wait for those.
    in_meta: Mutex<Vec<usize>>,
}

/// The daemon's drives held for one of its metadata writes; dropping it lets the clients' reads go.
pub(crate) struct MetaHold<'a> {
    board: &'a Board,
    caller: Option<usize>,
    _one: std::sync::MutexGuard<'a, ()>,
}

impl Drop for MetaHold<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.caller {
            let mut v = self.board.in_meta.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(i) = v.iter().position(|&s| s == c) {
                v.swap_remove(i);
            }
        }
        let idle = Word { generation: 1, ..Word::default() }.pack();
        for w in self.board.row(DAEMON_SLOT) {
            w.store(idle, Ordering::SeqCst);
        }
    }
}

/// A slot given to a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seat {
    pub slot: usize,
    pub generation: u16,
}

impl Board {
    pub fn new(drives: usize) -> Result<Board> {
        if drives == 0 || drives > MAX_DRIVES {
            return Err(DaemonError::Config(format!(
                "{drives} drives; the arbitration board covers 1..={MAX_DRIVES}"
            )));
        }
        let slots = MAX_SLOTS;
        let len = board_len(slots, drives);
        let fd = tutti_driver::memfd::create_sealed("tuttid-arbitration", len)
            .map_err(|e| DaemonError::io("the arbitration board's memfd", e))?;
        let shm = Shm::map(fd, len)?;
        let w = shm.words();
        for (i, v) in [MAGIC, BOARD_VERSION, slots as u64, drives as u64].into_iter().enumerate() {
            w[i].store(v, Ordering::SeqCst);
        }
        let board = Board {
            shm,
            slots,
            drives,
            held: Mutex::new((vec![0; slots], vec![0; slots])),
            meta: Mutex::new(()),
            in_meta: Mutex::new(Vec::new()),
        };
        // The daemon's own slot, generation 1 for as long as it runs.
        {
            let mut held = board.held.lock().unwrap_or_else(|p| p.into_inner());
            held.0[DAEMON_SLOT] = 1;
            held.1[DAEMON_SLOT] = 1;
        }
        let idle = Word { generation: 1, ..Word::default() }.pack();
        for w in board.row(DAEMON_SLOT) {
            w.store(idle, Ordering::SeqCst);
        }
        Ok(board)
    }

    /// Holds every drive for a metadata write of the daemon (a journal append, a flush):
    /// announces a write in flight on each in its own row (clients' reads wait from then on),
    /// then waits until no client has a read in flight (announce-then-check, as the clients
    /// do; reads merely ready do not hold it: the write is short and their readers wait for
    /// it). Past `within` it goes anyway, with a warning (a client whose row is stuck).
    /// `caller`: the slot of the client whose request this is; it, and every client blocked in
    /// such a request, cannot reap its reads until the request ends, so they are not waited for
    /// (their reads in flight started before; no new one starts while the hold lasts).
    pub fn hold_for_metadata(&self, caller: Option<usize>, within: Duration) -> MetaHold<'_> {
        if let Some(c) = caller {
            self.in_meta.lock().unwrap_or_else(|p| p.into_inner()).push(c);
        }
        let one = self.meta.lock().unwrap_or_else(|p| p.into_inner());
        let busy = Word { generation: 1, writes_in_flight: 1, ..Word::default() }.pack();
        for w in self.row(DAEMON_SLOT) {
            w.store(busy, Ordering::SeqCst);
        }
        let start = std::time::Instant::now();
        let mut spins = 0u32;
        loop {
            let blocked = self.in_meta.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let reading = (0..self.slots).filter(|&s| s != DAEMON_SLOT && !blocked.contains(&s)).find(|&s| {
                self.row(s).iter().any(|w| {
                    let w = Word::unpack(w.load(Ordering::SeqCst));
                    // Garbage (a free slot's counts, implausible ones) holds nothing.
                    w.generation != 0 && w.reads_in_flight > 0 && w.reads_in_flight <= MAX_PLAUSIBLE
                })
            });
            let Some(slot) = reading else { break };
            if start.elapsed() >= within {
                tracing::warn!(
                    slot,
                    waited_ms = within.as_millis() as u64,
                    "a client's reads stayed in flight past the deadline; the metadata write goes anyway"
                );
                break;
            }
            spins += 1;
            if spins < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        MetaHold { board: self, caller, _one: one }
    }

    pub fn slots(&self) -> usize {
        self.slots
    }
    pub fn drives(&self) -> usize {
        self.drives
    }
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.shm.fd.as_fd()
    }

    fn row(&self, slot: usize) -> &[AtomicU64] {
        let start = HEADER_WORDS + slot * self.drives;
        &self.shm.words()[start..start + self.drives]
    }

    /// A free slot, its row reset to the new generation with no counts.
    pub fn assign(&self) -> Option<Seat> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let slot = held.0.iter().position(|&g| g == 0)?; // never the daemon's slot (generation 1)
        let generation = match held.1[slot].wrapping_add(1) {
            0 => 1,
            g => g,
        };
        held.0[slot] = generation;
        held.1[slot] = generation;
        let fresh = Word { generation, ..Word::default() }.pack();
        for w in self.row(slot) {
            w.store(fresh, Ordering::SeqCst);
        }
        Some(Seat { slot, generation })
    }

    /// Zeroes the slot's row (whatever its departed holder announced stops counting) and frees it.
    pub fn release(&self, seat: Seat) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.0.get(seat.slot) != Some(&seat.generation) {
            return;
        }
        for w in self.row(seat.slot) {
            w.store(0, Ordering::SeqCst);
        }
        held.0[seat.slot] = 0;
    }
}

/// What a client's view of the board counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BoardStats {
    /// Words ignored because they cannot be right (counts in a free slot, or implausible).
    pub invalid_words: u64,
    /// Blocking words ignored because they did not change for the stale deadline.
    pub stale_words: u64,
}

/// A word of another client as last seen: (the word, since when, ignored).
type Seen = (u64, u64, bool);

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
    /// Blocking (or impossible) words seen, by (slot, drive).
    watch: Mutex<HashMap<(usize, usize), Seen>>,
    invalid: AtomicU64,
    stale: AtomicU64,
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
            invalid: AtomicU64::new(0),
            stale: AtomicU64::new(0),
        };
        if me.row(slot).iter().any(|w| Word::unpack(w.load(Ordering::SeqCst)).generation != reply.generation)
        {
            return Err(bad(format!("slot {slot} does not carry generation {}", reply.generation)));
        }
        Ok(me)
    }

    fn row(&self, slot: usize) -> &[AtomicU64] {
        let start = HEADER_WORDS + slot * self.drives;
        &self.shm.words()[start..start + self.drives]
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
        }
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
    /// client forbids it. Garbage is ignored and counted; a blocking word unchanged for the
    /// stale deadline is ignored (and counted) until it changes.
    pub fn clear(&self, write: bool, drives: &[usize], now_ns: u64) -> bool {
        if self.is_lost() {
            return true;
        }
        let stale_after = self.stale_after_ns.load(Ordering::Relaxed);
        let mut watch = self.watch.lock().unwrap_or_else(|p| p.into_inner());
        let mut clear = true;
        for s in (0..self.slots).filter(|&s| s != self.slot) {
            let row = self.row(s);
            for &d in drives {
                let Some(word) = row.get(d) else { continue };
                let raw = word.load(Ordering::SeqCst);
                let w = Word::unpack(raw);
                let counts = w.reads_in_flight | w.writes_in_flight | w.reads_ready;
                let plausible = w.reads_in_flight <= MAX_PLAUSIBLE && w.writes_in_flight <= MAX_PLAUSIBLE;
                if counts != 0 && (w.generation == 0 || !plausible) {
                    // Nobody holds a free slot, and no client has that much in flight.
                    if watch.insert((s, d), (raw, now_ns, true)).is_none_or(|(old, _, _)| old != raw) {
                        self.invalid.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(
                            slot = s,
                            drive = d,
                            word = raw,
                            "ignoring an impossible word on the arbitration board"
                        );
                    }
                    continue;
                }
                let blocks =
                    if write { w.reads_in_flight > 0 || w.reads_ready > 0 } else { w.writes_in_flight > 0 };
                if !blocks {
                    watch.remove(&(s, d));
                    continue;
                }
                let entry = watch.entry((s, d)).or_insert((raw, now_ns, false));
                if entry.0 != raw {
                    *entry = (raw, now_ns, false);
                }
                if entry.2 {
                    continue;
                }
                if now_ns.saturating_sub(entry.1) >= stale_after {
                    entry.2 = true;
                    self.stale.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(slot = s, drive = d, word = raw, stale_ms = stale_after / 1_000_000,
                        "a client's arbitration word blocked I/O unchanged past the deadline; ignoring it until it changes");
                    continue;
                }
                clear = false;
            }
        }
        clear
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::ArbitrationReply;
    use std::sync::mpsc;

    fn client_of(board: &Board) -> SharedArbitration {
        let seat = board.assign().unwrap();
        let reply = ArbitrationReply {
            slot: seat.slot as u32,
            generation: seat.generation,
            slots: board.slots() as u32,
            drives: board.drives() as u32,
        };
        SharedArbitration::attach(board.fd().try_clone_to_owned().unwrap(), &reply, board.drives()).unwrap()
    }

    #[test]
    fn a_metadata_hold_blocks_reads_and_waits_for_those_in_flight_except_the_callers() {
        let board = Board::new(2).unwrap();
        let c = client_of(&board);
        assert_ne!(c.slot(), DAEMON_SLOT);
        assert!(c.clear(false, &[0, 1], 0), "the daemon's idle row holds nothing");
        c.publish(1, 1, 0, 0);
        std::thread::scope(|s| {
            let (tx, rx) = mpsc::channel();
            let b = &board;
            s.spawn(move || {
                let hold = b.hold_for_metadata(None, Duration::from_secs(60));
                tx.send(()).unwrap();
                drop(hold);
            });
            // Announced first: reads wait from now on ...
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while c.clear(false, &[0], 0) {
                assert!(std::time::Instant::now() < deadline, "the hold was never announced");
                std::thread::yield_now();
            }
            // ... and it waits for the read in flight on drive 1 (bounded only by its 60 s).
            assert!(rx.try_recv().is_err());
            c.publish(1, 0, 0, 0);
            rx.recv_timeout(Duration::from_secs(20)).expect("the hold goes once the read finished");
        });
        assert!(c.clear(false, &[0, 1], 0), "released");
        // The caller's own reads (it is blocked in the request) are not waited for.
        c.publish(0, 1, 0, 0);
        let (tx, rx) = mpsc::channel();
        std::thread::scope(|s| {
            let b = &board;
            let slot = c.slot();
            s.spawn(move || {
                let _hold = b.hold_for_metadata(Some(slot), Duration::from_secs(60));
                tx.send(()).unwrap();
            });
            rx.recv_timeout(Duration::from_secs(20)).expect("the caller's reads do not hold it");
        });
        assert!(board.in_meta.lock().unwrap().is_empty());
    }
}
