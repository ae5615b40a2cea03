//! The CUDA executor: the I/O kernels on a GPU, optionally confined to a
//! green-context partition of its SMs.
//!
//! # What has been verified, and how
//! Nothing in this file has run: the machines it was written on have no GPU
//! and no NVIDIA driver. It compiles; the kernels it loads compile with NVRTC
//! for sm_90 without warnings (`kernels/tests/nvrtc.rs`), and the same kernel
//! source runs on the host executor against emulated controllers. Without
//! libcuda, [`CudaExecutor::new`] returns [`GioError::NoCuda`] (tested), and no
//! other code path here is reachable. Before trusting it on a GPU, check: the
//! green-context calls (driver >= 12.5), BAR registration with IOMEMORY (some
//! drivers refuse it; the error says so and no host-proxied doorbell fallback
//! exists yet), and that the persistent grid is co-resident (it is sized from
//! the occupancy of `tt_gio_persistent` times the partition's SMs).
//!
//! Memory: rings, control block and IOCBs in mapped pinned host memory; queue
//! state, slot arrays and layer tables in device memory; NVMe queue memory and
//! doorbells registered with `cuMemHostRegister`.

use super::cuda_mem::{check, CudaCtx, Device, Pinned, Registry};
use super::{ExecBinding, ExecMode, ExecShape, Executor};
use crate::error::{GioError, Result};
use crate::mem::{ExecMemory, HostMapping, HostRange, MemKind};
use cudarc::driver::sys;
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tutti_kernels::{nvrtc, GPU_BLOCK_THREADS, KERNEL_ISSUE, KERNEL_PERSISTENT, KERNEL_WAIT};

/// Green contexts (cuGreenCtxCreate) need 12.4, their streams 12.5.
const GREEN_CTX_DRIVER: i32 = 12050;

#[derive(Clone, Debug)]
pub struct CudaExecutorConfig {
    /// CUDA device ordinal.
    pub device: i32,
    pub mode: ExecMode,
    /// SMs of the I/O partition (a green context); `None` runs in the primary
    /// context with every SM.
    pub sm_count: Option<u32>,
    /// Target architecture for NVRTC (`sm_90`); `None` takes the device's.
    pub arch: Option<String>,
    /// How long `stop` waits for the kernels to return.
    pub stop_timeout: Duration,
}

impl Default for CudaExecutorConfig {
    fn default() -> Self {
        CudaExecutorConfig {
            device: 0,
            mode: ExecMode::Launch,
            sm_count: None,
            arch: None,
            stop_timeout: Duration::from_secs(60),
        }
    }
}

struct Kernels {
    module: sys::CUmodule,
    issue: sys::CUfunction,
    persistent: sys::CUfunction,
    wait: sys::CUfunction,
}

#[derive(Default)]
struct State {
    binding: Option<ExecBinding>,
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
}

// SAFETY: CUDA handles may be used from any thread with the context bound, which every
// method does first; mutable state is behind a mutex.
unsafe impl Send for CudaExecutor {}
// SAFETY: as above.
unsafe impl Sync for CudaExecutor {}

fn no_cuda(what: impl Into<String>) -> GioError {
    GioError::NoCuda(what.into())
}

