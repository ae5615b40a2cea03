//! Submission/completion queue rings (§4.1, §4.6) driven from Rust.
//!
//! One [`QueueCore`] is a submission queue and the completion queue it posts
//! to. Commands get a CID from a free list; completions are matched by CID
//! (never assumed in order), reaped in batches with one CQ-head doorbell per
//! batch, and the phase tag tells a new entry from an old one. A command whose
//! completion never comes becomes a timeout error naming the queue and CID;
//! its CID stays reserved so that a late completion cannot be mistaken for a
//! new command's.

use super::rings::QueueRings;
use crate::error::{DriverError, Result};
use crate::spec::{CompletionEntry, Status, SubmissionEntry, CQE_SIZE, SQE_SIZE};
use crate::transport::DmaBuffer;
use std::time::{Duration, Instant};

/// A reaped completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub cid: u16,
    pub status: Status,
    /// Command-specific DW0.
    pub dw0: u32,
    /// The caller's token given at submission.
    pub token: u64,
    pub opcode: u8,
}

/// What [`QueueCore::reset`] dropped: the commands that were still without
/// a completion, and completions reaped but not yet handed out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settled {
    /// Commands given up on after a timeout.
    pub abandoned: u32,
    /// Commands submitted and still waited for.
    pub outstanding: u32,
    /// Completions parked by `wait` for other CIDs, now dropped.
    pub parked: u32,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum SlotState {
    Free,
    Busy,
    /// Timed out: the CID stays reserved; a late completion is discarded.
    Abandoned,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    state: SlotState,
    token: u64,
    opcode: u8,
    name: &'static str,
}

/// An SQ/CQ pair with its doorbells and CID bookkeeping.
pub struct QueueCore {
    device: String,
    rings: QueueRings,
    sq_tail: u32,
    published_tail: u32,
    /// Last SQ head the controller reported (SQHD).
    sq_head: u32,
    cq_head: u32,
    phase: bool,
    slots: Vec<Slot>,
    free: Vec<u16>,
    in_flight: u32,
    /// Completions reaped while waiting for another CID.
    parked: Vec<Completion>,
}

impl QueueCore {
    /// Wraps queue memory that has been (or is about to be) registered with
    /// the controller. `depth` entries; at most `depth - 1` commands in flight.
    pub fn new(device: &str, rings: QueueRings) -> Result<Self> {
        let depth = rings.depth;
        if !(2..=65536).contains(&depth) {
            return Err(DriverError::invalid(format!("queue depth {depth} is not 2..=65536")));
        }
        if rings.sq.len() < depth as usize * SQE_SIZE || rings.cq.len() < depth as usize * CQE_SIZE {
            return Err(DriverError::invalid(format!("queue memory too small for {depth} entries")));
        }
        let slots = vec![Slot { state: SlotState::Free, token: 0, opcode: 0, name: "" }; depth as usize - 1];
        // Hand out low CIDs first: pop() takes from the end.
        let free = (0..depth as u16 - 1).rev().collect();
        Ok(QueueCore {
            device: device.to_string(),
            rings,
            sq_tail: 0,
            published_tail: 0,
            sq_head: 0,
            cq_head: 0,
            phase: true,
            slots,
            free,
            in_flight: 0,
            parked: Vec::new(),
        })
    }

