//! The CUDA executor: the I/O kernels on a GPU, optionally confined to a
//! green-context partition of its SMs.
//!
//! # What has been verified, and how
//! On an NVIDIA H100 80GB HBM3 (driver 580.159, CUDA 13.0; `scripts/gpu-check`
//! from a bundle built here, 2026-11-24): the gio_uring and objstore suites on
//! this executor (`TUTTI_TEST_EXECUTOR=cuda`, one test at a time), and
//! `tutti demo --cuda` in persistent and launch mode, staged (KV in HBM) and
//! direct (KV in host memory), every byte verified, at commit 6d67bf2. The I/O
//! kernels there ran in an 8-SM green context (asked for 1-4 SMs, the split gave
//! 8). Later kernel changes (the ring's idle-parking fields; issue 27's warp-cooperative
//! staged copy and withheld-slot reclaim) have not run on a GPU, nor have the persistent
//! kernel's restart past `deferred_bound` and the copy bench (`cuda/bench.rs`): those run
//! on the stand-in (`executor_deferred`, `tools/tests/bench_staged_cli.rs`) and the
//! staged copy's machine code is checked in the SASS.
//!
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
//! # A persistent kernel blocks module loads on the device
//! Seen on the H100: while the persistent kernel ran in its green context, a
//! `cuModuleLoadData` in the primary context (a second executor's) did not
//! return. So everything that loads modules must do so before a persistent
//! executor starts, or after it stops; an engine that loads kernels lazily
//! while serving must use launch mode, which the C ABI does by default. The
//! stand-in's `module_load_waits` knob models this (`executor_module_load`).

//! # How it runs
//! - Memory: rings, control block and IOCBs in mapped pinned host memory;
//!   queue state, slot arrays and layer tables in device memory, written and
//!   read through one non-blocking copy stream (see `cuda_mem`); NVMe queue
//!   memory and doorbells registered with `cuMemHostRegister`.
//! - Launch mode: each kick launches `tt_gio_issue` on the I/O stream.
//! - Persistent (SQPOLL) mode needs an SM partition (`sm_count`; see above for
//!   what it blocks while it runs): the kernel
//!   never returns, so in the primary context it would hold SMs of the
//!   engine's compute for good. Its grid is every block that can be resident
//!   in the partition less what one block of `tt_gio_wait` needs, so the wait
//!   kernel (run on a second stream) always finds room. `sm_budget` caps how
//!   many of its blocks take work (`tt_control.active_blocks`).
//! - Every driver call is made with the executor's context pushed on the
//!   calling thread under one lock, and the caller's context restored after.
//! - A stop that times out with kernels still running poisons the executor:
//!   later calls fail, and nothing the kernels may still touch is freed.

mod bench;

use super::copy_bench::{CopyReport, CopySpec};
use super::cuda_mem::{check, CudaCtx, Device, MapError, Pinned, Registry};
use super::relay::{DoorbellMode, DoorbellRelay, RelayConfig, Watch};
use super::{ExecBinding, ExecMode, ExecShape, Executor};
use crate::error::{GioError, Result};
use crate::mem::{ExecMemory, HostMapping, HostRange, MemKind};
use cudarc::driver::sys;
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tutti_driver::transport::DoorbellKind;
use tutti_kernels::{nvrtc, GPU_BLOCK_THREADS, KERNEL_COPY, KERNEL_ISSUE, KERNEL_PERSISTENT, KERNEL_WAIT};

/// Green contexts (cuGreenCtxCreate) need 12.4, their streams 12.5.
const GREEN_CTX_DRIVER: i32 = 12050;
/// Deadline of one host <-> device copy.
const COPY_TIMEOUT: Duration = Duration::from_secs(10);
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

struct Kernels {
    module: sys::CUmodule,
    issue: sys::CUfunction,
    persistent: sys::CUfunction,
    wait: sys::CUfunction,
    /// `tt_gio_copy` (the copy benchmark, `bench.rs`).
    copy: sys::CUfunction,
    /// The same image as a library: its kernel handles belong to no context,
    /// so `enqueue_wait` may launch on another context's stream.
    library: sys::CUlibrary,
    wait_any: sys::CUkernel,
}

/// The doorbell relay and its mailbox region as the GPU sees it.
struct Relay {
    relay: DoorbellRelay,
    /// Device address of the mailbox region (registered with DEVICEMAP).
    mailboxes: u64,
    _region: Box<dyn HostMapping>,
}

