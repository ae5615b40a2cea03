//! I/O queue pairs driven from Rust: submit/ring/reap for pipelines, and
//! synchronous helpers that split transfers at MDTS.

use super::core::{backoff, Completion, QueueCore, Settled};
use crate::command::prp::{self, Scratch};
use crate::command::{sgl, Command, DataMode, MAX_NLB};
use crate::controller::{Controller, NamespaceInfo};
use crate::error::{DriverError, Result};
use crate::transport::{DmaBuffer, IovaSegment};
use std::sync::Arc;
use std::time::Instant;

/// The sub-range `offset..offset+len` of a segment list.
pub fn slice_segments(segments: &[IovaSegment], offset: u64, len: u64) -> Vec<IovaSegment> {
    let mut out = Vec::new();
    let (mut pos, end) = (0u64, offset + len);
    for s in segments {
        let (lo, hi) = (pos.max(offset), (pos + s.len).min(end));
        if lo < hi {
            out.push(IovaSegment { iova: s.iova + (lo - pos), len: hi - lo });
        }
        pos += s.len;
        if pos >= end {
            break;
        }
    }
    out
}

/// What [`IoQueuePair::recover`] settled.
pub type QueueRecovery = Settled;

/// An I/O submission/completion queue pair owned by one thread at a time.
/// Deleted from the controller when dropped.
pub struct IoQueuePair {
    ctrl: Arc<Controller>,
    core: QueueCore,
    /// Per-CID pages for PRP lists and SGL segments.
    scratch: DmaBuffer,
    scratch_per_cid: usize,
    page: u64,
    /// Why a recovery failed: the controller's view of the queues is unknown,
    /// so every later call fails instead of resuming on it.
    unusable: Option<String>,
}

impl IoQueuePair {
    pub(crate) fn create(ctrl: &Arc<Controller>, depth: u32, purpose: &str) -> Result<Self> {
        let info = ctrl.info();
        if depth < 2 || depth > info.max_queue_entries {
            return Err(DriverError::invalid(format!(
                "{}: queue depth {depth} is outside 2..={} (CAP.MQES)",
                ctrl.name(),
                info.max_queue_entries
            )));
        }
        let page = info.page_size as u64;
        // Enough list pages for the largest transfer, starting at any offset.
        let entries = (info.max_transfer / page) as usize + 1;
        let scratch_per_cid = prp::list_pages(entries, page).max(1) * page as usize;
        let scratch = ctrl.dma().alloc(scratch_per_cid * depth as usize)?;
        let qid = ctrl.claim_io_qid(purpose)?;
        let created = ctrl.create_queues(qid, depth).and_then(|rings| {
            QueueCore::new(ctrl.name(), rings).inspect_err(|_| {
                let _ = ctrl.delete_io_queues(qid);
            })
        });
        match created {
            Ok(core) => {
                Ok(IoQueuePair { ctrl: ctrl.clone(), core, scratch, scratch_per_cid, page, unusable: None })
            }
            Err(e) => {
                ctrl.release_io_qid(qid);
                Err(e)
            }
        }
    }

    pub fn qid(&self) -> u16 {
        self.core.qid()
    }
    pub fn depth(&self) -> u32 {
        self.core.depth()
    }
    pub fn controller(&self) -> &Arc<Controller> {
        &self.ctrl
    }
    pub fn in_flight(&self) -> u32 {
        self.core.in_flight()
    }
    pub fn free_slots(&self) -> u32 {
        self.core.free_slots()
    }

    /// Whether a failed [`recover`](Self::recover) left the pair unusable.
    pub fn is_unusable(&self) -> bool {
        self.unusable.is_some()
    }

    fn usable(&self) -> Result<()> {
        match &self.unusable {
            None => Ok(()),
            Some(reason) => Err(DriverError::QueueUnusable {
                device: self.ctrl.name().to_string(),
                qid: self.qid(),
                reason: reason.clone(),
            }),
        }
    }

