//! Making a CUDA executor: the configuration checked, the driver loaded and
//! initialised, the device's limits read and its context made (the primary
//! context, or a green partition of its SMs); then the kernels are loaded
//! (`module.rs`) and the grid sized (`occupancy.rs`).

use super::context::{check, CudaCtx};
use super::module;
use super::occupancy::{self, SmLimits};
use super::registry::Registry;
use super::{config_err, no_cuda, CudaExecutor, CudaExecutorConfig};
use crate::error::Result;
use crate::executor::{ExecMode, ExecShape};
use cudarc::driver::sys;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tutti_kernels::GPU_BLOCK_THREADS;

/// Green contexts (cuGreenCtxCreate) need 12.4, their streams 12.5.
const GREEN_CTX_DRIVER: i32 = 12050;
/// Deadline of one host <-> device copy.
const COPY_TIMEOUT: Duration = Duration::from_secs(10);

/// The device, as the driver describes it.
struct Opened {
    /// `cuDriverGetVersion` (e.g. 12080).
    version: i32,
    device: sys::CUdevice,
    major: u32,
    minor: u32,
    /// Every SM of the device.
    sms: u32,
    sm: SmLimits,
}

impl CudaExecutor {
    /// Opens the device, makes the (green) context, compiles and loads the
    /// kernels. On a machine without the NVIDIA driver this returns
    /// [`crate::GioError::NoCuda`] without touching anything that could panic.
    pub fn new(cfg: CudaExecutorConfig) -> Result<Self> {
        check_config(&cfg)?;
        let dev = open(&cfg)?;
        let (major, minor, bt) = (dev.major, dev.minor, cfg.block_threads);
        let (ctx, sms) = context(&cfg, &dev)?;
        let arch = cfg.arch.clone().unwrap_or_else(|| format!("sm_{major}{minor}"));
        let image = match &cfg.cubin {
            Some(path) => module::prebuilt_cubin(path, major * 10 + minor)?,
            None => module::cubin(&arch)?,
        };
        let (kernels, stream, aux, per_sm) = {
            let cur = ctx.enter()?;
            tracing::debug!("CUDA executor: context entered, loading the kernels");
            let kernels = module::load(&image)?;
            tracing::debug!("CUDA executor: kernels loaded");
            let per_sm = occupancy::blocks_per_sm(&kernels, &cfg, &dev.sm)?;
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
        tracing::info!(executor = %name, driver = dev.version, blocks = shape.max_blocks, "CUDA executor ready");
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
            driver_version: dev.version,
        })
    }
}

/// Refuses a configuration no device could run, before the driver is touched.
fn check_config(cfg: &CudaExecutorConfig) -> Result<()> {
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
    Ok(())
}

/// Loads and initialises the driver, and reads what the executor needs of device `cfg.device`.
fn open(cfg: &CudaExecutorConfig) -> Result<Opened> {
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
    Ok(Opened { version, device, major, minor, sms: all_sms, sm })
}

/// The executor's context: the primary context with every SM, or a green context
/// of `cfg.sm_count` SMs. Returns it with its SM count.
fn context(cfg: &CudaExecutorConfig, dev: &Opened) -> Result<(Arc<CudaCtx>, u32)> {
    match cfg.sm_count {
        None => {
            let ctx = CudaCtx::primary(dev.device, COPY_TIMEOUT)?;
            tracing::debug!(device = cfg.device, "CUDA executor: primary context retained");
            Ok((ctx, dev.sms))
        }
        Some(n) => {
            let version = dev.version;
            if version < GREEN_CTX_DRIVER {
                return Err(config_err(format!(
                    "an SM partition needs green contexts (driver >= 12.5); this driver is {}.{}",
                    version / 1000,
                    version % 1000 / 10
                )));
            }
            let g = CudaCtx::green(dev.device, n, COPY_TIMEOUT)?;
            tracing::debug!(device = cfg.device, sms = g.1, "CUDA executor: green context made");
            Ok(g)
        }
    }
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
