//! Which blocks are resident on which SMs.
//!
//! Per SM (compute capability 9.0): 65536 registers (the `regs_per_sm` knob),
//! 2048 threads, 32 blocks. Registers are allocated per warp, rounded up to
//! 256. A block is placed on the least loaded SM of its context's set that has
//! room for it; a block that fits nowhere waits until a block leaves. Shared
//! memory is not counted (the kernels use a few bytes).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

pub(crate) const THREADS_PER_SM: u32 = 2048;
pub(crate) const BLOCKS_PER_SM: u32 = 32;
pub(crate) const MAX_BLOCK_THREADS: u32 = 1024;
const REG_ALLOC_UNIT: u32 = 256;

/// What one block of a kernel holds while resident.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Need {
    pub regs: u32,
    pub threads: u32,
}

impl Need {
    pub fn of(regs_per_thread: u32, block: u32) -> Need {
        let warps = block.div_ceil(32);
        let per_warp = (regs_per_thread.max(1) * 32).next_multiple_of(REG_ALLOC_UNIT);
        Need { regs: warps * per_warp, threads: warps * 32 }
    }

    /// Blocks of this shape one empty SM holds.
    pub fn per_sm(self, regs_per_sm: u32) -> u32 {
        (regs_per_sm / self.regs.max(1)).min(THREADS_PER_SM / self.threads.max(1)).min(BLOCKS_PER_SM)
    }
}

#[derive(Clone, Copy, Default)]
struct Sm {
    regs: u32,
    threads: u32,
    blocks: u32,
}

#[derive(Default)]
struct Table {
    sms: Vec<Sm>,
    /// Resident blocks per context, and the most ever.
    resident: HashMap<usize, (u64, u64)>,
}

fn table() -> MutexGuard<'static, Table> {
    static TABLE: OnceLock<Mutex<Table>> = OnceLock::new();
    TABLE.get_or_init(Mutex::default).lock().unwrap_or_else(|p| p.into_inner())
}

/// Places one block on an SM of `sms` with room; returns the SM.
pub(crate) fn try_place(sms: &[u32], need: Need, regs_per_sm: u32, ctx: usize) -> Option<u32> {
    let mut t = table();
    let top = sms.iter().copied().max()? as usize;
    if t.sms.len() <= top {
        t.sms.resize(top + 1, Sm::default());
    }
    let fits = |s: &Sm| {
        s.regs + need.regs <= regs_per_sm
            && s.threads + need.threads <= THREADS_PER_SM
            && s.blocks < BLOCKS_PER_SM
    };
    let sm = sms
        .iter()
        .copied()
        .filter(|&i| fits(&t.sms[i as usize]))
        .min_by_key(|&i| t.sms[i as usize].blocks)?;
    let s = &mut t.sms[sm as usize];
    s.regs += need.regs;
    s.threads += need.threads;
    s.blocks += 1;
    let r = t.resident.entry(ctx).or_default();
    r.0 += 1;
    r.1 = r.1.max(r.0);
    Some(sm)
}

/// A block placed by [`try_place`] left its SM.
pub(crate) fn leave(sm: u32, need: Need, ctx: usize) {
    let mut t = table();
    if let Some(s) = t.sms.get_mut(sm as usize) {
        s.regs = s.regs.saturating_sub(need.regs);
        s.threads = s.threads.saturating_sub(need.threads);
        s.blocks = s.blocks.saturating_sub(1);
    }
    if let Some(r) = t.resident.get_mut(&ctx) {
        r.0 = r.0.saturating_sub(1);
    }
}

/// The most blocks of `ctx` ever resident at once (0: the most of any context).
pub(crate) fn peak(ctx: usize) -> u64 {
    let t = table();
    if ctx == 0 {
        t.resident.values().map(|r| r.1).max().unwrap_or(0)
    } else {
        t.resident.get(&ctx).map_or(0, |r| r.1)
    }
}

/// Blocks of `ctx` resident now.
pub(crate) fn resident(ctx: usize) -> u64 {
    table().resident.get(&ctx).map_or(0, |r| r.0)
}

pub(crate) fn reset_peaks() {
    for r in table().resident.values_mut() {
        r.1 = r.0;
    }
}