    /// Settles every command still without a completion (abandoned after a
    /// timeout, or outstanding) by deleting the SQ and CQ on the controller
    /// and creating them again, then starts the host side over: SQ tail 0,
    /// CQ head 0, phase 1, every CID free, parked completions dropped.
    ///
    /// §5.6: the controller completes or aborts each command of the SQ before
    /// Delete I/O Submission Queue completes, so afterwards none of them can
    /// still move data: a timed-out write did either land before this
    /// returned or never will. Each admin command is bounded by the admin
    /// timeout. If any step fails the pair is left unusable: every later call
    /// returns [`DriverError::QueueUnusable`] (the controller needs a reset).
    pub fn recover(&mut self) -> Result<QueueRecovery> {
        self.usable()?;
        let qid = self.qid();
        let (sq, cq) = (self.core.sq_memory(), self.core.cq_memory());
        if let Err(e) = self.ctrl.recreate_queues(qid, self.depth(), sq, cq) {
            self.unusable = Some(format!("recovery failed: {e}"));
            return Err(e);
        }
        let settled = self.core.reset();
        tracing::info!(
            device = %self.ctrl.name(),
            qid,
            abandoned = settled.abandoned,
            outstanding = settled.outstanding,
            "I/O queue pair recovered"
        );
        Ok(settled)
    }

    /// Resolves `Auto` and refuses SGL on a controller without it.
    pub fn resolve_mode(&self, mode: DataMode) -> Result<DataMode> {
        let sgl = self.ctrl.info().sgl.available();
        match mode {
            DataMode::Auto if sgl => Ok(DataMode::Sgl),
            DataMode::Auto | DataMode::Prp => Ok(DataMode::Prp),
            DataMode::Sgl if sgl => Ok(DataMode::Sgl),
            DataMode::Sgl => Err(DriverError::Unsupported {
                device: self.ctrl.name().to_string(),
                what: "SGL data pointers requested, but Identify reports SGLS = 0".into(),
            }),
        }
    }

    /// Places a command without data at the tail. Not visible until [`ring`](Self::ring).
    pub fn submit(&mut self, cmd: Command, token: u64) -> Result<u16> {
        self.usable()?;
        self.core.submit(cmd.entry(), cmd.name(), token)
    }

    /// Places a command whose data is `segments`, described as PRP or SGL.
    /// The transfer must fit one command (≤ `info().max_transfer`).
    pub fn submit_data(
        &mut self,
        cmd: Command,
        segments: &[IovaSegment],
        mode: DataMode,
        token: u64,
    ) -> Result<u16> {
        self.usable()?;
        let mode = self.resolve_mode(mode)?;
        let bytes: u64 = segments.iter().map(|s| s.len).sum();
        let max = self.ctrl.info().max_transfer;
        if bytes > max {
            return Err(DriverError::invalid(format!(
                "{} of {bytes} bytes exceeds the {max}-byte maximum transfer",
                cmd.name()
            )));
        }
        let cid = self.core.reserve()?;
        let scratch = Scratch {
            buf: &self.scratch,
            offset: cid as usize * self.scratch_per_cid,
            len: self.scratch_per_cid,
        };
        let ptr = match mode {
            DataMode::Sgl => sgl::build(segments, self.ctrl.info().sgl, scratch),
            _ => prp::build(segments, self.page, scratch),
        };
        let pushed = ptr.and_then(|p| {
            let cmd = cmd.data(p);
            self.core.push(cid, cmd.entry(), cmd.name(), token)
        });
        if let Err(e) = pushed {
            self.core.unreserve(cid);
            return Err(e);
        }
        Ok(cid)
    }

    /// Publishes submitted commands with one doorbell write.
    pub fn ring(&mut self) {
        // Nothing can have been placed since the pair became unusable.
        self.core.ring()
    }

    /// Reaps completions (one CQ doorbell per batch).
    pub fn reap(&mut self, out: &mut Vec<Completion>) -> Result<usize> {
        self.usable()?;
        let before = out.len();
        self.core.take_parked(out);
        self.core.reap(out)?;
        Ok(out.len() - before)
    }

    /// Waits for one command, bounded by the controller's I/O timeout.
    pub fn wait(&mut self, cid: u16) -> Result<Completion> {
        self.usable()?;
        let timeout = self.ctrl.options().io_timeout;
        let ctrl = self.ctrl.clone();
        self.core.wait(cid, timeout, || ctrl.check_fatal())
    }

    fn fail(&self, c: &Completion) -> DriverError {
        DriverError::CommandFailed {
            device: self.ctrl.name().to_string(),
            qid: self.qid(),
            cid: c.cid,
            command: crate::command::io_opcode_name(c.opcode),
            status: c.status,
        }
    }

