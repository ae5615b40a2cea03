//! What the controller handle and its thread share: configuration,
//! registers, IOMMU, faults, counters and trace timestamps.

use crate::config::EmulatedConfig;
use crate::faults::FaultInjector;
use crate::iommu::EmuIommu;
use crate::regs::RegisterFile;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

/// Counters the controller keeps; read with [`EmulatedController::stats`].
#[derive(Default)]
pub(crate) struct Counters {
    pub commands: AtomicU64,
    pub admin_commands: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub errors: AtomicU64,
    pub dropped_completions: AtomicU64,
    pub late_executions: AtomicU64,
    pub cost_delayed: AtomicU64,
    pub mixed_commands: AtomicU64,
    pub mixed_nanos: AtomicU64,
    pub parks: AtomicU64,
    pub woken: AtomicU64,
}

/// Timestamps of one stretch of work, for a benchmark's breakdown of where a
/// command's time goes ([`EmulatedController::trace_start`]). Off by default:
/// the controller then pays one relaxed load per command.
#[derive(Default)]
pub(crate) struct Trace {
    pub on: AtomicBool,
    /// When the first command after `trace_start` was fetched (monotonic ns, 0 = none yet).
    pub first_fetch_ns: AtomicU64,
    /// When the last completion entry was written.
    pub last_post_ns: AtomicU64,
}

/// What [`EmulatedController::trace_take`] saw, on the clock of [`monotonic_ns`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TraceSpan {
    /// The controller fetched the first command since `trace_start`.
    pub first_fetch_ns: u64,
    /// It wrote the latest completion entry.
    pub last_post_ns: u64,
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of [`TraceSpan`], and the one the
/// host executor stamps IOCBs with, so the two can be compared.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec that we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// State shared by the controller handle and its thread.
pub(crate) struct Shared {
    pub cfg: EmulatedConfig,
    pub regs: Arc<RegisterFile>,
    pub iommu: EmuIommu,
    pub faults: Arc<FaultInjector>,
    pub counters: Counters,
    pub trace: Trace,
    /// Ask the thread to exit.
    pub stop: AtomicBool,
    /// Ask the thread to raise CSTS.CFS and stop processing commands.
    pub fatal: AtomicBool,
}