/// A relayed doorbell: the kernels store into its mailbox.
struct Relayed {
    _watch: Watch,
    exec: u64,
}

impl HostMapping for Relayed {
    fn exec_addr(&self) -> u64 {
        self.exec
    }
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

/// Loads `path` for the rest of the process with RTLD_NOW | RTLD_GLOBAL, so
/// that cudarc's `dlopen("libcuda.so")` finds it by its soname. One driver
/// per process: asking for another later is an error.
fn load_driver(path: &Path) -> Result<()> {
    static LOADED: OnceLock<Mutex<Option<PathBuf>>> = OnceLock::new();
    let mut loaded =
        LOADED.get_or_init(Mutex::default).lock().map_err(|_| no_cuda("driver loader lock poisoned"))?;
    match loaded.as_ref() {
        Some(p) if p == path => return Ok(()),
        Some(p) => {
            return Err(no_cuda(format!(
                "driver {} requested, but {} is already loaded in this process",
                path.display(),
                p.display()
            )))
        }
        None => {}
    }
    if !path.is_absolute() {
        return Err(no_cuda(format!("driver path {} is not absolute", path.display())));
    }
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| no_cuda(format!("driver path {} contains a NUL byte", path.display())))?;
    // SAFETY: a valid C string; the library stays loaded for the rest of the process.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns a thread-local message or NULL.
        let msg = unsafe { libc::dlerror() };
        let why = if msg.is_null() {
            "dlopen failed".to_string()
        } else {
            // SAFETY: a non-null dlerror result is a NUL-terminated string.
            unsafe { std::ffi::CStr::from_ptr(msg) }.to_string_lossy().into_owned()
        };
        return Err(no_cuda(format!("cannot load the driver {}: {why}", path.display())));
    }
    tracing::info!(driver = %path.display(), "CUDA driver library loaded");
    *loaded = Some(path.to_path_buf());
    Ok(())
}

/// The kernels compiled for `arch`, once per process.
fn cubin(arch: &str) -> Result<Arc<Vec<u8>>> {
    static CUBINS: OnceLock<Mutex<HashMap<String, Arc<Vec<u8>>>>> = OnceLock::new();
    let mut cache = CUBINS
        .get_or_init(Mutex::default)
        .lock()
        .map_err(|_| GioError::invalid("cubin cache lock poisoned"))?;
    if let Some(c) = cache.get(arch) {
        return Ok(c.clone());
    }
    let compiled = nvrtc::compile_gio(arch)?;
    for w in compiled.warnings() {
        tracing::warn!(arch, warning = w, "NVRTC warning in the I/O kernels");
    }
    let c = Arc::new(compiled.cubin);
    cache.insert(arch.to_string(), c.clone());
    Ok(c)
}

/// A cubin built elsewhere, checked against this device and the launchers
/// before the driver sees it.
fn prebuilt_cubin(path: &std::path::Path, sm: u32) -> Result<Arc<Vec<u8>>> {
    let bad = |what: String| GioError::invalid(format!("cubin {}: {what}", path.display()));
    let image = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let parsed = tutti_kernels::cubin::parse(&image).map_err(|e| bad(e.to_string()))?;
    if parsed.sm != sm {
        return Err(bad(format!("built for sm_{}, the device is sm_{sm}", parsed.sm)));
    }
    for (name, sizes) in tutti_kernels::KERNEL_PARAMS {
        let k = parsed.kernel(name).ok_or_else(|| bad(format!("no entry point {name}")))?;
        if k.param_sizes() != sizes {
            return Err(bad(format!(
                "{name} takes parameters of {:?} bytes, the launches pass {sizes:?}",
                k.param_sizes()
            )));
        }
    }
    Ok(Arc::new(image))
}

