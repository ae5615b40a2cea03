//! Exports: memory.
//!
//! Synchronous copies and memsets run on the legacy default stream of the
//! current context. Memset and copies from pageable memory to device memory
//! return at once and land `landing_delay` later (the source is copied
//! first); reads to the host wait for the legacy stream (and so for blocking
//! streams) but not for non-blocking ones. Writes to pinned host memory are
//! synchronous.

use crate::current;
use crate::device::{ledger, PendingWrite};
use crate::driver::{call, driver, out, State};
use crate::error::{fail, Result};
use crate::memory::{MemKind, DEVICE_BYTES};
use crate::stream::{abandon, read_done, HostTarget, Landing, Work};
use crate::sync::{implicit_deps, resolve, sync_context};
use cudarc::driver::sys::{CUdeviceptr, CUresult, CUstream};
use std::ffi::{c_uint, c_void};
use std::sync::{Arc, Mutex};
use std::time::Instant;

const CU_MEMHOSTREGISTER_IOMEMORY: c_uint = 0x04;
const CU_POINTER_ATTRIBUTE_CONTEXT: c_uint = 1;
const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_uint = 2;
const CU_POINTER_ATTRIBUTE_DEVICE_POINTER: c_uint = 3;
const CU_POINTER_ATTRIBUTE_HOST_POINTER: c_uint = 4;
const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_uint = 9;
const CU_MEMORYTYPE_HOST: c_uint = 1;
const CU_MEMORYTYPE_DEVICE: c_uint = 2;

/// Enqueues a write on `stream` (NULL: the legacy stream of the current
/// context); a write on a legacy stream to device memory lands late.
/// `staged`: the bytes were taken at the call (memset, pageable source), so the write can land late.
fn enqueue_write(
    st: &mut State,
    h: CUstream,
    dst: usize,
    staged: bool,
    make: impl FnOnce(Option<Landing>) -> Work,
    what: &str,
) -> Result<()> {
    let (s, ctx) = resolve(st, h)?;
    let device = st.memory.find(dst, 0).is_some_and(|(_, a)| a.kind == MemKind::Device);
    let late = staged && s.kind == crate::stream::StreamKind::Legacy && device;
    let ticket = st.ticket();
    let landing = late.then(|| {
        let mut l = ledger();
        l.pending_writes.insert(ticket, PendingWrite { ticket, overtaken: false });
        l.stats.legacy_writes += 1;
        Landing { ticket, delay: st.knobs.landing_delay }
    });
    let deps = implicit_deps(st, &s, &ctx);
    s.enqueue(deps, make(landing), what.to_string());
    Ok(())
}

/// Enqueues `work` on the current context's legacy stream and waits for it.
fn legacy_and_wait(call: &str, work: Work, target: Option<Arc<HostTarget>>) -> Result<()> {
    let (s, deadline, seq) = {
        let st = driver().state();
        let (s, ctx) = resolve(&st, std::ptr::null_mut())?;
        let deps = implicit_deps(&st, &s, &ctx);
        let seq = s.enqueue(deps, work, call.to_string());
        (s, st.knobs.sync_deadline, seq)
    };
    let start = Instant::now();
    if crate::device::progress().wait_until(start + deadline, || s.completed() >= seq) {
        return Ok(());
    }
    if let Some(t) = target {
        if !abandon(&t) && read_done(&t) {
            return Ok(());
        }
    }
    let text = format!(
        "{call} blocked {:.1} s behind earlier work on the legacy stream ({}); the driver would block until it \
         ran",
        start.elapsed().as_secs_f64(),
        s.running().unwrap_or_else(|| "waiting on a blocking stream".into())
    );
    driver().state().violation(text.clone());
    Err(fail(CUresult::CUDA_ERROR_TIMEOUT, text))
}

fn is_host(st: &State, p: usize, len: usize) -> bool {
    st.memory.find(p, len).is_some_and(|(_, a)| a.kind != MemKind::Device)
}

