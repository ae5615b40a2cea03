//! The staged path's copy alone, against the executor's own way of moving the
//! same bytes (`tutti bench staged`).
//!
//! `tt_gio_copy` runs `tt_warp_copy`, the routine `tt_process_staged` copies
//! each chunk between its staging slot and KV memory with, over `chunks`
//! chunks: slot i (pinned host memory, one after another) to or from KV
//! chunk `perm(i)` (KV memory, shuffled, as a request's blocks are). The
//! baselines move the same bytes: one copy of the whole slot region
//! (contiguous, the baseline's best case) and one copy per chunk to the same
//! shuffled places. Every method's destination is checked byte for byte
//! against its source on the first repetition.
//!
//! [`HostExecutor`](super::HostExecutor): the kernel's host build on the
//! executor's block threads against `memcpy`, timed by the wall clock.
//! [`CudaExecutor`](super::CudaExecutor): the kernel on the GPU against
//! `cuMemcpyAsync` (the copy engine), both timed with CUDA events on the
//! same stream; slots are mapped pinned host memory, KV memory is
//! `cuMemAlloc`. Run here only through the stand-in driver, whose times are
//! host threads' and say nothing of a GPU.

use crate::error::{GioError, Result};
use crate::mem::ExecMemory;
use std::time::Duration;

/// Which way the chunks go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum CopyDirection {
    /// Slot to KV memory: what a staged read does after the drive filled the slot.
    SlotToKv,
    /// KV memory to slot: what a staged write does before the drive reads the slot.
    KvToSlot,
}

impl CopyDirection {
    pub fn name(self) -> &'static str {
        match self {
            CopyDirection::SlotToKv => "slot -> KV",
            CopyDirection::KvToSlot => "KV -> slot",
        }
    }
}

/// What to copy, how often.
#[derive(Clone, Copy, Debug)]
pub struct CopySpec {
    /// Bytes per chunk: a multiple of 16 (the chunks of a staged table are whole LBAs).
    pub chunk_bytes: u64,
    pub chunks: u32,
    pub direction: CopyDirection,
    /// Timed repetitions of each method (alternating), at least 1.
    pub reps: u32,
    /// Seeds the data pattern and the shuffle of KV chunks.
    pub seed: u64,
}

/// Most bytes one bench run moves per method and repetition.
pub const COPY_MAX_BYTES: u64 = 4 << 30;

impl CopySpec {
    pub(crate) fn check(&self) -> Result<u64> {
        let bad = |what: String| Err(GioError::invalid(format!("copy bench: {what}")));
        if self.chunk_bytes == 0 || !self.chunk_bytes.is_multiple_of(16) || self.chunk_bytes > u32::MAX as u64
        {
            return bad(format!(
                "chunk of {} bytes: a multiple of 16 below 4 GiB is needed",
                self.chunk_bytes
            ));
        }
        if self.chunks == 0 || self.reps == 0 {
            return bad(format!(
                "{} chunks, {} repetitions: both must be at least 1",
                self.chunks, self.reps
            ));
        }
        let total = self.chunk_bytes * self.chunks as u64;
        if total > COPY_MAX_BYTES {
            return bad(format!("{total} bytes per copy; at most {COPY_MAX_BYTES}"));
        }
        Ok(total)
    }

    /// Chunk i's KV chunk: a shuffle (Fisher-Yates over a splitmix64 stream).
    pub(crate) fn permutation(&self) -> Vec<u32> {
        let mut p: Vec<u32> = (0..self.chunks).collect();
        let mut x = self.seed ^ 0x5EED_C0DE;
        for i in (1..p.len()).rev() {
            x = splitmix(x);
            p.swap(i, (x % (i as u64 + 1)) as usize);
        }
        p
    }

