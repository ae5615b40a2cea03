//! Launching the kernels: the I/O kernels on the executor's streams, and
//! `tt_gio_wait` (on the aux stream for `wait_kernel`, or on an engine's stream
//! for `enqueue_wait`), and waiting for a stream to drain.

use super::context::check;
use super::{CudaExecutor, WAIT_BLOCK_MAX, WAIT_MAX_IDS};
use crate::error::{GioError, Result};
use crate::mem::ExecMemory;
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// What one `tt_gio_wait` launch waits for (device addresses; see
/// [`CudaExecutor::enqueue_wait`]).
struct WaitArgs {
    ids: u64,
    seqs: u64,
    n: u32,
    timeout: Duration,
    done: u64,
}

impl CudaExecutor {
    /// Launches `f` on `stream` with this executor's context current.
    pub(super) fn launch(
        &self,
        f: sys::CUfunction,
        grid: u32,
        block: u32,
        stream: sys::CUstream,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let _cur = self.ctx.enter()?;
        // SAFETY: `f` is a loaded kernel (or a context-free CUkernel) whose parameters match
        // `params` (each entry points at a value of the kernel's parameter type, alive for the
        // call: cuLaunchKernel copies them).
        check("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                f,
                grid,
                1,
                1,
                block,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    /// Waits for `stream` to drain, up to `timeout`; the lock is taken per poll,
    /// so other threads' driver calls go on meanwhile.
    pub(super) fn drain(&self, stream: sys::CUstream, timeout: Duration) -> Result<bool> {
        let start = Instant::now();
        let mut nap = Duration::from_micros(50);
        loop {
            let idle = self.ctx.enter()?.drain(stream, Duration::ZERO)?;
            if idle {
                return Ok(true);
            }
            if start.elapsed() >= timeout {
                return Ok(false);
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(2));
        }
    }

    /// Enqueues `tt_gio_wait` on an engine's `stream`: the stream proceeds once
    /// the IOCBs `ids` (device array of `n` pool indices) completed the issues
    /// `seqs`, or `timeout` passed; `*done` (device u32, zeroed by the caller)
    /// receives how many completed. The kernel handle is context-free
    /// (`cuLibraryGetKernel`), so `stream` may belong to another context on
    /// this executor's device (the engine's own).
    ///
    /// # Safety
    /// `stream` must belong to a context of this executor's device; `ids`,
    /// `seqs` and `done` must be device addresses valid until the kernel ran.
    pub unsafe fn enqueue_wait(
        &self,
        stream: sys::CUstream,
        ids: u64,
        seqs: u64,
        n: u32,
        timeout: Duration,
        done: u64,
    ) -> Result<()> {
        let f = self.kernels.wait_any as sys::CUfunction;
        // SAFETY: forwarded contract.
        unsafe { self.launch_wait(f, stream, WaitArgs { ids, seqs, n, timeout, done }) }
    }

    /// # Safety
    /// As [`Self::enqueue_wait`]; `f` is `tt_gio_wait` usable on `stream`.
    unsafe fn launch_wait(&self, f: sys::CUfunction, stream: sys::CUstream, w: WaitArgs) -> Result<()> {
        let mut ctx = self.ctx_addr()?;
        let WaitArgs { mut ids, mut seqs, mut n, timeout, mut done } = w;
        let block = (n.div_ceil(32) * 32).clamp(32, WAIT_BLOCK_MAX);
        let mut t = timeout.as_nanos().min(u64::MAX as u128) as u64;
        let mut params: [*mut c_void; 6] = [
            (&raw mut ctx).cast(),
            (&raw mut ids).cast(),
            (&raw mut seqs).cast(),
            (&raw mut n).cast(),
            (&raw mut t).cast(),
            (&raw mut done).cast(),
        ];
        self.launch(f, 1, block, stream, &mut params)
    }

    /// [`crate::executor::Executor::wait_kernel`]: `tt_gio_wait` on the aux stream over
    /// the executor's wait scratch, waited for.
    pub(super) fn wait_for(&self, ids: &[u32], seqs: &[u32], timeout: Duration) -> Result<u32> {
        self.live_check()?;
        if ids.len() != seqs.len() || ids.is_empty() || ids.len() > WAIT_MAX_IDS {
            return Err(GioError::invalid(format!(
                "ids and seqs must be of equal length in 1..={WAIT_MAX_IDS} (got {} and {})",
                ids.len(),
                seqs.len()
            )));
        }
        let deadline = Instant::now() + timeout + Duration::from_secs(5);
        // One wait at a time uses the scratch; a second caller waits its turn, bounded.
        let mut guard = loop {
            match self.wait.try_lock() {
                Ok(g) => break g,
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_micros(200))
                }
                Err(std::sync::TryLockError::WouldBlock) => {
                    return Err(self.err(format!("another wait_kernel held the executor past {timeout:?}")))
                }
                Err(std::sync::TryLockError::Poisoned(_)) => return Err(self.err("wait lock poisoned")),
            }
        };
        let scratch =
            guard.as_ref().ok_or_else(|| self.err("not started, or a wait kernel never returned"))?;
        let n = ids.len();
        let host = scratch.mem.host().as_ptr();
        // SAFETY: the scratch holds 2 * WAIT_MAX_IDS u32s and a done word; n <= WAIT_MAX_IDS;
        // no kernel uses it (the previous wait kernel drained before its guard was released).
        unsafe {
            std::ptr::copy_nonoverlapping(ids.as_ptr(), host.cast::<u32>(), n);
            std::ptr::copy_nonoverlapping(seqs.as_ptr(), host.cast::<u32>().add(WAIT_MAX_IDS), n);
        }
        // SAFETY: the done word at 8 * WAIT_MAX_IDS, 4-aligned, inside the scratch.
        let done = unsafe { AtomicU32::from_ptr(host.add(8 * WAIT_MAX_IDS).cast::<u32>()) };
        done.store(0, Ordering::Release);
        let base = scratch.mem.exec_addr();
        // SAFETY: the scratch is mapped memory of this context, alive until the stream drained
        // (it is freed only after the kernels stopped); the launch orders the host stores above
        // before the kernel.
        unsafe {
            self.launch_wait(
                self.kernels.wait,
                self.aux,
                WaitArgs {
                    ids: base,
                    seqs: base + 4 * WAIT_MAX_IDS as u64,
                    n: n as u32,
                    timeout,
                    done: base + 8 * WAIT_MAX_IDS as u64,
                },
            )?
        };
        if !self.drain(self.aux, deadline.saturating_duration_since(Instant::now()))? {
            // The kernel may still write `done`: the scratch must never be reused or freed.
            if let Some(s) = guard.take() {
                std::mem::forget(s);
            }
            return Err(self.err(format!(
                "tt_gio_wait did not finish within {timeout:?} + 5 s (not resident?); wait scratch leaked"
            )));
        }
        Ok(done.load(Ordering::Acquire))
    }
}