/// # Safety
/// `dptr` is NULL or a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    call(&["cuMemAlloc_v2"], || {
        let mut st = driver().state();
        st.need_init()?;
        let ctx = current::current_ctx(&st)?;
        if dptr.is_null() {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, "dptr is NULL"));
        }
        let p = st.memory.alloc_device(bytes, ctx.handle)?;
        // SAFETY: non-null, valid per the contract.
        unsafe { dptr.write(p as CUdeviceptr) };
        Ok(())
    })
}

/// Frees after the owning context's streams are idle (bounded).
fn free(call_name: &str, base: usize, kinds: &[MemKind]) -> Result<()> {
    let ctx = {
        let st = driver().state();
        st.need_init()?;
        let a = st.memory.find(base, 0).filter(|(b, _)| *b == base).map(|(_, a)| a);
        let a = a.ok_or_else(|| {
            let code = if call_name == "cuMemHostUnregister" {
                CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
            } else {
                CUresult::CUDA_ERROR_INVALID_VALUE
            };
            fail(code, format!("{base:#x} is not the start of an allocation"))
        })?;
        a.ctx
    };
    sync_context(call_name, ctx)?;
    let mut st = driver().state();
    let a = st.memory.take(base, kinds, call_name)?;
    let pinned: Vec<u64> = st.memory.pins.iter().filter(|(_, p)| p.base == base).map(|(&h, _)| h).collect();
    if !pinned.is_empty() {
        // The real driver revokes the pages under the pin (gdrdrv's callback): the
        // mapping's user would see its memory vanish.
        st.violation(format!(
            "{call_name} of {base:#x} while GDRCopy pins {} of its ranges (gdr_unpin_buffer first)",
            pinned.len()
        ));
        for h in pinned {
            st.memory.pins.remove(&h);
        }
    }
    st.memory.release(base, a);
    Ok(())
}

#[no_mangle]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    call(&["cuMemFree_v2"], || free("cuMemFree_v2", dptr as usize, &[MemKind::Device]))
}

/// # Safety
/// `pp` is NULL or a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(pp: *mut *mut c_void, bytes: usize, _flags: c_uint) -> CUresult {
    call(&["cuMemHostAlloc"], || {
        let mut st = driver().state();
        st.need_init()?;
        let ctx = current::current_ctx(&st)?;
        if pp.is_null() {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, "pp is NULL"));
        }
        let p = st.memory.alloc_pinned(bytes, ctx.handle)?;
        // SAFETY: non-null, valid per the contract.
        unsafe { pp.write(p as *mut c_void) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    call(&["cuMemFreeHost"], || free("cuMemFreeHost", p as usize, &[MemKind::Pinned]))
}

#[no_mangle]
pub extern "C" fn cuMemHostRegister_v2(p: *mut c_void, bytes: usize, flags: c_uint) -> CUresult {
    let names: &[&str] = if flags & CU_MEMHOSTREGISTER_IOMEMORY != 0 {
        &["cuMemHostRegister_v2", "cuMemHostRegister_v2:IOMEMORY"]
    } else {
        &["cuMemHostRegister_v2"]
    };
    call(names, || {
        let mut st = driver().state();
        st.need_init()?;
        let ctx = current::current_ctx(&st)?;
        st.memory.register(p as usize, bytes, flags, ctx.handle)
    })
}

#[no_mangle]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    call(&["cuMemHostUnregister"], || {
        free("cuMemHostUnregister", p as usize, &[MemKind::Registered { flags: 0 }])
    })
}

/// # Safety
/// `pdptr` is NULL or a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    pdptr: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    call(&["cuMemHostGetDevicePointer_v2"], || {
        let st = driver().state();
        st.need_init()?;
        current::current_ctx(&st)?;
        if flags != 0 {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, format!("flags {flags:#x} (must be 0)")));
        }
        if !is_host(&st, p as usize, 0) {
            return Err(fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("{p:p} is not pinned (cuMemHostAlloc) or registered (cuMemHostRegister) memory"),
            ));
        }
        // SAFETY: forwarded contract. Mapped host memory has the same address on the device (UVA).
        unsafe { out(pdptr, p as CUdeviceptr, "pdptr") }
    })
}

