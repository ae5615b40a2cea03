//! The daemon's side of the board: giving slots and taking them back, holding the drives for
//! its own metadata writes, and watching the clients' rows for stuck ones.

use super::layout::{
    board_len, implausible, Shm, Word, BOARD_VERSION, DAEMON_SLOT, DEFAULT_STALE_AFTER, MAGIC, MAX_DRIVES,
    MAX_PLAUSIBLE, MAX_SLOTS,
};
use super::stats::{HoldStats, StaleSlot};
use crate::error::{DaemonError, Result};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

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
    waits: AtomicU64,
    wait_ns: AtomicU64,
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
        let mut waited = false;
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
            waited = true;
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
        if waited {
            self.counts.waits.fetch_add(1, Ordering::Relaxed);
            let ns = start.elapsed().as_nanos().min(u64::MAX as u128) as u64;
            self.counts.wait_ns.fetch_add(ns, Ordering::Relaxed);
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
            waits: c.waits.load(Ordering::Relaxed),
            wait_ns: c.wait_ns.load(Ordering::Relaxed),
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
        self.shm.row(slot, self.drives)
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

#[cfg(test)]
mod tests {
    use super::super::client::SharedArbitration;
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
        let counts = |h: HoldStats| (h.holds, h.stale_marks, h.stale_skips, h.waits);
        assert_eq!(counts(board.hold_stats()), (1, 1, 0, 1), "the first hold waited");
        assert!(board.hold_stats().wait_ns >= within.as_nanos() as u64, "{:?}", board.hold_stats());
        // Stuck still: the next holds go without waiting, and say they skipped it.
        for _ in 0..5 {
            drop(board.hold_for_metadata(None, Duration::from_secs(600)));
        }
        assert_eq!(counts(board.hold_stats()), (6, 1, 5, 1), "skips do not wait");
        let stale = board.stale();
        assert_eq!(stale.len(), 1);
        assert!(stale[0].slot == c.slot() && stale[0].skipped_by_holds, "{stale:?}");
        // It makes progress: its row changed, so the next hold waits for it again.
        c.publish(1, 2, 0, 0);
        drop(board.hold_for_metadata(None, within));
        assert_eq!(counts(board.hold_stats()), (7, 2, 5, 2));
        c.publish(0, 0, 0, 0);
        c.publish(1, 0, 0, 0);
        board.observe();
        assert!(board.stale().is_empty());
        drop(board.hold_for_metadata(None, Duration::from_secs(600)));
        assert_eq!(counts(board.hold_stats()), (8, 2, 5, 2), "nothing to wait for");
    }
}
