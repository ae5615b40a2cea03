//! The doorbell relay: NVMe doorbells rung by a host thread on the kernels' behalf.
//!
//! An executor normally maps a drive's doorbell registers (a BAR page) so its
//! kernels store SQ tails and CQ heads into them directly. Where that mapping
//! cannot be made — `cuMemHostRegister(.., IOMEMORY)` of a BAR is refused by
//! recent kernels and drivers — the executor maps a **mailbox** instead: one
//! word of ordinary page-aligned host memory per doorbell. The kernels are
//! unchanged (`tt_fence_system()` then `tt_st_mmio_u32(db, value)`); they
//! store into the mailbox, and the relay thread of a [`DoorbellRelay`] moves
//! each new value to the real register. The CPU is back on the per-batch
//! path (one store per doorbell write, not per command), at the cost of one
//! polling host thread and the relay's latency.
//!
//! # Using it from an executor
//!
//! 1. [`DoorbellRelay::new`] once, at the executor's construction. Its
//!    mailboxes live in one page-aligned region, [`DoorbellRelay::mailboxes`]:
//!    an executor that needs a device address registers that region once (the
//!    CUDA executor: `cuMemHostRegister(DEVICEMAP)`, then
//!    `cuMemHostGetDevicePointer`) and translates a mailbox by its
//!    [`Watch::offset`] in the region.
//! 2. In `map_host(ptr, 4, HostRange::Io)` (or `Executor::map_doorbell`), call
//!    [`DoorbellRelay::watch`] for the doorbell and return a mapping that
//!    holds the [`Watch`] and answers the mailbox's executor address. Dropping
//!    the `Watch` stops the relay from touching the doorbell.
//! 3. `Executor::flush_doorbells` calls [`DoorbellRelay::flush`]: queue
//!    recovery uses it before it deletes queue pairs, so no tail stored by a
//!    kernel reaches a recreated queue.
//!
//! # Mailbox protocol
//!
//! A mailbox holds [`MAILBOX_IDLE`] (`u32::MAX`) when there is nothing to
//! forward. The kernel's store replaces it with the doorbell value; the relay
//! takes the value with an atomic swap back to idle (acquire) and writes it
//! to the doorbell (a release fence and a volatile store for a BAR, a release
//! store for an emulated controller's register word). Doorbell values are
//! queue indices below 65536 (§4.1: a queue has at most 64 Ki entries), so
//! no real value is mistaken for idle. The kernels never read their
//! doorbells, so the mailbox need not hold the doorbell's value: it is
//! written, never read back, like the register. Initial value: idle, which
//! stands for "the register still holds its reset value (0)".
//!
//! Detecting *writes* rather than *changes* matters: after a queue recovery
//! the controller's tail is 0 again while the last relayed value was, say, 5;
//! a kernel that then publishes exactly five entries stores 5 again, and a
//! change detector would never forward it (the commands would time out).
//!
//! # Ordering
//!
//! - SQ entry before its doorbell: the kernel publishes the entries with a
//!   system-scope release (`tt_fence_system`) before the mailbox store; the
//!   relay's acquire swap sees them, and its release (fence or store) before
//!   the doorbell write orders them before the device can see the doorbell.
//!   On a GPU the entries are posted PCIe writes to host memory ahead of the
//!   mailbox write in the same order, so they have landed when the CPU sees
//!   the mailbox.
//! - One doorbell's values: each swap takes the newest value in the word's
//!   modification order, so the relay writes a subsequence of what the kernel
//!   wrote, in order. Skipping intermediate values is what a batched doorbell
//!   is (§4.1: the tail names the next free slot; every entry before it is
//!   submitted). It cannot alias: the SQ tail can advance by at most depth-1
//!   beyond the last tail the controller saw (slots are freed only by the
//!   SQHD the controller reports), and the CQ head by at most depth-1 beyond
//!   the last head it saw (the controller posts no more than that).
//! - The relay only ever delays a store, never makes one early, and a late
//!   doorbell is always allowed: a late tail delays commands, a late head
//!   delays the reuse of completion slots (the controller waits while the CQ
//!   is full, §4.1).
//! - SQ tail against CQ head, and across queues: no order is kept and none is
//!   needed. The two registers are independent (§3.1 SQyTDBL, CQyHDBL): a CQ head frees
//!   completion slots, a tail offers commands, and in direct mode different
//!   lanes write them concurrently, so the controller already sees them in
//!   any interleaving. The relay scans the mailboxes in watch order, so an SQ
//!   tail and a CQ head the kernel stored in one order are forwarded in that
//!   order unless a later pass picks up the earlier one — harmless by the above.
//!
//! # Costs and bounds
//!
//! The relay thread spins over the mailboxes while doorbells keep coming, then
//! after [`RelayConfig::spin_passes`] idle passes sleeps for 1 µs doubling up
//! to [`RelayConfig::max_sleep`] (Linux adds its timer slack, ~50 µs, to every
//! sleep). A doorbell written while the thread sleeps waits at most one sleep.
//! An idle relay wakes up about every `max_sleep` + slack (some 15 000 times a
//! second with the defaults): a few percent of one core, for as long as the
//! relay lives. Every pass is bounded by the number of mailboxes; unwatch and
//! flush wait at most for the pass in progress, stop for one pass and one
//! sleep (given up, with an error, after 5 s).
//!
//! # What is verified, and how
//!
//! The host executor's [`DoorbellMode::Relay`] runs every kernel doorbell
//! through a relay against emulated controllers (`gio_uring/tests/relay.rs`,
//! launch and persistent mode, recovery, a stopped relay);
//! `benches/doorbell_relay.rs` measures it against direct doorbells on the
//! host. No GPU has run it: the PCIe ordering argument above is from the
//! CUDA and PCIe ordering rules, not from a measurement.

