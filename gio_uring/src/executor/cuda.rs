//! The CUDA executor: the I/O kernels on a GPU, optionally confined to a
//! green-context partition of its SMs.
//!
//! # What verifies it
//! In CI the stand-in driver runs it (`cuda-standin/`: a `libcuda.so` that
//! cudarc loads through [`CudaExecutorConfig::driver`], and that runs kernel
//! launches through the host build of the same kernel source). The stand-in
//! models the CUDA semantics a host executor hides — streams and the legacy
//! default stream's late landings, block residency per SM from the cubin's
//! register counts, frees that wait for the device, one thread per green
//! context, functions bound to the context they were loaded in, module loads
//! that wait for the device (knob) — and the `executor_*` tests there show each
//! defect this executor had under those semantics and its fix. The gio_uring
//! and objstore suites also run on this executor through the stand-in
//! (`TUTTI_TEST_EXECUTOR=cuda`, `scripts/test`). The kernels compile with NVRTC
//! for sm_90 without warnings (`kernels/tests/nvrtc.rs`); their fences are
//! checked in the SASS (`kernels/tests/sass.rs`).
//!
//! One H100 ran the gio_uring and objstore suites on this executor and
//! `tutti demo --cuda` in all four modes, once; `docs/gpu-verification.md`
//! says when, at which commit, and which later changes have not run on a GPU.
//!
//! # A persistent kernel blocks module loads on the device
//! Seen on the H100: while the persistent kernel ran in its green context, a
//! `cuModuleLoadData` in the primary context (a second executor's) did not
//! return. So everything that loads modules must do so before a persistent
//! executor starts, or after it stops; an engine that loads kernels lazily
//! while serving must use launch mode, which the C ABI does by default. The
//! stand-in's `module_load_waits` knob models this (`executor_module_load`).
//!
//! # How it runs
//! - Memory: rings, control block and IOCBs in mapped pinned host memory;
//!   queue state, slot arrays and layer tables in device memory, written and
//!   read through one non-blocking copy stream (see `context.rs`); NVMe queue
//!   memory and doorbells registered with `cuMemHostRegister`.
//! - Launch mode: each kick launches `tt_gio_issue` on the I/O stream.
//! - Persistent (SQPOLL) mode needs an SM partition (`sm_count`; see above for
//!   what it blocks while it runs): the kernel never returns, so in the primary context it would hold SMs of the
//!   engine's compute for good. Its grid is every block that can be resident
//!   in the partition less what one block of `tt_gio_wait` needs, so the wait
//!   kernel (run on a second stream) always finds room. `sm_budget` caps how
//!   many of its blocks take work (`tt_control.active_blocks`).
//! - Every driver call is made with the executor's context pushed on the
//!   calling thread under one lock, and the caller's context restored after.
//! - A stop that times out with kernels still running poisons the executor:
//!   later calls fail, and nothing the kernels may still touch is freed.
//!
//! # Files
//! This file holds the executor's state and the [`Executor`] calls; the rest
//! is one concept a file: `setup.rs` (checking the configuration, opening the
//! device, making the context: [`CudaExecutor::new`]), `module.rs` (the
//! kernels' image and its loading), `occupancy.rs` (blocks per SM),
//! `launch.rs` (launches, `tt_gio_wait`, draining a stream), `persistent.rs`
//! (the persistent grid, its budget and restarts), `doorbells.rs` (mapped or
//! relayed doorbells), `context.rs` (the CUDA context and its rules for
//! memory), `memory.rs` (pinned and device memory), `registry.rs` (host
//! memory registered for the kernels), `bench.rs` (the copy benchmark).

mod bench;
mod context;
mod doorbells;
mod launch;
mod memory;
mod module;
mod occupancy;
mod persistent;
mod registry;
mod setup;

use super::copy_bench::{CopyReport, CopySpec};
use super::relay::{DoorbellMode, DoorbellRelay};
use super::{ExecBinding, ExecMode, ExecShape, Executor};
use crate::error::{GioError, Result};
use crate::mem::{ExecMemory, HostMapping, HostRange, MemKind};
use context::{check, CudaCtx};
use cudarc::driver::sys;
use memory::{Device, Pinned};
use module::Kernels;
use registry::Registry;
use std::ffi::c_void;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tutti_driver::transport::DoorbellKind;
use tutti_kernels::GPU_BLOCK_THREADS;

/// Most threads of a `tt_gio_wait` block (the persistent grid leaves room for one).
const WAIT_BLOCK_MAX: u32 = 256;
/// Most IOCBs one `wait_kernel` call waits for (a pool holds at most 4096).
const WAIT_MAX_IDS: usize = 4096;

