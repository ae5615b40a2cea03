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
//! flight to finish. A client whose reads a hold waited out is skipped by later holds until its
//! row changes.
//!
//! **A client that dies** (crash, SIGKILL) has its connection closed by the kernel; the daemon
//! then zeroes its row (generation 0) before the slot can be given again, so nothing it held
//! blocks a drive. A later slot holder gets a new generation: a client that lives on after its
//! connection ended (its row was zeroed) sees its generation gone and stops announcing.
//!
//! **Untrusted contents, stuck peers.** Any client can write anywhere in the board (it maps it
//! read-write). Everything read from it is checked: counts in a free slot's row, or over
//! [`MAX_PLAUSIBLE`], are ignored and counted. A client that stops moving (SIGSTOP, a debugger,
//! a frozen cgroup, a long pause, or garbage that looks plausible) leaves its row as it was:
//! each other client watches such a row with one clock per client, started when the row first
//! blocks it; once the row has stayed the same for [`DEFAULT_STALE_AFTER`] the client is
//! marked stale, counted once ([`BoardStats::stale_words`]), and every later check, of either
//! direction on any drive, skips it without waiting, until its row changes (it made progress,
//! or it left and its slot was given again). The daemon's metadata holds do the same with their
//! own deadline ([`METADATA_WAIT`]), and the daemon reports the stuck row in `tutti status`
//! ([`Board::stale`]). So a stuck peer costs each other process one deadline, not one per unit,
//! drive or store, and never a hang.
//!
//! **Why going past a stale row is safe.** A stale reader may still have reads on the drives
//! (or announce reads its drive has long served: a stopped process cannot reap). A write that
//! goes anyway can only share the drive with them, which is slower for both (the read/write
//! collapse arbitration exists to avoid); it cannot change what they read. A client reads only
//! files it holds an I/O reference on, and the daemon gives no reservation, so no writer, a file
//! with a reference; its own journal writes go to the journal region, which no client reads.
//! Wrong bytes are excluded by those references and by the commit order, not by arbitration.
//! The deadline (5 s) is long against any unit that makes progress: a unit's commands each end
//! within the command deadline (2 s by default), and a live client's row changes whenever one
//! of its units starts or ends. (A client of tuttid can already write any block of the pool;
//! the board gives it no more power over data than that.)

use crate::error::{DaemonError, Result};
use memmap2::{MmapOptions, MmapRaw};
use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

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
    /// The daemon's own watch of each slot's row (see [`Board::observe`]).
    rows: Mutex<Vec<RowSeen>>,
    counts: HoldCounts,
}

/// A slot's row as the daemon last saw it.
#[derive(Debug, Clone)]
struct RowSeen {
    row: Vec<u64>,
    /// When the daemon first saw this row (it may have changed and changed back unseen
    /// between two looks, so this is a lower bound on its age only while looks are frequent).
    changed: Instant,
    /// When a metadata hold waited this row's reads out: later holds skip it. Cleared when the
    /// row changes.
    waited_out: Option<Instant>,
}

#[derive(Debug, Default)]
struct HoldCounts {
    holds: AtomicU64,
    stale_marks: AtomicU64,
    stale_skips: AtomicU64,
}

/// What the daemon's metadata holds met on the board.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HoldStats {
    /// Metadata writes that held the drives.
    pub holds: u64,
    /// Clients whose reads a hold waited for [`METADATA_WAIT`] in vain: each is marked stale
    /// and the write goes anyway. Once per stuck client until its row changes, not per hold.
    pub stale_marks: u64,
    /// Holds that skipped a client marked stale instead of waiting for its reads.
    pub stale_skips: u64,
}

/// A client whose row the daemon sees stuck.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StaleSlot {
    pub slot: usize,
    /// How long its row has held I/O without changing (as far as the daemon's looks tell).
    pub unchanged_for: Duration,
    /// A metadata hold waited its reads out; holds skip it until its row changes.
    pub skipped_by_holds: bool,
}