/// # Safety
/// `data` is NULL or valid for the attribute's type.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attribute: c_uint,
    ptr: CUdeviceptr,
) -> CUresult {
    call(&["cuPointerGetAttribute"], || {
        let st = driver().state();
        st.need_init()?;
        let (_, a) = st.memory.device_range(ptr, 0, "pointer")?;
        let host = a.kind != MemKind::Device;
        // SAFETY: in every arm `data` is valid for the attribute's type (contract); `out` refuses NULL.
        unsafe {
            match attribute {
                CU_POINTER_ATTRIBUTE_MEMORY_TYPE => out(
                    data.cast::<c_uint>(),
                    if host { CU_MEMORYTYPE_HOST } else { CU_MEMORYTYPE_DEVICE },
                    "data",
                ),
                CU_POINTER_ATTRIBUTE_DEVICE_POINTER => out(data.cast::<CUdeviceptr>(), ptr, "data"),
                CU_POINTER_ATTRIBUTE_HOST_POINTER if host => {
                    out(data.cast::<*mut c_void>(), ptr as *mut c_void, "data")
                }
                CU_POINTER_ATTRIBUTE_CONTEXT => out(data.cast::<*mut c_void>(), a.ctx as *mut c_void, "data"),
                CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => out(data.cast::<i32>(), 0, "data"),
                _ => Err(fail(
                    CUresult::CUDA_ERROR_INVALID_VALUE,
                    format!("pointer attribute {attribute} not modelled"),
                )),
            }
        }
    })
}

/// # Safety
/// `free` and `total` are NULL or valid out pointers.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    call(&["cuMemGetInfo_v2"], || {
        let st = driver().state();
        st.need_init()?;
        current::current_ctx(&st)?;
        let used = st.memory.device_in_use();
        // SAFETY: forwarded contract.
        unsafe {
            out(free, DEVICE_BYTES - used, "free")?;
            out(total, DEVICE_BYTES, "total")
        }
    })
}

/// A memset to `dst` on `h` (NULL: synchronous-legacy semantics).
fn memset(st: &mut State, dst: CUdeviceptr, value: u8, n: usize, h: CUstream, what: &str) -> Result<()> {
    st.memory.device_range(dst, n, "destination")?;
    let dst = dst as usize;
    enqueue_write(st, h, dst, true, |landing| Work::Fill { dst, value, len: n, landing }, what)
}

#[no_mangle]
pub extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, value: u8, n: usize) -> CUresult {
    call(&["cuMemsetD8_v2"], || {
        let mut st = driver().state();
        st.need_init()?;
        current::current_ctx(&st)?;
        st.memory.device_range(dst, n, "destination")?;
        if is_host(&st, dst as usize, n) {
            drop(st);
            // Pinned memory: synchronous, after earlier legacy-stream work.
            let d = dst as usize;
            return legacy_and_wait(
                "cuMemsetD8_v2",
                Work::Fill { dst: d, value, len: n, landing: None },
                None,
            );
        }
        memset(&mut st, dst, value, n, std::ptr::null_mut(), "cuMemsetD8_v2")
    })
}

#[no_mangle]
pub extern "C" fn cuMemsetD8Async(dst: CUdeviceptr, value: u8, n: usize, stream: CUstream) -> CUresult {
    call(&["cuMemsetD8Async"], || {
        let mut st = driver().state();
        st.need_init()?;
        memset(&mut st, dst, value, n, stream, "cuMemsetD8Async")
    })
}

/// # Safety
/// `src` is valid for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) -> CUresult {
    call(&["cuMemcpyHtoD_v2"], || {
        let mut st = driver().state();
        st.need_init()?;
        current::current_ctx(&st)?;
        st.memory.device_range(dst, n, "destination")?;
        if src.is_null() && n > 0 {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, "srcHost is NULL"));
        }
        let d = dst as usize;
        if is_host(&st, d, n) || is_host(&st, src as usize, n) {
            drop(st);
            // Into pinned memory, or from pinned memory: synchronous.
            let work = Work::Copy { dst: d, src: src as usize, len: n };
            return legacy_and_wait("cuMemcpyHtoD_v2", work, None);
        }
        // SAFETY: `src` is valid for `n` bytes (contract). Pageable: staged now, lands later.
        let data = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), n) }.to_vec();
        enqueue_write(
            &mut st,
            std::ptr::null_mut(),
            d,
            true,
            |landing| Work::Write { dst: d, data, landing },
            "cuMemcpyHtoD_v2",
        )
    })
}

