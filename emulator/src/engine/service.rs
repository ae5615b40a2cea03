//! Command fetching and completion posting (§4.1, §4.6, §7.2).

use super::queues::{Cq, Pending};
use super::{Done, Engine, Phase};
use std::sync::atomic::Ordering;
use std::time::Instant;
use tutti_driver::spec::registers::{cq_head_doorbell, sq_tail_doorbell};
use tutti_driver::spec::{CompletionEntry, Status, SubmissionEntry};
use tutti_driver::spec::{CQE_SIZE, SQE_SIZE};
use zerocopy::IntoBytes;

/// Commands taken from one SQ before the next SQ gets a turn.
const BURST: u32 = 32;

impl Engine {
    /// A new or deleted queue starts from an empty ring: stale doorbell values must not be read.
    pub(super) fn zero_sq_doorbell(&self, qid: u16) {
        self.shared.regs.set32(sq_tail_doorbell(qid, self.dstrd()), 0);
    }
    pub(super) fn zero_cq_doorbell(&self, qid: u16) {
        self.shared.regs.set32(cq_head_doorbell(qid, self.dstrd()), 0);
    }

    pub(super) fn service(&mut self) -> bool {
        self.refresh_cq_heads();
        let mut busy = self.post_due(false);
        for qid in 0..self.sqs.len() {
            if self.phase != Phase::Running {
                break;
            }
            busy |= self.fetch(qid as u16);
        }
        busy
    }

    fn refresh_cq_heads(&mut self) {
        let (regs, dstrd) = (&self.shared.regs, self.shared.cfg.dstrd);
        for (qid, slot) in self.cqs.iter_mut().enumerate() {
            let Some(cq) = slot.as_mut() else { continue };
            let value = regs.get32(cq_head_doorbell(qid as u16, dstrd));
            // The head may only move over entries we posted (§4.1); anything else is a host bug.
            let posted = (cq.tail + cq.size - cq.head) % cq.size;
            let advance = value.wrapping_add(cq.size).wrapping_sub(cq.head) % cq.size;
            if value < cq.size && advance <= posted {
                cq.head = value;
                cq.bad_head = None;
            } else if cq.bad_head != Some(value) {
                tracing::warn!(
                    device = %self.shared.cfg.name, qid, value, head = cq.head, tail = cq.tail, size = cq.size,
                    "ignoring invalid CQ head doorbell write"
                );
                cq.bad_head = Some(value);
            }
        }
    }

    /// Fetches and executes up to [`BURST`] commands from SQ `qid`.
    fn fetch(&mut self, qid: u16) -> bool {
        let page = self.page_size();
        let doorbell = self.shared.regs.get32(sq_tail_doorbell(qid, self.dstrd()));
        let Some(sq) = self.sqs[qid as usize].as_mut() else { return false };
        if doorbell < sq.size {
            sq.tail = doorbell;
            sq.bad_tail = None;
        } else if sq.bad_tail != Some(doorbell) {
            tracing::warn!(device = %self.shared.cfg.name, qid, value = doorbell, size = sq.size,
                "ignoring SQ tail doorbell write beyond the queue");
            sq.bad_tail = Some(doorbell);
        }
        let mut busy = false;
        for _ in 0..BURST {
            let Some(sq) = self.sqs[qid as usize].as_mut() else { break };
            if sq.head == sq.tail || sq.stopped {
                break;
            }
            let cqid = sq.cqid;
            if !self.cqs[cqid as usize].as_ref().is_some_and(Cq::can_accept) {
                break;
            }
            let addr = sq.mem.entry(sq.head, SQE_SIZE, page);
            let mut sqe = SubmissionEntry::default();
            if self.qmem.dma_read(addr, sqe.as_mut_bytes()).is_err() {
                let why = format!("cannot fetch SQ {qid} entry {} at {addr:#x}", sq.head);
                if sq.remote {
                    // Another process's ring (a client that died or unmapped it)
                    // must not stop the controller for everyone else.
                    tracing::warn!(device = %self.shared.cfg.name, qid, "{why}: ring in another process; SQ stopped until deleted");
                    sq.stopped = true;
                    return true;
                }
                self.enter_fatal(&why);
                return true;
            }
            sq.head = (sq.head + 1) % sq.size;
            busy = true;
            let trace = &self.shared.trace;
            if trace.on.load(Ordering::Relaxed) && trace.first_fetch_ns.load(Ordering::Relaxed) == 0 {
                trace.first_fetch_ns.store(crate::monotonic_ns(), Ordering::Release);
            }
            if let Some(done) = self.execute(qid, &sqe) {
                self.complete(qid, cqid, sqe.cid(), done);
            }
            if self.phase != Phase::Running {
                break;
            }
        }
        busy
    }

