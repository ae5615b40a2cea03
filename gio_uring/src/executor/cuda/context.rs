//! The CUDA context everything of one executor lives in, and the rules its
//! memory follows (the allocations themselves are `memory.rs` and
//! `registry.rs`).
//!
//! Written against the CUDA driver API through `cudarc::driver::sys`. In CI
//! the stand-in driver runs it (`cuda-standin/`, the `executor_*` tests
//! there), which models the CUDA semantics this file is built around; one
//! H100 ran the gio_uring and objstore suites on it, once
//! (`docs/gpu-verification.md` says when, at which commit, and what has
//! changed since):
//!
//! - **One thread at a time, and the caller's context restored.** A green
//!   context may be current to one thread at a time, and the executor is
//!   called from any thread. Every driver call goes through [`CudaCtx::enter`],
//!   which takes the context's one lock, pushes the context
//!   (`cuCtxPushCurrent`) and pops it again when the guard drops, so the
//!   calling thread gets back whatever context it had. Nothing here calls
//!   `cuCtxSetCurrent`.
//! - **No legacy default stream.** Host -> device writes, device -> host reads
//!   and zeroing go through one non-blocking copy stream, through a pinned
//!   staging buffer, and are waited for (with a deadline) before the call
//!   returns. A pageable `cuMemcpyHtoD` or a `cuMemsetD8` may return before
//!   the data lands, and the legacy stream is not ordered with the
//!   executor's non-blocking kernel streams.
//! - **Nothing freed under a running kernel.** `cuMemFree`, `cuMemFreeHost`
//!   and `cuMemHostUnregister` wait for the device, so with a persistent
//!   kernel they would block until it stops (and memory freed under a kernel
//!   is a use after free). While the executor's kernels may run, frees go to
//!   a deferred list, released once the streams are idle (stop, or an idle
//!   moment in launch mode; a persistent executor stops and restarts its
//!   kernel when the list reaches its bound, `CudaExecutorConfig::deferred_bound`).
//! - **Poisoned after a failed stop.** When kernels are still running after
//!   the stop deadline, nothing of this context is ever freed again: memory,
//!   streams, module and the context itself are leaked on purpose.

use crate::error::{GioError, Result};
use cudarc::driver::sys;
use std::ffi::CStr;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Pinned staging for copies to and from device memory (larger copies go in pieces).
const STAGING_BYTES: usize = 1 << 20;

/// Turns a driver API result into our error, with the error's name.
pub(super) fn check(call: &'static str, rc: sys::CUresult) -> Result<()> {
    if rc == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string, or leaves it null.
    let named =
        unsafe { sys::cuGetErrorName(rc, &mut name) } == sys::CUresult::CUDA_SUCCESS && !name.is_null();
    let code = if named {
        // SAFETY: a non-null result of cuGetErrorName is a static NUL-terminated string.
        unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
    } else {
        format!("{rc:?}")
    };
    Err(GioError::Cuda { call, code })
}

/// Something whose release waits for the device.
pub(super) enum Deferred {
    Device(sys::CUdeviceptr),
    Host(*mut std::ffi::c_void),
    Unregister(*mut std::ffi::c_void),
}

/// What the context's lock guards: the driver calls themselves, and the copy path.
struct Driver {
    /// Non-blocking stream for every host <-> device copy and memset.
    copy: sys::CUstream,
    /// Pinned host memory the copies go through (`STAGING_BYTES`).
    staging: Option<NonNull<u8>>,
    /// Released once no kernel of the executor can be running.
    deferred: Vec<Deferred>,
}

/// The context everything of one executor lives in: a green context's, or
/// the device's primary context. Released last (memory holds an `Arc`).
pub(super) struct CudaCtx {
    ctx: sys::CUcontext,
    device: sys::CUdevice,
    green: Option<sys::CUgreenCtx>,
    driver: Mutex<Driver>,
    /// The executor's kernels may be running: frees are deferred.
    live: AtomicBool,
    /// A stop failed: kernels may still use everything; nothing is freed.
    poisoned: AtomicBool,
    /// `Driver::deferred.len()`, readable without the lock.
    deferred_len: AtomicUsize,
    /// Deadline of one copy or memset.
    copy_timeout: Duration,
}

