//! A queue pair whose commands are built by someone else: host executor lanes
//! or GPU threads that write submission entries and ring doorbells directly.

use super::rings::QueueRings;
use crate::controller::Controller;
use crate::error::Result;
use crate::transport::{Doorbell, DoorbellKind};
use std::sync::Arc;

/// An I/O SQ/CQ pair created on the controller, with its memory and doorbells
/// exposed as raw addresses. Initial state: SQ tail 0, CQ head 0, expected
/// phase 1. Deleted from the controller when dropped (SQ first, then CQ),
/// before its memory is released.
pub struct RawQueuePair {
    ctrl: Arc<Controller>,
    rings: QueueRings,
}

impl RawQueuePair {
    pub(crate) fn create(ctrl: &Arc<Controller>, depth: u32, purpose: &str) -> Result<Self> {
        let qid = ctrl.claim_io_qid(purpose)?;
        match ctrl.create_queues(qid, depth) {
            Ok(rings) => Ok(RawQueuePair { ctrl: ctrl.clone(), rings }),
            Err(e) => {
                ctrl.release_io_qid(qid);
                Err(e)
            }
        }
    }

    pub fn controller(&self) -> &Arc<Controller> {
        &self.ctrl
    }
    pub fn qid(&self) -> u16 {
        self.rings.qid
    }
    /// Entries in each of the SQ and CQ.
    pub fn depth(&self) -> u32 {
        self.rings.depth
    }
    /// Submission queue memory: `depth` 64-byte entries.
    pub fn sq_ptr(&self) -> *mut u8 {
        self.rings.sq.as_ptr()
    }
    /// Completion queue memory: `depth` 16-byte entries.
    pub fn cq_ptr(&self) -> *mut u8 {
        self.rings.cq.as_ptr()
    }
    pub fn sq_iova(&self) -> u64 {
        self.rings.sq.iova()
    }
    pub fn cq_iova(&self) -> u64 {
        self.rings.cq.iova()
    }
    pub fn sq_doorbell_ptr(&self) -> *mut u32 {
        self.rings.sq_doorbell.as_ptr()
    }
    pub fn cq_doorbell_ptr(&self) -> *mut u32 {
        self.rings.cq_doorbell.as_ptr()
    }
    /// How doorbell stores must be made (MMIO or ordinary memory).
    pub fn doorbell_kind(&self) -> DoorbellKind {
        self.rings.sq_doorbell.kind()
    }
    pub fn sq_doorbell(&self) -> &Doorbell {
        &self.rings.sq_doorbell
    }
    pub fn cq_doorbell(&self) -> &Doorbell {
        &self.rings.cq_doorbell
    }

    /// Deletes the SQ, then the CQ, on the controller and creates both again
    /// at the same memory and doorbells, back in the initial state (SQ tail
    /// 0, CQ head 0, expected phase 1, both rings zeroed).
    ///
    /// §5.6: the controller completes or aborts every command of the SQ
    /// before Delete I/O Submission Queue completes, so once this returns no
    /// command submitted before it can still move data. The caller must make
    /// sure nobody touches the queue memory or doorbells meanwhile. Every
    /// admin command is bounded by `ControllerOptions::admin_timeout`.
    ///
    /// Errors say which step failed; after a failed Delete the pair's state on
    /// the controller is unknown, and only a controller reset recovers it.
    pub fn recreate(&self) -> Result<()> {
        self.ctrl.recreate_queues(self.rings.qid, self.rings.depth, &self.rings.sq, &self.rings.cq)
    }
}

impl Drop for RawQueuePair {
    fn drop(&mut self) {
        if let Err(e) = self.ctrl.delete_io_queues(self.rings.qid) {
            tracing::warn!(device = %self.ctrl.name(), qid = self.rings.qid, error = %e, "deleting raw queue pair failed");
        }
        self.ctrl.release_io_qid(self.rings.qid);
    }
}
