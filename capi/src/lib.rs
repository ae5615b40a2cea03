//! The C ABI of tutti: `libtutti.so` and `include/tutti.h` (generated from
//! this crate by the cbindgen CLI; `scripts/gen-header` regenerates it and a
//! test fails when the committed header drifts).
//!
//! Rules every entry point follows:
//! - It returns an `int32_t` status (0 ok, 1 in progress, negative errors,
//!   named by `tutti_status_name`) and sets this thread's last-error message
//!   (`tutti_last_error`): cleared on success, naming the function and what
//!   was wrong on failure.
//! - Its body runs under `catch_unwind`: a panic is `TUTTI_E_PANIC`, never an
//!   unwind into C.
//! - Every pointer, length, enum value and `struct_size` is checked before
//!   use; handles are looked up in a registry (`TUTTI_E_BAD_HANDLE` for a
//!   stale or foreign one; destroying NULL is a no-op).
//!
//! Thread safety: every call may be made from any thread, concurrently.

// Libraries report through return values and `tracing`, never by printing.
#![warn(clippy::print_stdout, clippy::print_stderr)]
#![allow(non_camel_case_types)]

mod client;
mod clock;
mod config;
mod data_path;
mod error;
#[cfg(feature = "fault-injection")]
mod faults;
mod handles;
mod jobs;
mod kv;
mod profile_state;
mod profiler;
mod ptr;
mod runtime;
mod sched;
mod sched_gate;
mod session;
mod stats;
mod status;
mod store;

// Last: the old names follow the new ones in the header.
mod aliases;

pub use aliases::*;
pub use client::{tutti_client_config_t, tutti_runtime_connect};
pub use config::*;
pub use data_path::*;
pub use error::CapiError;
#[cfg(feature = "fault-injection")]
pub use faults::*;
pub use jobs::*;
pub use kv::*;
pub use profiler::*;
pub use ptr::{TUTTI_MAX_BLOCKS_PER_CALL, TUTTI_MAX_TIMEOUT_MS, TUTTI_MAX_TOKENS_PER_CALL};
pub use runtime::{
    tutti_runtime_destroy, tutti_runtime_info, tutti_runtime_info_t, tutti_runtime_open, tutti_runtime_t,
};
pub use sched::*;
pub use sched_gate::*;
pub use stats::*;
pub use status::*;
pub use store::*;

use std::ffi::c_char;

const EMPTY: &str = "\0";

/// The ABI version of this library; a caller built against another version
/// must not use it. It changes only when the ABI changes incompatibly.
///
/// Within ABI 1, additions are minor versions (`TUTTI_ABI_MINOR`): new
/// functions, constants, and fields appended to size-prefixed structs. A
/// library of minor `m` accepts in `struct_size` the size of the struct in
/// any minor `<= m` (the sizes are listed with each struct): it reads only
/// the fields the caller's size covers (absent inputs take their defaults)
/// and writes only those, so a caller built against an older header works
/// unchanged. Any other `struct_size` is `TUTTI_E_STRUCT_SIZE`. A caller that
/// needs the fields of minor `m` checks `tutti_abi_minor() >= m` first (an
/// older library refuses the larger size). Minor 0 is the first ABI 1;
/// minor 1 added the host-work counters of `tutti_stats_t` and
/// `tutti_job_status_t`; minor 2 added outcome-unknown failures
/// (`tutti_stats_t::quarantined_files`, `tutti_job_status_t::unknown` and
/// `unknown_bitmap`) and `tutti_emulated_delay_next`; minor 3 added clients
/// of tuttid (`tutti_runtime_connect`, `tutti_client_config_t`); minor 4
/// added the staged data path (`TUTTI_MEMORY_CUDA` accepted with
/// `TUTTI_EXECUTOR_GIO_CUDA`, `TUTTI_MEMORY_HOST_STAGED`, the CUDA and staging
/// fields of `tutti_runtime_config_t`, `tutti_data_path`, now `tutti_runtime_data_path`); minor 5 added the
/// emulated drives' bandwidth and latency model (the `emulated_*_bytes_per_sec`,
/// `emulated_*latency_us` and `emulated_mixed_*` fields of `tutti_runtime_config_t`);
/// minor 6 added the scheduler in the job path (`tutti_sched_configure`,
/// `tutti_sched_config_t`, the `tutti_sched_layer_*`/`tutti_sched_decode_*`
/// timing hooks, `tutti_sched_stats`); minor 7 added per-drive arbitration across the
/// clients of one tuttid and its counters (the `xproc_*` fields of `tutti_sched_stats_t`);
/// minor 8 added every executor to tuttid clients (`TUTTI_EXECUTOR_GIO_CUDA` and the CUDA
/// and staging fields appended to `tutti_client_config_t`; `TUTTI_EXECUTOR_CONTROL` for a
/// client that moves no bytes) and the executor mode (`TUTTI_EXEC_MODE_*`: the `exec_mode`
/// fields appended to `tutti_runtime_config_t` and `tutti_client_config_t`); minor 9 added the
/// names that follow one rule (`tutti_<object>_<verb>`, handles released by `_destroy`:
/// `tutti_load_submit`, `tutti_kv_register`, ..., `tutti_runtime_destroy`), the old names staying
/// as aliases (`aliases`).
pub const TUTTI_ABI_VERSION: u32 = 1;

/// The minor version of ABI 1 this library implements (see `TUTTI_ABI_VERSION`).
pub const TUTTI_ABI_MINOR: u32 = 9;

/// The ABI version of the loaded library (`TUTTI_ABI_VERSION` it was built with).
///
/// # Safety
/// None: callable at any time from any thread.
#[no_mangle]
pub extern "C" fn tutti_abi_version() -> u32 {
    TUTTI_ABI_VERSION
}

/// The minor version of ABI 1 the loaded library implements
/// (`TUTTI_ABI_MINOR` it was built with). Libraries of minor 0 lack this
/// function; a caller that loads the library dynamically treats its absence as 0.
///
/// # Safety
/// None: callable at any time from any thread.
#[no_mangle]
pub extern "C" fn tutti_abi_minor() -> u32 {
    TUTTI_ABI_MINOR
}

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