// SAFETY: the handles are used only under `driver`'s lock with the context pushed
// on the calling thread (`enter`); the staging pointer is touched only under that lock.
unsafe impl Send for CudaCtx {}
// SAFETY: as above.
unsafe impl Sync for CudaCtx {}

/// The context current on this thread and the driver lock held; the caller's
/// context comes back on drop.
pub(super) struct Current<'a> {
    ctx: &'a CudaCtx,
    driver: MutexGuard<'a, Driver>,
}

impl CudaCtx {
    /// Wraps a context this value now owns (primary: released with
    /// `cuDevicePrimaryCtxRelease`; green: destroyed with `cuGreenCtxDestroy`),
    /// and makes its copy stream and staging buffer.
    pub fn new(
        ctx: sys::CUcontext,
        device: sys::CUdevice,
        green: Option<sys::CUgreenCtx>,
        copy_timeout: Duration,
    ) -> Result<Arc<Self>> {
        let cuda = Arc::new(CudaCtx {
            ctx,
            device,
            green,
            driver: Mutex::new(Driver { copy: std::ptr::null_mut(), staging: None, deferred: Vec::new() }),
            live: AtomicBool::new(false),
            poisoned: AtomicBool::new(false),
            deferred_len: AtomicUsize::new(0),
            copy_timeout,
        });
        {
            let mut cur = cuda.enter()?;
            cur.driver.copy = cur.stream()?;
            let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
            // SAFETY: valid out pointer; the context is current.
            check("cuMemHostAlloc (staging)", unsafe { sys::cuMemHostAlloc(&mut p, STAGING_BYTES, 0) })?;
            cur.driver.staging = NonNull::new(p.cast::<u8>());
        }
        Ok(cuda)
    }

    /// Takes the driver lock and makes this context current on the calling
    /// thread until the guard drops.
    pub fn enter(&self) -> Result<Current<'_>> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(self.poisoned_err());
        }
        self.enter_any()
    }

    /// `enter`, also for a poisoned context (what teardown and logging need).
    fn enter_any(&self) -> Result<Current<'_>> {
        let driver =
            self.driver.lock().map_err(|_| GioError::invalid("CUDA driver lock poisoned by a panic"))?;
        // SAFETY: `ctx` is a live context owned by this value.
        check("cuCtxPushCurrent", unsafe { sys::cuCtxPushCurrent_v2(self.ctx) })?;
        Ok(Current { ctx: self, driver })
    }

    pub fn poisoned_err(&self) -> GioError {
        GioError::Executor {
            executor: "cuda".into(),
            what: "poisoned: a stop failed with kernels still running; the executor refuses further calls \
                   and leaks its memory rather than free it under them"
                .into(),
        }
    }

    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    /// Frees and unregistrations waiting for the kernels to stop (a relaxed read).
    pub fn deferred_len(&self) -> usize {
        self.deferred_len.load(Ordering::Relaxed)
    }

    /// From now on nothing of this context is freed.
    pub fn poison(&self) {
        self.poisoned.store(true, Ordering::Release);
    }

    /// Kernels may run from now on: frees are deferred until [`Self::settle`].
    pub fn set_live(&self) {
        self.live.store(true, Ordering::Release);
    }

    /// No kernel of the executor runs any more (its streams drained): releases
    /// what was deferred; later frees happen at once.
    pub fn settle(&self) -> Result<()> {
        let mut cur = self.enter()?;
        self.live.store(false, Ordering::Release);
        cur.release_deferred();
        Ok(())
    }

    /// Frees `what` now, later, or never (poisoned).
    pub(super) fn release(&self, what: Deferred) {
        if self.is_poisoned() {
            return;
        }
        let Ok(mut cur) = self.enter_any() else {
            tracing::warn!("CUDA context unavailable: leaking an allocation");
            return;
        };
        if self.live.load(Ordering::Acquire) {
            cur.driver.deferred.push(what);
            self.deferred_len.store(cur.driver.deferred.len(), Ordering::Relaxed);
        } else {
            cur.free(what);
        }
    }
}

