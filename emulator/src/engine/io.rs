//! NVM command set I/O commands (§6): Read, Write, Flush, Write Zeroes, Dataset Management.

use super::{Done, Engine};
use crate::config::NamespaceConfig;
use crate::cost::Direction;
use crate::media::MediaError;
use crate::walk::{walk_prp_into, walk_sgl_into, SglPiece};
use std::sync::atomic::Ordering;
use std::time::Instant;
use tutti_driver::spec::{IoOpcode, Psdt, Status, SubmissionEntry};

/// Flush with this NSID applies to every namespace (§6.8).
const ALL_NAMESPACES: u32 = 0xffff_ffff;
/// Force Unit Access (CDW12 bit 30 of Read/Write).
const FUA: u32 = 1 << 30;
/// Dataset Management CDW11 bit 2: Attribute – Deallocate (§6.7).
const DSM_DEALLOCATE: u32 = 1 << 2;
/// One Dataset Management range: context attributes u32, length u32, starting LBA u64.
const DSM_RANGE_LEN: usize = 16;

fn check_lba_range(ns: &NamespaceConfig, slba: u64, nlb: u64) -> Result<(), Status> {
    match slba.checked_add(nlb) {
        Some(end) if end <= ns.blocks => Ok(()),
        _ => Err(Status::LBA_OUT_OF_RANGE),
    }
}

impl Engine {
    /// The namespace `nsid` names (1-based) and its index in the media.
    pub(super) fn namespace(&self, nsid: u32) -> Result<(usize, NamespaceConfig), Status> {
        let index = (nsid as usize).checked_sub(1).ok_or(Status::INVALID_NAMESPACE)?;
        let ns = self.shared.cfg.namespaces.get(index).ok_or(Status::INVALID_NAMESPACE)?;
        Ok((index, ns.clone()))
    }

    fn media_status(&self, e: MediaError, is_read: bool) -> Status {
        match e {
            MediaError::Dma(fault) => {
                tracing::debug!(device = %self.name(), iova = format_args!("{:#x}", fault.iova), len = fault.len,
                    "data transfer hit an unmapped address");
                Status::DATA_TRANSFER_ERROR
            }
            MediaError::Io(err) => {
                tracing::warn!(device = %self.name(), error = %err, "media I/O failed");
                if is_read {
                    Status::UNRECOVERED_READ_ERROR
                } else {
                    Status::WRITE_FAULT
                }
            }
            MediaError::BadRequest => {
                tracing::error!(device = %self.name(), "engine asked the media for an invalid range");
                Status::INTERNAL_ERROR
            }
        }
    }

    pub(super) fn io_command(&mut self, sqe: &SubmissionEntry) -> Done {
        let Some(op) = IoOpcode::from_raw(sqe.opcode()) else {
            return Done::err(Status::INVALID_OPCODE);
        };
        // Fused operations (Compare and Write) are not supported.
        if sqe.fuse() != 0 {
            return Done::err(Status::INVALID_FIELD);
        }
        let result = match op {
            IoOpcode::Read | IoOpcode::Write => self.read_write(op == IoOpcode::Read, sqe),
            IoOpcode::Flush => self.flush(sqe),
            IoOpcode::WriteZeroes => self.write_zeroes(sqe),
            IoOpcode::DatasetManagement => self.dataset_management(sqe),
        };
        let moved = *result.as_ref().unwrap_or(&0);
        let mut done = Done::from(result.map(|_| 0));
        let dir = match op {
            IoOpcode::Read => Direction::Read,
            IoOpcode::Write => Direction::Write,
            _ => Direction::Other,
        };
        done.due = self.cost_due(dir, moved);
        done
    }

    /// When a command that moved `bytes` may complete under the cost model, if it adds any delay.
    fn cost_due(&mut self, dir: Direction, bytes: u64) -> Option<Instant> {
        // Without a model there is nothing to pace, and no clock to read per command.
        if self.cost_free {
            return None;
        }
        let a = self.cost.admit(&self.shared.cfg.cost, Instant::now(), dir, bytes);
        let counters = &self.shared.counters;
        if a.due.is_some() {
            counters.cost_delayed.fetch_add(1, Ordering::Relaxed);
        }
        if a.mixed {
            counters.mixed_commands.fetch_add(1, Ordering::Relaxed);
            counters.mixed_nanos.fetch_add(a.mixed_nanos, Ordering::Relaxed);
        }
        a.due
    }

    fn max_transfer(&self) -> Option<u64> {
        let cfg = &self.shared.cfg;
        (cfg.mdts != 0).then(|| 1u64 << (cfg.mdts as u32 + 12 + cfg.mps_min as u32))
    }

    /// The host memory a command's data pointer describes (§4.3 PRP, §4.4
    /// SGL), into `out` (a buffer the engine reuses: no allocation per command).
    pub(super) fn data_pieces(
        &self,
        sqe: &SubmissionEntry,
        len: u64,
        is_read: bool,
        out: &mut Vec<SglPiece>,
    ) -> Result<(), Status> {
        let iommu = &self.dma;
        let read = |iova: u64, buf: &mut [u8]| iommu.dma_read(iova, buf);
        match sqe.psdt() {
            Psdt::Prp => walk_prp_into(sqe.prp1(), sqe.prp2(), len, self.page_size(), read, out),
            Psdt::SglContiguousMeta | Psdt::SglMetaSegment => {
                let mode = self.shared.cfg.sgl;
                if !mode.available() {
                    return Err(Status::INVALID_FIELD);
                }
                walk_sgl_into(sqe.sgl1(), len, mode, is_read, read, out)
            }
            Psdt::Reserved => Err(Status::INVALID_FIELD),
        }
    }

