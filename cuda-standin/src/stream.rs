//! Streams and events: each stream is a FIFO of device work run by its own
//! worker thread (the stand-in's "GPU"), in order, each operation after the
//! operations it depends on.
//!
//! Ordering between streams (CUDA driver API, Stream synchronization behavior):
//! work on the legacy default stream waits for earlier work of every blocking
//! stream (flags 0) of its context, and work on a blocking stream waits for
//! earlier legacy-stream work. CU_STREAM_NON_BLOCKING streams are ordered with
//! neither. Writes on the legacy stream land `landing_delay` after they were
//! issued, so a kernel on a non-blocking stream can start before they land.

use crate::device::{ledger, progress};
use crate::residency::{self, Need};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tutti_kernels::host::{HostArgs, HostKernel, HostLaunch};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StreamKind {
    Legacy,
    Blocking,
    NonBlocking,
}

/// An event's record count, how many of those records were reached, and when the
/// last one reached was.
#[derive(Default)]
pub(crate) struct Event {
    state: Mutex<EventState>,
}

#[derive(Default)]
struct EventState {
    recorded: u64,
    reached: u64,
    reached_at: Option<Instant>,
}

impl Event {
    pub fn new() -> Arc<Event> {
        Arc::new(Event::default())
    }
    fn lock(&self) -> MutexGuard<'_, EventState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
    /// A new record; returns its generation.
    pub fn record(&self) -> u64 {
        let mut s = self.lock();
        s.recorded += 1;
        s.recorded
    }
    pub fn recorded(&self) -> u64 {
        self.lock().recorded
    }
    pub fn reached(&self, generation: u64) -> bool {
        self.lock().reached >= generation
    }
    /// When its latest record was reached: None if it was never recorded, or its latest
    /// record has not been reached yet (cuEventElapsedTime's NOT_READY).
    pub fn latest_reached_at(&self) -> Option<Option<Instant>> {
        let s = self.lock();
        if s.recorded == 0 {
            return None;
        }
        Some(if s.reached >= s.recorded { s.reached_at } else { None })
    }
    fn complete(&self, generation: u64) {
        let mut s = self.lock();
        if generation > s.reached {
            s.reached = generation;
            s.reached_at = Some(Instant::now());
        }
    }
}

/// Something an operation waits for before it runs.
pub(crate) enum Dep {
    /// The stream's operations up to this sequence number.
    Stream(Arc<Stream>, u64),
    Event(Arc<Event>, u64),
}

impl Dep {
    fn met(&self) -> bool {
        match self {
            Dep::Stream(s, seq) => s.completed() >= *seq,
            Dep::Event(e, generation) => e.reached(*generation),
        }
    }
}

/// A host buffer a waiting caller may give up on: the worker writes it only
/// while the caller still waits.
pub(crate) struct HostTarget {
    pub ptr: usize,
    /// (done, abandoned)
    pub state: Mutex<(bool, bool)>,
}

/// A kernel launch as the worker runs it.
pub(crate) struct Launch {
    pub ticket: u64,
    pub kernel: HostKernel,
    pub ctx: usize,
    pub sms: Vec<u32>,
    pub grid: u32,
    pub block: u32,
    pub need: Need,
    pub regs_per_sm: u32,
    pub args: HostArgs,
}

/// A legacy-stream write to device memory: it lands `delay` after it was issued
/// (the `landing_delay` knob when it was enqueued); `ticket` is its issue order.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Landing {
    pub ticket: u64,
    pub delay: Duration,
}

pub(crate) enum Work {
    Launch(Launch),
    /// Bytes copied at the call (pageable source).
    Write {
        dst: usize,
        data: Vec<u8>,
        landing: Option<Landing>,
    },
    Fill {
        dst: usize,
        value: u8,
        len: usize,
        landing: Option<Landing>,
    },
    /// Device (or pinned) to device (or pinned), read when the operation runs.
    Copy {
        dst: usize,
        src: usize,
        len: usize,
    },
    /// Device to a host buffer the caller waits on.
    Read {
        dst: Arc<HostTarget>,
        src: usize,
        len: usize,
    },
    Record(Arc<Event>, u64),
    Marker,
}

