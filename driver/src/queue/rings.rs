//! One queue pair's rings and doorbells: the memory of its SQ and CQ and the
//! two registers that publish their tails and heads, as the controller
//! created them (or, for the admin queue, as bring-up programmed them).

use crate::transport::{DmaBuffer, Doorbell};

/// The SQ and CQ memory of queue `qid` (`depth` entries each) and its doorbells.
pub struct QueueRings {
    pub qid: u16,
    /// Entries in each of the SQ and CQ.
    pub depth: u32,
    /// `depth` 64-byte submission entries.
    pub sq: DmaBuffer,
    /// `depth` 16-byte completion entries.
    pub cq: DmaBuffer,
    pub sq_doorbell: Doorbell,
    pub cq_doorbell: Doorbell,
}