#[derive(Clone, Debug)]
pub struct CudaExecutorConfig {
    /// CUDA device ordinal.
    pub device: i32,
    pub mode: ExecMode,
    /// SMs of the I/O partition (a green context); `None` runs in the primary
    /// context with every SM (launch mode only).
    pub sm_count: Option<u32>,
    /// Target architecture for NVRTC (`sm_90`); `None` takes the device's.
    pub arch: Option<String>,
    /// How long `stop` waits for the kernels to return.
    pub stop_timeout: Duration,
    /// The driver library to use (absolute path), loaded before the first
    /// driver call; `None` lets the loader find `libcuda.so`. Tests point it
    /// at the stand-in driver.
    pub driver: Option<PathBuf>,
    /// Threads per block, a multiple of 32 up to `GPU_BLOCK_THREADS` (512).
    pub block_threads: u32,
    /// At most this many blocks per SM (`None`: what occupancy allows).
    pub blocks_per_sm: Option<u32>,
    /// How the kernels ring doorbells. `Direct`: they store into the
    /// registers (a BAR page registered with IOMEMORY), and fall back to a
    /// relay with default settings where the driver refuses that
    /// registration. `Relay`: always through the relay.
    pub doorbells: DoorbellMode,
    /// A cubin of the kernels built elsewhere (`tutti kernels --cubin`), loaded
    /// instead of compiling with NVRTC: for machines without NVRTC 12 (see
    /// `scripts/gpu-check`). It is checked first: the device's architecture,
    /// every entry point, and the parameter tables the launches pass.
    pub cubin: Option<PathBuf>,
    /// Persistent mode: frees and host unregistrations wait while the kernel
    /// runs (the driver would block on it). When this many are waiting, the
    /// next issue stops the kernel (once the work already queued has run),
    /// releases them and starts it again, so they cannot pile up while an
    /// engine registers and drops memory. 0: they wait for `stop`.
    pub deferred_bound: usize,
}

impl Default for CudaExecutorConfig {
    fn default() -> Self {
        CudaExecutorConfig {
            device: 0,
            mode: ExecMode::Launch,
            sm_count: None,
            arch: None,
            stop_timeout: Duration::from_secs(60),
            driver: None,
            block_threads: GPU_BLOCK_THREADS,
            blocks_per_sm: None,
            doorbells: DoorbellMode::Direct,
            cubin: None,
            deferred_bound: 64,
        }
    }
}

/// The doorbell relay and its mailbox region as the GPU sees it.
struct Relay {
    relay: DoorbellRelay,
    /// Device address of the mailbox region (registered with DEVICEMAP).
    mailboxes: u64,
    _region: Box<dyn HostMapping>,
}

/// Pinned mapped memory `wait_kernel` hands to `tt_gio_wait`: ids, seqs, done.
struct WaitScratch {
    mem: Pinned,
}

#[derive(Default)]
struct State {
    binding: Option<ExecBinding>,
    stopped: bool,
    /// The persistent kernel is being stopped and started again (`restart_if_due`).
    restarting: bool,
}

/// Runs the I/O kernels on a GPU. See the module documentation for what has
/// (not) been verified.
pub struct CudaExecutor {
    cfg: CudaExecutorConfig,
    name: String,
    ctx: Arc<CudaCtx>,
    kernels: Kernels,
    /// I/O kernels run here.
    stream: sys::CUstream,
    /// `tt_gio_wait` runs here (the I/O stream is busy for good in persistent mode).
    aux: sys::CUstream,
    shape: ExecShape,
    registry: Arc<Registry>,
    state: Mutex<State>,
    /// Allocated before the kernels start; freed only after they stopped.
    wait: Mutex<Option<WaitScratch>>,
    /// Made when doorbells are relayed (configured, or a fallback).
    relay: Mutex<Option<Relay>>,
    /// `name` with the relay named, once doorbells are relayed.
    relayed_name: OnceLock<String>,
    /// Held while the persistent kernel is restarted or stopped (one at a time), and by an
    /// issue from its check of the deferred frees to its push.
    lifecycle: Mutex<()>,
    /// Times the persistent kernel was stopped and started again to release deferred frees.
    restarts: AtomicU64,
    /// `cuDriverGetVersion` (e.g. 12080): which entry points exist.
    driver_version: i32,
}

// SAFETY: CUDA handles are used only inside `CudaCtx::enter` (the context pushed on the
// calling thread, under one lock); mutable state is behind mutexes.
unsafe impl Send for CudaExecutor {}
// SAFETY: as above.
unsafe impl Sync for CudaExecutor {}

fn no_cuda(what: impl Into<String>) -> GioError {
    GioError::NoCuda(what.into())
}

fn config_err(what: impl Into<String>) -> GioError {
    GioError::Executor { executor: "cuda".into(), what: what.into() }
}

impl CudaExecutor {
    fn err(&self, what: impl Into<String>) -> GioError {
        GioError::Executor { executor: self.name.clone(), what: what.into() }
    }