// SAFETY: the raw pointers inside (kernel arguments, buffer addresses) are device addresses
// the caller handed to the driver; the worker is the only thread that uses them.
unsafe impl Send for Work {}

struct Op {
    seq: u64,
    deps: Vec<Dep>,
    work: Work,
    issued: Instant,
    what: String,
}

#[derive(Default)]
struct Queue {
    ops: VecDeque<Op>,
    enqueued: u64,
    completed: u64,
    destroyed: bool,
    running: Option<String>,
    /// A failed operation's error: every later query reports it (sticky).
    error: Option<String>,
}

pub(crate) struct Stream {
    pub handle: usize,
    pub ctx: usize,
    pub kind: StreamKind,
    q: Mutex<Queue>,
    cv: Condvar,
}

impl Stream {
    pub fn new(handle: usize, ctx: usize, kind: StreamKind) -> Arc<Stream> {
        let s = Arc::new(Stream { handle, ctx, kind, q: Mutex::default(), cv: Condvar::new() });
        let worker = s.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("cuda-standin stream {handle:#x}"))
            .spawn(move || worker.run());
        if let Err(e) = spawned {
            s.lock().error = Some(format!("cannot start the stream's worker thread: {e}"));
        }
        s
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.q.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn enqueued(&self) -> u64 {
        self.lock().enqueued
    }

    pub fn completed(&self) -> u64 {
        self.lock().completed
    }

    /// Idle (everything enqueued has run), or the sticky error.
    pub fn idle(&self) -> Result<bool, String> {
        let q = self.lock();
        match &q.error {
            Some(e) => Err(e.clone()),
            None => Ok(q.completed == q.enqueued),
        }
    }

    /// Work enqueued has not all run yet.
    pub fn busy(&self) -> bool {
        let q = self.lock();
        q.completed < q.enqueued
    }

    /// What the stream is running now, for messages.
    pub fn running(&self) -> Option<String> {
        self.lock().running.clone()
    }

    /// Appends `work`; returns its sequence number.
    pub fn enqueue(&self, deps: Vec<Dep>, work: Work, what: String) -> u64 {
        let mut q = self.lock();
        q.enqueued += 1;
        let seq = q.enqueued;
        q.ops.push_back(Op { seq, deps, work, issued: Instant::now(), what });
        drop(q);
        self.cv.notify_all();
        seq
    }

    /// No more work after what is queued; the worker leaves once it ran.
    pub fn destroy(&self) {
        self.lock().destroyed = true;
        self.cv.notify_all();
    }

    fn run(self: Arc<Self>) {
        loop {
            let op = {
                let mut q = self.lock();
                loop {
                    if let Some(op) = q.ops.pop_front() {
                        q.running = Some(op.what.clone());
                        break op;
                    }
                    if q.destroyed {
                        return;
                    }
                    q = self
                        .cv
                        .wait_timeout(q, Duration::from_millis(50))
                        .map(|r| r.0)
                        .unwrap_or_else(|p| p.into_inner().0);
                }
            };
            let progress = progress();
            while !op.deps.iter().all(Dep::met) {
                progress.nap(Duration::from_millis(2));
            }
            let result = execute(op.work, op.issued);
            let mut q = self.lock();
            q.completed = op.seq;
            q.running = None;
            if let Err(e) = result {
                tracing::warn!(stream = self.handle, error = %e, "CUDA stand-in: device work failed");
                q.error.get_or_insert(format!("{}: {e}", op.what));
            }
            drop(q);
            progress.notify();
        }
    }
}

/// Sleeps until `issued + delay` (a legacy-stream write lands).
fn land(issued: Instant, delay: Duration) {
    let at = issued + delay;
    let now = Instant::now();
    if at > now {
        std::thread::sleep(at - now);
    }
}

/// Records the landing of the write issued as `id`.
fn landed(id: u64) {
    let mut l = ledger();
    if let Some(w) = l.pending_writes.remove(&id) {
        if w.overtaken {
            l.stats.late_landings += 1;
        }
    }
}

