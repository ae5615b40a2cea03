//! The library's own calls for errors: the name of a status, and this thread's last-error
//! message (kept by `error`).

use crate::error::{self, CapiError};
use crate::ptr;
use crate::status::{self, TUTTI_OK};
use std::ffi::c_char;

const EMPTY: &str = "\0";

/// The name of a status code, e.g. "TUTTI_E_INVALID_ARG"
/// ("TUTTI_UNKNOWN_STATUS" for a value that is none). A static string.
///
/// # Safety
/// None: callable at any time; the result must not be freed.
#[no_mangle]
pub extern "C" fn tutti_status_name(code: i32) -> *const c_char {
    error::guard_value(status::UNKNOWN_STATUS.as_ptr(), || status::name_of(code).as_ptr()) as *const c_char
}

/// This thread's last error message ("" after a successful call). The
/// string belongs to the library and stays valid until the next tutti call
/// on this thread; copy it (or use `tutti_last_error_copy`) to keep it.
///
/// # Safety
/// None: callable at any time; the result must not be freed.
#[no_mangle]
pub extern "C" fn tutti_last_error() -> *const c_char {
    error::guard_value(EMPTY.as_ptr() as *const c_char, error::last_error_ptr)
}

/// Copies this thread's last error message into `buf` (NUL-terminated)
/// without changing it. `*needed` (nullable) gets the bytes needed including
/// the NUL; `TUTTI_E_BUFFER_TOO_SMALL` if `capacity` is less (the message is
/// kept in that case too).
///
/// # Safety
/// `buf` points to `capacity` writable bytes (NULL if 0); `needed` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tutti_last_error_copy(buf: *mut c_char, capacity: usize, needed: *mut usize) -> i32 {
    let msg = error::last_error_bytes();
    let text = &msg[..msg.len().saturating_sub(1)];
    // SAFETY: forwarded from the caller.
    let r = error::guard_value(Err(CapiError::Poisoned("panic")), || unsafe {
        ptr::copy_str(text, buf, capacity, needed)
    });
    match r {
        Ok(()) => TUTTI_OK,
        Err(e) => e.code(),
    }
}
