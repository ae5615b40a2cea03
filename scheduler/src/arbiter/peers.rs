//! Arbiters of other processes on the same drives (several engine processes on one tuttid).
//!
//! An [`Arbiter`](super::Arbiter) with [`Peers`] announces its per-drive counts after every
//! change and, before it starts a unit its own policy allows, announces the unit as in flight
//! and then asks whether a peer forbids it: a read, when a peer has a write in flight on one of
//! its drives; a write, when a peer has a read in flight or ready there. Announce-then-check
//! on both sides (sequentially consistent) means two conflicting units of two arbiters cannot
//! both start: whichever announced second sees the first (see `tutti_daemon::arbitration`).

use crate::IoKind;

/// One arbiter's counts on one drive, as it announces them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriveCounts {
    pub reads_in_flight: u32,
    pub writes_in_flight: u32,
    /// Reads asked for and not yet started.
    pub reads_ready: u32,
}

/// What the peers of an arbiter say about a unit it is about to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerVerdict {
    /// No peer forbids it.
    Clear,
    /// A peer has the other direction in flight (or, for a write, a read ready) on its drives.
    Blocked,
}

/// The other arbiters on the same drives. Implementations must not block for long: every
/// call is made with the arbiter locked.
pub trait Peers: Send + Sync + std::fmt::Debug {
    /// This arbiter's counts on drive `drive` are now `counts`.
    fn publish(&self, drive: usize, counts: DriveCounts);
    /// Called after this arbiter announced a unit of `kind` in flight on `drives`: whether a
    /// peer forbids it. `now_ns` lets an implementation ignore a peer that stopped changing.
    fn check(&self, kind: IoKind, drives: &[usize], now_ns: u64) -> PeerVerdict;
}
