//! A stand-in `libcuda.so` for machines without a GPU.
//!
//! The cdylib (soname `libcuda.so`) implements the subset of the CUDA driver
//! API that tutti's CUDA executor calls, with cudarc's types, and runs kernel
//! launches through the host build of the same kernel source
//! (`tutti_kernels::host`). Load it by path with `RTLD_NOW | RTLD_GLOBAL`
//! before the first cudarc call ([`control::Standin::load`]); cudarc's own
//! `dlopen("libcuda.so")` then finds it by soname.
//!
//! # What it models
//! - **Device**: one sm_90 device (driver 12.9), `sm_count` SMs (knob,
//!   default 4) of 65536 registers (knob `regs_per_sm`), 2048 threads and 32
//!   blocks each. Device pointers are host addresses.
//! - **Streams**: each stream a FIFO run by its own worker thread. The legacy
//!   default stream (NULL) is ordered with blocking streams (flags 0) both
//!   ways; non-blocking streams with neither. `cuMemsetD8` and `cuMemcpyHtoD`
//!   from pageable memory to device memory return at once and land
//!   `landing_delay_ms` later; `cuMemcpyDtoH` waits for the legacy stream but
//!   not for non-blocking streams; writes into pinned memory are synchronous.
//!   Events, `cuStreamWaitEvent`, queries and synchronisation as documented.
//! - **Residency**: each block of a launch is placed on an SM of its
//!   context's partition that has room (registers from the cubin's
//!   EIATTR_REGCOUNT, allocated per warp in units of 256; threads; blocks);
//!   a block that fits nowhere waits. A grid that fills the partition keeps
//!   every other kernel of the partition from starting.
//! - **Synchronising calls** (`cuMemFree`, `cuMemFreeHost`,
//!   `cuMemHostUnregister`, `cuModuleUnload`, `cuLibraryUnload`,
//!   `cuGreenCtxDestroy`, `cuStreamSynchronize`, `cuCtxSynchronize`, and the
//!   synchronous copies) wait for the device work they depend on for at most
//!   `sync_deadline_ms`, then fail with CUDA_ERROR_TIMEOUT and record a
//!   violation, where the driver would block (forever behind a persistent
//!   kernel).
//! - **Contexts**: a per-thread stack of current contexts; a green context
//!   current on two threads at once is refused (violation); a CUfunction
//!   launched on a stream of another context is refused (violation); a
//!   CUkernel runs in the stream's context.
//! - **Images**: cubins are validated (ELF64, EM_CUDA, sm_90, every entry
//!   point has a host build and a register count); a launch's parameters are
//!   read through the cubin's parameter table, which must match what the host
//!   kernel takes.
//! - **Failure injection** per call name, violations and statistics through
//!   the `tt_standin_*` control functions ([`control`]).
//!
//! # What it does not model
//! - Weak GPU memory ordering: lanes are host threads on x86, which orders
//!   far more than a GPU; a missing fence never shows here (the SASS checks
//!   in `tutti-kernels` cover that).
//! - Copy engines, PTX JIT, multi-dimensional launches, dynamic shared
//!   memory, shared memory as a residency limit, green-context SM
//!   granularity (any split is allowed), the per-thread default stream,
//!   memory freed behind a context's back, and primary-context destruction
//!   at its last release.
//! - Time: kernels run at host speed, one OS thread per CUDA thread.
//!
//! Nothing panics across the C boundary: every export runs inside
//! `catch_unwind` and reports a panic as CUDA_ERROR_UNKNOWN.

// Libraries report through return values and `tracing`, never by printing.
#![warn(clippy::print_stdout, clippy::print_stderr)]
// The exports carry the driver API's names.
#![allow(non_snake_case)]

mod api_control;
mod api_ctx;
mod api_exec;
mod api_gdr;
mod api_mem;
mod context;
pub mod control;
mod current;
mod device;
mod driver;
mod error;
mod memory;
mod module;
mod residency;
mod stream;
mod sync;

pub use error::StandinError;