    fn ctx_addr(&self) -> Result<u64> {
        let st = self.state.lock().map_err(|_| self.err("state lock poisoned"))?;
        if st.stopped {
            return Err(self.err("stopped"));
        }
        Ok(st.binding.ok_or_else(|| self.err("not started"))?.ctx)
    }

    fn live_check(&self) -> Result<()> {
        if self.ctx.is_poisoned() {
            Err(self.ctx.poisoned_err())
        } else {
            Ok(())
        }
    }
}

impl Executor for CudaExecutor {
    fn name(&self) -> &str {
        self.relayed_name.get().unwrap_or(&self.name)
    }
    fn mode(&self) -> ExecMode {
        self.cfg.mode
    }
    fn shape(&self) -> ExecShape {
        self.shape
    }

    fn alloc(&self, kind: MemKind, bytes: usize) -> Result<Box<dyn ExecMemory>> {
        Ok(match kind {
            MemKind::Shared => Box::new(Pinned::new(&self.ctx, bytes)?),
            MemKind::Private => Box::new(Device::new(&self.ctx, bytes)?),
        })
    }

    unsafe fn map_host(&self, ptr: *mut u8, len: usize, range: HostRange) -> Result<Box<dyn HostMapping>> {
        self.live_check()?;
        // SAFETY: forwarded contract.
        Ok(unsafe { self.registry.map(ptr, len, range) }?)
    }

    unsafe fn map_doorbell(
        &self,
        doorbell: NonNull<u32>,
        kind: DoorbellKind,
    ) -> Result<Box<dyn HostMapping>> {
        // SAFETY: forwarded contract.
        unsafe { self.map_doorbell_or_relay(doorbell, kind) }
    }

    /// Asks the driver what memory each end of the range is (`cuPointerGetAttribute`,
    /// memory type): pageable host memory, or an address nothing allocated, is refused
    /// with the driver's answer named. Verified on the stand-in libcuda
    /// (`cuda-standin/tests/executor_kernel_access.rs`); the H100 showed the fault it
    /// prevents (a staged test's pageable KV memory: ILLEGAL_ADDRESS, context dead).
    fn check_kernel_access(&self, addr: u64, len: u64) -> Result<()> {
        self.live_check()?;
        if len == 0 {
            return Ok(());
        }
        let last = addr
            .checked_add(len - 1)
            .ok_or_else(|| GioError::invalid(format!("range {addr:#x}+{len} wraps the address space")))?;
        let _cur = self.ctx.enter()?;
        for (end, at) in [("first", addr), ("last", last)] {
            let mut kind: u32 = 0;
            // SAFETY: `kind` is a valid out pointer for the memory-type attribute (an unsigned int).
            let rc = unsafe {
                sys::cuPointerGetAttribute(
                    (&raw mut kind).cast(),
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                    at,
                )
            };
            check("cuPointerGetAttribute", rc).map_err(|e| {
                GioError::table(format!(
                    "KV memory {addr:#x}..{:#x}: its {end} byte {at:#x} is not memory the kernels can reach \
                     (neither device memory nor host memory registered with the executor {}): {e}",
                    addr.saturating_add(len),
                    self.name
                ))
            })?;
        }
        Ok(())
    }

    fn flush_doorbells(&self) -> Result<()> {
        if let Some(r) = self.relay.lock().map_err(|_| self.err("relay lock poisoned"))?.as_ref() {
            r.relay.flush()?;
        }
        Ok(())
    }

    fn start(&self, binding: ExecBinding) -> Result<()> {
        self.live_check()?;
        {
            let mut st = self.state.lock().map_err(|_| self.err("state lock poisoned"))?;
            if st.binding.is_some() {
                return Err(self.err("already started"));
            }
            st.binding = Some(binding);
        }
        // Before any kernel can run: scratch for wait_kernel, never freed while they do.
        let scratch = Pinned::new(&self.ctx, 8 * WAIT_MAX_IDS + 4)?;
        *self.wait.lock().map_err(|_| self.err("wait lock poisoned"))? = Some(WaitScratch { mem: scratch });
        self.ctx.set_live();
        if self.cfg.mode == ExecMode::Persistent {
            self.set_active_blocks(&binding, self.shape.max_blocks);
            self.launch_persistent(&binding)?;
        }
        Ok(())
    }

    fn budget(&self, sm_budget: u32) -> Result<()> {
        if self.cfg.mode != ExecMode::Persistent {
            return Ok(());
        }
        self.restart_if_due()?;
        let grid = sm_budget.saturating_mul(self.shape.blocks_per_unit).clamp(1, self.shape.max_blocks);
        let b = self.state.lock().map_err(|_| self.err("state lock poisoned"))?.binding;
        let b = b.ok_or_else(|| self.err("not started"))?;
        self.set_active_blocks(&b, grid);
        Ok(())
    }

