//! The host executor: the CUDA kernels compiled as C++ (by `tutti-kernels`'
//! build script) and run with one host thread per CUDA block, whose lanes (CUDA
//! threads) are fibers on it (`kernels/host/runtime.cpp`).
//!
//! With [`DoorbellMode::Relay`] its kernels ring doorbells through a
//! [`DoorbellRelay`]'s mailboxes, as the CUDA executor does where a BAR
//! cannot be mapped for the GPU: that fallback runs against emulated
//! controllers in CI this way.

use super::copy_bench::{CopyReport, CopySpec, CopyTimes, Prepared};
use super::relay::{DoorbellMode, DoorbellRelay, Watch};
use super::{ExecBinding, ExecMode, ExecShape, Executor};
use crate::error::{GioError, Result};
use crate::mem::{ExecMemory, HostMapping, HostMemory, HostRange, MemKind};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tutti_driver::transport::DoorbellKind;
use tutti_kernels::abi::{ExecCtx, RingHeader};
use tutti_kernels::host::{HostArgs, HostInline, HostKernel, HostLaunch};

/// How many lanes, and in which mode.
#[derive(Clone, Debug)]
pub struct HostExecutorConfig {
    pub mode: ExecMode,
    /// Blocks (lane groups) a launch or the persistent kernel runs: the executor's
    /// OS threads, one per block.
    pub blocks: u32,
    /// Lanes per block (fibers on its thread); a multiple of 32.
    pub block_lanes: u32,
    /// Launch mode: kernels allowed to run at once.
    pub max_launches: u32,
    /// How the kernels reach doorbell registers.
    pub doorbells: DoorbellMode,
}

impl Default for HostExecutorConfig {
    /// One block of one warp: one OS thread, so an engine serving a model on the
    /// CPU keeps its cores (the block's 32 lanes are fibers on that thread).
    fn default() -> Self {
        HostExecutorConfig {
            mode: ExecMode::Launch,
            blocks: 1,
            block_lanes: 32,
            max_launches: 2,
            doorbells: DoorbellMode::Direct,
        }
    }
}

#[derive(Default)]
struct State {
    binding: Option<ExecBinding>,
    persistent: Option<HostLaunch>,
    launches: Vec<HostLaunch>,
    /// Inline mode: the block its callers run.
    inline: Option<HostInline>,
}

/// Inline mode: how long `stop` runs the lanes for the commands still in flight
/// (each is bounded by the ring's command timeout) before it gives up on them.
const INLINE_STOP_WAIT: Duration = Duration::from_secs(30);

/// Runs the I/O kernels on host threads. Needs no GPU; used in tests and on
/// machines without CUDA, against emulated or real (VFIO) controllers.
pub struct HostExecutor {
    cfg: HostExecutorConfig,
    name: String,
    state: Mutex<State>,
    relay: Option<DoorbellRelay>,
}

struct Identity(u64);

impl HostMapping for Identity {
    fn exec_addr(&self) -> u64 {
        self.0
    }
}

/// A relayed doorbell: the executor address is the mailbox's host address.
struct Relayed(Watch);

impl HostMapping for Relayed {
    fn exec_addr(&self) -> u64 {
        self.0.mailbox().as_ptr() as u64
    }
}

impl HostExecutor {
    pub fn new(cfg: HostExecutorConfig) -> Result<Self> {
        if cfg.block_lanes == 0 || !cfg.block_lanes.is_multiple_of(32) || cfg.block_lanes > 1024 {
            return Err(GioError::invalid(format!(
                "block_lanes {} is not a multiple of 32 in 32..=1024",
                cfg.block_lanes
            )));
        }
        if cfg.blocks == 0 || cfg.max_launches == 0 {
            return Err(GioError::invalid("blocks and max_launches must be at least 1"));
        }
        if cfg.mode == ExecMode::Inline && cfg.blocks != 1 {
            return Err(GioError::invalid(format!(
                "inline mode runs one block on the calling thread, not {}",
                cfg.blocks
            )));
        }
        let (relay, via) = match &cfg.doorbells {
            DoorbellMode::Direct => (None, ""),
            DoorbellMode::Relay(rc) => (Some(DoorbellRelay::new(rc.clone())?), ", doorbell relay"),
        };
        let name = format!("host ({:?}, {} x {} lanes{via})", cfg.mode, cfg.blocks, cfg.block_lanes);
        Ok(HostExecutor { cfg, name, state: Mutex::default(), relay })
    }