    /// Read (§6.9) or Write (§6.15); returns the bytes moved.
    fn read_write(&mut self, is_read: bool, sqe: &SubmissionEntry) -> Result<u64, Status> {
        let (index, ns) = self.namespace(sqe.nsid)?;
        let nlb = sqe.nlb() as u64;
        let bytes = nlb << ns.lba_shift;
        if self.max_transfer().is_some_and(|max| bytes > max) {
            return Err(Status::INVALID_FIELD);
        }
        check_lba_range(&ns, sqe.slba(), nlb)?;
        let mut pieces = std::mem::take(&mut self.pieces);
        let r = self.move_data(is_read, sqe, index, bytes, ns.lba_shift, &mut pieces);
        self.pieces = pieces;
        r
    }

    /// The data movement of [`read_write`](Self::read_write), with the engine's piece buffer.
    fn move_data(
        &mut self,
        is_read: bool,
        sqe: &SubmissionEntry,
        index: usize,
        bytes: u64,
        lba_shift: u8,
        pieces: &mut Vec<SglPiece>,
    ) -> Result<u64, Status> {
        self.data_pieces(sqe, bytes, is_read, pieces)?;
        let pieces = &pieces[..];
        let offset = sqe.slba() << lba_shift;
        let counters = &self.shared.counters;
        if is_read {
            let r = self.media.read(index, offset, pieces, &self.dma);
            r.map_err(|e| self.media_status(e, true))?;
            super::bump(&counters.bytes_read, bytes);
        } else {
            let r = self.media.write(index, offset, pieces, &self.dma);
            r.map_err(|e| self.media_status(e, false))?;
            // Without a write cache (or with FUA) a write is durable when it completes.
            if sqe.cdw12 & FUA != 0 || !self.features.write_cache {
                let r = self.media.flush();
                r.map_err(|e| self.media_status(e, false))?;
            }
            super::bump(&counters.bytes_written, bytes);
        }
        Ok(bytes)
    }

    /// Flush (§6.8).
    fn flush(&mut self, sqe: &SubmissionEntry) -> Result<u64, Status> {
        if sqe.nsid != ALL_NAMESPACES {
            self.namespace(sqe.nsid)?;
        }
        let r = self.media.flush();
        r.map_err(|e| self.media_status(e, false))?;
        Ok(0)
    }

    /// Write Zeroes (§6.16): no data transfer, so MDTS does not apply.
    fn write_zeroes(&mut self, sqe: &SubmissionEntry) -> Result<u64, Status> {
        let (index, ns) = self.namespace(sqe.nsid)?;
        let nlb = sqe.nlb() as u64;
        check_lba_range(&ns, sqe.slba(), nlb)?;
        let r = self.media.write_zeroes(index, sqe.slba() << ns.lba_shift, nlb << ns.lba_shift);
        r.map_err(|e| self.media_status(e, false))?;
        Ok(0)
    }

    /// Dataset Management (§6.7): NR (CDW10[7:0], 0-based) ranges read through the
    /// data pointer; with AD (CDW11 bit 2) they are deallocated, otherwise they are hints.
    fn dataset_management(&mut self, sqe: &SubmissionEntry) -> Result<u64, Status> {
        let (index, ns) = self.namespace(sqe.nsid)?;
        let ranges = (sqe.cdw10 & 0xff) as usize + 1;
        let mut raw = vec![0u8; ranges * DSM_RANGE_LEN];
        let mut pieces = Vec::new();
        self.data_pieces(sqe, raw.len() as u64, false, &mut pieces)?;
        let mut pos = 0usize;
        for piece in &pieces {
            let n = piece.len() as usize;
            if let SglPiece::Data(seg) = piece {
                let r = self.dma.dma_read(seg.iova, &mut raw[pos..pos + n]);
                r.map_err(|_| Status::DATA_TRANSFER_ERROR)?;
            }
            pos += n;
        }
        if sqe.cdw11 & DSM_DEALLOCATE == 0 {
            return Ok(0);
        }
        let parsed: Vec<(u64, u64)> = raw
            .chunks_exact(DSM_RANGE_LEN)
            .map(|r| {
                let mut nlb = [0u8; 4];
                nlb.copy_from_slice(&r[4..8]);
                let mut slba = [0u8; 8];
                slba.copy_from_slice(&r[8..16]);
                (u64::from_le_bytes(slba), u32::from_le_bytes(nlb) as u64)
            })
            .collect();
        // Check every range before changing any, so a bad range leaves the namespace untouched.
        for &(slba, nlb) in &parsed {
            check_lba_range(&ns, slba, nlb)?;
        }
        for (slba, nlb) in parsed.into_iter().filter(|&(_, nlb)| nlb > 0) {
            let r = self.media.deallocate(index, slba << ns.lba_shift, nlb << ns.lba_shift);
            r.map_err(|e| self.media_status(e, false))?;
        }
        Ok(0)
    }
}
