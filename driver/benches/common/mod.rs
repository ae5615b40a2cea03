//! What the driver's benches share: a batch of 4 KiB Reads submitted and reaped with every
//! error surfaced and every wait bounded, and the io_uring NOP baseline. Also compiled into
//! `driver/tests/bench_helpers.rs`, which checks that failures come out as errors.

use std::fmt;
use std::time::{Duration, Instant};
use tutti_driver::command::{Command, DataMode};
use tutti_driver::queue::{Completion, IoQueuePair};
use tutti_driver::transport::{DmaBuffer, IovaSegment};

/// How long one batch may take before the bench gives up on it.
pub const BATCH_DEADLINE: Duration = Duration::from_secs(10);

/// Why a batch did not complete.
#[derive(Debug)]
pub enum BatchError {
    /// Submitting command `index` of the batch failed.
    Submit { index: u32, error: String },
    /// Reaping failed (a dead queue, a fatal controller).
    Reap(String),
    /// A command completed with an error status.
    Failed { cid: u16, status: String },
    /// The deadline passed with `got` of `want` completions reaped.
    Deadline { got: usize, want: usize, waited: Duration },
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BatchError::Submit { index, error } => {
                write!(f, "submitting command {index} of the batch: {error}")
            }
            BatchError::Reap(e) => write!(f, "reaping: {e}"),
            BatchError::Failed { cid, status } => write!(f, "command {cid} failed: {status}"),
            BatchError::Deadline { got, want, waited } => {
                write!(f, "{got} of {want} completions after {waited:?}: the rest never came")
            }
        }
    }
}

/// Reaps until `want` completions are in `out` or `deadline` passes; a completion with an error
/// status is an error.
pub fn reap_by(
    qp: &mut IoQueuePair,
    want: usize,
    out: &mut Vec<Completion>,
    deadline: Instant,
) -> Result<(), BatchError> {
    let start = Instant::now();
    let mut spins = 0u32;
    while out.len() < want {
        let before = out.len();
        qp.reap(out).map_err(|e| BatchError::Reap(e.to_string()))?;
        if let Some(c) = out[before..].iter().find(|c| !c.status.is_success()) {
            return Err(BatchError::Failed { cid: c.cid, status: c.status.to_string() });
        }
        if out.len() >= want {
            break;
        }
        if Instant::now() >= deadline {
            return Err(BatchError::Deadline { got: out.len(), want, waited: start.elapsed() });
        }
        spins += 1;
        if spins > 64 {
            std::thread::yield_now();
        }
    }
    Ok(())
}

/// Submits `batch` 4 KiB Reads of namespace 1 (LBAs of 512 bytes: 8 per command) into
/// consecutive pages of `buf`, rings the doorbell once and reaps them all by `deadline`.
pub fn read_batch(
    qp: &mut IoQueuePair,
    buf: &DmaBuffer,
    batch: u32,
    mode: DataMode,
    out: &mut Vec<Completion>,
    deadline: Instant,
) -> Result<usize, BatchError> {
    out.clear();
    for i in 0..batch {
        let seg = [IovaSegment { iova: buf.iova_at(i as usize * 4096), len: 4096 }];
        if let Err(e) = qp.submit_data(Command::read(1, i as u64 * 8, 8), &seg, mode, i as u64) {
            // Publish what was placed so the queue does not keep stranded entries.
            qp.ring();
            return Err(BatchError::Submit { index: i, error: e.to_string() });
        }
    }
    qp.ring();
    reap_by(qp, batch as usize, out, deadline)?;
    Ok(out.len())
}

/// io_uring NOPs, `batch` per `io_uring_enter`: the kernel's floor for a submit→complete.
pub struct NopRing {
    ring: io_uring::IoUring,
}

impl NopRing {
    pub fn new(entries: u32) -> std::io::Result<Self> {
        Ok(NopRing { ring: io_uring::IoUring::new(entries)? })
    }

    /// Submits `batch` NOPs and waits for all of them; any failure is an error.
    pub fn round(&mut self, batch: u32) -> std::io::Result<()> {
        let nop = io_uring::opcode::Nop::new().build();
        for i in 0..batch {
            let e = nop.clone().user_data(u64::from(i));
            // SAFETY: a NOP references no memory.
            unsafe { self.ring.submission().push(&e) }
                .map_err(|_| std::io::Error::other("io_uring SQ full"))?;
        }
        self.ring.submit_and_wait(batch as usize)?;
        let mut got = 0;
        for c in self.ring.completion() {
            if c.result() < 0 {
                return Err(std::io::Error::from_raw_os_error(-c.result()));
            }
            got += 1;
        }
        if got != batch {
            return Err(std::io::Error::other(format!("{got} of {batch} NOP completions")));
        }
        Ok(())
    }
}
