//! A stand-in GDRCopy (`libgdrapi.so.2`, API 2.x): the calls tutti's GDRCopy
//! provider makes, exported from this same library so that a pin names the
//! stand-in's own device allocations. Load it by setting `TUTTI_GDRAPI` to
//! this library's path.
//!
//! What it models: `gdr_pin_buffer` pins whole 64 KiB GPU pages (the range
//! rounded out to pages, as gdrdrv does), which must all lie inside one
//! device allocation of at least one page (smaller allocations are not
//! memfd-backed here and are refused); `gdr_get_info_v2` reports the pinned
//! page range; `gdr_map` maps those pages a second time, at another address
//! (as BAR1 is another view of the same GPU memory): bytes written through
//! either view are seen through the other. `cuMemFree` of an allocation still
//! pinned records a violation (the real driver revokes the pages).
//! Return values are 0 or an errno, as in GDRCopy; failures can be injected
//! by call name with `tt_standin_fail`.

use crate::driver::{call, driver};
use crate::error::{fail, Result};
use crate::memory::{GdrPin, MemKind, GPU_PAGE};
use cudarc::driver::sys::CUresult;
use std::ffi::{c_int, c_uint, c_void};

/// `gdr_mh_t`: a struct of one `unsigned long` (64 bits on the LP64 Linux tutti runs on),
/// passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct gdr_mh_t {
    pub h: u64,
}

/// `gdr_info_v2_t` (GDRCopy 2.x).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct gdr_info_v2_t {
    pub va: u64,
    pub mapped_size: u64,
    pub page_size: u32,
    pub tm_cycles: u64,
    pub cycles_per_ms: u32,
    /// Bit 0 `mapped`, bit 1 `wc_mapping`.
    pub flags: c_uint,
    /// `gdr_mapping_type_t`: 0 none, 1 write-combined, 2 caching, 3 device.
    pub mapping_type: c_int,
}

const EINVAL: c_int = libc::EINVAL;

/// Runs a call as [`call`] does and turns its result into GDRCopy's (0 or an errno).
fn gdr_call(name: &str, body: impl FnOnce() -> Result<()>) -> c_int {
    match call(&[name], body) {
        CUresult::CUDA_SUCCESS => 0,
        _ => EINVAL,
    }
}

/// The one `gdr_t` handle value this stand-in gives out (opaque to callers).
static HANDLE: u8 = 0;

fn check_g(g: *mut c_void) -> Result<()> {
    if g.is_null() || g.cast_const() != (&raw const HANDLE).cast() {
        return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, "not a gdr_t from gdr_open"));
    }
    Ok(())
}

#[no_mangle]
pub extern "C" fn gdr_open() -> *mut c_void {
    match call(&["gdr_open"], || Ok(())) {
        CUresult::CUDA_SUCCESS => (&raw const HANDLE).cast_mut().cast(),
        _ => std::ptr::null_mut(),
    }
}

#[no_mangle]
pub extern "C" fn gdr_close(g: *mut c_void) -> c_int {
    gdr_call("gdr_close", || check_g(g))
}