/// Where an executor's context comes from.
impl CudaCtx {
    /// The device's primary context (retained; released on drop).
    pub fn primary(device: sys::CUdevice, copy_timeout: Duration) -> Result<Arc<Self>> {
        let mut c: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out pointer and device; released in CudaCtx::drop.
        check("cuDevicePrimaryCtxRetain", unsafe { sys::cuDevicePrimaryCtxRetain(&mut c, device) })?;
        CudaCtx::new(c, device, None, copy_timeout)
    }

    /// A green context of `n` SMs: cuDeviceGetDevResource → cuDevSmResourceSplitByCount
    /// → cuDevResourceGenerateDesc → cuGreenCtxCreate (§ CUDA driver API, Green Contexts).
    pub fn green(device: sys::CUdevice, n: u32, copy_timeout: Duration) -> Result<(Arc<Self>, u32)> {
        // SAFETY: plain C structs for which all-zero is a valid (empty) value.
        let (mut all, mut part, mut rest): (sys::CUdevResource, sys::CUdevResource, sys::CUdevResource) =
            unsafe { (std::mem::zeroed(), std::mem::zeroed(), std::mem::zeroed()) };
        // SAFETY: valid out pointer and device.
        check("cuDeviceGetDevResource", unsafe {
            sys::cuDeviceGetDevResource(device, &mut all, sys::CUdevResourceType::CU_DEV_RESOURCE_TYPE_SM)
        })?;
        let mut groups = 1u32;
        // SAFETY: one result slot for one group; input read-only.
        check("cuDevSmResourceSplitByCount", unsafe {
            sys::cuDevSmResourceSplitByCount(&mut part, &mut groups, &all, &mut rest, 0, n)
        })?;
        // SAFETY: reading the SM arm of the union of a resource of type SM.
        let got = unsafe { part.__bindgen_anon_1.sm.smCount };
        if groups != 1 || got == 0 {
            return Err(GioError::Executor {
                executor: "cuda".into(),
                what: format!("cannot split off {n} SMs (got {groups} groups of {got})"),
            });
        }
        let mut desc: sys::CUdevResourceDesc = std::ptr::null_mut();
        // SAFETY: one valid resource.
        check("cuDevResourceGenerateDesc", unsafe {
            sys::cuDevResourceGenerateDesc(&mut desc, &mut part, 1)
        })?;
        let mut green: sys::CUgreenCtx = std::ptr::null_mut();
        // SAFETY: a descriptor generated above; destroyed in CudaCtx::drop.
        check("cuGreenCtxCreate", unsafe {
            sys::cuGreenCtxCreate(
                &mut green,
                desc,
                device,
                sys::CUgreenCtxCreate_flags::CU_GREEN_CTX_DEFAULT_STREAM as u32,
            )
        })?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `green` is live. The context it yields is owned by the green context.
        let rc = unsafe { sys::cuCtxFromGreenCtx(&mut ctx, green) };
        if let Err(e) = check("cuCtxFromGreenCtx", rc) {
            // SAFETY: created above, used by nothing yet.
            let _ = unsafe { sys::cuGreenCtxDestroy(green) };
            return Err(e);
        }
        Ok((CudaCtx::new(ctx, device, Some(green), copy_timeout)?, got))
    }
}