use crate::error::{GioError, Result};
use crate::mem::HostMemory;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tutti_driver::transport::DoorbellKind;

/// The value of a mailbox with nothing to forward.
pub const MAILBOX_IDLE: u32 = u32::MAX;

/// Bytes between two mailboxes: one cache line each, so lanes ringing
/// different doorbells do not share a line.
pub const MAILBOX_STRIDE: usize = 64;

/// Longest `stop` waits for the relay thread to leave.
const STOP_DEADLINE: Duration = Duration::from_secs(5);

/// How an executor's kernels ring NVMe doorbells.
#[derive(Clone, Debug, Default)]
pub enum DoorbellMode {
    /// They store into the doorbell registers themselves.
    #[default]
    Direct,
    /// They store into mailboxes a [`DoorbellRelay`] thread forwards. The host
    /// executor relays every doorbell (BAR or emulated register), so the
    /// fallback runs against emulated controllers.
    Relay(RelayConfig),
}

/// Tunables of a [`DoorbellRelay`].
#[derive(Clone, Debug)]
pub struct RelayConfig {
    /// Mailboxes (doorbells) the relay can watch at once; two per queue pair.
    pub capacity: usize,
    /// Idle passes the thread spins before it starts to sleep.
    pub spin_passes: u32,
    /// Longest sleep between idle passes (the relay's worst added latency).
    pub max_sleep: Duration,
}

impl Default for RelayConfig {
    /// 256 doorbells (128 queue pairs, four pages); 64 idle passes; sleeps up to 20 µs.
    fn default() -> Self {
        RelayConfig { capacity: 256, spin_passes: 64, max_sleep: Duration::from_micros(20) }
    }
}

/// Counters of a [`DoorbellRelay`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Doorbell writes made on the kernels' behalf.
    pub relayed: u64,
    /// Times the thread slept and woke up again.
    pub wakeups: u64,
    /// Passes over the mailboxes.
    pub passes: u64,
    /// Doorbells watched now.
    pub watched: usize,
    /// Whether the relay thread runs.
    pub running: bool,
}

struct Entry {
    slot: usize,
    doorbell: NonNull<u32>,
    kind: DoorbellKind,
    /// The emulated controller's wake word (in the doorbell's register file).
    wake: Option<NonNull<u32>>,
    relayed: Arc<AtomicU64>,
}