/// # Safety
/// `handle` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn gdr_pin_buffer(
    g: *mut c_void,
    addr: u64,
    size: usize,
    _p2p_token: u64,
    _va_space: u32,
    handle: *mut gdr_mh_t,
) -> c_int {
    gdr_call("gdr_pin_buffer", || {
        check_g(g)?;
        let bad = |what: String| fail(CUresult::CUDA_ERROR_INVALID_VALUE, what);
        if handle.is_null() || size == 0 {
            return Err(bad("NULL handle or an empty range".into()));
        }
        let addr = addr as usize;
        let va = addr & !(GPU_PAGE - 1);
        let end = addr.checked_add(size).ok_or_else(|| bad("the range wraps".into()))?;
        let len = crate::memory::round_up(end - va, GPU_PAGE);
        let mut st = driver().state();
        let (base, a) = st
            .memory
            .find(va, len)
            .filter(|(_, a)| a.kind == MemKind::Device)
            .ok_or_else(|| bad(format!("{va:#x}+{len:#x} is not inside one device allocation")))?;
        if a.fd < 0 {
            return Err(bad(format!(
                "the allocation at {base:#x} ({} bytes) is smaller than a GPU page: the stand-in maps only \
                 allocations of at least 64 KiB for GDRCopy",
                a.len
            )));
        }
        st.memory.next_pin += 1;
        let h = st.memory.next_pin;
        st.memory.pins.insert(h, GdrPin { base, va, len, maps: Vec::new() });
        // SAFETY: non-null, valid per the contract.
        unsafe { handle.write(gdr_mh_t { h }) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn gdr_unpin_buffer(g: *mut c_void, handle: gdr_mh_t) -> c_int {
    gdr_call("gdr_unpin_buffer", || {
        check_g(g)?;
        let mut st = driver().state();
        let pin = st.memory.pins.get(&handle.h).cloned().ok_or_else(|| {
            fail(CUresult::CUDA_ERROR_INVALID_VALUE, format!("{} is not a pinned handle", handle.h))
        })?;
        if !pin.maps.is_empty() {
            st.violation(format!(
                "gdr_unpin_buffer of handle {} with {} live mapping(s)",
                handle.h,
                pin.maps.len()
            ));
        }
        st.memory.pins.remove(&handle.h);
        Ok(())
    })
}

/// # Safety
/// `info` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn gdr_get_info_v2(
    g: *mut c_void,
    handle: gdr_mh_t,
    info: *mut gdr_info_v2_t,
) -> c_int {
    gdr_call("gdr_get_info_v2", || {
        check_g(g)?;
        let st = driver().state();
        let pin = st.memory.pins.get(&handle.h).ok_or_else(|| {
            fail(CUresult::CUDA_ERROR_INVALID_VALUE, format!("{} is not a pinned handle", handle.h))
        })?;
        if info.is_null() {
            return Err(fail(CUresult::CUDA_ERROR_INVALID_VALUE, "info is NULL"));
        }
        let mapped = !pin.maps.is_empty();
        let v = gdr_info_v2_t {
            va: pin.va as u64,
            mapped_size: pin.len as u64,
            page_size: GPU_PAGE as u32,
            flags: if mapped { 1 } else { 0 },
            mapping_type: if mapped { 2 } else { 0 },
            ..Default::default()
        };
        // SAFETY: non-null, valid per the contract.
        unsafe { info.write(v) };
        Ok(())
    })
}

/// # Safety
/// `va` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn gdr_map(
    g: *mut c_void,
    handle: gdr_mh_t,
    va: *mut *mut c_void,
    size: usize,
) -> c_int {
    gdr_call("gdr_map", || {
        check_g(g)?;
        let mut st = driver().state();
        let bad = |what: String| fail(CUresult::CUDA_ERROR_INVALID_VALUE, what);
        let pin = st
            .memory
            .pins
            .get(&handle.h)
            .cloned()
            .ok_or_else(|| bad(format!("{} is not a pinned handle", handle.h)))?;
        if va.is_null() || size != pin.len {
            return Err(bad(format!("gdr_map of {size} bytes; the pin has {} (its mapped_size)", pin.len)));
        }
        let a = st.memory.find(pin.base, 0).map(|(_, a)| a).filter(|a| a.fd >= 0);
        let a = a.ok_or_else(|| bad("the pinned allocation was freed".into()))?;
        // SAFETY: a shared mapping of the allocation's own memfd at the pinned pages'
        // offset (a multiple of the page size), in a new place chosen by the kernel.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                pin.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                a.fd,
                (pin.va - pin.base) as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(fail(
                CUresult::CUDA_ERROR_OUT_OF_MEMORY,
                format!("mmap of the pinned pages: {}", std::io::Error::last_os_error()),
            ));
        }
        if let Some(pin) = st.memory.pins.get_mut(&handle.h) {
            pin.maps.push((p as usize, pin.len));
        }
        // SAFETY: non-null, valid per the contract.
        unsafe { va.write(p) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn gdr_unmap(g: *mut c_void, handle: gdr_mh_t, va: *mut c_void, size: usize) -> c_int {
    gdr_call("gdr_unmap", || {
        check_g(g)?;
        let mut st = driver().state();
        let pin = st.memory.pins.get_mut(&handle.h).ok_or_else(|| {
            fail(CUresult::CUDA_ERROR_INVALID_VALUE, format!("{} is not a pinned handle", handle.h))
        })?;
        let i = pin.maps.iter().position(|&(p, n)| p == va as usize && n == size).ok_or_else(|| {
            fail(
                CUresult::CUDA_ERROR_INVALID_VALUE,
                format!("{va:p}+{size} is not a mapping of handle {}", handle.h),
            )
        })?;
        pin.maps.remove(i);
        // SAFETY: a mapping gdr_map made with this length, now forgotten.
        unsafe { libc::munmap(va, size) };
        Ok(())
    })
}

/// # Safety
/// Both pointers are NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn gdr_runtime_get_version(major: *mut c_int, minor: *mut c_int) {
    // SAFETY: per the contract.
    unsafe {
        if !major.is_null() {
            major.write(2);
        }
        if !minor.is_null() {
            minor.write(4);
        }
    }
}

/// # Safety
/// Both pointers are NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn gdr_driver_get_version(
    g: *mut c_void,
    major: *mut c_int,
    minor: *mut c_int,
) -> c_int {
    if check_g(g).is_err() {
        return EINVAL;
    }
    // SAFETY: per the contract.
    unsafe { gdr_runtime_get_version(major, minor) };
    0
}

/// Live pins and `gdr_map` mappings (`tt_standin_stat` "gdr_pins" / "gdr_maps").
pub(crate) fn live() -> (u64, u64) {
    let st = driver().state();
    let maps = st.memory.pins.values().map(|p| p.maps.len() as u64).sum();
    (st.memory.pins.len() as u64, maps)
}
