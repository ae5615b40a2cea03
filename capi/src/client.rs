//! A runtime that is a client of tuttid: the daemon owns the drives and the
//! pool; this process leases its own queue pairs and moves its own bytes, and its scheduler
//! arbitrates each drive with the daemon's other clients through the daemon's arbitration
//! board (`tutti_daemon::arbitration`).

use crate::config::{tutti_geometry_t, Rig};
use crate::error::{guard, CapiError};
use crate::io_config::{io_fields, TUTTI_EXECUTOR_CONTROL};
use crate::link::{Link, Policy, Role};
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
/// Default ceiling of the wait between two reconnect attempts.
const DEFAULT_RECONNECT_BACKOFF_MS: u32 = 1_000;
const MAX_RECONNECT_BACKOFF_MS: u32 = 60_000;
/// Default time a client goes on trying to reconnect after its daemon went away.
const DEFAULT_RECONNECT_DEADLINE_MS: u32 = 600_000;

/// `tutti_client_config_t::reconnect`: a client whose tuttid went away reconnects on its next
/// calls (the default; ABI 1.11).
pub const TUTTI_RECONNECT_AUTO: u32 = 0;
/// `tutti_client_config_t::reconnect`: it does not; once its daemon is gone every call fails
/// (`TUTTI_E_IO`, naming tuttid) until the runtime is closed, as before ABI 1.11.
pub const TUTTI_RECONNECT_OFF: u32 = 1;

/// How to connect to tuttid. Set `struct_size = sizeof(tutti_client_config_t)`.
/// (ABI 1.3; 1.8 appended the CUDA executor's and staging fields, the
/// executor mode, and accepts `TUTTI_EXECUTOR_GIO_CUDA` and
/// `TUTTI_EXECUTOR_CONTROL`; 1.11 appended the reconnect fields.)
///
/// Reconnecting (ABI 1.11): when the daemon goes away (stopped, killed, restarted), the next
/// call that needs it connects again, with the same name, executor and geometry, and gets the
/// runtime back in its state: its queue pairs leased again, its KV memory registered again,
/// a new executor on the new queues, a new slot on the daemon's arbitration board. Jobs and
/// store sessions of before end as errors (their blocks are misses); pins of before are not
/// held (unpinning them is a no-op). The first attempt is made at once, later ones after a
/// backoff doubling from 10 ms to `reconnect_backoff_ms`, or at once when the socket file was
/// replaced (a new daemon bound it); calls in between fail at once with `TUTTI_E_IO` naming
/// tuttid and the last attempt. A daemon back with another geometry or another pool (other
/// media, or formatted again) is refused (the calls say so) and tried again at that pace.
/// After `reconnect_deadline_ms` from when the outage was seen, the client stops trying.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct tutti_client_config_t {
    pub struct_size: u32,
    /// `TUTTI_EXECUTOR_*`: how this process moves its layers (ABI 1.3: GIO_HOST
    /// or DIRECT; 1.8: also GIO_CUDA, and CONTROL for a client that moves none).
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
    /// ABI 1.8: `TUTTI_EXEC_MODE_*` (0 = launch), as in `tutti_runtime_config_t`.
    pub exec_mode: u32,
    /// ABI 1.8, GIO_CUDA: the CUDA device ordinal of this process's GPU.
    pub cuda_device: u32,
    /// ABI 1.8, GIO_CUDA: SMs of the I/O partition (a green context); 0 runs
    /// in the primary context with every SM.
    pub cuda_sm_count: u32,
    /// ABI 1.8, GIO_CUDA: threads per block of the I/O kernels, a multiple of
    /// 32 up to 512 (0 = 512).
    pub cuda_block_threads: u32,
    /// ABI 1.8, GIO_CUDA, nullable: the CUDA driver library to load instead of
    /// `libcuda.so` from the loader path.
    pub cuda_driver: *const c_char,
    /// ABI 1.8: staging slots (one chunk each, pinned host memory of this
    /// process, mapped for the drives like its queue rings) for KV memory the
    /// drives cannot reach; 0 = 256.
    pub staging_slots: u32,
    /// Alignment padding (ignored; set 0).
    pub rsvd0: u32,
    /// ABI 1.11: `TUTTI_RECONNECT_*` (0 = `TUTTI_RECONNECT_AUTO`).
    pub reconnect: u32,
    /// ABI 1.11: the longest wait in ms between two reconnect attempts (0 = 1000, at most 60000).
    pub reconnect_backoff_ms: u32,
    /// ABI 1.11: how long in ms after its daemon went away a client goes on trying to reconnect
    /// (0 = 600000, ten minutes; `UINT32_MAX`, about 49 days, for as good as always).
    pub reconnect_deadline_ms: u32,
    /// Alignment padding (ignored; set 0).
    pub rsvd1: u32,
}

