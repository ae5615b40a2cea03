//! How many blocks of the I/O kernel go on one SM: the driver's occupancy
//! answer, and in persistent mode what leaves room for one `tt_gio_wait` block
//! (computed from the SM's limits and each kernel's registers and shared memory).

use super::context::check;
use super::module::Kernels;
use super::{config_err, CudaExecutorConfig, WAIT_BLOCK_MAX};
use crate::error::Result;
use crate::executor::ExecMode;
use cudarc::driver::sys;
use tutti_kernels::{KERNEL_ISSUE, KERNEL_PERSISTENT};

/// What one SM holds, and what a block of a kernel takes of it.
#[derive(Clone, Copy, Debug)]
pub(super) struct SmLimits {
    pub regs: u32,
    pub threads: u32,
    pub blocks: u32,
    pub smem: u32,
}

#[derive(Clone, Copy, Debug)]
struct BlockCost {
    threads: u32,
    regs_per_thread: u32,
    smem: u32,
}

impl BlockCost {
    /// Registers are allocated per warp, in units of 256.
    fn regs(&self) -> u32 {
        let per_warp = (self.regs_per_thread.max(1) * 32).next_multiple_of(256);
        self.threads.div_ceil(32) * per_warp
    }
}

impl SmLimits {
    /// Whether `n` blocks of `a` and one of `b` fit together on one SM.
    fn fits(&self, n: u32, a: BlockCost, b: Option<BlockCost>) -> bool {
        let (br, bt, bs, bb) = b.map_or((0, 0, 0, 0), |b| (b.regs(), b.threads, b.smem, 1));
        n as u64 * a.regs() as u64 + br as u64 <= self.regs as u64
            && n as u64 * a.threads as u64 + bt as u64 <= self.threads as u64
            && n as u64 * a.smem as u64 + bs as u64 <= self.smem as u64
            && n + bb <= self.blocks
    }

    /// Most blocks of `a` per SM that leave room for one block of `b`.
    fn blocks_leaving_room(&self, a: BlockCost, b: Option<BlockCost>) -> u32 {
        (0..=self.blocks).rev().find(|&n| self.fits(n, a, b)).unwrap_or(0)
    }
}

/// What one block of `f` takes of an SM, at `threads` threads.
fn cost(f: sys::CUfunction, threads: u32) -> Result<BlockCost> {
    let get = |a: sys::CUfunction_attribute| -> Result<u32> {
        let mut v = 0;
        // SAFETY: a loaded function; valid out pointer.
        check("cuFuncGetAttribute", unsafe { sys::cuFuncGetAttribute(&mut v, a, f) })?;
        Ok(v.max(0) as u32)
    };
    use sys::CUfunction_attribute as F;
    Ok(BlockCost {
        threads,
        regs_per_thread: get(F::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
        smem: get(F::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
    })
}

/// Blocks of the I/O kernel of `cfg.mode` per SM, capped by `cfg.blocks_per_sm`; an
/// error when not one fits. The kernels' context is current (the caller holds
/// `CudaCtx::enter`).
pub(super) fn blocks_per_sm(kernels: &Kernels, cfg: &CudaExecutorConfig, sm: &SmLimits) -> Result<u32> {
    let bt = cfg.block_threads;
    let io = match cfg.mode {
        ExecMode::Launch | ExecMode::Inline => kernels.issue,
        ExecMode::Persistent => kernels.persistent,
    };
    let io_cost = cost(io, bt)?;
    let mut occ = 0;
    // SAFETY: a loaded function; valid out pointer.
    check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
        sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut occ, io, bt as i32, 0)
    })?;
    let occ = occ.max(0) as u32;
    let per_sm = match cfg.mode {
        ExecMode::Launch | ExecMode::Inline => occ,
        // A grid that fills the partition keeps tt_gio_wait from ever becoming resident.
        ExecMode::Persistent => {
            occ.min(sm.blocks_leaving_room(io_cost, Some(cost(kernels.wait, WAIT_BLOCK_MAX)?)))
        }
    };
    let per_sm = cfg.blocks_per_sm.map_or(per_sm, |cap| per_sm.min(cap));
    if per_sm == 0 {
        return Err(config_err(format!(
            "no block of {bt} threads of {} fits an SM{}",
            if cfg.mode == ExecMode::Launch { KERNEL_ISSUE } else { KERNEL_PERSISTENT },
            if cfg.mode == ExecMode::Persistent { " next to one of tt_gio_wait" } else { "" }
        )));
    }
    Ok(per_sm)
}
