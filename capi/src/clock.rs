//! The runtime's monotonic clock, shared by the profiler's and the scheduler's timing hooks.

use std::sync::OnceLock;
use std::time::Instant;

/// Monotonic nanoseconds since the first call in this process.
pub(crate) fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}