/// # Safety
/// `src` is valid for `n` bytes until the copy ran (pinned) or for the call (pageable).
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    n: usize,
    stream: CUstream,
) -> CUresult {
    call(&["cuMemcpyHtoDAsync_v2"], || {
        let mut st = driver().state();
        st.need_init()?;
        st.memory.device_range(dst, n, "destination")?;
        if src.is_null() && n > 0 {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, "srcHost is NULL"));
        }
        let d = dst as usize;
        if is_host(&st, src as usize, n) {
            let s = src as usize;
            return enqueue_write(
                &mut st,
                stream,
                d,
                false,
                |_| Work::Copy { dst: d, src: s, len: n },
                "cuMemcpyHtoDAsync_v2",
            );
        }
        // SAFETY: `src` is valid for `n` bytes (contract).
        let data = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), n) }.to_vec();
        enqueue_write(
            &mut st,
            stream,
            d,
            true,
            |landing| Work::Write { dst: d, data, landing },
            "cuMemcpyHtoDAsync_v2",
        )
    })
}

/// Reads device memory into a host buffer through `h`'s ordering and waits (bounded).
fn read(call_name: &str, dst: *mut c_void, src: CUdeviceptr, n: usize, h: CUstream) -> Result<()> {
    let target = Arc::new(HostTarget { ptr: dst as usize, state: Mutex::new((false, false)) });
    let work = Work::Read { dst: target.clone(), src: src as usize, len: n };
    let (s, seq, deadline) = {
        let st = driver().state();
        st.need_init()?;
        st.memory.device_range(src, n, "source")?;
        if dst.is_null() && n > 0 {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, "dstHost is NULL"));
        }
        let (s, ctx) = resolve(&st, h)?;
        let deps = implicit_deps(&st, &s, &ctx);
        let seq = s.enqueue(deps, work, call_name.to_string());
        (s, seq, st.knobs.sync_deadline)
    };
    let start = Instant::now();
    if crate::device::progress().wait_until(start + deadline, || s.completed() >= seq) || !abandon(&target) {
        return Ok(());
    }
    let text = format!(
        "{call_name} blocked {:.1} s behind earlier work ({} on stream {:#x}); the driver would block until it ran",
        start.elapsed().as_secs_f64(),
        s.running().unwrap_or_else(|| "waiting on another stream".into()),
        s.handle
    );
    driver().state().violation(text.clone());
    Err(fail(CUresult::CUDA_ERROR_TIMEOUT, text))
}

/// # Safety
/// `dst` is valid for `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) -> CUresult {
    call(&["cuMemcpyDtoH_v2"], || read("cuMemcpyDtoH_v2", dst, src, n, std::ptr::null_mut()))
}

/// # Safety
/// `dst` is valid for `n` bytes until the copy ran.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    n: usize,
    stream: CUstream,
) -> CUresult {
    call(&["cuMemcpyDtoHAsync_v2"], || {
        let mut st = driver().state();
        st.need_init()?;
        st.memory.device_range(src, n, "source")?;
        if is_host(&st, dst as usize, n) {
            let (d, s) = (dst as usize, src as usize);
            return enqueue_write(
                &mut st,
                stream,
                d,
                false,
                |_| Work::Copy { dst: d, src: s, len: n },
                "cuMemcpyDtoHAsync_v2",
            );
        }
        drop(st);
        // To pageable memory the copy is synchronous.
        read("cuMemcpyDtoHAsync_v2", dst, src, n, stream)
    })
}

#[no_mangle]
pub extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) -> CUresult {
    call(&["cuMemcpyDtoD_v2"], || {
        let mut st = driver().state();
        st.need_init()?;
        st.memory.device_range(dst, n, "destination")?;
        st.memory.device_range(src, n, "source")?;
        let (d, s) = (dst as usize, src as usize);
        enqueue_write(
            &mut st,
            std::ptr::null_mut(),
            d,
            false,
            |_| Work::Copy { dst: d, src: s, len: n },
            "cuMemcpyDtoD_v2",
        )
    })
}