    pub fn qid(&self) -> u16 {
        self.rings.qid
    }
    pub fn depth(&self) -> u32 {
        self.rings.depth
    }
    pub fn device(&self) -> &str {
        &self.device
    }
    /// Commands submitted and not yet completed (abandoned ones included).
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }
    /// How many more commands can be submitted now.
    pub fn free_slots(&self) -> u32 {
        self.free.len() as u32
    }

    /// Reserves a CID for a command about to be built (so that per-CID scratch
    /// memory can be filled first). Queue full is an error the caller may
    /// answer by reaping.
    pub fn reserve(&mut self) -> Result<u16> {
        self.free.pop().ok_or_else(|| DriverError::QueueFull {
            device: self.device.clone(),
            qid: self.rings.qid,
            depth: self.rings.depth,
            in_flight: self.in_flight,
        })
    }

    /// Returns a reserved CID that was not used.
    pub fn unreserve(&mut self, cid: u16) {
        if self.slots.get(cid as usize).is_some_and(|s| s.state == SlotState::Free)
            && !self.free.contains(&cid)
        {
            self.free.push(cid);
        }
    }

    /// Places `entry` (whose CID must be a reserved one) at the SQ tail. The
    /// controller does not see it until [`ring`](Self::ring).
    pub fn push(
        &mut self,
        cid: u16,
        mut entry: SubmissionEntry,
        name: &'static str,
        token: u64,
    ) -> Result<()> {
        let slot = self
            .slots
            .get_mut(cid as usize)
            .filter(|s| s.state == SlotState::Free)
            .ok_or_else(|| DriverError::invalid(format!("cid {cid} was not reserved")))?;
        entry.set_cid(cid);
        *slot = Slot { state: SlotState::Busy, token, opcode: entry.opcode(), name };
        self.rings.sq.write_obj(self.sq_tail as usize * SQE_SIZE, &entry)?;
        self.sq_tail = (self.sq_tail + 1) % self.rings.depth;
        self.in_flight += 1;
        Ok(())
    }

    /// Reserves a CID and places `entry`; returns the CID.
    pub fn submit(&mut self, entry: SubmissionEntry, name: &'static str, token: u64) -> Result<u16> {
        let cid = self.reserve()?;
        if let Err(e) = self.push(cid, entry, name, token) {
            self.unreserve(cid);
            return Err(e);
        }
        Ok(cid)
    }

    /// Publishes every entry placed since the last ring with one doorbell write.
    pub fn ring(&mut self) {
        if self.sq_tail != self.published_tail {
            self.rings.sq_doorbell.ring(self.sq_tail);
            self.published_tail = self.sq_tail;
        }
    }

    /// Reaps every new completion into `out` and acknowledges them with one
    /// CQ-head doorbell write. Returns how many were reaped.
    pub fn reap(&mut self, out: &mut Vec<Completion>) -> Result<usize> {
        let mut n = 0;
        let mut bad = None;
        loop {
            let off = self.cq_head as usize * CQE_SIZE;
            // Acquire load of DW3 first: the rest of the entry is valid once the phase flips.
            let dw3 = self.rings.cq.load_u32(off + 12)?;
            if (dw3 & (1 << 16) != 0) != self.phase {
                break;
            }
            let cqe: CompletionEntry = self.rings.cq.read_obj(off)?;
            let cqe = CompletionEntry { dw3, ..cqe };
            self.cq_head += 1;
            if self.cq_head == self.rings.depth {
                self.cq_head = 0;
                self.phase = !self.phase;
            }
            n += 1;
            let sqhd = cqe.sq_head() as u32;
            if sqhd < self.rings.depth {
                self.sq_head = sqhd;
            }
            let cid = cqe.cid();
            match self.slots.get_mut(cid as usize) {
                Some(slot) if slot.state == SlotState::Busy => {
                    out.push(Completion {
                        cid,
                        status: cqe.status(),
                        dw0: cqe.dw0,
                        token: slot.token,
                        opcode: slot.opcode,
                    });
                    slot.state = SlotState::Free;
                    self.free.push(cid);
                    self.in_flight -= 1;
                }
                Some(slot) if slot.state == SlotState::Abandoned => {
                    tracing::warn!(device = %self.device, qid = self.rings.qid, cid, "late completion of a timed-out command discarded");
                    slot.state = SlotState::Free;
                    self.free.push(cid);
                    self.in_flight -= 1;
                }
                _ => {
                    bad.get_or_insert(cid);
                }
            }
        }
        if n > 0 {
            self.rings.cq_doorbell.ring(self.cq_head);
        }
        if let Some(cid) = bad {
            return Err(DriverError::BadDeviceResponse {
                device: self.device.clone(),
                what: format!("qid {}: completion for cid {cid}, which is not in flight", self.rings.qid),
            });
        }
        Ok(n)
    }

    /// Waits for the completion of `cid`, keeping others for later [`take_parked`](Self::take_parked).
    /// `check` runs about every millisecond of waiting (e.g. to notice CSTS.CFS).
    pub fn wait(
        &mut self,
        cid: u16,
        timeout: Duration,
        mut check: impl FnMut() -> Result<()>,
    ) -> Result<Completion> {
        if let Some(i) = self.parked.iter().position(|c| c.cid == cid) {
            return Ok(self.parked.swap_remove(i));
        }
        let name = match self.slots.get(cid as usize) {
            Some(s) if s.state == SlotState::Busy => s.name,
            _ => {
                return Err(DriverError::invalid(format!(
                    "qid {} cid {cid} is not in flight",
                    self.rings.qid
                )))
            }
        };
        let start = Instant::now();
        let mut spins = 0u32;
        let mut buf = Vec::new();
        let mut last_check = start;
        loop {
            buf.clear();
            self.reap(&mut buf)?;
            let mut found = None;
            for c in buf.drain(..) {
                if c.cid == cid && found.is_none() {
                    found = Some(c);
                } else {
                    self.parked.push(c);
                }
            }
            if let Some(c) = found {
                return Ok(c);
            }
            let now = Instant::now();
            if now.duration_since(last_check) >= Duration::from_millis(1) {
                check()?;
                last_check = now;
            }
            if now.duration_since(start) >= timeout {
                self.abandon(cid);
                return Err(DriverError::CommandTimeout {
                    device: self.device.clone(),
                    qid: self.rings.qid,
                    cid,
                    command: name,
                    waited: timeout,
                });
            }
            backoff(&mut spins);
        }
    }

    /// Completions reaped by [`wait`](Self::wait) for other CIDs.
    pub fn take_parked(&mut self, out: &mut Vec<Completion>) {
        out.append(&mut self.parked);
    }

    /// Gives up on `cid`: its slot stays reserved until a completion (if any) arrives.
    pub fn abandon(&mut self, cid: u16) {
        if let Some(slot) = self.slots.get_mut(cid as usize) {
            if slot.state == SlotState::Busy {
                slot.state = SlotState::Abandoned;
            }
        }
    }

    /// Forgets every command and completion and returns to the initial state
    /// (SQ tail 0, CQ head 0, expected phase 1, every CID free). Only sound
    /// once the controller's queues were deleted and created again, so that
    /// none of those commands can complete or move data any more.
    pub fn reset(&mut self) -> Settled {
        let count = |state| self.slots.iter().filter(|s| s.state == state).count() as u32;
        let settled = Settled {
            abandoned: count(SlotState::Abandoned),
            outstanding: count(SlotState::Busy),
            parked: self.parked.len() as u32,
        };
        for slot in &mut self.slots {
            *slot = Slot { state: SlotState::Free, token: 0, opcode: 0, name: "" };
        }
        self.free = (0..self.rings.depth as u16 - 1).rev().collect();
        self.in_flight = 0;
        self.parked.clear();
        self.sq_tail = 0;
        self.published_tail = 0;
        self.sq_head = 0;
        self.cq_head = 0;
        self.phase = true;
        settled
    }

    /// Whether `cid` is waiting for its completion.
    pub fn is_busy(&self, cid: u16) -> bool {
        self.slots.get(cid as usize).is_some_and(|s| s.state == SlotState::Busy)
    }

    /// Name of the command in flight under `cid`, for messages.
    pub fn command_name(&self, cid: u16) -> &'static str {
        self.slots.get(cid as usize).map_or("command", |s| s.name)
    }

    pub fn sq_memory(&self) -> &DmaBuffer {
        &self.rings.sq
    }
    pub fn cq_memory(&self) -> &DmaBuffer {
        &self.rings.cq
    }
}

/// Polling backoff: spin briefly, then yield so that a software controller
/// (or other lanes) sharing the cores can run.
#[inline]
pub fn backoff(spins: &mut u32) {
    *spins = spins.saturating_add(1);
    if *spins < 64 {
        std::hint::spin_loop();
    } else if *spins < 4096 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(20));
    }
}
