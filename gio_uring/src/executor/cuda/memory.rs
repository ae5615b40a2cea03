//! The two kinds of memory the CUDA executor allocates for `GioUring`:
//! mapped pinned host memory and device memory, each freed through its
//! context's rules (`context.rs`: nothing freed under a running kernel).

use super::context::{check, CudaCtx, Deferred};
use crate::error::{GioError, Result};
use crate::mem::{check_range, ExecMemory};
use cudarc::driver::sys;
use std::ptr::NonNull;
use std::sync::Arc;

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
        let cur = ctx.enter()?;
        let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: valid out pointer; the context is current.
        check("cuMemHostAlloc", unsafe { sys::cuMemHostAlloc(&mut p, len.max(1), flags) })?;
        let host = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| GioError::Cuda { call: "cuMemHostAlloc", code: "null".into() })?;
        // SAFETY: `len` bytes were just allocated at `host`.
        unsafe { std::ptr::write_bytes(host.as_ptr(), 0, len) };
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: `p` is a DEVICEMAP allocation of this context.
        let rc = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, p, 0) };
        drop(cur);
        // Constructed before the check so that `Drop` frees it on error.
        let mem = Pinned { ctx: ctx.clone(), host, dev, len };
        check("cuMemHostGetDevicePointer", rc)?;
        Ok(mem)
    }

    pub fn host(&self) -> NonNull<u8> {
        self.host
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        self.ctx.release(Deferred::Host(self.host.as_ptr().cast()));
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

/// Device memory, reached by the host through copies on the copy stream.
pub(super) struct Device {
    ctx: Arc<CudaCtx>,
    dev: u64,
    len: usize,
}

impl Device {
    pub fn new(ctx: &Arc<CudaCtx>, len: usize) -> Result<Self> {
        let cur = ctx.enter()?;
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: valid out pointer; the context is current.
        check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut dev, len.max(1)) })?;
        let zeroed = cur.zero(dev, len);
        drop(cur);
        // Constructed before the check so that `Drop` frees it on error.
        let mem = Device { ctx: ctx.clone(), dev, len };
        zeroed?;
        Ok(mem)
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.ctx.release(Deferred::Device(self.dev));
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
        self.ctx.enter()?.write(self.dev + offset as u64, bytes)
    }
    fn read_bytes(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        check_range(self.len, offset, out.len())?;
        self.ctx.enter()?.read(self.dev + offset as u64, out)
    }
}
