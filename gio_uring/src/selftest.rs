//! A write/read/verify round trip through gio_uring on brought-up controllers:
//! what `tutti selftest` can run on emulated drives, on VFIO drives, and on
//! QEMU's controllers in the guest harness.
//!
//! It overwrites `lbas` from `first_lba` on namespace 1 of every controller.

use crate::drive::DriveQueues;
use crate::error::{GioError, Result};
use crate::executor::{ExecMode, HostExecutor, HostExecutorConfig};
use crate::gio_uring::{GioOptions, GioUring};
use crate::iocb::{ioctx, DataRef, Op};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_driver::controller::Controller;
use tutti_driver::spec::{SglDescriptor, SglSupport};
use tutti_driver::transport::DmaBuffer;
use tutti_kernels::abi::IoCtx;

/// What to run.
#[derive(Clone, Debug)]
pub struct SelftestOptions {
    pub mode: ExecMode,
    pub queue_pairs: u32,
    pub queue_depth: u32,
    /// IOCBs per pass (each of `ioctx_per_iocb` commands, spread over the drives).
    pub iocbs: u32,
    pub ioctx_per_iocb: u32,
    /// Bytes per command (a multiple of every drive's LBA size and of 4 KiB).
    pub command_bytes: u32,
    pub first_lba: u64,
    /// Use PRP even where the controller supports SGLs.
    pub force_prp: bool,
    pub timeout: Duration,
}

impl Default for SelftestOptions {
    fn default() -> Self {
        SelftestOptions {
            mode: ExecMode::Launch,
            queue_pairs: 2,
            queue_depth: 64,
            iocbs: 4,
            ioctx_per_iocb: 2048,
            command_bytes: 4096,
            first_lba: 0,
            force_prp: false,
            timeout: Duration::from_secs(60),
        }
    }
}

/// What a round trip did.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SelftestReport {
    pub drives: Vec<String>,
    /// "SGL" or "PRP" per drive.
    pub data_pointers: Vec<&'static str>,
    pub executor: String,
    pub commands: u64,
    pub bytes_verified: u64,
    /// Fewest times a queue wrapped.
    pub min_queue_wraps: u64,
    pub write_ms: u64,
    pub read_ms: u64,
}

/// What recovering one drive of the ring did ([`GioUring::recover_drive`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DriveRecovery {
    pub drive: String,
    /// NVMe queue ids deleted and created again through the admin queue.
    pub qids: Vec<u16>,
    /// Commands that had expired on the drive's queues before the recovery.
    pub expired_commands: u64,
    pub dead_queues: u32,
    /// How long the drive's queues were closed.
    pub elapsed_us: u64,
}

/// Writes a pattern through gio_uring, reads it back into fresh memory and
/// compares byte for byte. Fails on any IOCTX error or differing byte.
pub fn round_trip(ctrls: &[Arc<Controller>], opts: &SelftestOptions) -> Result<SelftestReport> {
    Selftest::new(ctrls, opts)?.pass(0)
}

/// A ring over the controllers' queues and the buffers of the round trip, so
/// that several passes — and a recovery of the drives between them — run on
/// the same queues.
pub struct Selftest {
    ring: GioUring,
    opts: SelftestOptions,
    names: Vec<String>,
    sgl: Vec<bool>,
    lbas_per_cmd: Vec<u64>,
    total: usize,
    len: usize,
    src: Vec<DmaBuffer>,
    dst: Vec<DmaBuffer>,
}

impl Selftest {
    /// Creates the queue pairs, the ring and the buffers; moves no data.
    pub fn new(ctrls: &[Arc<Controller>], opts: &SelftestOptions) -> Result<Self> {
        if ctrls.is_empty() || opts.command_bytes == 0 || !opts.command_bytes.is_multiple_of(4096) {
            return Err(GioError::invalid("need controllers and a command size that is a multiple of 4 KiB"));
        }
        let drives = ctrls
            .iter()
            .map(|c| DriveQueues::create(c, 1, opts.queue_pairs, opts.queue_depth))
            .collect::<Result<Vec<_>>>()?;
        let nd = drives.len();
        let total = opts.iocbs as usize * opts.ioctx_per_iocb as usize;
        let per_drive = total.div_ceil(nd);
        let mut lbas_per_cmd = Vec::new();
        let mut sgl = Vec::new();
        for d in &drives {
            if !opts.command_bytes.is_multiple_of(d.lba_size) || opts.command_bytes as u64 > d.max_transfer {
                return Err(GioError::invalid(format!(
                    "{}: {}-byte commands do not fit LBA size {} / transfer limit {}",
                    d.name, opts.command_bytes, d.lba_size, d.max_transfer
                )));
            }
            let n = (opts.command_bytes / d.lba_size) as u64;
            if opts.first_lba + per_drive as u64 * n > d.blocks {
                return Err(GioError::invalid(format!(
                    "{}: the test needs {} blocks past LBA {}",
                    d.name,
                    per_drive as u64 * n,
                    opts.first_lba
                )));
            }
            let use_sgl = d.sgl != SglSupport::None && !opts.force_prp;
            if !use_sgl && opts.command_bytes > 8192 {
                return Err(GioError::invalid(format!(
                    "{}: PRP commands here are at most 8 KiB (PRP1 + PRP2, no list)",
                    d.name
                )));
            }
            lbas_per_cmd.push(n);
            sgl.push(use_sgl);
        }
        let names: Vec<String> = drives.iter().map(|d| d.name.clone()).collect();
        let exec = Arc::new(HostExecutor::new(HostExecutorConfig { mode: opts.mode, ..Default::default() })?);
        let ring =
            GioUring::init_with(GioOptions { depth: opts.iocbs.max(1), ..Default::default() }, drives, exec)?;

        let len = per_drive * opts.command_bytes as usize;
        let alloc = |c: &Arc<Controller>| c.dma().alloc(len).map_err(GioError::from);
        let src = ctrls.iter().map(alloc).collect::<Result<Vec<DmaBuffer>>>()?;
        let dst = ctrls.iter().map(alloc).collect::<Result<Vec<DmaBuffer>>>()?;
        Ok(Selftest { ring, opts: opts.clone(), names, sgl, lbas_per_cmd, total, len, src, dst })
    }