    fn namespace(&self, nsid: u32, lba: u64, blocks: u64) -> Result<NamespaceInfo> {
        let ns = self.ctrl.data_namespace(nsid)?.clone();
        if lba.checked_add(blocks).is_none_or(|end| end > ns.blocks) {
            return Err(DriverError::invalid(format!(
                "{}: LBAs {lba}..{} are past the end of namespace {nsid} ({} blocks)",
                self.ctrl.name(),
                lba.saturating_add(blocks),
                ns.blocks
            )));
        }
        Ok(ns)
    }

    /// Reads `segments` (total a multiple of the LBA size) from `lba` on, split
    /// at the maximum transfer and pipelined up to the queue depth.
    pub fn read(&mut self, nsid: u32, lba: u64, segments: &[IovaSegment], mode: DataMode) -> Result<()> {
        self.transfer(false, nsid, lba, segments, mode)
    }

    /// Writes `segments` starting at `lba`; see [`read`](Self::read).
    pub fn write(&mut self, nsid: u32, lba: u64, segments: &[IovaSegment], mode: DataMode) -> Result<()> {
        self.transfer(true, nsid, lba, segments, mode)
    }

    /// Reads into `buf[offset..offset+len]`.
    pub fn read_buf(
        &mut self,
        nsid: u32,
        lba: u64,
        buf: &DmaBuffer,
        offset: usize,
        len: usize,
        mode: DataMode,
    ) -> Result<()> {
        let seg = buffer_segment(buf, offset, len)?;
        self.read(nsid, lba, &[seg], mode)
    }

    /// Writes `buf[offset..offset+len]`.
    pub fn write_buf(
        &mut self,
        nsid: u32,
        lba: u64,
        buf: &DmaBuffer,
        offset: usize,
        len: usize,
        mode: DataMode,
    ) -> Result<()> {
        let seg = buffer_segment(buf, offset, len)?;
        self.write(nsid, lba, &[seg], mode)
    }