impl CudaExecutor {
    /// Opens the device, makes the (green) context, compiles and loads the
    /// kernels. On a machine without the NVIDIA driver this returns
    /// [`GioError::NoCuda`] without touching anything that could panic.
    pub fn new(cfg: CudaExecutorConfig) -> Result<Self> {
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
        let attr = |a: sys::CUdevice_attribute| -> Result<i32> {
            let mut v = 0;
            // SAFETY: valid out pointer and device.
            check("cuDeviceGetAttribute", unsafe { sys::cuDeviceGetAttribute(&mut v, a, device) })?;
            Ok(v)
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
        let all_sms = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;

        let (ctx, sms) = match cfg.sm_count {
            None => {
                let mut c: sys::CUcontext = std::ptr::null_mut();
                // SAFETY: valid out pointer and device; released in CudaCtx::drop.
                check("cuDevicePrimaryCtxRetain", unsafe { sys::cuDevicePrimaryCtxRetain(&mut c, device) })?;
                (Arc::new(CudaCtx { ctx: c, device, green: None }), all_sms)
            }
            Some(n) => {
                if version < GREEN_CTX_DRIVER {
                    return Err(GioError::Executor {
                        executor: "cuda".into(),
                        what: format!(
                            "an SM partition needs green contexts (driver >= 12.5); this driver is {}.{}",
                            version / 1000,
                            version % 1000 / 10
                        ),
                    });
                }
                green_context(device, n)?
            }
        };
        ctx.bind()?;
        let arch = cfg.arch.clone().unwrap_or_else(|| format!("sm_{major}{minor}"));
        let compiled = nvrtc::compile_gio(&arch)?;
        for w in compiled.warnings() {
            tracing::warn!(arch, warning = w, "NVRTC warning in the I/O kernels");
        }
        let kernels = load(&compiled.cubin)?;
        let (stream, aux) = streams(&ctx)?;
        let mut per_sm = 0;
        // SAFETY: a loaded function; valid out pointer.
        check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut per_sm,
                kernels.persistent,
                GPU_BLOCK_THREADS as i32,
                0,
            )
        })?;
        let per_sm = (per_sm.max(1)) as u32;
        let shape =
            ExecShape { block_threads: GPU_BLOCK_THREADS, blocks_per_unit: per_sm, max_blocks: sms * per_sm };
        let name = format!(
            "cuda device {} (sm_{major}{minor}, {sms} SMs{}, {:?})",
            cfg.device,
            if cfg.sm_count.is_some() { " in a green context" } else { "" },
            cfg.mode
        );
        let registry = Registry::new(&ctx);
        tracing::info!(executor = %name, driver = version, blocks = shape.max_blocks, "CUDA executor ready");
        Ok(CudaExecutor { cfg, name, ctx, kernels, stream, aux, shape, registry, state: Mutex::default() })
    }

    fn err(&self, what: impl Into<String>) -> GioError {
        GioError::Executor { executor: self.name.clone(), what: what.into() }
    }

    fn launch(
        &self,
        f: sys::CUfunction,
        grid: u32,
        block: u32,
        stream: sys::CUstream,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: `f` is a loaded kernel whose parameters match `params` (each entry points at a
        // value of the kernel's parameter type, alive for the call: cuLaunchKernel copies them).
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
        Ok(st.binding.ok_or_else(|| self.err("not started"))?.ctx)
    }

    /// Waits for `stream` to drain, up to `timeout`.
    fn drain(&self, stream: sys::CUstream, timeout: Duration) -> Result<()> {
        self.ctx.bind()?;
        let start = Instant::now();
        loop {
            // SAFETY: a live stream of this context.
            match unsafe { sys::cuStreamQuery(stream) } {
                sys::CUresult::CUDA_SUCCESS => return Ok(()),
                sys::CUresult::CUDA_ERROR_NOT_READY if start.elapsed() < timeout => {
                    std::thread::sleep(Duration::from_micros(100))
                }
                sys::CUresult::CUDA_ERROR_NOT_READY => {
                    return Err(self.err(format!("kernels still running after {timeout:?}")))
                }
                rc => return check("cuStreamQuery", rc),
            }
        }
    }

    /// Enqueues `tt_gio_wait` on an engine's `stream`: the stream proceeds once
    /// the IOCBs `ids` (device array of `n` pool indices) completed the issues
    /// `seqs`, or `timeout` passed; `*done` (device u32, zeroed by the caller)
    /// receives how many completed.
    ///
    /// # Safety
    /// `stream` must belong to this executor's device and context; `ids`,
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
        let block = n.div_ceil(32).clamp(1, 32) * 32;
        self.launch(self.kernels.wait, 1, block, stream, &mut params)
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
        return Err(GioError::Executor {
            executor: "cuda".into(),
            what: format!("cannot split off {n} SMs (got {groups} groups of {got})"),
        });
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
    let cuda = Arc::new(CudaCtx { ctx, device, green: Some(green) });
    check("cuCtxFromGreenCtx", rc)?;
    Ok((cuda, got))
}

fn streams(ctx: &Arc<CudaCtx>) -> Result<(sys::CUstream, sys::CUstream)> {
    let flags = sys::CUstream_flags_enum::CU_STREAM_NON_BLOCKING as u32;
    let make = || -> Result<sys::CUstream> {
        let mut s: sys::CUstream = std::ptr::null_mut();
        // SAFETY: valid out pointers; the context (or green context) is live and current.
        let rc = unsafe {
            match ctx.green {
                Some(g) => sys::cuGreenCtxStreamCreate(&mut s, g, flags, 0),
                None => sys::cuStreamCreate(&mut s, flags),
            }
        };
        check("creating a stream", rc)?;
        Ok(s)
    };
    Ok((make()?, make()?))
}