/// What one SM holds, and what a block of a kernel takes of it.
#[derive(Clone, Copy, Debug)]
struct SmLimits {
    regs: u32,
    threads: u32,
    blocks: u32,
    smem: u32,
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

impl CudaExecutor {
    /// Opens the device, makes the (green) context, compiles and loads the
    /// kernels. On a machine without the NVIDIA driver this returns
    /// [`GioError::NoCuda`] without touching anything that could panic.
    pub fn new(cfg: CudaExecutorConfig) -> Result<Self> {
        let bt = cfg.block_threads;
        if bt == 0 || !bt.is_multiple_of(32) || bt > GPU_BLOCK_THREADS {
            return Err(config_err(format!(
                "block_threads {bt} is not a multiple of 32 in 32..={GPU_BLOCK_THREADS} (the kernels' launch bounds)"
            )));
        }
        if cfg.blocks_per_sm == Some(0) || cfg.sm_count == Some(0) {
            return Err(config_err("blocks_per_sm and sm_count must be at least 1 when set"));
        }
        if cfg.mode == ExecMode::Inline {
            return Err(config_err(
                "inline mode runs lanes on the calling host thread: only the host executor has it",
            ));
        }
        if cfg.mode == ExecMode::Persistent && cfg.sm_count.is_none() {
            return Err(config_err(
                "persistent mode needs an SM partition (sm_count): a kernel that never returns would hold \
                 SMs of the engine's own compute in the primary context",
            ));
        }
        if let Some(path) = &cfg.driver {
            load_driver(path)?;
        }
        // cudarc's loader panics on the first call when libcuda is missing: look first.
        // SAFETY: only tries to dlopen the library.
        if !unsafe { sys::is_culib_present() } {
            return Err(no_cuda("libcuda.so (the NVIDIA driver) is not installed on this machine"));
        }
        // SAFETY: libcuda is present; cuInit has no other preconditions.
        check("cuInit", unsafe { sys::cuInit(0) })
            .map_err(|e| no_cuda(format!("the CUDA driver did not initialise: {e}")))?;
        let mut version = 0;
        // SAFETY: valid out pointer.
        check("cuDriverGetVersion", unsafe { sys::cuDriverGetVersion(&mut version) })?;
        let mut device: sys::CUdevice = 0;
        // SAFETY: valid out pointer.
        check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut device, cfg.device) })
            .map_err(|e| no_cuda(format!("no CUDA device {}: {e}", cfg.device)))?;
        let attr = |a: sys::CUdevice_attribute| -> Result<u32> {
            let mut v = 0;
            // SAFETY: valid out pointer and device.
            check("cuDeviceGetAttribute", unsafe { sys::cuDeviceGetAttribute(&mut v, a, device) })?;
            Ok(v.max(0) as u32)
        };
        use sys::CUdevice_attribute as A;
        let (major, minor) = (
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        if major < 7 {
            return Err(no_cuda(format!(
                "device {} is sm_{major}{minor}; the kernels need sm_70 or newer",
                cfg.device
            )));
        }
        let all_sms = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let sm = SmLimits {
            regs: attr(A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)?,
            threads: attr(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?,
            blocks: attr(A::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR)?,
            smem: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?,
        };

        let (ctx, sms) = match cfg.sm_count {
            None => {
                let mut c: sys::CUcontext = std::ptr::null_mut();
                // SAFETY: valid out pointer and device; released in CudaCtx::drop.
                check("cuDevicePrimaryCtxRetain", unsafe { sys::cuDevicePrimaryCtxRetain(&mut c, device) })?;
                tracing::debug!(device = cfg.device, "CUDA executor: primary context retained");
                (CudaCtx::new(c, device, None, COPY_TIMEOUT)?, all_sms)
            }
            Some(n) => {
                if version < GREEN_CTX_DRIVER {
                    return Err(config_err(format!(
                        "an SM partition needs green contexts (driver >= 12.5); this driver is {}.{}",
                        version / 1000,
                        version % 1000 / 10
                    )));
                }
                let g = green_context(device, n)?;
                tracing::debug!(device = cfg.device, sms = g.1, "CUDA executor: green context made");
                g
            }
        };
        let arch = cfg.arch.clone().unwrap_or_else(|| format!("sm_{major}{minor}"));
        let image = match &cfg.cubin {
            Some(path) => prebuilt_cubin(path, major * 10 + minor)?,
            None => cubin(&arch)?,
        };
        let (kernels, stream, aux, per_sm) = {
            let cur = ctx.enter()?;
            tracing::debug!("CUDA executor: context entered, loading the kernels");
            let kernels = load(&image)?;
            tracing::debug!("CUDA executor: kernels loaded");
            let cost = |f: sys::CUfunction, threads: u32| -> Result<BlockCost> {
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
            };
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
            let stream = cur.stream()?;
            let aux = cur.stream()?;
            tracing::debug!(per_sm, "CUDA executor: streams made");
            (kernels, stream, aux, per_sm)
        };
        let shape = ExecShape { block_threads: bt, blocks_per_unit: per_sm, max_blocks: sms * per_sm };
        let name = format!(
            "cuda device {} (sm_{major}{minor}, {sms} SMs{}, {:?}, {} x {bt} threads)",
            cfg.device,
            if cfg.sm_count.is_some() { " in a green context" } else { "" },
            cfg.mode,
            shape.max_blocks
        );
        let registry = Registry::new(&ctx, cfg.mode == ExecMode::Launch);
        tracing::info!(executor = %name, driver = version, blocks = shape.max_blocks, "CUDA executor ready");
        Ok(CudaExecutor {
            cfg,
            name,
            ctx,
            kernels,
            stream,
            aux,
            shape,
            registry,
            state: Mutex::default(),
            wait: Mutex::new(None),
            relay: Mutex::new(None),
            relayed_name: OnceLock::new(),
            lifecycle: Mutex::new(()),
            restarts: AtomicU64::new(0),
            driver_version: version,
        })
    }

    /// Frees and host unregistrations waiting for the kernels (see
    /// [`CudaExecutorConfig::deferred_bound`]).
    pub fn deferred_frees(&self) -> usize {
        self.ctx.deferred_len()
    }

    /// Times the persistent kernel was stopped and started again to release them.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// Persistent mode, before parts are pushed: when `deferred_bound` frees are waiting,
    /// stops the kernel (it returns once the submission ring is empty, so the work already
    /// queued runs first; nothing new is pushed meanwhile, since the caller pushes only
    /// after this returns), releases them, and starts it again. Skipped while `tt_gio_wait`
    /// runs on the aux stream (the driver's frees would wait for it); the next issue
    /// looks again. A kernel that does not return within `stop_timeout` poisons the
    /// executor, as a failed stop does.
    fn restart_if_due(&self) -> Result<()> {
        let bound = self.cfg.deferred_bound;
        if self.cfg.mode != ExecMode::Persistent || bound == 0 || self.ctx.deferred_len() < bound {
            return Ok(());
        }
        let _life = self.lifecycle.lock().map_err(|_| self.err("lifecycle lock poisoned"))?;
        if self.ctx.deferred_len() < bound || !self.ctx.enter()?.idle(&[self.aux]) {
            return Ok(());
        }
        let binding = {
            let mut st = self.state.lock().map_err(|_| self.err("state lock poisoned"))?;
            match st.binding {
                Some(b) if !st.stopped => {
                    st.restarting = true;
                    b
                }
                _ => return Ok(()),
            }
        };
        let result = self.restart(&binding);
        if let Ok(mut st) = self.state.lock() {
            st.restarting = false;
        }
        result
    }

    fn restart(&self, b: &ExecBinding) -> Result<()> {
        // SAFETY: `control` is the live shared control block (pinned, mapped for the GPU).
        let stop = unsafe { AtomicU32::from_ptr(&raw mut (*b.control.as_ptr()).stop) };
        stop.store(1, Ordering::Release);
        if !self.drain(self.stream, self.cfg.stop_timeout)? {
            self.ctx.poison();
            tracing::error!(executor = %self.name, "the persistent kernel did not return to release deferred frees: poisoned");
            return Err(self.err(format!(
                "the persistent kernel did not return within {:?} when stopped to release deferred frees; \
                 the executor is poisoned and leaks its memory",
                self.cfg.stop_timeout
            )));
        }
        let released = {
            let mut cur = self.ctx.enter()?;
            let n = cur.deferred();
            // No launch can start on aux while this thread holds the driver lock.
            if cur.idle(&[self.aux]) {
                cur.release_deferred();
                n
            } else {
                0
            }
        };
        stop.store(0, Ordering::Release);
        self.launch_persistent(b)?;
        self.restarts.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(executor = %self.name, released, "persistent kernel restarted to release deferred frees");
        Ok(())
    }

    /// Launches the persistent grid. Every block must be resident: they wait on each
    /// other through the queues. Everything the kernel reads was written through the copy
    /// stream and has landed.
    fn launch_persistent(&self, b: &ExecBinding) -> Result<()> {
        let mut ctx = b.ctx;
        let mut params: [*mut c_void; 1] = [(&raw mut ctx).cast()];
        self.launch(
            self.kernels.persistent,
            self.shape.max_blocks,
            self.shape.block_threads,
            self.stream,
            &mut params,
        )
    }

    /// The doorbell relay's counters, once doorbells are relayed.
    pub fn relay_stats(&self) -> Option<super::RelayStats> {
        self.relay.lock().ok()?.as_ref().map(|r| r.relay.stats())
    }

    /// Watches `doorbell` through the relay, starting it (and mapping its
    /// mailboxes for the GPU) on first use.
    ///
    /// # Safety
    /// `doorbell` stays valid until the returned mapping is dropped.
    unsafe fn relay_doorbell(
        &self,
        doorbell: NonNull<u32>,
        kind: DoorbellKind,
        why: &str,
    ) -> Result<Box<dyn HostMapping>> {
        let mut relay = self.relay.lock().map_err(|_| self.err("relay lock poisoned"))?;
        if relay.is_none() {
            let cfg = match &self.cfg.doorbells {
                DoorbellMode::Relay(c) => c.clone(),
                DoorbellMode::Direct => RelayConfig::default(),
            };
            let r = DoorbellRelay::new(cfg)?;
            let (ptr, len) = r.mailboxes();
            // SAFETY: the region lives as long as the relay, which outlives this mapping
            // (both are dropped together, the mapping first).
            let region = unsafe { self.registry.map(ptr, len, HostRange::Memory) }.map_err(GioError::from)?;
            let mailboxes = region.exec_addr();
            *relay = Some(Relay { relay: r, mailboxes, _region: region });
            let _ =
                self.relayed_name.set(format!("{}, doorbells relayed by a host thread ({why})", self.name));
            tracing::warn!(executor = %self.name, why, "NVMe doorbells go through the host relay thread");
        }
        let r = relay.as_ref().ok_or_else(|| self.err("relay missing"))?;
        // SAFETY: the caller's contract, passed on; the watch lives in the mapping.
        let watch = unsafe { r.relay.watch(doorbell, kind)? };
        let exec = r.mailboxes + watch.offset() as u64;
        Ok(Box::new(Relayed { _watch: watch, exec }))
    }

    fn err(&self, what: impl Into<String>) -> GioError {
        GioError::Executor { executor: self.name.clone(), what: what.into() }
    }

    /// Launches `f` on `stream` with this executor's context current.
    fn launch(
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

    fn ctx_addr(&self) -> Result<u64> {
        let st = self.state.lock().map_err(|_| self.err("state lock poisoned"))?;
        if st.stopped {
            return Err(self.err("stopped"));
        }
        Ok(st.binding.ok_or_else(|| self.err("not started"))?.ctx)
    }

    /// Waits for `stream` to drain, up to `timeout`; the lock is taken per poll,
    /// so other threads' driver calls go on meanwhile.
    fn drain(&self, stream: sys::CUstream, timeout: Duration) -> Result<bool> {
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
        unsafe { self.launch_wait(f, stream, ids, seqs, n, timeout, done) }
    }

    /// # Safety
    /// As [`Self::enqueue_wait`]; `f` is `tt_gio_wait` usable on `stream`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch_wait(
        &self,
        f: sys::CUfunction,
        stream: sys::CUstream,
        ids: u64,
        seqs: u64,
        n: u32,
        timeout: Duration,
        done: u64,
    ) -> Result<()> {
        let mut ctx = self.ctx_addr()?;
        let (mut ids, mut seqs, mut n_, mut done) = (ids, seqs, n, done);
        let mut t = timeout.as_nanos().min(u64::MAX as u128) as u64;
        let mut params: [*mut c_void; 6] = [
            (&raw mut ctx).cast(),
            (&raw mut ids).cast(),
            (&raw mut seqs).cast(),
            (&raw mut n_).cast(),
            (&raw mut t).cast(),
            (&raw mut done).cast(),
        ];
        let block = (n.div_ceil(32) * 32).clamp(32, WAIT_BLOCK_MAX);
        self.launch(f, 1, block, stream, &mut params)
    }

    /// Stores the persistent kernel's active block count (the SM budget).
    fn set_active_blocks(&self, b: &ExecBinding, blocks: u32) {
        // SAFETY: `control` is the live shared control block (pinned, mapped for the GPU).
        unsafe { AtomicU32::from_ptr(&raw mut (*b.control.as_ptr()).active_blocks) }
            .store(blocks, Ordering::Release);
    }

    fn live_check(&self) -> Result<()> {
        if self.ctx.is_poisoned() {
            Err(self.ctx.poisoned_err())
        } else {
            Ok(())
        }
    }
}