struct Registry {
    entries: Vec<Entry>,
    used: Vec<bool>,
}

// SAFETY: the doorbell pointers name registers (or emulated register words) that the
// watcher guarantees stay valid while their entry is registered; they are only stored to,
// with single 32-bit volatile or atomic stores, under the registry lock.
unsafe impl Send for Registry {}

struct Shared {
    region: HostMemory,
    capacity: usize,
    registry: Mutex<Registry>,
    stop: AtomicBool,
    running: AtomicBool,
    relayed: AtomicU64,
    wakeups: AtomicU64,
    passes: AtomicU64,
}

impl Shared {
    fn registry(&self) -> Result<MutexGuard<'_, Registry>> {
        self.registry.lock().map_err(|_| relay_err("the mailbox registry lock is poisoned"))
    }

    fn mailbox(&self, slot: usize) -> &AtomicU32 {
        debug_assert!(slot < self.capacity);
        // SAFETY: `slot < capacity` and the region holds `capacity * MAILBOX_STRIDE` bytes,
        // page aligned, so the word is in bounds and 4-byte aligned; the region lives as long
        // as `self`, and every access to a mailbox word (host or executor) is atomic.
        unsafe { AtomicU32::from_ptr(self.region.as_ptr().add(slot * MAILBOX_STRIDE).cast()) }
    }

    /// Forwards a pending value of `e`'s mailbox to its doorbell; true if one was.
    /// Called with the registry lock held (the entry is registered).
    fn forward(&self, e: &Entry) -> bool {
        let mailbox = self.mailbox(e.slot);
        // A plain load first: an idle pass reads the lines and leaves them shared.
        if mailbox.load(Ordering::Relaxed) == MAILBOX_IDLE {
            return false;
        }
        // Acquire: the queue entries the kernel released before its store are visible.
        let value = mailbox.swap(MAILBOX_IDLE, Ordering::Acquire);
        if value == MAILBOX_IDLE {
            return false;
        }
        match e.kind {
            DoorbellKind::Mmio => {
                // Everything seen through the swap reaches memory before the device sees the doorbell.
                fence(Ordering::Release);
                // SAFETY: a 4-byte aligned register of a live BAR mapping (the watcher's contract,
                // the entry is registered while we hold the lock).
                unsafe { e.doorbell.as_ptr().write_volatile(value) }
            }
            DoorbellKind::Memory => {
                // SAFETY: a 4-byte aligned word of an emulated register file, valid while the
                // entry is registered; the emulated controller reads it atomically.
                unsafe { AtomicU32::from_ptr(e.doorbell.as_ptr()) }.store(value, Ordering::Release);
                if let Some(w) = e.wake {
                    // SAFETY: a word of the same register file as the doorbell, as valid.
                    tutti_driver::transport::wake::wake_controller(unsafe {
                        AtomicU32::from_ptr(w.as_ptr())
                    });
                }
            }
        }
        e.relayed.fetch_add(1, Ordering::Relaxed);
        self.relayed.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// One pass over every watched mailbox; how many doorbells it wrote.
    fn pass(&self) -> Result<u64> {
        let reg = self.registry()?;
        let n = reg.entries.iter().map(|e| u64::from(self.forward(e))).sum();
        self.passes.fetch_add(1, Ordering::Relaxed);
        Ok(n)
    }
}

fn relay_err(what: impl Into<String>) -> GioError {
    GioError::Executor { executor: "doorbell relay".into(), what: what.into() }
}

