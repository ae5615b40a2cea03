//! tutti's KV object store: a GPU file pool with tensor stripes across NVMe drives.

// Libraries report through return values and `tracing`, never by printing.
#![warn(clippy::print_stdout, clippy::print_stderr)]

mod codec;
pub mod control;
mod drives;
pub mod error;
pub mod gate;
pub mod gdr;
pub mod geometry;
pub mod hash;
pub mod index;
pub mod io;
pub mod journal;
pub mod layout;
pub mod local;
mod mapped;
pub mod memory;
pub mod p2p;
pub mod pool;
mod probe;
pub mod registration;
pub mod report;
pub mod store;
pub mod stripe;
pub mod superblock;

pub use control::{ControlStats, PoolControl, PoolShape, ReservationId, Reserved, Verdict};
pub use drives::DriveSpec;
pub use error::{ObjError, Result};
pub use gate::{Admit, GateUnit, IoGate, StoreAdmission};
pub use geometry::{Dtype, Geometry};
pub use hash::{chain_hashes, BlockHash, CacheIdentity, IdentityId};
pub use index::FileId;
pub use io::gio::{GioConfig, GioExecutor};
pub use io::{Direction, FailureKind, LayerRequest, PairFailure};
pub use layout::{KvLayout, LayerBases, LayoutKind};
pub use local::LocalPool;
pub use memory::HostKvMemory;
pub use p2p::{CpuMapped, DeviceAccess, DeviceKvMemory, P2pPolicy};
pub use pool::{OpenMode, PoolOptions};
pub use registration::{DataPath, KvMemoryKind, TableSizes};
pub use report::DataPathReport;
pub use store::{
    thread_cpu_ns, Backend, JobId, JobStatus, KvStore, Lookup, PoolInfo, StoreId, StoreOptions, StoreReport,
    StoreStats,
};
/// The CUDA executor's settings ([`GioExecutor::Cuda`]).
pub use tutti_gio_uring::CudaExecutorConfig;
/// How an executor runs its kernels (`GioConfig::host`, `CudaExecutorConfig::mode`).
pub use tutti_gio_uring::ExecMode;
