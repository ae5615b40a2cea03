//! What the board's two sides count, and what the daemon reports about stuck clients.

use std::time::Duration;

/// What the daemon's metadata holds met on the board.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HoldStats {
    /// Metadata writes that held the drives.
    pub holds: u64,
    /// Clients whose reads a hold waited for the metadata wait (`METADATA_WAIT`) in vain: each is marked stale
    /// and the write goes anyway. Once per stuck client until its row changes, not per hold.
    pub stale_marks: u64,
    /// Holds that skipped a client marked stale instead of waiting for its reads.
    pub stale_skips: u64,
    /// Holds that found a client's reads in flight and waited for them (or for the deadline).
    #[serde(default)]
    pub waits: u64,
    /// Time those holds waited, ns.
    #[serde(default)]
    pub wait_ns: u64,
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
