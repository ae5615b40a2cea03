//! A read/write verification any controller can be put through: random data
//! written at random LBAs through PRP and SGL on several queue pairs from
//! several threads, read back into other buffers and compared byte for byte.
//!
//! The same routine runs against the emulated controller (tests, `tutti demo`)
//! and against QEMU's controller through VFIO (the guest harness), so the two
//! controllers are held to the same standard.

use crate::command::{Command, DataMode};
use crate::controller::Controller;
use crate::error::{DriverError, Result};
use crate::queue::{Completion, IoQueuePair};
use crate::transport::{DmaBuffer, IovaSegment};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to exercise.
#[derive(Clone, Debug)]
pub struct SelftestOptions {
    pub nsid: u32,
    /// Queue pairs, each driven by its own thread.
    pub queue_pairs: u32,
    pub queue_depth: u32,
    /// Commands per queue pair and data mode (each is written, then read).
    pub commands_per_queue: u32,
    /// Largest command in logical blocks (capped at the maximum transfer).
    pub max_blocks: u32,
    pub modes: Vec<DataMode>,
    /// Use scattered buffers (several segments per command).
    pub scattered: bool,
    /// Also run transfers larger than MDTS through the splitting helpers.
    pub large_transfers: bool,
    pub seed: u64,
    /// Use at most this many blocks of the namespace (from LBA 0).
    pub max_lbas: Option<u64>,
}

impl Default for SelftestOptions {
    fn default() -> Self {
        SelftestOptions {
            nsid: 1,
            queue_pairs: 4,
            queue_depth: 64,
            commands_per_queue: 1024,
            max_blocks: 64,
            modes: vec![DataMode::Prp, DataMode::Sgl],
            scattered: true,
            large_transfers: true,
            seed: 0x7077_1e55,
            max_lbas: None,
        }
    }
}

/// Bytes moved and verified for one data mode.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ModeReport {
    pub mode: String,
    pub commands: u64,
    pub bytes_written: u64,
    pub bytes_verified: u64,
}

/// What a self-test did.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SelftestReport {
    pub device: String,
    pub nsid: u32,
    pub lba_size: u32,
    pub queue_pairs: u32,
    pub queue_depth: u32,
    pub modes: Vec<ModeReport>,
    /// Times each SQ wrapped around, summed over queues.
    pub queue_wraps: u64,
    pub elapsed_ms: u64,
}

/// Small deterministic generator (SplitMix64); no dependency, reproducible by seed.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

fn mode_name(m: DataMode) -> &'static str {
    match m {
        DataMode::Prp => "PRP",
        DataMode::Sgl => "SGL",
        DataMode::Auto => "auto",
    }
}

