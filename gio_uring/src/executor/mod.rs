//! Executors: what runs the kernels of `tutti-kernels` against the rings.
//!
//! [`HostExecutor`] runs them on host threads (the same source compiled as
//! C++); [`CudaExecutor`] runs them on a GPU. `GioUring` is written against
//! [`Executor`] only: it lays out memory through it, then asks it to start,
//! to run queued IOCB parts, and to stop.

mod copy_bench;
mod cuda;
mod host;
mod relay;

pub use copy_bench::{CopyDirection, CopyReport, CopySpec, CopyTimes, COPY_MAX_BYTES};
pub use cuda::{CudaExecutor, CudaExecutorConfig};
pub use host::{HostExecutor, HostExecutorConfig};
pub use relay::{DoorbellMode, DoorbellRelay, RelayConfig, RelayStats, Watch, MAILBOX_IDLE, MAILBOX_STRIDE};

use crate::error::Result;
use crate::mem::{ExecMemory, HostMapping, HostRange, MemKind};
use std::ptr::NonNull;
use std::time::Duration;
use tutti_driver::transport::DoorbellKind;
use tutti_kernels::abi::Control;

/// Launch mode or SQPOLL mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ExecMode {
    /// A kernel is launched when work is issued; it drains the submission
    /// ring and returns.
    #[default]
    Launch,
    /// One kernel runs from start to stop, polling the submission ring.
    Persistent,
    /// Host executor only: one block whose lanes run on the threads that call
    /// gio_uring (issue submits, waits reap), like io_uring without SQPOLL. No
    /// thread of its own, so nothing runs, and no CPU is spent, between calls.
    Inline,
}

/// How work is cut up for an executor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecShape {
    /// Threads per block; an IOCB part is at most this many IOCTXs per round.
    pub block_threads: u32,
    /// Blocks one unit of `sm_budget` buys (blocks resident per SM on a GPU).
    pub blocks_per_unit: u32,
    /// Blocks that can run at once.
    pub max_blocks: u32,
}

/// Where the executor finds its work, once `GioUring` has laid it out.
#[derive(Clone, Copy, Debug)]
pub struct ExecBinding {
    /// Executor address of the `tt_exec_ctx`.
    pub ctx: u64,
    /// Host address of the shared `tt_control` block.
    pub control: NonNull<Control>,
}

// SAFETY: the pointers name memory owned by the GioUring that owns the executor binding,
// used only through atomics and volatile accesses.
unsafe impl Send for ExecBinding {}
// SAFETY: as above.
unsafe impl Sync for ExecBinding {}

/// An I/O executor.
pub trait Executor: Send + Sync {
    fn name(&self) -> &str;
    fn mode(&self) -> ExecMode;
    fn shape(&self) -> ExecShape;
    /// Allocates zeroed memory of `kind`.
    fn alloc(&self, kind: MemKind, bytes: usize) -> Result<Box<dyn ExecMemory>>;
    /// Makes host memory it did not allocate (queue memory, doorbells) reachable.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid until the mapping is dropped.
    unsafe fn map_host(&self, ptr: *mut u8, len: usize, range: HostRange) -> Result<Box<dyn HostMapping>>;
    /// Makes one doorbell register reachable: by default mapped like any host
    /// range (`Io` for a BAR); an executor may hand out a relay mailbox instead
    /// (see `relay.rs`).
    ///
    /// # Safety
    /// `doorbell` must stay valid until the mapping is dropped.
    unsafe fn map_doorbell(
        &self,
        doorbell: NonNull<u32>,
        kind: DoorbellKind,
    ) -> Result<Box<dyn HostMapping>> {
        let range = match kind {
            DoorbellKind::Mmio => HostRange::Io,
            DoorbellKind::Memory => HostRange::Memory,
        };
        // SAFETY: the caller's contract, passed on.
        unsafe { self.map_host(doorbell.as_ptr().cast(), 4, range) }
    }
    /// The executor address of an emulated controller's wake word for the
    /// kernels to wake it after their doorbell stores (host lanes), or `None`
    /// when they do not (a GPU; doorbells relayed by a thread that wakes it).
    ///
    /// # Safety
    /// `wake` must stay valid until the doorbells mapped with it are dropped.
    unsafe fn map_wake(&self, wake: NonNull<u32>) -> Result<Option<u64>> {
        let _ = wake;
        Ok(None)
    }
    /// Makes every doorbell value the kernels stored reach its register before
    /// it returns (queue recovery calls it before deleting queue pairs). Only
    /// an executor that relays doorbells has anything to do.
    fn flush_doorbells(&self) -> Result<()> {
        Ok(())
    }
    /// Checks, before a table naming it is registered, that the kernels can touch
    /// `addr..addr+len` (executor addresses of KV memory a staged table copies to and
    /// from). The host executor's lanes can touch any memory of the process; a GPU's
    /// kernels only device memory and registered host memory, and a kernel touching
    /// anything else kills the context. The check looks at both ends of the range.
    fn check_kernel_access(&self, addr: u64, len: u64) -> Result<()> {
        let _ = (addr, len);
        Ok(())
    }
    /// Called once the context is laid out; a persistent executor starts here.
    fn start(&self, binding: ExecBinding) -> Result<()>;
    /// Parts are about to be pushed to the submission ring, to be run with
    /// `sm_budget`: a persistent kernel that limits which blocks take work must
    /// know before the parts are there to take (set after the push, an idle
    /// block outside the budget could take one first).
    fn budget(&self, sm_budget: u32) -> Result<()> {
        let _ = sm_budget;
        Ok(())
    }
    /// Parts were pushed to the submission ring, to be run with `sm_budget`.
    fn kick(&self, sm_budget: u32) -> Result<()>;
    /// Called while the host waits; `queued` says the submission ring is not empty.
    fn poll(&self, queued: bool) -> Result<()>;
    /// A caller-driven executor ([`ExecMode::Inline`]) runs its lanes here, on the
    /// waiting thread, for up to `max`, and returns true. Executors with lanes of
    /// their own return false: the waiter then blocks on the completion ring.
    fn drive(&self, queued: bool, max: Duration) -> Result<bool> {
        let _ = (queued, max);
        Ok(false)
    }
    /// Runs `tt_gio_wait` on the executor for IOCB indices `ids` at issue
    /// sequence numbers `seqs`; returns how many completed before `timeout`.
    fn wait_kernel(&self, ids: &[u32], seqs: &[u32], timeout: Duration) -> Result<u32>;
    /// Stops a persistent kernel and waits for every kernel it launched.
    fn stop(&self) -> Result<()>;
    /// Times the staged path's copy alone (`tt_gio_copy`) against this executor's own
    /// way of moving the same bytes, and checks every byte (see `copy_bench.rs`). Not
    /// while a ring runs on the executor: it launches kernels of its own.
    fn copy_bench(&self, spec: &CopySpec) -> Result<CopyReport> {
        let _ = spec;
        Err(crate::error::GioError::Executor {
            executor: self.name().into(),
            what: "this executor has no copy benchmark".into(),
        })
    }
}