    /// The doorbell relay, in [`DoorbellMode::Relay`].
    pub fn relay(&self) -> Option<&DoorbellRelay> {
        self.relay.as_ref()
    }

    fn state(&self) -> Result<std::sync::MutexGuard<'_, State>> {
        self.state.lock().map_err(|_| self.err("state lock poisoned"))
    }

    fn err(&self, what: impl Into<String>) -> GioError {
        GioError::Executor { executor: self.name.clone(), what: what.into() }
    }

    fn launch(&self, st: &mut State, blocks: u32) -> Result<()> {
        let b = st.binding.ok_or_else(|| self.err("not started"))?;
        // SAFETY: the context and everything it points at belong to the GioUring that owns
        // this executor and outlive the launch: GioUring stops (joins) the executor before
        // releasing its memory.
        let launch = unsafe {
            HostLaunch::start(
                HostKernel::Issue,
                blocks,
                self.cfg.block_lanes,
                HostArgs::exec(b.ctx as *mut ExecCtx),
            )?
        };
        st.launches.push(launch);
        Ok(())
    }

    /// Inline mode: runs the block on this thread until no lane can run and
    /// `max` has passed (0: just what can run now), starting its kernel afresh
    /// first if it had returned and `start`.
    fn pump(&self, st: &mut State, start: bool, max: Duration) -> Result<bool> {
        let Some(block) = st.inline.as_mut() else { return Err(self.err("not started")) };
        Ok(block.run(start, max))
    }
}

impl Executor for HostExecutor {
    fn name(&self) -> &str {
        &self.name
    }
    fn mode(&self) -> ExecMode {
        self.cfg.mode
    }
    fn shape(&self) -> ExecShape {
        ExecShape { block_threads: self.cfg.block_lanes, blocks_per_unit: 1, max_blocks: self.cfg.blocks }
    }

    fn alloc(&self, _kind: MemKind, bytes: usize) -> Result<Box<dyn ExecMemory>> {
        Ok(Box::new(HostMemory::new(bytes)?))
    }

    unsafe fn map_host(&self, ptr: *mut u8, _len: usize, _range: HostRange) -> Result<Box<dyn HostMapping>> {
        Ok(Box::new(Identity(ptr as u64)))
    }

    unsafe fn map_doorbell(
        &self,
        doorbell: NonNull<u32>,
        kind: DoorbellKind,
    ) -> Result<Box<dyn HostMapping>> {
        match &self.relay {
            None => Ok(Box::new(Identity(doorbell.as_ptr() as u64))),
            // SAFETY: the caller keeps the doorbell valid until the mapping, which owns the
            // watch, is dropped.
            Some(relay) => Ok(Box::new(Relayed(unsafe { relay.watch(doorbell, kind)? }))),
        }
    }

    unsafe fn map_wake(&self, wake: NonNull<u32>) -> Result<Option<u64>> {
        // Lanes store doorbells themselves only without a relay; the relay wakes otherwise.
        Ok(self.relay.is_none().then_some(wake.as_ptr() as u64))
    }

    fn flush_doorbells(&self) -> Result<()> {
        if let Some(relay) = &self.relay {
            relay.flush()?;
        }
        Ok(())
    }