/// A green context of `n` SMs: cuDeviceGetDevResource → cuDevSmResourceSplitByCount
/// → cuDevResourceGenerateDesc → cuGreenCtxCreate (§ CUDA driver API, Green Contexts).
fn green_context(device: sys::CUdevice, n: u32) -> Result<(Arc<CudaCtx>, u32)> {
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
        return Err(config_err(format!("cannot split off {n} SMs (got {groups} groups of {got})")));
    }
    let mut desc: sys::CUdevResourceDesc = std::ptr::null_mut();
    // SAFETY: one valid resource.
    check("cuDevResourceGenerateDesc", unsafe { sys::cuDevResourceGenerateDesc(&mut desc, &mut part, 1) })?;
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
    Ok((CudaCtx::new(ctx, device, Some(green), COPY_TIMEOUT)?, got))
}

/// Loads the image twice: as a module (functions of this context, for its own
/// streams) and as a library (context-free kernel handles, for engine streams).
/// The executor's context is current (the caller holds `CudaCtx::enter`).
fn load(cubin: &[u8]) -> Result<Kernels> {
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: `cubin` is an ELF image from NVRTC, alive for the call.
    check("cuModuleLoadData", unsafe { sys::cuModuleLoadData(&mut module, cubin.as_ptr().cast()) })?;
    tracing::debug!("CUDA executor: module loaded");
    let name = |n: &str| CString::new(n).map_err(|_| GioError::invalid("kernel name with NUL"));
    let get = |n: &str| -> Result<sys::CUfunction> {
        let c = name(n)?;
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: a loaded module and a NUL-terminated name.
        check("cuModuleGetFunction", unsafe { sys::cuModuleGetFunction(&mut f, module, c.as_ptr()) })?;
        Ok(f)
    };
    let funcs = (|| {
        Ok::<_, GioError>((get(KERNEL_ISSUE)?, get(KERNEL_PERSISTENT)?, get(KERNEL_WAIT)?, get(KERNEL_COPY)?))
    })();
    let (issue, persistent, wait, copy) = match funcs {
        Ok(f) => f,
        Err(e) => {
            // SAFETY: loaded above; no kernel of it was launched.
            let _ = unsafe { sys::cuModuleUnload(module) };
            return Err(e);
        }
    };
    let mut library: sys::CUlibrary = std::ptr::null_mut();
    // SAFETY: the same image; no JIT or library options.
    let rc = unsafe {
        sys::cuLibraryLoadData(
            &mut library,
            cubin.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    let mut wait_any: sys::CUkernel = std::ptr::null_mut();
    let got = check("cuLibraryLoadData", rc).and_then(|()| {
        let c = name(KERNEL_WAIT)?;
        // SAFETY: a loaded library and a NUL-terminated name.
        check("cuLibraryGetKernel", unsafe { sys::cuLibraryGetKernel(&mut wait_any, library, c.as_ptr()) })
    });
    if let Err(e) = got {
        // SAFETY: loaded above (the library only if its load succeeded); nothing launched.
        unsafe {
            if !library.is_null() {
                let _ = sys::cuLibraryUnload(library);
            }
            let _ = sys::cuModuleUnload(module);
        }
        return Err(e);
    }
    Ok(Kernels { module, issue, persistent, wait, copy, library, wait_any })
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
        self.live_check()?;
        if matches!(self.cfg.doorbells, DoorbellMode::Relay(_)) {
            // SAFETY: forwarded contract.
            return unsafe { self.relay_doorbell(doorbell, kind, "configured") };
        }
        // Once one doorbell page was refused, the others go the same way (one path per executor).
        if self.relayed_name.get().is_some() {
            // SAFETY: forwarded contract.
            return unsafe { self.relay_doorbell(doorbell, kind, "fallback") };
        }
        let range = match kind {
            DoorbellKind::Mmio => HostRange::Io,
            DoorbellKind::Memory => HostRange::Memory,
        };
        // SAFETY: forwarded contract.
        match unsafe { self.registry.map(doorbell.as_ptr().cast(), 4, range) } {
            Ok(m) => Ok(m),
            // The driver will not map the doorbell page for the GPU (a BAR on a kernel whose
            // driver refuses IOMEMORY registration, or any doorbell page it would not
            // register): the host relays instead.
            Err(MapError::IoRefused(e) | MapError::Other(e)) => {
                tracing::warn!(executor = %self.name, error = %e, "doorbell registration refused; relaying");
                // SAFETY: forwarded contract.
                unsafe { self.relay_doorbell(doorbell, kind, &format!("registration refused: {e}")) }
            }
        }
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
                base,
                base + 4 * WAIT_MAX_IDS as u64,
                n as u32,
                timeout,
                base + 8 * WAIT_MAX_IDS as u64,
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
