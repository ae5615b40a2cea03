//! The I/O path's settings that `tutti_runtime_config_t` and `tutti_client_config_t` share
//! (executor, its mode, timeouts, lanes, CUDA and staging), and their translation into the
//! object store's `Backend`. Every field is checked here; the error names it.

use crate::error::{CapiError, Result};
use crate::ptr;
use std::ffi::c_char;
use std::path::PathBuf;
use std::time::Duration;
use tutti_objstore::{Backend, ExecMode, GioConfig, GioExecutor};

/// gio_uring with its host executor (the main path on machines without a GPU).
pub const TUTTI_EXECUTOR_GIO_HOST: u32 = 1;
/// The CPU-driven baseline: the host submits every NVMe command. It does not
/// recover queues after a timeout, so timed-out commands keep an unknown outcome
/// (quarantined files, `unknown_bitmap`); the gio executor recovers the drive and
/// settles them.
pub const TUTTI_EXECUTOR_DIRECT: u32 = 2;
/// ABI 1.4: gio_uring with its CUDA executor (`cuda_device`, `cuda_sm_count`).
/// CUDA KV memory (`TUTTI_MEMORY_CUDA`) moves on the staged data path. On a
/// machine without a CUDA driver or GPU, `tutti_runtime_open` fails with
/// `TUTTI_E_UNSUPPORTED`, naming what is missing.
pub const TUTTI_EXECUTOR_GIO_CUDA: u32 = 3;
/// ABI 1.8, tuttid clients only (`tutti_runtime_connect`): a client that moves
/// no bytes. It leases no queue pairs, maps no memory and runs no executor;
/// its lookups, `tutti_kv_contains_identity`, pins and stats go to the daemon.
/// `tutti_kv_register` (and so every load and store) gets
/// `TUTTI_E_UNSUPPORTED`. An engine's scheduler process uses it.
pub const TUTTI_EXECUTOR_CONTROL: u32 = 4;

/// ABI 1.8: the executor's default mode (launch, for both gio executors).
pub const TUTTI_EXEC_MODE_DEFAULT: u32 = 0;
/// ABI 1.8: a kernel (host: a block of lanes on OS threads) is launched when
/// work is issued, drains the submission ring and returns.
pub const TUTTI_EXEC_MODE_LAUNCH: u32 = 1;
/// ABI 1.8: one kernel polls the submission ring from open to close (SQPOLL).
/// On the CUDA executor it needs `cuda_sm_count` (a green context), since it
/// holds its SMs for good; a persistent kernel also blocks module loads on
/// the device while it runs.
pub const TUTTI_EXEC_MODE_PERSISTENT: u32 = 2;
/// ABI 1.8, `TUTTI_EXECUTOR_GIO_HOST` only: one block of lanes that runs on
/// the threads calling tutti (submits issue, waits reap), with no executor
/// thread, like io_uring without SQPOLL. Needs `host_lane_blocks` <= 1.
pub const TUTTI_EXEC_MODE_INLINE: u32 = 3;

pub(crate) const DEFAULT_IO_TIMEOUT_MS: u32 = 2000;
const MAX_LANE_BLOCKS: u32 = 64;
/// Most staging slots a runtime may ask for.
const MAX_STAGING_SLOTS: u32 = 1 << 16;

/// The I/O settings `tutti_runtime_config_t` and `tutti_client_config_t`
/// share, as the caller gave them (0 = the default throughout).
/// [`io_fields!`] takes them from either struct.
pub(crate) struct IoFields {
    pub executor: u32,
    pub exec_mode: u32,
    pub io_timeout_ms: u32,
    pub host_lane_blocks: u32,
    pub staging_slots: u32,
    pub cuda_device: u32,
    pub cuda_sm_count: u32,
    pub cuda_block_threads: u32,
    pub cuda_driver: *const c_char,
}

/// The [`IoFields`] of a `tutti_runtime_config_t` or a `tutti_client_config_t`
/// (the fields have the same names in both).
macro_rules! io_fields {
    ($c:expr) => {
        $crate::io_config::IoFields {
            executor: $c.executor,
            exec_mode: $c.exec_mode,
            io_timeout_ms: $c.io_timeout_ms,
            host_lane_blocks: $c.host_lane_blocks,
            staging_slots: $c.staging_slots,
            cuda_device: $c.cuda_device,
            cuda_sm_count: $c.cuda_sm_count,
            cuda_block_threads: $c.cuda_block_threads,
            cuda_driver: $c.cuda_driver,
        }
    };
}
pub(crate) use io_fields;

