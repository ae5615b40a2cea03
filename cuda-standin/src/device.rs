//! What device work (the streams' worker threads) shares with the calls that
//! enqueue it: progress notifications, the legacy-stream writes that have not
//! landed yet, and the counters tests read. Kept apart from the driver's state
//! (`driver.rs`) so that the workers never take the driver lock: calls that
//! hold it may take the ledger's lock, never the other way round.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Counters tests read (`tt_standin_stat`).
#[derive(Clone, Debug, Default)]
pub(crate) struct Stats {
    pub launches: u64,
    pub blocks_run: u64,
    /// Writes on a legacy stream (memset, copy) to device memory.
    pub legacy_writes: u64,
    /// Legacy-stream writes that landed after a kernel not ordered after them
    /// had started (the kernel could have read the old bytes).
    pub late_landings: u64,
    /// Kernels that started while a legacy-stream write issued before their
    /// launch had not landed yet.
    pub launches_before_landing: u64,
}

/// A legacy-stream write that has not landed yet.
pub(crate) struct PendingWrite {
    /// Issue order among all enqueued device work.
    pub ticket: u64,
    pub overtaken: bool,
}

/// The legacy-stream writes not landed yet, by issue ticket, and the counters.
#[derive(Default)]
pub(crate) struct Ledger {
    pub pending_writes: HashMap<u64, PendingWrite>,
    pub stats: Stats,
}

/// The ledger, also after a panic elsewhere poisoned its lock.
pub(crate) fn ledger() -> MutexGuard<'static, Ledger> {
    static LEDGER: OnceLock<Mutex<Ledger>> = OnceLock::new();
    LEDGER.get_or_init(Mutex::default).lock().unwrap_or_else(|p| p.into_inner())
}

/// Where waiters for device work sleep.
pub(crate) fn progress() -> &'static Progress {
    static PROGRESS: OnceLock<Progress> = OnceLock::new();
    PROGRESS.get_or_init(|| Progress { generation: Mutex::new(0), cv: Condvar::new() })
}

/// Wakes waiters whenever device work makes progress (an operation
/// completes, a block leaves an SM). Waiters also wake every few
/// milliseconds, so a missed notification costs time, never a hang.
pub(crate) struct Progress {
    generation: Mutex<u64>,
    cv: Condvar,
}

impl Progress {
    pub fn notify(&self) {
        if let Ok(mut g) = self.generation.lock() {
            *g = g.wrapping_add(1);
        }
        self.cv.notify_all();
    }

    /// Sleeps until the next notification or `cap`, whichever is first.
    pub fn nap(&self, cap: Duration) {
        let Ok(g) = self.generation.lock() else {
            std::thread::sleep(cap);
            return;
        };
        let seen = *g;
        let _ = self.cv.wait_timeout_while(g, cap, |g| *g == seen);
    }

    /// Waits until `done()` or `deadline`; true if done.
    pub fn wait_until(&self, deadline: Instant, mut done: impl FnMut() -> bool) -> bool {
        loop {
            if done() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            self.nap((deadline - now).min(Duration::from_millis(2)));
        }
    }
}
