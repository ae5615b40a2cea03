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

// First in the header: the library's version, then its last error.
mod version;

mod last_error;

mod client;
mod clock;
mod config;
mod data_path;
mod error;
#[cfg(feature = "fault-injection")]
mod faults;
mod handles;
mod io_config;
mod jobs;
mod kv;
mod link;
mod load;
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
pub use client::{tutti_client_config_t, tutti_runtime_connect, TUTTI_RECONNECT_AUTO, TUTTI_RECONNECT_OFF};
pub use config::*;
pub use data_path::*;
pub use error::CapiError;
#[cfg(feature = "fault-injection")]
pub use faults::*;
pub use io_config::*;
pub use jobs::*;
pub use kv::*;
pub use last_error::*;
pub use load::*;
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
pub use version::*;