fn execute(work: Work, issued: Instant) -> Result<(), String> {
    match work {
        Work::Launch(l) => run_launch(&l),
        Work::Write { dst, data, landing } => {
            if let Some(l) = landing {
                land(issued, l.delay);
            }
            // SAFETY: `dst .. dst + len` was checked to lie inside an allocation at the call.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst as *mut u8, data.len()) };
            if let Some(l) = landing {
                landed(l.ticket);
            }
            Ok(())
        }
        Work::Fill { dst, value, len, landing } => {
            if let Some(l) = landing {
                land(issued, l.delay);
            }
            // SAFETY: checked to lie inside an allocation at the call.
            unsafe { std::ptr::write_bytes(dst as *mut u8, value, len) };
            if let Some(l) = landing {
                landed(l.ticket);
            }
            Ok(())
        }
        Work::Copy { dst, src, len } => {
            // SAFETY: both ranges checked at the call; `copy` allows overlap.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
            Ok(())
        }
        Work::Read { dst, src, len } => {
            let mut s = dst.state.lock().unwrap_or_else(|p| p.into_inner());
            if !s.1 {
                // SAFETY: the source was checked at the call; the caller still waits (not
                // abandoned), so its buffer of `len` bytes is live.
                unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.ptr as *mut u8, len) };
            }
            s.0 = true;
            Ok(())
        }
        Work::Record(e, generation) => {
            e.complete(generation);
            Ok(())
        }
        Work::Marker => Ok(()),
    }
}

/// A block running on an SM.
struct Resident {
    launch: HostLaunch,
    sm: u32,
}

/// Runs a launch block by block as SMs of its context have room.
fn run_launch(l: &Launch) -> Result<(), String> {
    {
        // Legacy-stream writes issued before this launch and not landed yet: this kernel is not
        // ordered after them, so it may read what they overwrite.
        let mut ledger = ledger();
        let mut overtook = false;
        for w in ledger.pending_writes.values_mut().filter(|w| w.ticket < l.ticket) {
            w.overtaken = true;
            overtook = true;
        }
        if overtook {
            ledger.stats.launches_before_landing += 1;
        }
    }
    let progress = progress();
    let mut next = 0u32;
    let mut running: Vec<Resident> = Vec::new();
    let mut failed: Option<String> = None;
    loop {
        let before = running.len();
        running.retain(|r| {
            if r.launch.finished() {
                residency::leave(r.sm, l.need, l.ctx);
                false
            } else {
                true
            }
        });
        let left = before - running.len();
        if left > 0 {
            progress.notify();
        }
        while next < l.grid && failed.is_none() {
            let Some(sm) = residency::try_place(&l.sms, l.need, l.regs_per_sm, l.ctx) else { break };
            // SAFETY: the arguments are device addresses the launcher vouched for (cuLaunchKernel's
            // contract); the block is joined before this function returns.
            match unsafe { HostLaunch::start_blocks(l.kernel, l.grid, next, 1, l.block, l.args) } {
                Ok(launch) => {
                    running.push(Resident { launch, sm });
                    next += 1;
                }
                Err(e) => {
                    residency::leave(sm, l.need, l.ctx);
                    failed = Some(e.to_string());
                }
            }
        }
        if running.is_empty() && (next == l.grid || failed.is_some()) {
            break;
        }
        progress.nap(Duration::from_millis(if left > 0 { 0 } else { 2 }));
    }
    ledger().stats.blocks_run += u64::from(next);
    failed.map_or(Ok(()), Err)
}

/// A waiting caller gives up on a read: the worker will not write its buffer.
pub(crate) fn abandon(t: &HostTarget) -> bool {
    let mut s = t.state.lock().unwrap_or_else(|p| p.into_inner());
    if s.0 {
        return false;
    }
    s.1 = true;
    true
}

pub(crate) fn read_done(t: &HostTarget) -> bool {
    t.state.lock().unwrap_or_else(|p| p.into_inner()).0
}
