//! Queue pairs a client runs itself: claiming a queue id, creating the queues over the
//! client's own memory, deleting them and giving the id back.

use super::reply::{from_driver, invalid, ok, Reply};
use super::Service;
use crate::proto::{Response, MAX_NAME};

impl Service {
    /// Whether queue `qid` of `ctrl` exists, if it is leased to `client`.
    fn owns_qid(&self, client: u64, ctrl: u32, qid: u16) -> Result<bool, Response> {
        self.with_client(client, |c| c.qids.get(&(ctrl, qid)).copied())
            .flatten()
            .ok_or_else(|| invalid(format!("queue {qid} of controller {ctrl} is not leased to this client")))
    }

    /// `ClaimQueue`: a free queue id of `ctrl`, leased to the client.
    pub(super) fn claim_queue(&self, client: u64, ctrl: u32, purpose: &str) -> Reply {
        let s = self.served(ctrl)?;
        if purpose.len() > MAX_NAME {
            return Err(invalid("queue purpose too long"));
        }
        let qid = s.ctrl.claim_io_qid(&format!("client {client}: {purpose}")).map_err(from_driver)?;
        self.with_client(client, |c| c.qids.insert((ctrl, qid), false));
        ok(Response::Qid(qid))
    }

    /// `ReleaseQueue`: gives back a claimed queue id whose queues are deleted.
    pub(super) fn release_queue(&self, client: u64, ctrl: u32, qid: u16) -> Reply {
        let s = self.served(ctrl)?;
        if self.owns_qid(client, ctrl, qid)? {
            return Err(invalid(format!("queue {qid} still exists; delete it first")));
        }
        self.with_client(client, |c| c.qids.remove(&(ctrl, qid)));
        s.ctrl.release_io_qid(qid);
        ok(Response::Ok)
    }

    /// `FreeQueues`: how many queue pairs of `ctrl` are free.
    pub(super) fn free_queues(&self, ctrl: u32) -> Reply {
        ok(Response::Count(self.served(ctrl)?.ctrl.free_io_queue_pairs() as u64))
    }

    /// `CreateQueues`: creates the queue pair over rings in the client's own memory.
    pub(super) fn create_queues(
        &self,
        client: u64,
        ctrl: u32,
        qid: u16,
        depth: u32,
        sq_iova: u64,
        cq_iova: u64,
    ) -> Reply {
        let s = self.served(ctrl)?;
        if self.owns_qid(client, ctrl, qid)? {
            return Err(invalid(format!("queue {qid} already exists")));
        }
        // The rings must be this client's own memory: a client may not put its
        // queues over memory the daemon or another client mapped.
        if let Some(emu) = &s.emulated {
            let d = depth as usize;
            if !emu.iommu().owned_by(sq_iova, d * 64, client)
                || !emu.iommu().owned_by(cq_iova, d * 16, client)
            {
                return Err(invalid(format!(
                    "queue memory at SQ {sq_iova:#x} / CQ {cq_iova:#x} ({depth} entries) is not mapped for this client"
                )));
            }
        }
        let mut ranges = None;
        if s.vfio.is_some() {
            let d = depth as u64;
            match (
                self.client_range(client, ctrl, sq_iova, d * 64),
                self.client_range(client, ctrl, cq_iova, d * 16),
            ) {
                (Some(sq), Some(cq)) => ranges = Some([sq, cq]),
                _ => {
                    return Err(invalid(format!(
                        "queue memory at SQ {sq_iova:#x} / CQ {cq_iova:#x} ({depth} entries) is not inside \
                         IOVA ranges this client reserved and mapped"
                    )))
                }
            }
        }
        s.ctrl.create_queues_at(qid, depth, sq_iova, cq_iova).map_err(from_driver)?;
        self.with_client(client, |c| {
            c.qids.insert((ctrl, qid), true);
            if let Some(r) = ranges {
                c.queue_ranges.insert((ctrl, qid), r);
            }
        });
        ok(Response::Ok)
    }

    /// `DeleteQueues`: deletes the client's queue pair (its id stays claimed).
    pub(super) fn delete_queues(&self, client: u64, ctrl: u32, qid: u16) -> Reply {
        let s = self.served(ctrl)?;
        if !self.owns_qid(client, ctrl, qid)? {
            return Err(invalid(format!("queue {qid} does not exist")));
        }
        // Whatever the outcome, the client may not use the queues any more.
        self.with_client(client, |c| c.qids.insert((ctrl, qid), false));
        s.ctrl.delete_io_queues(qid).map_err(from_driver)?;
        // Deleted: the controller no longer touches their rings.
        self.with_client(client, |c| c.queue_ranges.remove(&(ctrl, qid)));
        ok(Response::Ok)
    }
}