/// A host thread that forwards doorbell values from mailboxes to doorbell
/// registers (see the module documentation).
pub struct DoorbellRelay {
    shared: Arc<Shared>,
    cfg: RelayConfig,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl DoorbellRelay {
    /// Allocates the mailbox region and starts the relay thread.
    pub fn new(cfg: RelayConfig) -> Result<Self> {
        if cfg.capacity == 0 || cfg.capacity > 65536 {
            return Err(GioError::invalid(format!(
                "doorbell relay capacity {} is not in 1..=65536 doorbells",
                cfg.capacity
            )));
        }
        if cfg.max_sleep.is_zero() || cfg.max_sleep > Duration::from_millis(10) {
            return Err(GioError::invalid(format!(
                "doorbell relay max_sleep {:?} is not in 1 ns..=10 ms (it bounds the relay's latency)",
                cfg.max_sleep
            )));
        }
        let region = HostMemory::new(cfg.capacity * MAILBOX_STRIDE)?;
        let shared = Arc::new(Shared {
            region,
            capacity: cfg.capacity,
            registry: Mutex::new(Registry { entries: Vec::new(), used: vec![false; cfg.capacity] }),
            stop: AtomicBool::new(false),
            running: AtomicBool::new(true),
            relayed: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
            passes: AtomicU64::new(0),
        });
        for slot in 0..cfg.capacity {
            shared.mailbox(slot).store(MAILBOX_IDLE, Ordering::Relaxed);
        }
        let worker = shared.clone();
        let (spin, max_sleep) = (cfg.spin_passes, cfg.max_sleep);
        let thread = std::thread::Builder::new()
            .name("tutti-doorbell-relay".into())
            .spawn(move || run(&worker, spin, max_sleep))
            .map_err(|e| relay_err(format!("cannot start the relay thread: {e}")))?;
        tracing::info!(capacity = cfg.capacity, max_sleep = ?cfg.max_sleep, "doorbell relay started");
        Ok(DoorbellRelay { shared, cfg, thread: Mutex::new(Some(thread)) })
    }

    pub fn config(&self) -> &RelayConfig {
        &self.cfg
    }

    /// The mailbox region: page-aligned host memory, `capacity * MAILBOX_STRIDE`
    /// bytes rounded up to pages, valid while the relay or any [`Watch`] lives.
    /// An executor that needs a device address for a mailbox maps this region
    /// once and adds [`Watch::offset`].
    pub fn mailboxes(&self) -> (*mut u8, usize) {
        use crate::mem::ExecMemory;
        (self.shared.region.as_ptr(), self.shared.region.len())
    }

    /// Starts relaying `doorbell`: returns the mailbox the kernels store into
    /// instead. The relay never touches the doorbell after the `Watch` is dropped.
    ///
    /// # Safety
    /// `doorbell` must be a 4-byte aligned doorbell register (a BAR mapping for
    /// [`DoorbellKind::Mmio`], an emulated register word for
    /// [`DoorbellKind::Memory`]) that stays valid until the `Watch` is dropped.
    pub unsafe fn watch(&self, doorbell: NonNull<u32>, kind: DoorbellKind) -> Result<Watch> {
        if !doorbell.as_ptr().is_aligned() {
            return Err(GioError::invalid(format!("doorbell {doorbell:p} is not 4-byte aligned")));
        }
        let mut reg = self.shared.registry()?;
        let slot = reg.used.iter().position(|u| !u).ok_or_else(|| {
            relay_err(format!("all {} mailboxes are in use (RelayConfig::capacity)", self.shared.capacity))
        })?;
        reg.used[slot] = true;
        self.shared.mailbox(slot).store(MAILBOX_IDLE, Ordering::Relaxed);
        let relayed = Arc::new(AtomicU64::new(0));
        let wake = match kind {
            DoorbellKind::Memory => tutti_driver::transport::wake::wake_word_of(doorbell.as_ptr()),
            DoorbellKind::Mmio => None,
        };
        reg.entries.push(Entry { slot, doorbell, kind, wake, relayed: relayed.clone() });
        tracing::debug!(slot, doorbell = ?doorbell, ?kind, "doorbell relayed");
        Ok(Watch { shared: self.shared.clone(), slot, relayed })
    }

    /// Forwards every pending mailbox value now, on the calling thread. When it
    /// returns, every doorbell value stored before the call has reached its
    /// register, whether or not the relay thread runs. Waits at most for the
    /// relay thread's current pass.
    pub fn flush(&self) -> Result<u64> {
        let n = self.shared.pass()?;
        if n > 0 {
            tracing::debug!(forwarded = n, "doorbell relay flushed");
        }
        Ok(n)
    }

    pub fn stats(&self) -> RelayStats {
        let s = &self.shared;
        RelayStats {
            relayed: s.relayed.load(Ordering::Relaxed),
            wakeups: s.wakeups.load(Ordering::Relaxed),
            passes: s.passes.load(Ordering::Relaxed),
            watched: s.registry().map(|r| r.entries.len()).unwrap_or(0),
            running: s.running.load(Ordering::Acquire),
        }
    }

    /// Stops the relay thread and waits for it (bounded). Mailbox stores made
    /// afterwards reach no doorbell until [`flush`](Self::flush); stopping
    /// twice is fine.
    pub fn stop(&self) -> Result<()> {
        self.shared.stop.store(true, Ordering::Release);
        let handle = self.thread.lock().map_err(|_| relay_err("the thread handle lock is poisoned"))?.take();
        let Some(handle) = handle else { return Ok(()) };
        let deadline = Instant::now() + STOP_DEADLINE;
        while !handle.is_finished() {
            if Instant::now() >= deadline {
                // The thread keeps its own reference to the mailboxes and touches doorbells
                // only under the registry lock, so leaving it is safe; it exits at its next pass.
                tracing::error!(waited = ?STOP_DEADLINE, "the doorbell relay thread did not stop; left running");
                return Err(relay_err(format!("the relay thread did not stop within {STOP_DEADLINE:?}")));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        handle.join().map_err(|_| relay_err("the relay thread panicked"))?;
        tracing::info!(relayed = self.shared.relayed.load(Ordering::Relaxed), "doorbell relay stopped");
        Ok(())
    }
}

impl Drop for DoorbellRelay {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            tracing::warn!(error = %e, "stopping the doorbell relay failed");
        }
    }
}

/// The relay thread: passes over the mailboxes, spinning while doorbells come,
/// sleeping (bounded, exponential) when idle.
fn run(s: &Shared, spin_passes: u32, max_sleep: Duration) {
    let mut idle: u32 = 0;
    let mut sleep = Duration::from_micros(1).min(max_sleep);
    while !s.stop.load(Ordering::Acquire) {
        match s.pass() {
            Ok(0) => {}
            Ok(_) => {
                idle = 0;
                sleep = Duration::from_micros(1).min(max_sleep);
                continue;
            }
            Err(e) => {
                tracing::error!(error = %e, "the doorbell relay thread stops");
                break;
            }
        }
        if idle < spin_passes {
            idle += 1;
            std::hint::spin_loop();
            continue;
        }
        std::thread::sleep(sleep);
        s.wakeups.fetch_add(1, Ordering::Relaxed);
        sleep = (sleep * 2).min(max_sleep);
    }
    s.running.store(false, Ordering::Release);
}

/// One doorbell being relayed; dropping it stops the relay from touching the doorbell.
pub struct Watch {
    shared: Arc<Shared>,
    slot: usize,
    relayed: Arc<AtomicU64>,
}

impl Watch {
    /// Host address of the mailbox word the kernels store into.
    pub fn mailbox(&self) -> NonNull<u32> {
        NonNull::from(self.shared.mailbox(self.slot)).cast()
    }
    /// Byte offset of the mailbox in [`DoorbellRelay::mailboxes`].
    pub fn offset(&self) -> usize {
        self.slot * MAILBOX_STRIDE
    }
    /// Doorbell writes made for this doorbell.
    pub fn relayed(&self) -> u64 {
        self.relayed.load(Ordering::Relaxed)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        // Under the lock: once removed, no pass can write this doorbell again. A value still
        // pending is dropped: the executor that stored it is stopped, nobody waits for it.
        match self.shared.registry() {
            Ok(mut reg) => {
                reg.entries.retain(|e| e.slot != self.slot);
                if let Some(u) = reg.used.get_mut(self.slot) {
                    *u = false;
                }
                let pending = self.shared.mailbox(self.slot).swap(MAILBOX_IDLE, Ordering::Relaxed);
                if pending != MAILBOX_IDLE {
                    tracing::debug!(slot = self.slot, pending, "unwatched a doorbell with a value pending");
                }
            }
            Err(e) => tracing::error!(slot = self.slot, error = %e, "cannot unwatch a relayed doorbell"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relay() -> DoorbellRelay {
        DoorbellRelay::new(RelayConfig { capacity: 4, ..Default::default() }).unwrap()
    }

    fn store(w: &Watch, v: u32) {
        // SAFETY: the mailbox is a live, aligned word of the relay's region.
        unsafe { AtomicU32::from_ptr(w.mailbox().as_ptr()) }.store(v, Ordering::Release);
    }

    fn wait_for(word: &AtomicU32, v: u32) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while word.load(Ordering::Acquire) != v {
            assert!(Instant::now() < deadline, "doorbell never became {v}");
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    #[test]
    fn forwards_every_write_even_of_an_unchanged_value() {
        let r = relay();
        let db = AtomicU32::new(0);
        // SAFETY: `db` outlives the watch.
        let w = unsafe { r.watch(NonNull::from(&db).cast(), DoorbellKind::Memory) }.unwrap();
        store(&w, 5);
        wait_for(&db, 5);
        // The controller's register is reset (queue recreated); the kernel stores 5 again.
        db.store(0, Ordering::Release);
        store(&w, 5);
        wait_for(&db, 5);
        // The pass that wrote the doorbell counts it before it releases the registry.
        assert_eq!(r.flush().unwrap(), 0);
        assert_eq!(w.relayed(), 2);
        assert_eq!(r.stats().relayed, 2);
    }

    #[test]
    fn flush_forwards_on_the_caller_when_the_thread_is_stopped() {
        let r = relay();
        r.stop().unwrap();
        assert!(!r.stats().running);
        let db = AtomicU32::new(0);
        // SAFETY: `db` outlives the watch.
        let w = unsafe { r.watch(NonNull::from(&db).cast(), DoorbellKind::Mmio) }.unwrap();
        store(&w, 9);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(db.load(Ordering::Acquire), 0, "a stopped relay forwarded");
        assert_eq!(r.flush().unwrap(), 1);
        assert_eq!(db.load(Ordering::Acquire), 9);
    }

    #[test]
    fn unwatched_doorbells_are_left_alone_and_slots_reused() {
        let r = relay();
        let dbs: Vec<AtomicU32> = (0..4).map(|_| AtomicU32::new(0)).collect();
        let mut ws: Vec<Watch> = dbs
            .iter()
            // SAFETY: the doorbells outlive the watches.
            .map(|d| unsafe { r.watch(NonNull::from(d).cast(), DoorbellKind::Memory) }.unwrap())
            .collect();
        let extra = AtomicU32::new(0);
        // SAFETY: as above.
        let full = unsafe { r.watch(NonNull::from(&extra).cast(), DoorbellKind::Memory) };
        assert!(full.err().unwrap().to_string().contains("all 4 mailboxes are in use"));
        let gone = ws.remove(1);
        let mailbox = gone.mailbox();
        drop(gone);
        // SAFETY: the region outlives the relay; the word is idle and unwatched.
        unsafe { AtomicU32::from_ptr(mailbox.as_ptr()) }.store(7, Ordering::Release);
        r.flush().unwrap();
        assert_eq!(dbs[1].load(Ordering::Acquire), 0, "an unwatched doorbell was written");
        assert_eq!(r.stats().watched, 3);
        // SAFETY: as above.
        let again = unsafe { r.watch(NonNull::from(&extra).cast(), DoorbellKind::Memory) }.unwrap();
        assert_eq!(again.offset(), MAILBOX_STRIDE, "the freed slot is reused");
    }

    #[test]
    fn bad_configs_are_refused() {
        let e = DoorbellRelay::new(RelayConfig { capacity: 0, ..Default::default() }).err().unwrap();
        assert!(e.to_string().contains("capacity 0"), "{e}");
        let e = DoorbellRelay::new(RelayConfig { max_sleep: Duration::ZERO, ..Default::default() })
            .err()
            .unwrap();
        assert!(e.to_string().contains("max_sleep"), "{e}");
    }
}