impl IoFields {
    /// The I/O path these fields ask for, every field checked (the error names it).
    /// `TUTTI_EXECUTOR_CONTROL` is the caller's to handle: it has no I/O path.
    ///
    /// # Safety
    /// `cuda_driver` is NULL or a NUL-terminated string.
    pub(crate) unsafe fn backend(&self) -> Result<Backend> {
        let io_timeout_ms = if self.io_timeout_ms == 0 { DEFAULT_IO_TIMEOUT_MS } else { self.io_timeout_ms };
        let io_timeout = Duration::from_millis(io_timeout_ms as u64);
        let lane_blocks = if self.host_lane_blocks == 0 { 1 } else { self.host_lane_blocks };
        if lane_blocks > MAX_LANE_BLOCKS {
            return Err(CapiError::invalid(
                "host_lane_blocks",
                format!("{lane_blocks} is more than {MAX_LANE_BLOCKS}"),
            ));
        }
        let mode = self.mode()?;
        match self.executor {
            TUTTI_EXECUTOR_GIO_HOST | TUTTI_EXECUTOR_GIO_CUDA => {}
            // The baseline stays minimal through the C ABI (and keeps the unknown-outcome
            // path observable to bindings); the object store can recover it too.
            TUTTI_EXECUTOR_DIRECT => {
                if self.exec_mode != TUTTI_EXEC_MODE_DEFAULT {
                    return Err(CapiError::invalid(
                        "exec_mode",
                        "applies to the gio executors; leave it 0 with TUTTI_EXECUTOR_DIRECT",
                    ));
                }
                return Ok(Backend::Direct { queue_depth: 64, recover_queues: false });
            }
            n => {
                return Err(CapiError::invalid(
                    "executor",
                    format!(
                        "{n} is not TUTTI_EXECUTOR_GIO_HOST (1), TUTTI_EXECUTOR_DIRECT (2) or TUTTI_EXECUTOR_GIO_CUDA (3)"
                    ),
                ))
            }
        }
        let mut gio = GioConfig::default();
        gio.ring.command_timeout = io_timeout;
        gio.ring.submit_timeout = io_timeout.saturating_mul(2);
        gio.host.blocks = lane_blocks;
        gio.host.mode = mode;
        gio.sm_budget = lane_blocks;
        gio.staging_slots = match self.staging_slots {
            0 => 256,
            n if n > MAX_STAGING_SLOTS => {
                return Err(CapiError::invalid(
                    "staging_slots",
                    format!("{n} is more than {MAX_STAGING_SLOTS}"),
                ))
            }
            n => n,
        };
        if mode == ExecMode::Inline && lane_blocks > 1 {
            return Err(CapiError::invalid(
                "exec_mode",
                format!(
                    "TUTTI_EXEC_MODE_INLINE runs one block of lanes on the calling thread; host_lane_blocks is {lane_blocks}"
                ),
            ));
        }
        if self.executor == TUTTI_EXECUTOR_GIO_CUDA {
            // SAFETY: forwarded from the caller.
            gio.executor = GioExecutor::Cuda(Box::new(unsafe { self.cuda(mode)? }));
        }
        Ok(Backend::Gio(gio))
    }

    fn mode(&self) -> Result<ExecMode> {
        match self.exec_mode {
            TUTTI_EXEC_MODE_DEFAULT | TUTTI_EXEC_MODE_LAUNCH => Ok(ExecMode::Launch),
            TUTTI_EXEC_MODE_PERSISTENT => Ok(ExecMode::Persistent),
            TUTTI_EXEC_MODE_INLINE if self.executor == TUTTI_EXECUTOR_GIO_CUDA => Err(CapiError::invalid(
                "exec_mode",
                "TUTTI_EXEC_MODE_INLINE runs lanes on the calling host thread: only TUTTI_EXECUTOR_GIO_HOST has it",
            )),
            TUTTI_EXEC_MODE_INLINE => Ok(ExecMode::Inline),
            n => Err(CapiError::invalid("exec_mode", format!("{n} is not a TUTTI_EXEC_MODE_* value (0..=3)"))),
        }
    }

    /// The CUDA executor's settings.
    ///
    /// # Safety
    /// `cuda_driver` is NULL or a NUL-terminated string.
    unsafe fn cuda(&self, mode: ExecMode) -> Result<tutti_objstore::CudaExecutorConfig> {
        let device = i32::try_from(self.cuda_device).map_err(|_| {
            CapiError::invalid("cuda_device", format!("{} is not a device ordinal", self.cuda_device))
        })?;
        let driver = if self.cuda_driver.is_null() {
            None
        } else {
            // SAFETY: forwarded from the caller.
            let d = unsafe { ptr::str_in(self.cuda_driver, "cuda_driver", 4096)? };
            if d.is_empty() {
                return Err(CapiError::invalid(
                    "cuda_driver",
                    "the empty string names no library (NULL: libcuda.so)",
                ));
            }
            Some(PathBuf::from(d))
        };
        let block_threads = match self.cuda_block_threads {
            0 => tutti_objstore::CudaExecutorConfig::default().block_threads,
            n if n % 32 == 0 && n <= 512 => n,
            n => {
                return Err(CapiError::invalid(
                    "cuda_block_threads",
                    format!("{n} is not a multiple of 32 in 32..=512"),
                ))
            }
        };
        if mode == ExecMode::Persistent && self.cuda_sm_count == 0 {
            return Err(CapiError::invalid(
                "exec_mode",
                "a persistent CUDA executor holds its SMs for good: it needs cuda_sm_count (a green context), not every SM",
            ));
        }
        Ok(tutti_objstore::CudaExecutorConfig {
            device,
            mode,
            sm_count: (self.cuda_sm_count != 0).then_some(self.cuda_sm_count),
            driver,
            block_threads,
            ..Default::default()
        })
    }
}