    /// The bytes every source starts with: no two 8-byte words alike.
    pub(crate) fn pattern(&self, len: usize) -> Vec<u8> {
        let s = splitmix(self.seed);
        (0..len.div_ceil(8) as u64)
            .flat_map(|i| (s ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_le_bytes())
            .take(len)
            .collect()
    }

    /// (source offset, destination offset) of each chunk, in the slot and KV regions.
    pub(crate) fn offsets(&self, perm: &[u32]) -> Vec<(u64, u64)> {
        let b = self.chunk_bytes;
        perm.iter()
            .enumerate()
            .map(|(i, &k)| {
                let (slot, kv) = (i as u64 * b, k as u64 * b);
                match self.direction {
                    CopyDirection::SlotToKv => (slot, kv),
                    CopyDirection::KvToSlot => (kv, slot),
                }
            })
            .collect()
    }

    /// One run between `slots` and `kv` (each `total` bytes, `check`ed): the source, by
    /// direction, gets the pattern.
    pub(crate) fn prepare<'m, M: ExecMemory + ?Sized>(
        &self,
        total: usize,
        slots: &'m M,
        kv: &'m M,
    ) -> Result<Prepared<'m, M>> {
        let (src_mem, dst_mem) = match self.direction {
            CopyDirection::SlotToKv => (slots, kv),
            CopyDirection::KvToSlot => (kv, slots),
        };
        let src = self.pattern(total);
        src_mem.write_bytes(0, &src)?;
        let offsets = self.offsets(&self.permutation());
        let pairs =
            offsets.iter().flat_map(|&(s, d)| [src_mem.exec_addr() + s, dst_mem.exec_addr() + d]).collect();
        Ok(Prepared { src_mem, dst_mem, src, offsets, pairs })
    }

    /// An empty report of a run of this spec on `grid` blocks of `block` threads, against
    /// `baseline`, timed by `clock`.
    pub(crate) fn report(&self, grid: u32, block: u32, baseline: &str, clock: &str) -> CopyReport {
        CopyReport {
            chunk_bytes: self.chunk_bytes,
            chunks: self.chunks,
            direction: self.direction,
            grid,
            block,
            baseline: baseline.into(),
            clock: clock.into(),
            runs: Vec::new(),
            verified_bytes: 0,
        }
    }

    /// Checks that every chunk of `dst` holds its source's bytes (`offsets`), or, with
    /// `offsets` None, that `dst` is `src` as a whole.
    pub(crate) fn verify(
        &self,
        what: &str,
        src: &[u8],
        dst: &[u8],
        offsets: Option<&[(u64, u64)]>,
    ) -> Result<u64> {
        let b = self.chunk_bytes as usize;
        let differs = match offsets {
            None => (src != dst).then_some(0),
            Some(o) => o
                .iter()
                .position(|&(s, d)| src[s as usize..s as usize + b] != dst[d as usize..d as usize + b])
                .map(|i| o[i].1),
        };
        match differs {
            None => Ok(dst.len() as u64),
            Some(at) => Err(GioError::invalid(format!(
                "copy bench: {what} left wrong bytes in the chunk at destination offset {at:#x}"
            ))),
        }
    }
}

/// A run set up by [`CopySpec::prepare`].
pub(crate) struct Prepared<'m, M: ?Sized> {
    pub src_mem: &'m M,
    pub dst_mem: &'m M,
    /// The pattern the source holds.
    pub src: Vec<u8>,
    /// (source offset, destination offset) of each chunk.
    pub offsets: Vec<(u64, u64)>,
    /// (source address, destination address) of each chunk, flat: `tt_gio_copy`'s table.
    pub pairs: Vec<u64>,
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One repetition: each method's time for all the chunks.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct CopyTimes {
    /// `tt_gio_copy`.
    pub kernel: Duration,
    /// The baseline, the whole region at once.
    pub baseline: Duration,
    /// The baseline, one copy per chunk to the same places as the kernel's.
    pub baseline_chunks: Duration,
}

/// What a bench run measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CopyReport {
    pub chunk_bytes: u64,
    pub chunks: u32,
    pub direction: CopyDirection,
    /// The kernel's launch shape.
    pub grid: u32,
    pub block: u32,
    /// What the baseline is (`memcpy`, `cuMemcpyAsync (copy engine)`).
    pub baseline: String,
    /// How the times were taken.
    pub clock: String,
    pub runs: Vec<CopyTimes>,
    /// Bytes checked, over every method.
    pub verified_bytes: u64,
}
