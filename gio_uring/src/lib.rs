//! gio_uring: io_uring-like rings of I/O control blocks between the host and
//! an I/O executor that turns them into NVMe commands with no CPU on the data
//! path.
//!
//! - An IOCTX ([`IoCtx`]) is one NVMe command; an IOCB holds up to 2048.
//! - [`GioUring`]: `init(depth)`, [`GioUring::get_iocb`], [`GioUring::issue`],
//!   [`GioUring::wait_cqe`], [`GioUring::poll_cqe`], and
//!   [`GioUring::submit_layer`], which lets the executor expand (file, block)
//!   pairs through a device-resident [`LayerTable`] so the host does O(1) work
//!   per command batch; [`GioUring::register_pairs`] and
//!   [`GioUring::submit_layer_list`] go further: the pairs are copied to the
//!   executor once per request, and each layer costs the host a few header
//!   words per IOCB, however many blocks it moves.
//! - Executors ([`executor`]): [`HostExecutor`] runs the CUDA kernels of
//!   `tutti-kernels` on host threads; [`CudaExecutor`] runs them on a GPU.
//!
//! ```no_run
//! # use std::{sync::Arc, time::Duration};
//! # use tutti_gio_uring::*;
//! # fn demo(drives: Vec<DriveQueues>, desc: tutti_driver::spec::SglDescriptor) -> Result<()> {
//! let exec = Arc::new(HostExecutor::new(HostExecutorConfig::default())?);
//! let ring = GioUring::init(16, drives, exec)?;
//! let ids = ring.get_iocb(1)?;
//! ring.set_ioctxs(ids[0], &[ioctx(Op::Read, 0, 2048, 8, DataRef::Sgl(desc))])?;
//! ring.issue(&ids, 2)?;
//! let done = ring.wait_cqe(&ids, Duration::from_secs(5))?;
//! assert!(done[0].is_ok());
//! # Ok(()) }
//! ```

// Libraries report through return values and `tracing`, never by printing.
#![warn(clippy::print_stdout, clippy::print_stderr)]

pub mod drive;
mod error;
pub mod executor;
mod gio_uring;
mod handle;
mod iocb;
pub mod layer_table;
pub mod mem;
pub mod selftest;
pub mod shared_ring;
mod status;

pub use drive::{DriveInfo, DriveQueues};
pub use error::{GioError, Result};
pub use executor::{
    CopyDirection, CopyReport, CopySpec, CopyTimes, CudaExecutor, CudaExecutorConfig, ExecMode, Executor,
    HostExecutor, HostExecutorConfig,
};
pub use gio_uring::{
    pairs_per_iocb, ExecutorStats, GioOptions, GioUring, QueueStats, RecoveryReport, StagingStats, TableInfo,
};
pub use handle::{IocbId, PairListId, TableId};
pub use iocb::{ioctx, DataRef, IocbResult, IoctxFailure, Op};
pub use layer_table::{Kv, LayerGeometry, LayerTable, PoolDrive, TableKind};
pub use status::{Invalid, IoStatus, Translation};
pub use tutti_kernels::abi::IoCtx;
