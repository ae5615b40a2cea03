//! A write/read/verify round trip through gio_uring on brought-up controllers:
//! what `tutti selftest` can run on emulated drives, on VFIO drives, and on
//! QEMU's controllers in the guest harness.
//!
//! It overwrites `lbas` from `first_lba` on namespace 1 of every controller.

use crate::drive::DriveQueues;
use crate::error::{GioError, Result};
use crate::executor::{ExecMode, HostExecutor, HostExecutorConfig};
use crate::iocb::{ioctx, DataRef, Op};
use crate::uring::{GioOptions, GioUring};
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

/// Writes a pattern through gio_uring, reads it back into fresh memory and
/// compares byte for byte. Fails on any IOCTX error or differing byte.
pub fn round_trip(ctrls: &[Arc<Controller>], opts: &SelftestOptions) -> Result<SelftestReport> {
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
    for (d, b) in src.iter().enumerate() {
        let pattern: Vec<u8> = (0..len / 8)
            .flat_map(|i| {
                ((d as u64 + 1) << 56 ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_le_bytes()
            })
            .collect();
        b.copy_in(0, &pattern)?;
    }
    let plan = |op: Op, bufs: &[DmaBuffer]| -> Vec<IoCtx> {
        (0..total)
            .map(|k| {
                let (d, m) = (k % nd, k / nd);
                let (iova, bytes) = (bufs[d].iova_at(m * opts.command_bytes as usize), opts.command_bytes);
                // Page-aligned buffers: PRP1, and PRP2 for a second page (§4.3).
                let data = if sgl[d] {
                    DataRef::Sgl(SglDescriptor::data_block(iova, bytes))
                } else {
                    DataRef::Prp { prp1: iova, prp2: if bytes > 4096 { iova + 4096 } else { 0 } }
                };
                let lba = opts.first_lba + m as u64 * lbas_per_cmd[d];
                ioctx(op, d as u16, lba, lbas_per_cmd[d] as u32, data)
            })
            .collect()
    };
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
    let write_ms = pass(plan(Op::Write, &src))?;
    let read_ms = pass(plan(Op::Read, &dst))?;
    let mut verified = 0u64;
    for d in 0..nd {
        let used = (total - d).div_ceil(nd) * opts.command_bytes as usize;
        let (mut a, mut b) = (vec![0u8; used], vec![0u8; used]);
        src[d].copy_out(0, &mut a)?;
        dst[d].copy_out(0, &mut b)?;
        if let Some(i) = a.iter().zip(&b).position(|(x, y)| x != y) {
            return Err(GioError::invalid(format!(
                "{}: byte {i} read back differs from what was written",
                names[d]
            )));
        }
        verified += used as u64;
    }
    let stats = ring.queue_stats()?;
    Ok(SelftestReport {
        drives: names,
        data_pointers: sgl.iter().map(|&s| if s { "SGL" } else { "PRP" }).collect(),
        executor: ring.executor().name().to_string(),
        commands: 2 * total as u64,
        bytes_verified: verified,
        min_queue_wraps: stats.iter().map(|s| s.tickets / s.depth as u64).min().unwrap_or(0),
        write_ms,
        read_ms,
    })
}