    /// Posts now, or queues the completion until it is due.
    fn complete(&mut self, sqid: u16, cqid: u16, cid: u16, done: Done) {
        let sqhd = self.sqs[sqid as usize].as_ref().map_or(0, |sq| sq.head as u16);
        match done.due {
            Some(due) if due > Instant::now() || done.deferred.is_some() => {
                if let Some(cq) = self.cqs[cqid as usize].as_mut() {
                    cq.reserved += 1;
                }
                let at = self.pending.partition_point(|p| p.due <= due);
                let p = Pending {
                    due,
                    sqid,
                    cqid,
                    sqhd,
                    cid,
                    dw0: done.dw0,
                    status: done.status,
                    deferred: done.deferred,
                };
                self.pending.insert(at, p);
            }
            _ => self.post(cqid, sqid, sqhd, cid, done.dw0, done.status),
        }
    }

    /// Posts pending completions that are due (all of them with `force`) and whose CQ has room.
    pub(super) fn post_due(&mut self, force: bool) -> bool {
        if self.pending.is_empty() {
            return false;
        }
        let now = Instant::now();
        let mut posted = false;
        let mut i = 0;
        while i < self.pending.len() {
            let (due, cqid, sqid) = (self.pending[i].due, self.pending[i].cqid, self.pending[i].sqid);
            if !force && due > now {
                break;
            }
            let Some(cq) = self.cqs[cqid as usize].as_mut() else {
                self.pending.remove(i);
                continue;
            };
            if cq.free() == 0 {
                i += 1;
                continue;
            }
            cq.reserved = cq.reserved.saturating_sub(1);
            let mut p = self.pending.remove(i);
            if let Some(sqe) = p.deferred.take() {
                // The late execution: data moves only now, long after the command was fetched.
                let done = if sqid == super::ADMIN_QID {
                    self.admin_command(&sqe)
                } else {
                    self.io_command_of(sqid, &sqe)
                };
                p.status = super::with_dnr_if_permanent(done.status);
                p.dw0 = done.dw0;
                self.shared.counters.late_executions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::debug!(device = %self.shared.cfg.name, sqid, cid = p.cid, status = %p.status,
                    "fault: deferred command executed");
            }
            let sqhd = self.sqs[sqid as usize].as_ref().map_or(p.sqhd, |sq| sq.head as u16);
            self.post(cqid, sqid, sqhd, p.cid, p.dw0, p.status);
            posted = true;
        }
        posted
    }

    /// Writes one completion entry at the CQ tail. Callers make sure the CQ has room.
    fn post(&mut self, cqid: u16, sqid: u16, sqhd: u16, cid: u16, dw0: u32, status: Status) {
        let page = self.page_size();
        let Some(cq) = self.cqs[cqid as usize].as_mut() else { return };
        let entry = CompletionEntry::new(dw0, sqhd, sqid, cid, cq.phase, status);
        let addr = cq.mem.entry(cq.tail, CQE_SIZE, page);
        let remote = cq.remote;
        cq.tail += 1;
        if cq.tail == cq.size {
            cq.tail = 0;
            cq.phase = !cq.phase;
        }
        // §4.6: the host owns an entry once its phase tag flips, so DW3 (which
        // holds the tag) is stored last, with release ordering.
        let iommu = &self.qmem;
        let written = iommu
            .dma_write(addr, &entry.as_bytes()[..12])
            .and_then(|()| iommu.dma_store_u32(addr + 12, entry.dw3));
        if self.shared.trace.on.load(Ordering::Relaxed) {
            self.shared.trace.last_post_ns.store(crate::monotonic_ns(), Ordering::Release);
        }
        if written.is_err() {
            let why = format!("cannot write CQ {cqid} entry at {addr:#x}");
            if remote {
                tracing::warn!(device = %self.shared.cfg.name, cqid, sqid, cid, "{why}: ring in another process; completion dropped");
            } else {
                self.enter_fatal(&why);
            }
        }
    }

    /// Completes the pending commands of SQ `sqid` now with Aborted: SQ Deletion (§5.6).
    pub(super) fn abort_pending_for_sq(&mut self, sqid: u16) {
        let now = Instant::now();
        let sqhd = self.sqs[sqid as usize].as_ref().map_or(0, |sq| sq.head as u16);
        let mut any = false;
        for p in self.pending.iter_mut().filter(|p| p.sqid == sqid) {
            p.due = now.min(p.due);
            p.status = Status::ABORTED_SQ_DELETION;
            // A command not yet executed is aborted without touching memory.
            p.deferred = None;
            p.sqhd = sqhd;
            any = true;
        }
        if any {
            self.pending.sort_by_key(|p| p.due);
            self.post_due(false);
        }
    }
}
