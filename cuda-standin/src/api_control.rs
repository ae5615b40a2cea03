//! The control functions tests call (found with dlsym; see [`crate::control`]).

use crate::api_ctx::known_code;
use crate::driver::{driver, last_error};
use crate::residency;
use std::ffi::{c_char, c_int, CStr};
use std::panic::AssertUnwindSafe;

/// Runs `f`, turning a panic into `dflt`.
fn guard<T>(dflt: T, f: impl FnOnce() -> T) -> T {
    std::panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or(dflt)
}

fn text<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated string (the control functions' contract).
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

/// Copies `s` into `buf` (NUL-terminated, truncated to `len`); returns its full length.
fn copy_out(s: &str, buf: *mut c_char, len: usize) -> u64 {
    if !buf.is_null() && len > 0 {
        let n = s.len().min(len - 1);
        // SAFETY: `buf` has `len` bytes (contract); n + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr().cast::<c_char>(), buf, n);
            *buf.add(n) = 0;
        }
    }
    s.len() as u64
}

/// 1: this library is the stand-in, not NVIDIA's driver.
#[no_mangle]
pub extern "C" fn tt_standin_present() -> u32 {
    1
}

/// Knobs back to their defaults (and environment), failures disarmed,
/// violations and statistics cleared. Objects (contexts, memory, ...) stay.
#[no_mangle]
pub extern "C" fn tt_standin_reset() {
    guard((), || driver().state().reset())
}

/// Sets a knob; 0 on success, -1 (with `tt_standin_last_error`) otherwise.
///
/// # Safety
/// `name` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn tt_standin_set_knob(name: *const c_char, value: u64) -> c_int {
    let rc = crate::driver::call(&["tt_standin_set_knob"], || {
        let name = text(name).unwrap_or("");
        driver()
            .state()
            .knobs_mut()
            .set(name, value)
            .map_err(|e| crate::error::fail(cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE, e))
    });
    if rc == cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        0
    } else {
        -1
    }
}

/// Reads a knob into `*out`; 0 on success, -1 for an unknown name.
///
/// # Safety
/// `name` is a NUL-terminated string; `out` a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn tt_standin_get_knob(name: *const c_char, out: *mut u64) -> c_int {
    guard(-1, || {
        let Some(v) = text(name).and_then(|n| driver().state().knobs_mut().get(n)) else { return -1 };
        if out.is_null() {
            return -1;
        }
        // SAFETY: non-null, valid per the contract.
        unsafe { out.write(v) };
        0
    })
}

/// After `skip` more calls of `name` (a driver function's exported name, or
/// `cuMemHostRegister_v2:IOMEMORY` for registrations with that flag), the next
/// `count` calls return `code`. 0 on success, -1 for a code the stand-in does not know.
///
/// # Safety
/// `name` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn tt_standin_fail(name: *const c_char, skip: u64, count: u64, code: u32) -> c_int {
    guard(-1, || {
        let (Some(name), Some(code)) = (text(name), known_code(code)) else { return -1 };
        driver().state().arm(name, skip, count, code);
        0
    })
}

/// How many violations were recorded since the last reset.
#[no_mangle]
pub extern "C" fn tt_standin_violation_count() -> u64 {
    guard(0, || driver().state().violations.len() as u64)
}

/// Copies violation `index` into `buf`; returns its length, or -1 if there is none.
///
/// # Safety
/// `buf` is NULL or has `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn tt_standin_violation(index: u64, buf: *mut c_char, len: usize) -> i64 {
    guard(-1, || {
        let st = driver().state();
        match usize::try_from(index).ok().and_then(|i| st.violations.get(i)) {
            Some(v) => copy_out(v, buf, len) as i64,
            None => -1,
        }
    })
}

/// Reads a statistic: `launches`, `blocks_run`, `legacy_writes`,
/// `late_landings`, `launches_before_landing`, `pending_writes`,
/// `peak_resident` and `resident` (blocks of context `ctx`; `ctx` 0 for the
/// most of any context), `gdr_pins` and `gdr_maps` (live GDRCopy pins and mappings).
/// 0 on success, -1 for an unknown name.
///
/// # Safety
/// `name` is a NUL-terminated string; `out` a valid out pointer.
#[no_mangle]
pub unsafe extern "C" fn tt_standin_stat(name: *const c_char, ctx: u64, out: *mut u64) -> c_int {
    guard(-1, || {
        let ctx = ctx as usize;
        match text(name) {
            Some("gdr_pins") | Some("gdr_maps") => {
                let (pins, maps) = crate::api_gdr::live();
                if out.is_null() {
                    return -1;
                }
                let v = if text(name) == Some("gdr_pins") { pins } else { maps };
                // SAFETY: non-null, valid per the contract.
                unsafe { out.write(v) };
                return 0;
            }
            _ => {}
        }
        let v = {
            let ledger = crate::device::ledger();
            let s = &ledger.stats;
            match text(name) {
                Some("launches") => s.launches,
                Some("blocks_run") => s.blocks_run,
                Some("legacy_writes") => s.legacy_writes,
                Some("late_landings") => s.late_landings,
                Some("launches_before_landing") => s.launches_before_landing,
                Some("pending_writes") => ledger.pending_writes.len() as u64,
                Some("peak_resident") => residency::peak(ctx),
                Some("resident") => residency::resident(ctx),
                _ => return -1,
            }
        };
        if out.is_null() {
            return -1;
        }
        // SAFETY: non-null, valid per the contract.
        unsafe { out.write(v) };
        0
    })
}

/// Copies why the calling thread's last refused call was refused; returns its length.
///
/// # Safety
/// `buf` is NULL or has `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn tt_standin_last_error(buf: *mut c_char, len: usize) -> u64 {
    guard(0, || copy_out(&last_error(), buf, len))
}