impl Current<'_> {
    /// A non-blocking stream of the (green) context.
    pub fn stream(&self) -> Result<sys::CUstream> {
        let flags = sys::CUstream_flags_enum::CU_STREAM_NON_BLOCKING as u32;
        let mut s: sys::CUstream = std::ptr::null_mut();
        // SAFETY: valid out pointer; the context (or its green context) is live and current.
        let rc = unsafe {
            match self.ctx.green {
                Some(g) => sys::cuGreenCtxStreamCreate(&mut s, g, flags, 0),
                None => sys::cuStreamCreate(&mut s, flags),
            }
        };
        check("creating a stream", rc)?;
        Ok(s)
    }

    /// Waits for `stream` to drain, up to `timeout`, polling (never an unbounded synchronize).
    pub fn drain(&self, stream: sys::CUstream, timeout: Duration) -> Result<bool> {
        let start = Instant::now();
        let mut nap = Duration::from_micros(20);
        loop {
            // SAFETY: a live stream of this context.
            match unsafe { sys::cuStreamQuery(stream) } {
                sys::CUresult::CUDA_SUCCESS => return Ok(true),
                sys::CUresult::CUDA_ERROR_NOT_READY if start.elapsed() < timeout => {
                    std::thread::sleep(nap);
                    nap = (nap * 2).min(Duration::from_millis(1));
                }
                sys::CUresult::CUDA_ERROR_NOT_READY => return Ok(false),
                rc => return check("cuStreamQuery", rc).map(|_| false),
            }
        }
    }

    /// Waits for the copy stream; an error if a copy did not finish in time.
    fn copied(&self) -> Result<()> {
        if self.drain(self.driver.copy, self.ctx.copy_timeout)? {
            Ok(())
        } else {
            Err(GioError::Executor {
                executor: "cuda".into(),
                what: format!(
                    "a copy to or from device memory did not finish within {:?}",
                    self.ctx.copy_timeout
                ),
            })
        }
    }

    fn staging(&self) -> Result<NonNull<u8>> {
        self.driver.staging.ok_or_else(|| GioError::invalid("CUDA staging buffer missing"))
    }

    /// Zeroes `len` bytes of device memory at `dev`, landed on return.
    pub fn zero(&self, dev: sys::CUdeviceptr, len: usize) -> Result<()> {
        // SAFETY: `dev..dev+len` is device memory of this context (callers' contract).
        check("cuMemsetD8Async", unsafe { sys::cuMemsetD8Async(dev, 0, len, self.driver.copy) })?;
        self.copied()
    }

    /// Copies `bytes` to device memory at `dev`, landed on return.
    pub fn write(&self, dev: sys::CUdeviceptr, bytes: &[u8]) -> Result<()> {
        let staging = self.staging()?;
        for (k, piece) in bytes.chunks(STAGING_BYTES).enumerate() {
            // SAFETY: `piece` fits the staging buffer; the previous copy out of it has finished.
            unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), staging.as_ptr(), piece.len()) };
            let at = dev + (k * STAGING_BYTES) as u64;
            // SAFETY: pinned source of `piece.len()` bytes; destination inside the caller's allocation.
            check("cuMemcpyHtoDAsync", unsafe {
                sys::cuMemcpyHtoDAsync_v2(at, staging.as_ptr().cast(), piece.len(), self.driver.copy)
            })?;
            self.copied()?;
        }
        Ok(())
    }

    /// Copies device memory at `dev` into `out`.
    pub fn read(&self, dev: sys::CUdeviceptr, out: &mut [u8]) -> Result<()> {
        let staging = self.staging()?;
        for (k, piece) in out.chunks_mut(STAGING_BYTES).enumerate() {
            let at = dev + (k * STAGING_BYTES) as u64;
            // SAFETY: pinned destination of at least `piece.len()` bytes; source inside the allocation.
            check("cuMemcpyDtoHAsync", unsafe {
                sys::cuMemcpyDtoHAsync_v2(staging.as_ptr().cast(), at, piece.len(), self.driver.copy)
            })?;
            self.copied()?;
            // SAFETY: the copy into staging has finished; `piece` is a separate slice.
            unsafe { std::ptr::copy_nonoverlapping(staging.as_ptr(), piece.as_mut_ptr(), piece.len()) };
        }
        Ok(())
    }

    /// Whether every stream in `streams` is idle now (no waiting).
    pub fn idle(&self, streams: &[sys::CUstream]) -> bool {
        // SAFETY: live streams of this context.
        streams.iter().all(|&s| unsafe { sys::cuStreamQuery(s) } == sys::CUresult::CUDA_SUCCESS)
    }

    /// Releases what was deferred (the caller knows no kernel runs).
    pub fn release_deferred(&mut self) {
        let all = std::mem::take(&mut self.driver.deferred);
        self.ctx.deferred_len.store(0, Ordering::Relaxed);
        for d in all {
            self.free(d);
        }
    }

    pub fn deferred(&self) -> usize {
        self.driver.deferred.len()
    }

    /// Deferred host unregistrations whose registration starts in `start..end`.
    pub(super) fn deferred_unregisters_in(&self, start: usize, end: usize) -> usize {
        self.driver
            .deferred
            .iter()
            .filter(|d| matches!(d, Deferred::Unregister(p) if (start..end).contains(&(*p as usize))))
            .count()
    }

    /// Performs now the deferred host unregistrations whose registration starts in
    /// `start..end` (the caller knows no kernel still uses them, and that the
    /// driver's wait for the device ends: launch mode).
    pub(super) fn release_unregisters_in(&mut self, start: usize, end: usize) {
        let (now, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.driver.deferred)
            .into_iter()
            .partition(|d| matches!(d, Deferred::Unregister(p) if (start..end).contains(&(*p as usize))));
        self.driver.deferred = keep;
        self.ctx.deferred_len.store(self.driver.deferred.len(), Ordering::Relaxed);
        for d in now {
            self.free(d);
        }
    }

    fn free(&self, what: Deferred) {
        // SAFETY: each pointer came from the matching allocation call of this context and is
        // released exactly once (it left its owner when it was handed to `release`).
        let (call, rc) = unsafe {
            match what {
                Deferred::Device(p) => ("cuMemFree", sys::cuMemFree_v2(p)),
                Deferred::Host(p) => ("cuMemFreeHost", sys::cuMemFreeHost(p)),
                Deferred::Unregister(p) => ("cuMemHostUnregister", sys::cuMemHostUnregister(p)),
            }
        };
        if let Err(e) = check(call, rc) {
            tracing::warn!(error = %e, "releasing CUDA memory failed");
        }
    }
}