    fn start(&self, binding: ExecBinding) -> Result<()> {
        let mut st = self.state()?;
        if st.binding.is_some() {
            return Err(self.err("already started"));
        }
        st.binding = Some(binding);
        if self.cfg.mode == ExecMode::Persistent {
            // SAFETY: as in `launch`.
            let launch = unsafe {
                HostLaunch::start(
                    HostKernel::Persistent,
                    self.cfg.blocks,
                    self.cfg.block_lanes,
                    HostArgs::exec(binding.ctx as *mut ExecCtx),
                )?
            };
            st.persistent = Some(launch);
        }
        if self.cfg.mode == ExecMode::Inline {
            // SAFETY: as in `launch`: the block is dropped in `stop`, before the context goes.
            let block = unsafe {
                HostInline::new(
                    HostKernel::Issue,
                    self.cfg.block_lanes,
                    HostArgs::exec(binding.ctx as *mut ExecCtx),
                )?
            };
            st.inline = Some(block);
        }
        Ok(())
    }

    fn kick(&self, sm_budget: u32) -> Result<()> {
        match self.cfg.mode {
            ExecMode::Persistent => return Ok(()),
            // Submits what was pushed: the lanes build, submit and publish, then return
            // here once they only wait for the drives.
            ExecMode::Inline => return self.pump(&mut *self.state()?, true, Duration::ZERO).map(|_| ()),
            ExecMode::Launch => {}
        }
        let mut st = self.state()?;
        st.launches.retain(|l| !l.finished());
        if st.launches.len() < self.cfg.max_launches as usize {
            self.launch(&mut st, sm_budget.clamp(1, self.cfg.blocks))?;
        }
        Ok(())
    }

    fn poll(&self, queued: bool) -> Result<()> {
        let mut st = self.state()?;
        match self.cfg.mode {
            ExecMode::Persistent => match &st.persistent {
                Some(l) if l.finished() => {
                    Err(self.err("the persistent kernel returned without being stopped"))
                }
                _ => Ok(()),
            },
            ExecMode::Inline => self.pump(&mut st, queued, Duration::ZERO).map(|_| ()),
            ExecMode::Launch => {
                st.launches.retain(|l| !l.finished());
                // A launch that found the ring empty just before more parts were pushed
                // leaves them stranded when `kick` was at its launch limit.
                if queued && st.launches.is_empty() {
                    self.launch(&mut st, self.cfg.blocks)?;
                }
                Ok(())
            }
        }
    }

    fn drive(&self, queued: bool, max: Duration) -> Result<bool> {
        if self.cfg.mode != ExecMode::Inline {
            return Ok(false);
        }
        self.pump(&mut *self.state()?, queued, max)?;
        Ok(true)
    }

    fn wait_kernel(&self, ids: &[u32], seqs: &[u32], timeout: Duration) -> Result<u32> {
        if ids.len() != seqs.len() {
            return Err(GioError::invalid("ids and seqs differ in length"));
        }
        let ctx = self.state()?.binding.ok_or_else(|| self.err("not started"))?.ctx;
        let done = AtomicU32::new(0);
        let args = HostArgs {
            ctx: ctx as *mut ExecCtx,
            ids: ids.as_ptr(),
            seqs: seqs.as_ptr(),
            n: ids.len() as u32,
            timeout_ns: timeout.as_nanos().min(u64::MAX as u128) as u64,
            result: done.as_ptr(),
            ..HostArgs::exec(std::ptr::null_mut())
        };
        // SAFETY: `ids`, `seqs` and `done` outlive the launch, which is joined before returning;
        // the context outlives the executor's use as in `launch`.
        let launch = unsafe { HostLaunch::start(HostKernel::Wait, 1, 32, args)? };
        if self.cfg.mode == ExecMode::Inline {
            // Nothing completes unless this thread runs the lanes meanwhile. The wait
            // kernel returns by its own timeout; this loop ends with it.
            while !launch.finished() {
                self.drive(true, Duration::from_micros(100))?;
            }
        }
        launch.join();
        Ok(done.load(Ordering::Acquire))
    }

