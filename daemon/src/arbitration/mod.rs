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

mod board;
mod client;
mod layout;
mod stats;

pub(crate) use board::{Board, MetaHold, Seat};
pub use client::SharedArbitration;
pub use layout::{
    board_len, Word, BOARD_VERSION, DAEMON_SLOT, DEFAULT_STALE_AFTER, MAGIC, MAX_DRIVES, MAX_PLAUSIBLE,
    MAX_SLOTS, METADATA_WAIT,
};
pub use stats::{BoardStats, HoldStats, StaleSlot};