    fn kick(&self, sm_budget: u32) -> Result<()> {
        self.live_check()?;
        let grid = sm_budget.saturating_mul(self.shape.blocks_per_unit).clamp(1, self.shape.max_blocks);
        if self.cfg.mode == ExecMode::Persistent {
            let b = self.state.lock().map_err(|_| self.err("state lock poisoned"))?.binding;
            let b = b.ok_or_else(|| self.err("not started"))?;
            self.set_active_blocks(&b, grid);
            return Ok(());
        }
        let mut ctx = self.ctx_addr()?;
        let mut params: [*mut c_void; 1] = [(&raw mut ctx).cast()];
        // Launches on one stream run one after another, each draining what is queued by then.
        self.launch(self.kernels.issue, grid, self.shape.block_threads, self.stream, &mut params)
    }

    fn poll(&self, _queued: bool) -> Result<()> {
        let mut cur = self.ctx.enter()?;
        // SAFETY: a live stream of this context.
        match unsafe { sys::cuStreamQuery(self.stream) } {
            sys::CUresult::CUDA_SUCCESS if self.cfg.mode == ExecMode::Persistent => {
                // The driver lock held by `cur` keeps a restart from launching the kernel again
                // between the query and this look at the state.
                let started = self.state.lock().map_err(|_| self.err("state lock poisoned"))?;
                if started.binding.is_some() && !started.stopped && !started.restarting {
                    return Err(self.err("the persistent kernel returned without being stopped"));
                }
                Ok(())
            }
            sys::CUresult::CUDA_SUCCESS => {
                // Launch mode, nothing running: what was freed meanwhile can go now (no launch
                // can start while this thread holds the driver lock).
                if cur.deferred() > 0 && cur.idle(&[self.aux]) {
                    cur.release_deferred();
                }
                Ok(())
            }
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(()),
            rc => check("cuStreamQuery (an I/O kernel failed)", rc),
        }
    }

    fn wait_kernel(&self, ids: &[u32], seqs: &[u32], timeout: Duration) -> Result<u32> {
        self.wait_for(ids, seqs, timeout)
    }

    fn stop(&self) -> Result<()> {
        self.live_check()?;
        let _life = self.lifecycle.lock().map_err(|_| self.err("lifecycle lock poisoned"))?;
        let binding = {
            let mut st = self.state.lock().map_err(|_| self.err("state lock poisoned"))?;
            st.stopped = true;
            st.binding
        };
        if let Some(b) = binding {
            // SAFETY: `control` is the live shared control block (pinned, mapped for the GPU).
            unsafe { AtomicU32::from_ptr(&raw mut (*b.control.as_ptr()).stop) }.store(1, Ordering::Release);
        }
        let deadline = Instant::now() + self.cfg.stop_timeout;
        let drained = self.drain(self.stream, self.cfg.stop_timeout)?
            && self.drain(self.aux, deadline.saturating_duration_since(Instant::now()))?;
        if !drained {
            self.ctx.poison();
            tracing::error!(
                executor = %self.name,
                timeout = ?self.cfg.stop_timeout,
                "kernels still running after the stop deadline: executor poisoned, its memory leaked"
            );
            return Err(self.err(format!(
                "kernels still running {:?} after stop; the executor is poisoned and leaks its memory",
                self.cfg.stop_timeout
            )));
        }
        self.ctx.settle()
    }

    fn copy_bench(&self, spec: &CopySpec) -> Result<CopyReport> {
        self.run_copy_bench(spec)
    }
}

impl Drop for CudaExecutor {
    fn drop(&mut self) {
        if !self.ctx.is_poisoned() {
            if let Err(e) = self.stop() {
                tracing::error!(executor = %self.name, error = %e, "stopping the CUDA executor failed");
            }
        }
        if self.ctx.is_poisoned() {
            // Kernels may still run: streams, module and memory stay as they are.
            if let Ok(mut w) = self.wait.lock() {
                if let Some(s) = w.take() {
                    std::mem::forget(s);
                }
            }
            // Kernels may still store into the mailboxes: the relay and its region stay.
            if let Ok(mut r) = self.relay.lock() {
                if let Some(r) = r.take() {
                    std::mem::forget(r);
                }
            }
            return;
        }
        let Ok(_cur) = self.ctx.enter() else { return };
        // SAFETY: handles created in `new`, destroyed once, with every stream drained by `stop`;
        // the context outlives them (Arc).
        unsafe {
            let _ = sys::cuStreamDestroy_v2(self.stream);
            let _ = sys::cuStreamDestroy_v2(self.aux);
            let _ = sys::cuModuleUnload(self.kernels.module);
            let _ = sys::cuLibraryUnload(self.kernels.library);
        }
    }
}
