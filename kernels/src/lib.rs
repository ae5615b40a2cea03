//! tutti's I/O kernels: CUDA C sources for gio_uring's executor, written once
//! against `include/portable.cuh` and built two ways.
//!
//! - [`abi`]: the shared memory layout, mirrored from `include/tutti_gio.h`.
//! - [`GIO_SOURCE`]: the kernels as one NVRTC program (`cuda/gio.cu` with its
//!   includes inlined at build time); [`nvrtc`] compiles it to a cubin and
//!   reports registers per kernel.
//! - [`host`]: the same source compiled as C++20 by build.rs and run by host
//!   threads, one per CUDA thread — the executor used without a GPU.
//!
//! Kernels: `tt_gio_issue` (launch mode), `tt_gio_persistent` (SQPOLL mode),
//! `tt_gio_wait` (waits for IOCB completions on a stream), `tt_gio_copy` (the
//! staged path's warp copy alone, for `tutti bench staged`).

// Libraries report through return values and `tracing`, never by printing.
#![warn(clippy::print_stdout, clippy::print_stderr)]

pub mod abi;
pub mod cubin;
mod error;
pub mod host;
pub mod nvrtc;
pub mod sass;
mod wheel;

pub use error::KernelError;

/// The kernels as a single NVRTC translation unit.
pub const GIO_SOURCE: &str = include_str!(concat!(env!("OUT_DIR"), "/gio_bundle.cu"));
/// Name of the program in NVRTC messages.
pub const GIO_PROGRAM: &str = "tutti_gio.cu";
/// Entry points of [`GIO_SOURCE`].
pub const KERNEL_ISSUE: &str = "tt_gio_issue";
pub const KERNEL_PERSISTENT: &str = "tt_gio_persistent";
pub const KERNEL_WAIT: &str = "tt_gio_wait";
pub const KERNEL_COPY: &str = "tt_gio_copy";
pub const KERNELS: [&str; 4] = [KERNEL_ISSUE, KERNEL_PERSISTENT, KERNEL_WAIT, KERNEL_COPY];
/// Threads per block the issue kernels are compiled for (`TT_GIO_BLOCK_THREADS`).
pub const GPU_BLOCK_THREADS: u32 = 512;

/// The parameter sizes (bytes, in order) every launcher passes each kernel:
/// `tt_gio_issue(ctx)`, `tt_gio_persistent(ctx)`,
/// `tt_gio_wait(ctx, ids, seqs, n, timeout_ns, done)`, `tt_gio_copy(pairs, n, bytes)`.
/// The cubin's own parameter tables must match (`kernels/tests/sass.rs`).
pub const KERNEL_PARAMS: [(&str, &[u32]); 4] = [
    (KERNEL_ISSUE, &[8]),
    (KERNEL_PERSISTENT, &[8]),
    (KERNEL_WAIT, &[8, 8, 8, 4, 8, 8]),
    (KERNEL_COPY, &[8, 4, 8]),
];
