//! CUDA contexts and the memory the CUDA executor hands to `GioUring`.
//!
//! Written against the CUDA driver API through `cudarc::driver::sys`, and —
//! like the rest of the CUDA executor — compiled but never run here (no GPU).

use crate::error::{GioError, Result};
use crate::mem::{check_range, ExecMemory, HostMapping, HostRange};
use cudarc::driver::sys;
use std::collections::HashMap;
use std::ffi::CStr;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

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

/// The context everything of one executor lives in: a green context's, or
/// the device's primary context. Released last (memory holds an `Arc`).
pub(super) struct CudaCtx {
    pub ctx: sys::CUcontext,
    pub device: sys::CUdevice,
    pub green: Option<sys::CUgreenCtx>,
}

// SAFETY: driver API handles may be used from any thread once the context is made
// current on it, which `bind` does before every call.
unsafe impl Send for CudaCtx {}
// SAFETY: as above.
unsafe impl Sync for CudaCtx {}

impl CudaCtx {
    /// Makes the context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        // SAFETY: `ctx` is a live context owned by this value.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })
    }
}

impl Drop for CudaCtx {
    fn drop(&mut self) {
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

/// Mapped pinned host memory: the host uses `host`, the GPU `dev`. Not
/// write-combined, so the host reads it (completion ring, IOCB results) at
/// normal speed.
pub(super) struct Pinned {
    ctx: Arc<CudaCtx>,
    host: NonNull<u8>,
    dev: u64,
    len: usize,
}

// SAFETY: plain pinned memory; concurrent use follows the ring protocol (atomics).
unsafe impl Send for Pinned {}
// SAFETY: as above.
unsafe impl Sync for Pinned {}

impl Pinned {
    pub fn new(ctx: &Arc<CudaCtx>, len: usize) -> Result<Self> {
        ctx.bind()?;
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: valid out pointer; the context is current.
        check("cuMemHostAlloc", unsafe { sys::cuMemHostAlloc(&mut p, len, flags) })?;
        let host = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| GioError::Cuda { call: "cuMemHostAlloc", code: "null".into() })?;
        // Constructed before the next call so that `Drop` frees it on error.
        let mut mem = Pinned { ctx: ctx.clone(), host, dev: 0, len };
        // SAFETY: `len` bytes were just allocated at `host`.
        unsafe { std::ptr::write_bytes(host.as_ptr(), 0, len) };
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: `p` is a DEVICEMAP allocation of this context.
        check("cuMemHostGetDevicePointer", unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, p, 0) })?;
        mem.dev = dev;
        Ok(mem)
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: allocated by cuMemHostAlloc in `new`, freed once.
        let _ = check("cuMemFreeHost", unsafe { sys::cuMemFreeHost(self.host.as_ptr().cast()) });
    }
}

impl ExecMemory for Pinned {
    fn exec_addr(&self) -> u64 {
        self.dev
    }
    fn host_ptr(&self) -> Option<NonNull<u8>> {
        Some(self.host)
    }
    fn len(&self) -> usize {
        self.len
    }
    fn write_bytes(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        check_range(self.len, offset, bytes.len())?;
        // SAFETY: in bounds (checked); separate source slice.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.host.as_ptr().add(offset), bytes.len()) };
        Ok(())
    }
    fn read_bytes(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        check_range(self.len, offset, out.len())?;
        // SAFETY: in bounds (checked); separate destination slice.
        unsafe { std::ptr::copy_nonoverlapping(self.host.as_ptr().add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }
}

/// Device memory, reached by the host through copies.
pub(super) struct Device {
    ctx: Arc<CudaCtx>,
    dev: u64,
    len: usize,
}

impl Device {
    pub fn new(ctx: &Arc<CudaCtx>, len: usize) -> Result<Self> {
        ctx.bind()?;
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: valid out pointer; the context is current.
        check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut dev, len.max(1)) })?;
        let mem = Device { ctx: ctx.clone(), dev, len };
        // SAFETY: `dev` is an allocation of at least `len` bytes.
        check("cuMemsetD8", unsafe { sys::cuMemsetD8_v2(dev, 0, len) })?;
        Ok(mem)
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        let _ = self.ctx.bind();
        // SAFETY: allocated by cuMemAlloc in `new`, freed once.
        let _ = check("cuMemFree", unsafe { sys::cuMemFree_v2(self.dev) });
    }
}

