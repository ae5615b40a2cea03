//! I/O queue ids and queue pairs: claiming, creating, deleting and
//! recreating them. The calls are the same on an owned
//! and a leased controller; the controller's admin path carries them out.

use super::Controller;
use crate::error::{DriverError, Result};
use crate::queue::QueueRings;
use crate::spec::registers::{cq_head_doorbell, sq_tail_doorbell};
use crate::transport::{DmaBuffer, Doorbell};

impl Controller {
    /// Claims a free I/O queue id for `purpose` (named in the error when none
    /// is left). The owner of a controller serves a lease with this; on a
    /// leased controller it asks the owner.
    pub fn claim_io_qid(&self, purpose: &str) -> Result<u16> {
        self.admin.claim_qid(purpose)
    }

    /// I/O queue pairs granted and not held by anyone now (on a leased
    /// controller: what its owner says this client may still claim).
    pub fn free_io_queue_pairs(&self) -> u16 {
        self.admin.free()
    }

    /// Gives back an I/O queue id from [`claim_io_qid`](Self::claim_io_qid)
    /// (its queues deleted first). Unknown ids are ignored.
    pub fn release_io_qid(&self, qid: u16) {
        self.admin.release_qid(qid)
    }

    /// An error unless a queue of `depth` entries fits CAP.MQES (and holds a command).
    fn check_depth(&self, depth: u32) -> Result<()> {
        let max = self.info.max_queue_entries;
        if depth < 2 || depth > max {
            return Err(DriverError::invalid(format!(
                "{}: queue depth {depth} is outside 2..={max} (CAP.MQES)",
                self.name
            )));
        }
        Ok(())
    }

    /// Creates the CQ and SQ of queue `qid` on the controller, with memory of
    /// `depth` entries. On failure nothing is left behind.
    pub(crate) fn create_queues(&self, qid: u16, depth: u32) -> Result<QueueRings> {
        self.check_depth(depth)?;
        let sq = self.dma.alloc(depth as usize * 64)?;
        let cq = self.dma.alloc(depth as usize * 16)?;
        self.admin.create_queues(qid, depth, sq.iova(), cq.iova())?;
        let dstrd = self.cap.dstrd();
        let sq_doorbell = Doorbell::new(&self.regs, sq_tail_doorbell(qid, dstrd))?;
        let cq_doorbell = Doorbell::new(&self.regs, cq_head_doorbell(qid, dstrd))?;
        Ok(QueueRings { qid, depth, sq, cq, sq_doorbell, cq_doorbell })
    }

    /// Creates the CQ then the SQ of claimed queue `qid`, `depth` entries
    /// each, at device addresses `sq_iova`/`cq_iova` (IOVA-contiguous memory
    /// of `depth` × 64 and × 16 bytes; PC = 1, CQ interrupts off). On
    /// failure nothing is left behind. The owner of a controller serves a
    /// lease with this; on a leased controller it asks the owner.
    pub fn create_queues_at(&self, qid: u16, depth: u32, sq_iova: u64, cq_iova: u64) -> Result<()> {
        self.check_depth(depth)?;
        self.admin.create_queues(qid, depth, sq_iova, cq_iova)
    }

    /// Deletes I/O queue pair `qid` (SQ, then CQ) and creates it again at
    /// the same memory, with both rings zeroed, so the host side can start
    /// over at SQ tail 0, CQ head 0, expected phase 1.
    ///
    /// §5.6: the controller completes or aborts every command of the SQ
    /// before Delete I/O Submission Queue completes, so once this returns no
    /// command submitted before it can still move data. The caller must make
    /// sure nobody touches the queue memory or doorbells meanwhile. Every
    /// admin command is bounded by `ControllerOptions::admin_timeout`.
    ///
    /// Errors say which step failed; after a failure the pair's state on the
    /// controller is unknown, and only a controller reset recovers it.
    pub(crate) fn recreate_queues(&self, qid: u16, depth: u32, sq: &DmaBuffer, cq: &DmaBuffer) -> Result<()> {
        let step = |what: &str, r: Result<()>| {
            r.map_err(|e| {
                tracing::error!(device = %self.name, qid, step = what, error = %e, "queue pair recreation failed");
                e
            })
        };
        step("delete queues", self.admin.delete_queues(qid))?;
        // Stale phase tags in the old CQ would read as fresh completions.
        sq.fill(0);
        cq.fill(0);
        step("create queues", self.admin.create_queues(qid, depth, sq.iova(), cq.iova()))?;
        tracing::info!(device = %self.name, qid, leased = self.is_leased(), "I/O queue pair deleted and created again");
        Ok(())
    }

    /// Deletes the SQ then the CQ of claimed queue `qid` (§5.6: the
    /// controller completes or aborts every command of the SQ first, so
    /// none of them moves data afterwards). Both deletions are tried; the
    /// qid stays claimed ([`release_io_qid`](Self::release_io_qid) gives it
    /// back). The owner serves a lease, and cleans up after a client that
    /// went away, with this; on a leased controller it asks the owner.
    pub fn delete_io_queues(&self, qid: u16) -> Result<()> {
        self.admin.delete_queues(qid)
    }
}