/// Runs the self-test; `progress` is called with the number of bytes verified so far.
pub fn round_trip(
    ctrl: &Arc<Controller>,
    opts: &SelftestOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<SelftestReport> {
    let info = ctrl.info();
    let ns = ctrl.data_namespace(opts.nsid)?.clone();
    if opts.queue_pairs == 0 || opts.modes.is_empty() || opts.max_blocks == 0 {
        return Err(DriverError::invalid("self-test needs ≥1 queue pair, ≥1 mode and max_blocks ≥ 1"));
    }
    let usable = opts.max_lbas.unwrap_or(ns.blocks).min(ns.blocks);
    let stripe = usable / opts.queue_pairs as u64;
    let max_cmd_blocks = (info.max_transfer / ns.lba_size as u64).min(opts.max_blocks as u64).max(1);
    if stripe < max_cmd_blocks * 2 {
        return Err(DriverError::invalid(format!(
            "namespace {} is too small for {} queue pairs of {}-block commands",
            opts.nsid, opts.queue_pairs, max_cmd_blocks
        )));
    }
    let verified = AtomicU64::new(0);
    let start = Instant::now();
    let results: Vec<Result<Vec<ModeReport>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..opts.queue_pairs)
            .map(|t| {
                let (ctrl, verified) = (ctrl.clone(), &verified);
                let lba0 = t as u64 * stripe;
                s.spawn(move || {
                    let mut qp =
                        ctrl.create_io_queue_pair(opts.queue_depth.min(ctrl.info().max_queue_entries))?;
                    let mut w = Worker {
                        qp: &mut qp,
                        rng: Rng::new(opts.seed ^ (t as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d)),
                        lba0,
                        stripe,
                        lba_size: ns.lba_size as u64,
                        max_cmd_blocks,
                        opts,
                    };
                    w.run(&|n| {
                        let total = verified.fetch_add(n, Ordering::Relaxed) + n;
                        progress(total);
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(DriverError::invalid("self-test thread panicked"))))
            .collect()
    });
    let mut modes: Vec<ModeReport> = Vec::new();
    for r in results {
        for m in r? {
            match modes.iter_mut().find(|x| x.mode == m.mode) {
                Some(x) => {
                    x.commands += m.commands;
                    x.bytes_written += m.bytes_written;
                    x.bytes_verified += m.bytes_verified;
                }
                None => modes.push(m),
            }
        }
    }
    let commands: u64 = modes.iter().map(|m| m.commands).sum();
    Ok(SelftestReport {
        device: ctrl.name().to_string(),
        nsid: opts.nsid,
        lba_size: ns.lba_size,
        queue_pairs: opts.queue_pairs,
        queue_depth: opts.queue_depth,
        modes,
        queue_wraps: commands / opts.queue_depth as u64,
        elapsed_ms: start.elapsed().as_millis() as u64,
    })
}

struct Worker<'a> {
    qp: &'a mut IoQueuePair,
    rng: Rng,
    lba0: u64,
    stripe: u64,
    lba_size: u64,
    max_cmd_blocks: u64,
    opts: &'a SelftestOptions,
}

/// One planned command: where on the namespace, and where in host memory.
struct Planned {
    lba: u64,
    blocks: u64,
    /// Segments in the write buffer and (same shape) in the read buffer.
    wsegs: Vec<IovaSegment>,
    rsegs: Vec<IovaSegment>,
    /// Offsets of those segments within their buffers (for comparing).
    offsets: Vec<(usize, usize)>,
}

impl Worker<'_> {
    fn run(&mut self, progress: &dyn Fn(u64)) -> Result<Vec<ModeReport>> {
        let mut out = Vec::new();
        for &mode in &self.opts.modes {
            let mode = self.qp.resolve_mode(mode)?;
            let mut rep = ModeReport { mode: mode_name(mode).into(), ..Default::default() };
            let batch = (self.qp.depth() - 1).min(32) as u64;
            let slot_blocks = self.max_cmd_blocks;
            let slots = self.stripe / slot_blocks;
            let cmd_bytes = (slot_blocks * self.lba_size) as usize;
            // Each command gets a 2×cmd_bytes window so scattered pieces can leave gaps.
            let window = (cmd_bytes * 2).next_multiple_of(4096) + 4096;
            let dma = self.qp.controller().dma().clone();
            let wbuf = dma.alloc(window * batch as usize)?;
            let rbuf = dma.alloc(window * batch as usize)?;
            let mut left = self.opts.commands_per_queue as u64;
            while left > 0 {
                let k = left.min(batch).min(slots);
                left -= k;
                let mut chosen: Vec<u64> = Vec::new();
                while (chosen.len() as u64) < k {
                    let s = self.rng.below(slots);
                    if !chosen.contains(&s) {
                        chosen.push(s);
                    }
                }
                let plans: Vec<Planned> = chosen
                    .iter()
                    .enumerate()
                    .map(|(i, &s)| self.plan(mode, s * slot_blocks, i * window, &wbuf, &rbuf))
                    .collect::<Result<_>>()?;
                for p in &plans {
                    for &(wo, len) in &p.offsets {
                        let mut data = vec![0u8; len];
                        self.rng.fill(&mut data);
                        wbuf.copy_in(wo, &data)?;
                    }
                }
                rbuf.fill(0xa5);
                self.pipeline(&plans, true, mode)?;
                self.pipeline(&plans, false, mode)?;
                for (i, p) in plans.iter().enumerate() {
                    // The read segments mirror the write segments at the same offsets.
                    for &(off, len) in &p.offsets {
                        let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
                        wbuf.copy_out(off, &mut a)?;
                        rbuf.copy_out(off, &mut b)?;
                        if a != b {
                            let at = a.iter().zip(&b).position(|(x, y)| x != y).unwrap_or(0);
                            return Err(DriverError::BadDeviceResponse {
                                device: self.qp.controller().name().to_string(),
                                what: format!(
                                    "qid {} {} command {i}: LBA {} read back different bytes than written (first at byte {at} of a {len}-byte piece)",
                                    self.qp.qid(), mode_name(mode), p.lba
                                ),
                            });
                        }
                    }
                    let bytes = p.blocks * self.lba_size;
                    rep.bytes_written += bytes;
                    rep.bytes_verified += bytes;
                    progress(bytes);
                }
                rep.commands += 2 * k;
            }
            if self.opts.large_transfers {
                let bytes = self.large(mode)?;
                rep.bytes_written += bytes;
                rep.bytes_verified += bytes;
                progress(bytes);
            }
            out.push(rep);
        }
        Ok(out)
    }

    /// Lays out one command of random length in window `base` of the buffers.
    fn plan(
        &mut self,
        mode: DataMode,
        slot_lba: u64,
        base: usize,
        wbuf: &DmaBuffer,
        rbuf: &DmaBuffer,
    ) -> Result<Planned> {
        let blocks = 1 + self.rng.below(self.max_cmd_blocks);
        let bytes = (blocks * self.lba_size) as usize;
        let page = 4096usize;
        let mut pieces: Vec<(usize, usize)> = Vec::new();
        if !self.opts.scattered || self.rng.below(3) == 0 {
            // Contiguous, starting at a random dword offset (PRP1 with offset).
            let off = (self.rng.below(page as u64 / 4) * 4) as usize;
            pieces.push((base + off, bytes));
        } else if mode == DataMode::Prp {
            // PRP: first piece may start mid-page, inner pieces are whole pages, with gaps between.
            let mut left = bytes;
            let mut at = base + (self.rng.below(page as u64 / 4) * 4) as usize;
            while left > 0 {
                let room = page - at % page;
                let n = room.min(left);
                pieces.push((at, n));
                left -= n;
                at = (at + n).next_multiple_of(page) + if self.rng.below(2) == 0 { page } else { 0 };
            }
        } else {
            // SGL: arbitrary dword-aligned pieces with gaps.
            let mut left = bytes;
            let mut at = base + (self.rng.below(64) * 4) as usize;
            while left > 0 {
                let n = if left <= 4 { left } else { ((1 + self.rng.below(left as u64 / 4)) * 4) as usize };
                let n = n.min(left);
                pieces.push((at, n));
                left -= n;
                at += n + (self.rng.below(16) * 4) as usize;
            }
        }
        let seg = |buf: &DmaBuffer, o: usize, n: usize| IovaSegment { iova: buf.iova_at(o), len: n as u64 };
        Ok(Planned {
            lba: self.lba0 + slot_lba,
            blocks,
            wsegs: pieces.iter().map(|&(o, n)| seg(wbuf, o, n)).collect(),
            rsegs: pieces.iter().map(|&(o, n)| seg(rbuf, o, n)).collect(),
            offsets: pieces,
        })
    }

    fn pipeline(&mut self, plans: &[Planned], write: bool, mode: DataMode) -> Result<()> {
        let nsid = self.opts.nsid;
        for (i, p) in plans.iter().enumerate() {
            let blocks = p.blocks as u32;
            let (cmd, segs) = if write {
                (Command::write(nsid, p.lba, blocks), &p.wsegs)
            } else {
                (Command::read(nsid, p.lba, blocks), &p.rsegs)
            };
            self.qp.submit_data(cmd, segs, mode, i as u64)?;
        }
        self.qp.ring();
        let mut done: Vec<Completion> = Vec::new();
        let deadline = Instant::now() + self.qp.controller().options().io_timeout;
        let mut spins = 0;
        while done.len() < plans.len() {
            if self.qp.reap(&mut done)? == 0 {
                if Instant::now() >= deadline {
                    return Err(DriverError::Timeout {
                        device: self.qp.controller().name().to_string(),
                        what: format!(
                            "qid {}: {} of {} completions",
                            self.qp.qid(),
                            plans.len() - done.len(),
                            plans.len()
                        ),
                        waited: self.qp.controller().options().io_timeout,
                    });
                }
                crate::queue::backoff(&mut spins);
            }
        }
        if let Some(c) = done.iter().find(|c| !c.status.is_success()) {
            return Err(DriverError::CommandFailed {
                device: self.qp.controller().name().to_string(),
                qid: self.qp.qid(),
                cid: c.cid,
                command: if write { "Write" } else { "Read" },
                status: c.status,
            });
        }
        Ok(())
    }

    /// A transfer of several maximum-size commands plus a partial one, through
    /// the helpers that split at MDTS; returns bytes verified.
    fn large(&mut self, mode: DataMode) -> Result<u64> {
        let ctrl = self.qp.controller().clone();
        let max = ctrl.info().max_transfer;
        let bytes = (max * 3 + self.lba_size).min(self.stripe * self.lba_size / 2);
        let bytes = bytes - bytes % self.lba_size;
        let w = ctrl.dma().alloc(bytes as usize)?;
        let r = ctrl.dma().alloc(bytes as usize)?;
        let mut data = vec![0u8; bytes as usize];
        self.rng.fill(&mut data);
        w.copy_in(0, &data)?;
        let lba = self.lba0;
        let wseg = [IovaSegment { iova: w.iova(), len: bytes }];
        let rseg = [IovaSegment { iova: r.iova(), len: bytes }];
        self.qp.write(self.opts.nsid, lba, &wseg, mode)?;
        self.qp.read(self.opts.nsid, lba, &rseg, mode)?;
        let mut back = vec![0u8; bytes as usize];
        r.copy_out(0, &mut back)?;
        if back != data {
            return Err(DriverError::BadDeviceResponse {
                device: ctrl.name().to_string(),
                what: format!("split {}-byte transfer at LBA {lba} read back different bytes", bytes),
            });
        }
        Ok(bytes)
    }
}

/// Default deadline used by callers that wrap the self-test.
pub const SELFTEST_TIMEOUT: Duration = Duration::from_secs(120);