impl Default for tutti_client_config_t {
    fn default() -> Self {
        tutti_client_config_t {
            struct_size: 0,
            executor: 0,
            socket: std::ptr::null(),
            client_name: std::ptr::null(),
            control_timeout_ms: 0,
            io_timeout_ms: 0,
            host_lane_blocks: 0,
            geometry: tutti_geometry_t::default(),
            exec_mode: 0,
            cuda_device: 0,
            cuda_sm_count: 0,
            cuda_block_threads: 0,
            cuda_driver: std::ptr::null(),
            staging_slots: 0,
            rsvd0: 0,
            reconnect: 0,
            reconnect_backoff_ms: 0,
            reconnect_deadline_ms: 0,
            rsvd1: 0,
        }
    }
}

// SAFETY: repr(C) with `struct_size: u32` first; `rsvd0` makes the padding a
// field, so the struct has none; every field is an integer or a pointer.
unsafe impl SizePrefixed for tutti_client_config_t {
    const NAME: &'static str = "tutti_client_config_t";
    const SIZES: &'static [u32] = &[
        std::mem::offset_of!(tutti_client_config_t, exec_mode) as u32,
        std::mem::offset_of!(tutti_client_config_t, reconnect) as u32,
        std::mem::size_of::<tutti_client_config_t>() as u32,
    ];
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
/// in this process on queue pairs the daemon leased to it, with the executor
/// `config->executor` names: host lanes, or (ABI 1.8) this process's own I/O
/// kernels on its own GPU, with its own pinned staging slots for CUDA KV
/// memory. `TUTTI_EXECUTOR_CONTROL` (ABI 1.8) leases nothing and moves no
/// bytes (an engine's scheduler). A daemon that is not there, refuses, or
/// stops answering gives an error within `control_timeout_ms`, never a hang.
/// The pool's geometry must be `config->geometry`. Added in ABI 1.3. Since ABI 1.11 the
/// runtime reconnects when its daemon goes away and comes back (see `tutti_client_config_t`).
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
        let c = unsafe { ptr::sized_in_prefix(config)? };
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
        let geometry = c.geometry.to_geometry()?;
        let timeout = Duration::from_millis(timeout_ms as u64);
        let policy = policy_of(&c)?;
        let (store, board, role) = if c.executor == TUTTI_EXECUTOR_CONTROL {
            if let Some(field) = data_field_set(&c) {
                return Err(CapiError::invalid(
                    field,
                    "a TUTTI_EXECUTOR_CONTROL client moves no bytes: leave it 0",
                ));
            }
            let store =
                tutti_daemon::remote::connect_control(Path::new(socket), &name, timeout, Some(&geometry))?;
            (store, None, Role::Control)
        } else {
            // SAFETY: `cuda_driver` is NULL or NUL-terminated per the field docs.
            let backend = unsafe { io_fields!(c).backend()? };
            let (store, board) = tutti_daemon::remote::connect_arbitrated(
                Path::new(socket),
                &name,
                &backend,
                timeout,
                Some(&geometry),
            )?;
            (store, Some(board), Role::Data(backend))
        };
        let link = Link::new(Path::new(socket), &name, timeout, role, geometry, store.pool_id(), policy);
        let rt = Runtime::new(store, Rig { emulated: Vec::new() }, c.executor, geometry, Some(link))?;
        if let Some(board) = board {
            // Its loads and stores defer to the other clients' on the same drives.
            rt.sched.share(board)?;
        }
        *out = RUNTIMES.insert(Arc::new(rt));
        Ok(TUTTI_OK)
    })
}

/// The reconnect fields of `c`, checked.
fn policy_of(c: &tutti_client_config_t) -> Result<Policy, CapiError> {
    let enabled = match c.reconnect {
        TUTTI_RECONNECT_AUTO => true,
        TUTTI_RECONNECT_OFF => false,
        n => {
            return Err(CapiError::invalid(
                "reconnect",
                format!("{n} is not a TUTTI_RECONNECT_* value (0 = AUTO, 1 = OFF)"),
            ))
        }
    };
    let backoff =
        if c.reconnect_backoff_ms == 0 { DEFAULT_RECONNECT_BACKOFF_MS } else { c.reconnect_backoff_ms };
    if backoff > MAX_RECONNECT_BACKOFF_MS {
        return Err(CapiError::invalid(
            "reconnect_backoff_ms",
            format!("{backoff} is more than {MAX_RECONNECT_BACKOFF_MS}"),
        ));
    }
    let deadline =
        if c.reconnect_deadline_ms == 0 { DEFAULT_RECONNECT_DEADLINE_MS } else { c.reconnect_deadline_ms };
    Ok(Policy {
        enabled,
        max_backoff: Duration::from_millis(backoff as u64),
        deadline: Duration::from_millis(deadline as u64),
    })
}

/// The first field of `c` that only a client moving bytes uses, if one is set.
fn data_field_set(c: &tutti_client_config_t) -> Option<&'static str> {
    [
        ("io_timeout_ms", c.io_timeout_ms != 0),
        ("host_lane_blocks", c.host_lane_blocks != 0),
        ("exec_mode", c.exec_mode != 0),
        ("cuda_device", c.cuda_device != 0),
        ("cuda_sm_count", c.cuda_sm_count != 0),
        ("cuda_block_threads", c.cuda_block_threads != 0),
        ("cuda_driver", !c.cuda_driver.is_null()),
        ("staging_slots", c.staging_slots != 0),
    ]
    .into_iter()
    .find_map(|(name, set)| set.then_some(name))
}