    /// One verified pass: writes a pattern derived from `seed` (a pass with
    /// another seed cannot be satisfied by bytes an earlier pass left on the
    /// media or in memory), reads it back into zeroed memory and compares.
    /// `min_queue_wraps` counts since the ring started or the drive was last
    /// recovered (recovery restarts the queues' tickets).
    pub fn pass(&self, seed: u64) -> Result<SelftestReport> {
        let (opts, nd, total) = (&self.opts, self.names.len(), self.total);
        for (d, b) in self.src.iter().enumerate() {
            let salt = (d as u64 + 1) << 56 ^ seed.wrapping_mul(0xD6E8_FEB8_6659_FD93);
            let pattern: Vec<u8> = (0..self.len / 8)
                .flat_map(|i| (salt ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_le_bytes())
                .collect();
            b.copy_in(0, &pattern)?;
        }
        for b in &self.dst {
            b.fill(0);
        }
        let plan = |op: Op, bufs: &[DmaBuffer]| -> Vec<IoCtx> {
            (0..total)
                .map(|k| {
                    let (d, m) = (k % nd, k / nd);
                    let (iova, bytes) =
                        (bufs[d].iova_at(m * opts.command_bytes as usize), opts.command_bytes);
                    // Page-aligned buffers: PRP1, and PRP2 for a second page (§4.3).
                    let data = if self.sgl[d] {
                        DataRef::Sgl(SglDescriptor::data_block(iova, bytes))
                    } else {
                        DataRef::Prp { prp1: iova, prp2: if bytes > 4096 { iova + 4096 } else { 0 } }
                    };
                    let lba = opts.first_lba + m as u64 * self.lbas_per_cmd[d];
                    ioctx(op, d as u16, lba, self.lbas_per_cmd[d] as u32, data)
                })
                .collect()
        };
        let ring = &self.ring;
        let pass = |ctxs: Vec<IoCtx>| -> Result<u64> {
            let t = Instant::now();
            let ids = ring.get_iocb(ctxs.len().div_ceil(opts.ioctx_per_iocb as usize))?;
            for (id, chunk) in ids.iter().zip(ctxs.chunks(opts.ioctx_per_iocb as usize)) {
                ring.set_ioctxs(*id, chunk)?;
            }
            ring.issue(&ids, 3)?;
            for r in ring.wait_cqe(&ids, opts.timeout)? {
                r.check()?;
            }
            Ok(t.elapsed().as_millis() as u64)
        };
        let write_ms = pass(plan(Op::Write, &self.src))?;
        let read_ms = pass(plan(Op::Read, &self.dst))?;
        let mut verified = 0u64;
        for d in 0..nd {
            let used = (total - d).div_ceil(nd) * opts.command_bytes as usize;
            let (mut a, mut b) = (vec![0u8; used], vec![0u8; used]);
            self.src[d].copy_out(0, &mut a)?;
            self.dst[d].copy_out(0, &mut b)?;
            if let Some(i) = a.iter().zip(&b).position(|(x, y)| x != y) {
                return Err(GioError::invalid(format!(
                    "{}: byte {i} read back differs from what was written",
                    self.names[d]
                )));
            }
            verified += used as u64;
        }
        let stats = ring.queue_stats()?;
        Ok(SelftestReport {
            drives: self.names.clone(),
            data_pointers: self.sgl.iter().map(|&s| if s { "SGL" } else { "PRP" }).collect(),
            executor: ring.executor().name().to_string(),
            commands: 2 * total as u64,
            bytes_verified: verified,
            min_queue_wraps: stats.iter().map(|s| s.tickets / s.depth as u64).min().unwrap_or(0),
            write_ms,
            read_ms,
        })
    }

    /// Recovers every drive of the ring in turn: its queue pairs deleted and
    /// created again on the controller. Stops at the first drive that fails;
    /// the error names it.
    pub fn recover_all(&self, timeout: Duration) -> Result<Vec<DriveRecovery>> {
        (0..self.names.len())
            .map(|d| {
                let r = self.ring.recover_drive(d as u16, timeout)?;
                Ok(DriveRecovery {
                    drive: self.names[d].clone(),
                    qids: r.qids,
                    expired_commands: r.expired_commands,
                    dead_queues: r.dead_queues,
                    elapsed_us: r.elapsed.as_micros() as u64,
                })
            })
            .collect()
    }
}