    fn transfer(
        &mut self,
        write: bool,
        nsid: u32,
        lba: u64,
        segments: &[IovaSegment],
        mode: DataMode,
    ) -> Result<()> {
        self.usable()?;
        let bytes: u64 = segments.iter().map(|s| s.len).sum();
        let lba_size = self.ctrl.info().namespace(nsid).map_or(512, |n| n.lba_size as u64);
        if bytes == 0 || !bytes.is_multiple_of(lba_size) {
            return Err(DriverError::invalid(format!(
                "transfer of {bytes} bytes is not a whole number of {lba_size}-byte blocks"
            )));
        }
        self.namespace(nsid, lba, bytes / lba_size)?;
        let chunk = (self.ctrl.info().max_transfer / lba_size).min(MAX_NLB as u64) * lba_size;
        let mut off = 0u64;
        let mut outstanding = 0u32;
        let mut done = Vec::new();
        let mut first_err = None;
        let timeout = self.ctrl.options().io_timeout;
        let mut last_progress = Instant::now();
        let mut spins = 0;
        while off < bytes || outstanding > 0 {
            while off < bytes && self.core.free_slots() > 0 && first_err.is_none() {
                let len = chunk.min(bytes - off);
                let blocks = (len / lba_size) as u32;
                let slba = lba + off / lba_size;
                let cmd = if write {
                    Command::write(nsid, slba, blocks)
                } else {
                    Command::read(nsid, slba, blocks)
                };
                let segs = slice_segments(segments, off, len);
                match self.submit_data(cmd, &segs, mode, off) {
                    Ok(_) => {
                        outstanding += 1;
                        off += len;
                    }
                    Err(e) => {
                        first_err = Some(e);
                        off = bytes;
                    }
                }
            }
            self.core.ring();
            if outstanding == 0 {
                break;
            }
            done.clear();
            if self.reap(&mut done)? > 0 {
                last_progress = Instant::now();
                spins = 0;
            }
            for c in &done {
                outstanding -= 1;
                if !c.status.is_success() && first_err.is_none() {
                    first_err = Some(self.fail(c));
                }
            }
            if outstanding > 0 && done.is_empty() {
                if last_progress.elapsed() >= timeout {
                    self.ctrl.check_fatal()?;
                    return Err(self.timeout_error(timeout));
                }
                backoff(&mut spins);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn timeout_error(&mut self, waited: std::time::Duration) -> DriverError {
        // Report the oldest command still in flight; the CID stays reserved.
        let cid = (0..self.depth() as u16 - 1).find(|&c| self.is_busy(c)).unwrap_or(0);
        self.core.abandon(cid);
        DriverError::CommandTimeout {
            device: self.ctrl.name().to_string(),
            qid: self.qid(),
            cid,
            command: self.core.command_name(cid),
            waited,
        }
    }

    fn is_busy(&self, cid: u16) -> bool {
        self.core.is_busy(cid)
    }

    /// Flushes the volatile write cache.
    pub fn flush(&mut self, nsid: u32) -> Result<()> {
        self.simple(Command::flush(nsid))
    }

    /// Zeroes `blocks` blocks at `lba` without transferring data.
    pub fn write_zeroes(&mut self, nsid: u32, lba: u64, blocks: u32) -> Result<()> {
        if blocks == 0 || blocks > MAX_NLB {
            return Err(DriverError::invalid(format!(
                "Write Zeroes of {blocks} blocks is not 1..={MAX_NLB}"
            )));
        }
        self.namespace(nsid, lba, blocks as u64)?;
        self.simple(Command::write_zeroes(nsid, lba, blocks))
    }

    /// Deallocates (trims) the given `(lba, blocks)` ranges (at most 256).
    pub fn deallocate(&mut self, nsid: u32, ranges: &[(u64, u32)]) -> Result<()> {
        if ranges.is_empty() || ranges.len() > 256 {
            return Err(DriverError::invalid(format!(
                "{} ranges; Dataset Management takes 1..=256",
                ranges.len()
            )));
        }
        let buf = self.ctrl.dma().alloc(ranges.len() * 16)?;
        for (i, &(lba, blocks)) in ranges.iter().enumerate() {
            self.namespace(nsid, lba, blocks as u64)?;
            // §6.7 range: context attributes, length in blocks, starting LBA.
            buf.write_obj(i * 16, &[0u32, blocks])?;
            buf.write_obj(i * 16 + 8, &lba)?;
        }
        let seg = IovaSegment { iova: buf.iova(), len: ranges.len() as u64 * 16 };
        let cid =
            self.submit_data(Command::deallocate(nsid, ranges.len() as u32), &[seg], DataMode::Prp, 0)?;
        self.core.ring();
        let c = self.wait(cid)?;
        if !c.status.is_success() {
            return Err(self.fail(&c));
        }
        Ok(())
    }

    fn simple(&mut self, cmd: Command) -> Result<()> {
        let cid = self.submit(cmd, 0)?;
        self.core.ring();
        let c = self.wait(cid)?;
        if !c.status.is_success() {
            return Err(self.fail(&c));
        }
        Ok(())
    }
}

fn buffer_segment(buf: &DmaBuffer, offset: usize, len: usize) -> Result<IovaSegment> {
    if offset.checked_add(len).is_none_or(|e| e > buf.len()) {
        return Err(DriverError::invalid(format!(
            "{offset:#x}+{len:#x} is outside a {:#x}-byte buffer",
            buf.len()
        )));
    }
    Ok(IovaSegment { iova: buf.iova_at(offset), len: len as u64 })
}

impl Drop for IoQueuePair {
    fn drop(&mut self) {
        if let Err(e) = self.ctrl.delete_io_queues(self.qid()) {
            tracing::warn!(device = %self.ctrl.name(), qid = self.qid(), error = %e, "deleting I/O queue pair failed");
        }
        self.ctrl.release_io_qid(self.qid());
    }
}

impl Controller {
    /// Creates an I/O queue pair of `depth` entries (≤ CAP.MQES + 1).
    pub fn create_io_queue_pair(self: &Arc<Self>, depth: u32) -> Result<IoQueuePair> {
        IoQueuePair::create(self, depth, "an I/O queue pair")
    }
    /// Creates a queue pair for an executor that builds commands itself.
    pub fn create_raw_queue_pair(self: &Arc<Self>, depth: u32) -> Result<super::RawQueuePair> {
        super::RawQueuePair::create(self, depth, "a raw queue pair")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slicing_segments() {
        let s = [IovaSegment { iova: 0x1000, len: 0x1000 }, IovaSegment { iova: 0x9000, len: 0x2000 }];
        assert_eq!(
            slice_segments(&s, 0x800, 0x1000),
            vec![IovaSegment { iova: 0x1800, len: 0x800 }, IovaSegment { iova: 0x9000, len: 0x800 }]
        );
        assert_eq!(slice_segments(&s, 0x1000, 0x2000), vec![IovaSegment { iova: 0x9000, len: 0x2000 }]);
        assert_eq!(slice_segments(&s, 0, 0x3000).len(), 2);
    }
}
