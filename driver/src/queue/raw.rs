//! A queue pair whose commands are built by someone else: host executor lanes
//! or GPU threads that write submission entries and ring doorbells directly.

use crate::controller::Controller;
use crate::error::Result;
use crate::transport::{DmaBuffer, Doorbell, DoorbellKind};
use std::sync::Arc;

/// An I/O SQ/CQ pair created on the controller, with its memory and doorbells
/// exposed as raw addresses. Initial state: SQ tail 0, CQ head 0, expected
/// phase 1. Deleted from the controller when dropped (SQ first, then CQ),
/// before its memory is released.
pub struct RawQueuePair {
    ctrl: Arc<Controller>,
    qid: u16,
    depth: u32,
    sq: DmaBuffer,
    cq: DmaBuffer,
    sq_doorbell: Doorbell,
    cq_doorbell: Doorbell,
}

impl RawQueuePair {
    pub(crate) fn create(ctrl: &Arc<Controller>, depth: u32, purpose: &str) -> Result<Self> {
        let qid = ctrl.claim_io_qid(purpose)?;
        match ctrl.create_queues(qid, depth) {
            Ok((sq, cq, sq_doorbell, cq_doorbell)) => {
                Ok(RawQueuePair { ctrl: ctrl.clone(), qid, depth, sq, cq, sq_doorbell, cq_doorbell })
            }
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
        self.qid
    }
    /// Entries in each of the SQ and CQ.
    pub fn depth(&self) -> u32 {
        self.depth
    }
    /// Submission queue memory: `depth` 64-byte entries.
    pub fn sq_ptr(&self) -> *mut u8 {
        self.sq.as_ptr()
    }
    /// Completion queue memory: `depth` 16-byte entries.
    pub fn cq_ptr(&self) -> *mut u8 {
        self.cq.as_ptr()
    }
    pub fn sq_iova(&self) -> u64 {
        self.sq.iova()
    }
    pub fn cq_iova(&self) -> u64 {
        self.cq.iova()
    }
    pub fn sq_doorbell_ptr(&self) -> *mut u32 {
        self.sq_doorbell.as_ptr()
    }
    pub fn cq_doorbell_ptr(&self) -> *mut u32 {
        self.cq_doorbell.as_ptr()
    }
    /// How doorbell stores must be made (MMIO or ordinary memory).
    pub fn doorbell_kind(&self) -> DoorbellKind {
        self.sq_doorbell.kind()
    }
    pub fn sq_doorbell(&self) -> &Doorbell {
        &self.sq_doorbell
    }
    pub fn cq_doorbell(&self) -> &Doorbell {
        &self.cq_doorbell
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
        self.ctrl.recreate_queues(self.qid, self.depth, &self.sq, &self.cq)
    }
}

impl Drop for RawQueuePair {
    fn drop(&mut self) {
        if let Err(e) = self.ctrl.delete_io_queues(self.qid) {
            tracing::warn!(device = %self.ctrl.name(), qid = self.qid, error = %e, "deleting raw queue pair failed");
        }
        self.ctrl.release_io_qid(self.qid);
    }
}