    fn stop(&self) -> Result<()> {
        let mut st = self.state()?;
        if let (Some(l), Some(b)) = (st.persistent.take(), st.binding) {
            // SAFETY: `control` points at the live shared control block (see ExecBinding).
            unsafe { AtomicU32::from_ptr(&raw mut (*b.control.as_ptr()).stop) }.store(1, Ordering::Release);
            // Lanes blocked on the empty submission ring see the stop once woken.
            // SAFETY: on the host executor the context's executor address is its host address,
            // and the context and its rings are live (as in `launch`).
            unsafe {
                let ring = (*(b.ctx as *const ExecCtx)).sq_ring as *mut RingHeader;
                if !ring.is_null() {
                    tutti_kernels::host::wake_ring_sleepers(ring);
                }
            }
            l.join();
        }
        for l in st.launches.drain(..) {
            l.join();
        }
        if self.cfg.mode == ExecMode::Inline && st.inline.is_some() {
            // Runs the kernel to its return: what is queued or in flight finishes (or
            // times out) first, as a joined launch's would.
            let start = Instant::now();
            while !self.pump(&mut st, false, Duration::from_millis(1))? {
                if start.elapsed() > INLINE_STOP_WAIT {
                    tracing::warn!(executor = %self.name, "inline lanes still waiting at stop; dropped where they wait");
                    break;
                }
            }
            st.inline = None;
        }
        Ok(())
    }

    /// The kernel's host build on `blocks` threads of `block_lanes` fibers against `memcpy`
    /// on the calling thread, wall clock. The kernel's time includes starting its threads
    /// (tens of microseconds), as a launch's would.
    fn copy_bench(&self, spec: &CopySpec) -> Result<CopyReport> {
        let total = spec.check()? as usize;
        let (slots, kv) = (HostMemory::new(total)?, HostMemory::new(total)?);
        let Prepared { src_mem, dst_mem, src, offsets, pairs } = spec.prepare(total, &slots, &kv)?;
        let (grid, block) = (self.cfg.blocks, self.cfg.block_lanes);
        let zero = vec![0u8; total];
        let mut got = vec![0u8; total];
        let mut report = spec.report(grid, block, "memcpy on the calling thread", "wall clock");
        let b = spec.chunk_bytes as usize;
        for rep in 0..spec.reps {
            dst_mem.write_bytes(0, &zero)?;
            let t = Instant::now();
            let args = HostArgs::copy(pairs.as_ptr(), spec.chunks, spec.chunk_bytes);
            // SAFETY: `pairs` and both regions outlive the launch, joined right here.
            unsafe { HostLaunch::start(HostKernel::Copy, grid, block, args)? }.join();
            let kernel = t.elapsed();
            if rep == 0 {
                dst_mem.read_bytes(0, &mut got)?;
                report.verified_bytes += spec.verify("tt_gio_copy", &src, &got, Some(&offsets))?;
            }

            dst_mem.write_bytes(0, &zero)?;
            let t = Instant::now();
            for &(s, d) in &offsets {
                // SAFETY: both ranges lie inside their regions (offsets of whole chunks), which
                // do not overlap.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        src_mem.as_ptr().add(s as usize),
                        dst_mem.as_ptr().add(d as usize),
                        b,
                    )
                };
            }
            let baseline_chunks = t.elapsed();
            if rep == 0 {
                dst_mem.read_bytes(0, &mut got)?;
                report.verified_bytes += spec.verify("memcpy per chunk", &src, &got, Some(&offsets))?;
            }

            dst_mem.write_bytes(0, &zero)?;
            let t = Instant::now();
            // SAFETY: two separate regions of `total` bytes.
            unsafe { std::ptr::copy_nonoverlapping(src_mem.as_ptr(), dst_mem.as_ptr(), total) };
            let baseline = t.elapsed();
            if rep == 0 {
                dst_mem.read_bytes(0, &mut got)?;
                report.verified_bytes += spec.verify("memcpy", &src, &got, None)?;
            }
            report.runs.push(CopyTimes { kernel, baseline, baseline_chunks });
        }
        Ok(report)
    }
}

impl Drop for HostExecutor {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::warn!(executor = %self.name, error = %e, "stopping the host executor failed");
        }
    }
}