impl ExecMemory for Device {
    fn exec_addr(&self) -> u64 {
        self.dev
    }
    fn host_ptr(&self) -> Option<NonNull<u8>> {
        None
    }
    fn len(&self) -> usize {
        self.len
    }
    fn write_bytes(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        check_range(self.len, offset, bytes.len())?;
        self.ctx.bind()?;
        // SAFETY: destination range inside the allocation (checked); synchronous copy.
        check("cuMemcpyHtoD", unsafe {
            sys::cuMemcpyHtoD_v2(self.dev + offset as u64, bytes.as_ptr().cast(), bytes.len())
        })
    }
    fn read_bytes(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        check_range(self.len, offset, out.len())?;
        self.ctx.bind()?;
        // SAFETY: source range inside the allocation (checked); synchronous copy.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), self.dev + offset as u64, out.len())
        })
    }
}

struct Registered {
    len: usize,
    dev: u64,
    refs: usize,
}

/// Host ranges registered with the driver, by page-aligned start. Several
/// mappings share one registration (both doorbells of a queue sit in one BAR
/// page, and registering a page twice is an error).
pub(super) struct Registry {
    ctx: Arc<CudaCtx>,
    map: Mutex<HashMap<usize, Registered>>,
}

impl Registry {
    pub fn new(ctx: &Arc<CudaCtx>) -> Arc<Self> {
        Arc::new(Registry { ctx: ctx.clone(), map: Mutex::default() })
    }

    /// # Safety
    /// `ptr..ptr+len` must stay mapped until the returned mapping is dropped.
    pub unsafe fn map(
        self: &Arc<Self>,
        ptr: *mut u8,
        len: usize,
        range: HostRange,
    ) -> Result<Box<dyn HostMapping>> {
        const PAGE: usize = 4096;
        let start = ptr as usize & !(PAGE - 1);
        let end = (ptr as usize + len.max(1)).next_multiple_of(PAGE);
        let mut map = self.map.lock().map_err(|_| GioError::invalid("registry lock poisoned"))?;
        let hit = map.iter_mut().find(|(&base, r)| base <= start && end <= base + r.len);
        let (base, dev) = match hit {
            Some((&base, r)) => {
                r.refs += 1;
                (base, r.dev)
            }
            None => {
                self.ctx.bind()?;
                // IOMEMORY tells the driver the range is device registers (a BAR), which it
                // maps uncached for the GPU's stores (DESIGN.md: doorbells written by the GPU).
                let flags = sys::CU_MEMHOSTREGISTER_DEVICEMAP
                    | if range == HostRange::Io { sys::CU_MEMHOSTREGISTER_IOMEMORY } else { 0 };
                // SAFETY: the caller keeps the range mapped; page-aligned as the driver requires.
                let rc = unsafe { sys::cuMemHostRegister_v2(start as *mut _, end - start, flags) };
                check("cuMemHostRegister", rc).map_err(|e| match range {
                    // Some drivers refuse remap_pfn_range mappings (open-gpu-kernel-modules #732).
                    HostRange::Io => GioError::Executor {
                        executor: "cuda".into(),
                        what: format!(
                            "cannot map the drive's doorbell page for the GPU ({e}); this driver may not \
                                       support registering PCI BARs (IOMEMORY)"
                        ),
                    },
                    HostRange::Memory => e,
                })?;
                let mut dev: sys::CUdeviceptr = 0;
                // SAFETY: `start` was just registered with DEVICEMAP.
                let rc = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, start as *mut _, 0) };
                if let Err(e) = check("cuMemHostGetDevicePointer", rc) {
                    // SAFETY: registered just above.
                    let _ = unsafe { sys::cuMemHostUnregister(start as *mut _) };
                    return Err(e);
                }
                map.insert(start, Registered { len: end - start, dev, refs: 1 });
                (start, dev)
            }
        };
        Ok(Box::new(Mapping { registry: self.clone(), base, exec: dev + (ptr as usize - base) as u64 }))
    }

    fn unmap(&self, base: usize) {
        let Ok(mut map) = self.map.lock() else { return };
        let Some(r) = map.get_mut(&base) else { return };
        r.refs -= 1;
        if r.refs == 0 {
            map.remove(&base);
            let _ = self.ctx.bind();
            // SAFETY: registered by `map`, unregistered once when the last mapping goes.
            let _ = check("cuMemHostUnregister", unsafe { sys::cuMemHostUnregister(base as *mut _) });
        }
    }
}

struct Mapping {
    registry: Arc<Registry>,
    base: usize,
    exec: u64,
}

impl HostMapping for Mapping {
    fn exec_addr(&self) -> u64 {
        self.exec
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        self.registry.unmap(self.base);
    }
}