fn load(cubin: &[u8]) -> Result<Kernels> {
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: `cubin` is an ELF image from NVRTC, alive for the call.
    check("cuModuleLoadData", unsafe { sys::cuModuleLoadData(&mut module, cubin.as_ptr().cast()) })?;
    let get = |name: &str| -> Result<sys::CUfunction> {
        let c = CString::new(name).map_err(|_| GioError::invalid("kernel name with NUL"))?;
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: a loaded module and a NUL-terminated name.
        check("cuModuleGetFunction", unsafe { sys::cuModuleGetFunction(&mut f, module, c.as_ptr()) })?;
        Ok(f)
    };
    Ok(Kernels {
        module,
        issue: get(KERNEL_ISSUE)?,
        persistent: get(KERNEL_PERSISTENT)?,
        wait: get(KERNEL_WAIT)?,
    })
}

impl Executor for CudaExecutor {
    fn name(&self) -> &str {
        &self.name
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
        // SAFETY: forwarded contract.
        unsafe { self.registry.map(ptr, len, range) }
    }

    fn start(&self, binding: ExecBinding) -> Result<()> {
        {
            let mut st = self.state.lock().map_err(|_| self.err("state lock poisoned"))?;
            if st.binding.is_some() {
                return Err(self.err("already started"));
            }
            st.binding = Some(binding);
        }
        if self.cfg.mode == ExecMode::Persistent {
            let mut ctx = binding.ctx;
            let mut params: [*mut c_void; 1] = [(&raw mut ctx).cast()];
            // Every block of the grid must be resident: they wait on each other through the queues.
            self.launch(
                self.kernels.persistent,
                self.shape.max_blocks,
                GPU_BLOCK_THREADS,
                self.stream,
                &mut params,
            )?;
        }
        Ok(())
    }

    fn kick(&self, sm_budget: u32) -> Result<()> {
        if self.cfg.mode == ExecMode::Persistent {
            return Ok(());
        }
        let mut ctx = self.ctx_addr()?;
        let grid = sm_budget.saturating_mul(self.shape.blocks_per_unit).clamp(1, self.shape.max_blocks);
        let mut params: [*mut c_void; 1] = [(&raw mut ctx).cast()];
        // Launches on one stream run one after another, each draining what is queued by then.
        self.launch(self.kernels.issue, grid, GPU_BLOCK_THREADS, self.stream, &mut params)
    }

    fn poll(&self, _queued: bool) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: a live stream of this context.
        match unsafe { sys::cuStreamQuery(self.stream) } {
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_NOT_READY => Ok(()),
            rc => check("cuStreamQuery (an I/O kernel failed)", rc),
        }
    }

    fn wait_kernel(&self, ids: &[u32], seqs: &[u32], timeout: Duration) -> Result<u32> {
        if ids.len() != seqs.len() || ids.is_empty() {
            return Err(GioError::invalid("ids and seqs must be non-empty and of equal length"));
        }
        let n = ids.len();
        let scratch = Device::new(&self.ctx, 8 * n + 4)?;
        let ids_bytes: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
        let seq_bytes: Vec<u8> = seqs.iter().flat_map(|v| v.to_le_bytes()).collect();
        scratch.write_bytes(0, &ids_bytes)?;
        scratch.write_bytes(4 * n, &seq_bytes)?;
        let base = scratch.exec_addr();
        // SAFETY: the scratch addresses are device memory of this context, alive until after the
        // stream drained below.
        unsafe {
            self.enqueue_wait(self.aux, base, base + 4 * n as u64, n as u32, timeout, base + 8 * n as u64)?
        };
        self.drain(self.aux, timeout + Duration::from_secs(5))?;
        let mut done = [0u8; 4];
        scratch.read_bytes(8 * n, &mut done)?;
        Ok(u32::from_le_bytes(done))
    }

    fn stop(&self) -> Result<()> {
        let binding = self.state.lock().map_err(|_| self.err("state lock poisoned"))?.binding;
        if let Some(b) = binding {
            // SAFETY: `control` is the live shared control block (pinned, mapped for the GPU).
            unsafe { AtomicU32::from_ptr(&raw mut (*b.control.as_ptr()).stop) }.store(1, Ordering::Release);
        }
        self.drain(self.stream, self.cfg.stop_timeout)?;
        self.drain(self.aux, self.cfg.stop_timeout)
    }
}

impl Drop for CudaExecutor {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::error!(executor = %self.name, error = %e, "stopping the CUDA executor failed");
        }
        let _ = self.ctx.bind();
        // SAFETY: handles created in `new`, destroyed once; the context outlives them (Arc).
        unsafe {
            let _ = sys::cuStreamDestroy_v2(self.stream);
            let _ = sys::cuStreamDestroy_v2(self.aux);
            let _ = sys::cuModuleUnload(self.kernels.module);
        }
    }
}
