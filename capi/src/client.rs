//! A runtime that is a client of tuttid: the daemon owns the drives and the
//! pool; this process leases its own queue pairs and moves its own bytes, and its scheduler
//! arbitrates each drive with the daemon's other clients through the daemon's arbitration
//! board (`tutti_daemon::arbitration`).

use crate::config::{backend_for, tutti_geometry_t, Rig, TUTTI_EXECUTOR_DIRECT, TUTTI_EXECUTOR_GIO_HOST};
use crate::error::{guard, CapiError};
use crate::ptr::{self, SizePrefixed};
use crate::runtime::{tutti_runtime_t, Runtime, RUNTIMES};
use crate::status::TUTTI_OK;
use std::ffi::c_char;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tutti_daemon::proto::ErrorKind;
use tutti_daemon::DaemonError;

/// Default deadline of each request to the daemon.
const DEFAULT_CONTROL_TIMEOUT_MS: u32 = 10_000;
const MAX_CONTROL_TIMEOUT_MS: u32 = 600_000;

/// How to connect to tuttid. Set `struct_size = sizeof(tutti_client_config_t)`.
/// (ABI 1.3.)
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tutti_client_config_t {
    pub struct_size: u32,
    /// `TUTTI_EXECUTOR_*`: how this process moves its layers.
    pub executor: u32,
    /// Path of the daemon's Unix socket (NUL-terminated, required).
    pub socket: *const c_char,
    /// This client's name in `tutti status` (NUL-terminated; NULL = "capi").
    pub client_name: *const c_char,
    /// Deadline of each request to the daemon in ms (0 = 10000).
    pub control_timeout_ms: u32,
    /// Deadline of each NVMe command in ms (0 = 2000).
    pub io_timeout_ms: u32,
    /// GIO_HOST: blocks of host lanes (0 = 1).
    pub host_lane_blocks: u32,
    /// The geometry this process's KV has; the pool's must be the same.
    pub geometry: tutti_geometry_t,
}

// SAFETY: repr(C) with `struct_size: u32` first.
unsafe impl SizePrefixed for tutti_client_config_t {
    const NAME: &'static str = "tutti_client_config_t";
}

impl From<DaemonError> for CapiError {
    fn from(e: DaemonError) -> Self {
        match e {
            DaemonError::Obj(o) => CapiError::Obj(o),
            e @ DaemonError::Rejected { kind: ErrorKind::Busy, .. } => CapiError::Busy(e.to_string()),
            e @ DaemonError::Rejected { kind: ErrorKind::Invalid, .. } => {
                CapiError::invalid("request", e.to_string())
            }
            e => CapiError::Io(e.to_string()),
        }
    }
}

/// Opens a runtime as a client of the tuttid listening at `config->socket`.
/// The same calls work on it as on a runtime from `tutti_runtime_open`; the
/// pool's lookups, pins and commits go to the daemon, loads and stores run
/// in this process on queue pairs the daemon leased to it. A daemon that is
/// not there, refuses, or stops answering gives an error within
/// `control_timeout_ms`, never a hang. The pool's geometry must be
/// `config->geometry`. Added in ABI 1.3.
///
/// # Safety
/// `config` is NULL or points to a `tutti_client_config_t` whose string
/// fields are NULL or NUL-terminated; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tutti_runtime_connect(
    config: *const tutti_client_config_t,
    out: *mut *mut tutti_runtime_t,
) -> i32 {
    guard("tutti_runtime_connect", || {
        // SAFETY: forwarded from the caller.
        let out = unsafe { ptr::out(out, "out")? };
        *out = std::ptr::null_mut();
        // SAFETY: forwarded from the caller.
        let c = unsafe { ptr::sized_in(config)? };
        if c.socket.is_null() {
            return Err(CapiError::Null("socket"));
        }
        // SAFETY: non-NULL and NUL-terminated per the field docs.
        let socket = unsafe { ptr::str_in(c.socket, "socket", 4096)? };
        if socket.is_empty() {
            return Err(CapiError::invalid("socket", "the empty string names no socket"));
        }
        let name = if c.client_name.is_null() {
            "capi".to_string()
        } else {
            // SAFETY: NUL-terminated per the field docs.
            unsafe { ptr::str_in(c.client_name, "client_name", 256)? }.to_string()
        };
        let timeout_ms =
            if c.control_timeout_ms == 0 { DEFAULT_CONTROL_TIMEOUT_MS } else { c.control_timeout_ms };
        if timeout_ms > MAX_CONTROL_TIMEOUT_MS {
            return Err(CapiError::invalid(
                "control_timeout_ms",
                format!("{timeout_ms} is more than {MAX_CONTROL_TIMEOUT_MS}"),
            ));
        }
        if c.executor != TUTTI_EXECUTOR_GIO_HOST && c.executor != TUTTI_EXECUTOR_DIRECT {
            return Err(CapiError::invalid(
                "executor",
                format!("{} is not TUTTI_EXECUTOR_GIO_HOST (1) or TUTTI_EXECUTOR_DIRECT (2)", c.executor),
            ));
        }
        let geometry = c.geometry.to_geometry()?;
        let backend = backend_for(c.executor, c.io_timeout_ms, c.host_lane_blocks)?;
        let (store, board) = tutti_daemon::remote::connect_arbitrated(
            Path::new(socket),
            &name,
            &backend,
            Duration::from_millis(timeout_ms as u64),
        )?;
        if *store.geometry() != geometry {
            return Err(CapiError::invalid(
                "geometry",
                format!(
                    "the daemon's pool is formatted for {}, this process has {geometry}",
                    store.geometry()
                ),
            ));
        }
        let rt = Runtime::new(store, Rig { emulated: Vec::new() }, c.executor, geometry)?;
        // Its loads and stores defer to the other clients' on the same drives.
        rt.sched.share(board)?;
        *out = RUNTIMES.insert(Arc::new(rt));
        Ok(TUTTI_OK)
    })
}
