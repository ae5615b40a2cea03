//! CUDA device memory of the driver the runtime loaded (here the stand-in
//! libcuda.so): allocated, written and read with the driver API, as an
//! engine's kernels would touch KV memory.

use super::Mem;
use cudarc::driver::sys;
use std::ptr;

pub fn cu(what: &str, rc: sys::CUresult) {
    assert_eq!(rc, sys::CUresult::CUDA_SUCCESS, "{what}");
}

/// Device memory of the driver the runtime loaded (the primary context of device 0).
pub struct DeviceMem {
    pub ptr: sys::CUdeviceptr,
    pub len: usize,
}

impl DeviceMem {
    pub fn new(len: usize) -> DeviceMem {
        // SAFETY: the runtime loaded the driver; these calls take valid out pointers.
        unsafe {
            cu("cuInit", sys::cuInit(0));
            let mut dev = 0;
            cu("cuDeviceGet", sys::cuDeviceGet(&mut dev, 0));
            let mut ctx = ptr::null_mut();
            cu("cuDevicePrimaryCtxRetain", sys::cuDevicePrimaryCtxRetain(&mut ctx, dev));
            cu("cuCtxPushCurrent", sys::cuCtxPushCurrent_v2(ctx));
            let mut p = 0;
            cu("cuMemAlloc", sys::cuMemAlloc_v2(&mut p, len));
            DeviceMem { ptr: p, len }
        }
    }
    pub fn write(&self, src: &Mem) {
        let mut src_copy = Mem::new(src.len);
        // SAFETY: `src` has `len` bytes (same size); copy then wait for the legacy stream.
        unsafe {
            src_copy.bytes().copy_from_slice(std::slice::from_raw_parts(src.addr() as *const u8, src.len));
            cu("cuMemcpyHtoD", sys::cuMemcpyHtoD_v2(self.ptr, src_copy.addr() as *const _, self.len));
            cu("cuCtxSynchronize", sys::cuCtxSynchronize());
        }
    }
    pub fn read(&self) -> Mem {
        let mut out = Mem::new(self.len);
        // SAFETY: `out` has `len` writable bytes.
        unsafe {
            cu("cuMemcpyDtoH", sys::cuMemcpyDtoH_v2(out.bytes().as_mut_ptr().cast(), self.ptr, self.len))
        };
        out
    }
    pub fn zero(&self) {
        // SAFETY: an allocation of `len` bytes; then wait for the legacy stream.
        unsafe {
            cu("cuMemsetD8", sys::cuMemsetD8_v2(self.ptr, 0, self.len));
            cu("cuCtxSynchronize", sys::cuCtxSynchronize());
        }
    }
}