impl Drop for Current<'_> {
    fn drop(&mut self) {
        let mut popped: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: pops the context `enter` pushed on this thread.
        let rc = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
        if rc != sys::CUresult::CUDA_SUCCESS || popped != self.ctx.ctx {
            tracing::error!(?rc, "cuCtxPopCurrent did not pop the executor's context");
        }
    }
}

impl Drop for CudaCtx {
    fn drop(&mut self) {
        if self.is_poisoned() {
            tracing::error!("CUDA context of a poisoned executor left allocated (kernels may still use it)");
            return;
        }
        if let Ok(mut cur) = self.enter_any() {
            cur.release_deferred();
            if let Some(s) = cur.driver.staging.take() {
                cur.free(Deferred::Host(s.as_ptr().cast()));
            }
            if !cur.driver.copy.is_null() {
                // SAFETY: created in `new`, destroyed once; no copy is pending (every copy is waited for).
                let _ = unsafe { sys::cuStreamDestroy_v2(cur.driver.copy) };
            }
        }
        // SAFETY: each handle is released exactly once, here. A context obtained from
        // cuCtxFromGreenCtx is owned by the green context and not destroyed separately.
        let rc = unsafe {
            match self.green {
                Some(g) => sys::cuGreenCtxDestroy(g),
                None => sys::cuDevicePrimaryCtxRelease_v2(self.device),
            }
        };
        if let Err(e) = check("releasing the context", rc) {
            tracing::warn!(error = %e, "CUDA context release failed");
        }
    }
}