/// Whether a row announces any plausible I/O (a free slot's, or garbage, announces none).
fn holds_io(row: &[u64]) -> bool {
    row.iter().map(|&w| Word::unpack(w)).any(|w| {
        w.generation != 0 && !implausible(&w) && (w.reads_in_flight | w.writes_in_flight | w.reads_ready) != 0
    })
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
            rows: Mutex::new(vec![
                RowSeen { row: vec![0; drives], changed: Instant::now(), waited_out: None };
                slots
            ]),
            counts: HoldCounts::default(),
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
    /// it). Past `within` it goes anyway, with a warning, and marks the clients still reading
    /// stale: later holds skip them without waiting, until their rows change (one wait per
    /// stuck client, not one per hold).
    /// `caller`: the slot of the client whose request this is; it, and every client blocked in
    /// such a request, cannot reap its reads until the request ends, so they are not waited for
    /// (their reads in flight started before; no new one starts while the hold lasts).
    ///
    /// Why a write that goes anyway is safe: arbitration is about speed (a drive given reads
    /// and writes at once serves both slower), never about which bytes a read returns. The
    /// daemon's metadata writes go to the journal region, which no client reads, and a client
    /// reads only files it holds an I/O reference on, which no reservation (so no client's
    /// write either) is given while the reference lasts. A stale reader's reads in flight can
    /// only end up sharing a drive with the write.
    pub fn hold_for_metadata(&self, caller: Option<usize>, within: Duration) -> MetaHold<'_> {
        if let Some(c) = caller {
            self.in_meta.lock().unwrap_or_else(|p| p.into_inner()).push(c);
        }
        let one = self.meta.lock().unwrap_or_else(|p| p.into_inner());
        let busy = Word { generation: 1, writes_in_flight: 1, ..Word::default() }.pack();
        for w in self.row(DAEMON_SLOT) {
            w.store(busy, Ordering::SeqCst);
        }
        self.counts.holds.fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        let mut spins = 0u32;
        let mut skipped = false;
        loop {
            let blocked = self.in_meta.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let reading: Vec<usize> = (0..self.slots)
                .filter(|&s| s != DAEMON_SLOT && !blocked.contains(&s))
                .filter(|&s| {
                    self.row(s).iter().any(|w| {
                        let w = Word::unpack(w.load(Ordering::SeqCst));
                        // Garbage (a free slot's counts, implausible ones) holds nothing.
                        w.generation != 0 && w.reads_in_flight > 0 && w.reads_in_flight <= MAX_PLAUSIBLE
                    })
                })
                .collect();
            let now = Instant::now();
            let (stale, live): (Vec<usize>, Vec<usize>) =
                reading.into_iter().partition(|&s| self.look(s, now).is_some());
            skipped |= !stale.is_empty();
            if live.is_empty() {
                break;
            }
            if now.duration_since(start) >= within {
                for slot in live {
                    self.mark_waited_out(slot, now);
                    tracing::warn!(
                        slot,
                        waited_ms = within.as_millis() as u64,
                        "a client's reads stayed in flight past the deadline; the metadata write goes anyway, \
                         and later ones skip it until its arbitration row changes"
                    );
                }
                break;
            }
            spins += 1;
            if spins < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        if skipped {
            self.counts.stale_skips.fetch_add(1, Ordering::Relaxed);
        }
        MetaHold { board: self, caller, _one: one }
    }

    /// Looks at every client's row, so that [`Board::stale`] can say how long a stuck row has
    /// not changed. The daemon calls it a few times a second.
    pub fn observe(&self) {
        let now = Instant::now();
        for s in (0..self.slots).filter(|&s| s != DAEMON_SLOT) {
            self.look(s, now);
        }
    }

    /// Looks at slot `s`'s row now: one that changed loses its mark. Returns when a hold
    /// waited it out, if it did and the row has not changed since.
    fn look(&self, s: usize, now: Instant) -> Option<Instant> {
        let cur: Vec<u64> = self.row(s).iter().map(|w| w.load(Ordering::SeqCst)).collect();
        let mut rows = self.rows.lock().unwrap_or_else(|p| p.into_inner());
        let seen = rows.get_mut(s)?;
        if seen.row != cur {
            if seen.waited_out.is_some() {
                tracing::info!(
                    slot = s,
                    "a client marked stale changed its arbitration row; holds wait for it again"
                );
            }
            *seen = RowSeen { row: cur, changed: now, waited_out: None };
        }
        seen.waited_out
    }

    fn mark_waited_out(&self, s: usize, now: Instant) {
        let mut rows = self.rows.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(seen) = rows.get_mut(s) {
            if seen.waited_out.is_none() {
                seen.waited_out = Some(now);
                self.counts.stale_marks.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The clients whose rows are stuck now: waited out by a metadata hold, or holding I/O
    /// unchanged for [`DEFAULT_STALE_AFTER`] (the clients' own deadline), by slot.
    pub fn stale(&self) -> Vec<StaleSlot> {
        let now = Instant::now();
        let rows = self.rows.lock().unwrap_or_else(|p| p.into_inner());
        rows.iter()
            .enumerate()
            .filter(|&(slot, _)| slot != DAEMON_SLOT)
            .filter_map(|(slot, r)| {
                let unchanged_for = now.duration_since(r.changed);
                let stuck = holds_io(&r.row) && unchanged_for >= DEFAULT_STALE_AFTER;
                (stuck || r.waited_out.is_some()).then_some(StaleSlot {
                    slot,
                    unchanged_for,
                    skipped_by_holds: r.waited_out.is_some(),
                })
            })
            .collect()
    }

    pub fn hold_stats(&self) -> HoldStats {
        let c = &self.counts;
        HoldStats {
            holds: c.holds.load(Ordering::Relaxed),
            stale_marks: c.stale_marks.load(Ordering::Relaxed),
            stale_skips: c.stale_skips.load(Ordering::Relaxed),
        }
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
    /// Times another client was marked stale: its row blocked I/O here without changing for
    /// the stale deadline. Once per stuck peer, however many drives, directions and units it
    /// blocked, until its row changes.
    pub stale_words: u64,
    /// Checks that skipped a peer marked stale (each would otherwise have waited on it).
    pub stale_skips: u64,
}

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

/// Whether a word's counts cannot be right: counts in a free slot, or more than a client has
/// in flight on one drive.
fn implausible(w: &Word) -> bool {
    let counts = w.reads_in_flight | w.writes_in_flight | w.reads_ready;
    let plausible = w.reads_in_flight <= MAX_PLAUSIBLE && w.writes_in_flight <= MAX_PLAUSIBLE;
    counts != 0 && (w.generation == 0 || !plausible)
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

    #[test]
    fn a_metadata_hold_waits_out_a_stuck_reader_once_then_skips_it_until_its_row_changes() {
        let board = Board::new(2).unwrap();
        let c = client_of(&board);
        c.publish(0, 1, 0, 0);
        c.publish(1, 3, 0, 0);
        let within = Duration::from_millis(50);
        drop(board.hold_for_metadata(None, within));
        assert_eq!(board.hold_stats(), HoldStats { holds: 1, stale_marks: 1, stale_skips: 0 });
        // Stuck still: the next holds go without waiting, and say they skipped it.
        for _ in 0..5 {
            drop(board.hold_for_metadata(None, Duration::from_secs(600)));
        }
        assert_eq!(board.hold_stats(), HoldStats { holds: 6, stale_marks: 1, stale_skips: 5 });
        let stale = board.stale();
        assert_eq!(stale.len(), 1);
        assert!(stale[0].slot == c.slot() && stale[0].skipped_by_holds, "{stale:?}");
        // It makes progress: its row changed, so the next hold waits for it again.
        c.publish(1, 2, 0, 0);
        drop(board.hold_for_metadata(None, within));
        assert_eq!(board.hold_stats(), HoldStats { holds: 7, stale_marks: 2, stale_skips: 5 });
        c.publish(0, 0, 0, 0);
        c.publish(1, 0, 0, 0);
        board.observe();
        assert!(board.stale().is_empty());
        drop(board.hold_for_metadata(None, Duration::from_secs(600)));
        assert_eq!(board.hold_stats(), HoldStats { holds: 8, stale_marks: 2, stale_skips: 5 });
    }
}
