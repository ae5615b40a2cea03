//! Collecting finished IOCBs from the completion ring.

use super::state::{Pool, SlotState};
use super::GioUring;
use crate::error::{GioError, Result};
use crate::handle::IocbId;
use crate::iocb::{IocbResult, IoctxFailure};
use crate::status::IoStatus;
use std::time::{Duration, Instant};
use tutti_kernels::abi::{self, IoCtx, IocbHeader};

/// How long `wait_cqe` yields the core between looks before it blocks: a host
/// executor that posts within it needs no futex wake of this thread (measured with
/// `tutti bench commands`: gio persistent at batch 32 took about 1.8x longer per
/// command when the wait blocked after 16 spins, 1.3x with a 10 us window).
const HOST_YIELD_WINDOW: Duration = Duration::from_micros(50);

impl GioUring {
    /// Moves every IOCB on the completion ring to Done, with its result.
    fn reap(&self, pool: &mut Pool) {
        while let Some(v) = self.cq.pop() {
            let index = v as u32;
            let Some(slot) = pool.slots.get_mut(index as usize) else {
                tracing::error!(index, "executor posted a completion for an IOCB outside the pool");
                continue;
            };
            if !matches!(slot.state, SlotState::InFlight) {
                tracing::error!(
                    index,
                    state = slot.state.name(),
                    "executor posted a completion for an IOCB not in flight"
                );
                continue;
            }
            let iocb = self.iocb_ptr(index);
            // SAFETY: the executor posted this IOCB, so it no longer writes to it; the ring pop
            // (acquire) ordered its writes before these reads.
            let h: IocbHeader = unsafe { (&raw const (*iocb).hdr).read_volatile() };
            if h.done_seq != slot.seq {
                tracing::error!(
                    index,
                    posted = h.done_seq,
                    issued = slot.seq,
                    "completion for another issue of this IOCB"
                );
            }
            let mut failures = Vec::new();
            if h.failed > 0 {
                for i in 0..slot.count.min(abi::IOCB_MAX_IOCTX as u32) {
                    // SAFETY: as above; `i` is inside the IOCTX array.
                    let io: IoCtx = unsafe { (&raw const (*iocb).ioctx[i as usize]).read_volatile() };
                    let status = IoStatus::from_raw(io.status);
                    if !status.is_success() {
                        failures.push(IoctxFailure {
                            index: i,
                            status,
                            drive: io.drive,
                            opcode: io.opcode,
                            slba: io.slba,
                            nlb: io.nlb,
                            queue: io.queue,
                        });
                    }
                }
            }
            let first_error = (h.first_error != abi::NO_ERROR)
                .then(|| ((h.first_error >> 32) as u32, IoStatus::from_raw(h.first_error as u32)));
            if h.completed != slot.count {
                tracing::error!(
                    index,
                    completed = h.completed,
                    count = slot.count,
                    "IOCB completed with IOCTXs unaccounted for"
                );
            }
            let result = IocbResult {
                id: IocbId { index, gen: slot.gen },
                count: slot.count,
                completed: h.completed,
                failed: h.failed,
                first_error,
                failures,
                elapsed: Duration::from_nanos(h.done_ns.saturating_sub(h.start_ns)),
                started_ns: h.start_ns,
                done_ns: h.done_ns,
            };
            if !result.is_ok() {
                tracing::debug!(iocb = %result.id, failed = result.failed, "IOCB finished with failures");
            }
            slot.state = SlotState::Done(Box::new(result));
            pool.done.push(index);
        }
    }

    fn collect(pool: &mut Pool, index: u32) -> Option<IocbResult> {
        let slot = &mut pool.slots[index as usize];
        match std::mem::replace(&mut slot.state, SlotState::Free) {
            SlotState::Done(r) => {
                pool.free.push(index);
                pool.done.retain(|&d| d != index);
                Some(*r)
            }
            other => {
                slot.state = other;
                None
            }
        }
    }

    /// Waits until every IOCB in `ids` has completed, then returns their
    /// results (in the order of `ids`) and returns them to the pool. On timeout
    /// nothing is collected and the error lists the IOCBs still in flight.
    pub fn wait_cqe(&self, ids: &[IocbId], timeout: Duration) -> Result<Vec<IocbResult>> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            {
                let mut pool = self.pool()?;
                self.reap(&mut pool);
                let mut pending = Vec::new();
                for (k, &id) in ids.iter().enumerate() {
                    if ids[..k].contains(&id) {
                        return Err(GioError::invalid(format!("{id} is listed twice")));
                    }
                    let slot = Self::slot(&mut pool, id)?;
                    match slot.state {
                        SlotState::Done(_) => {}
                        SlotState::InFlight => pending.push(id),
                        ref s => {
                            return Err(GioError::WrongState { id, state: s.name(), expected: "issued" })
                        }
                    }
                }
                if pending.is_empty() {
                    return Ok(ids.iter().filter_map(|id| Self::collect(&mut pool, id.index)).collect());
                }
                if start.elapsed() >= timeout {
                    return Err(GioError::WaitTimeout { pending, waited: start.elapsed() });
                }
            }
            let queued = !self.sq.is_empty();
            self.exec.poll(queued)?;
            spins += 1;
            let nap = Duration::from_micros(50).min(timeout.saturating_sub(start.elapsed()));
            match spins {
                0..=16 => std::hint::spin_loop(),
                // An inline executor's lanes run on this thread, until they posted or `nap` passed.
                _ if self.exec.drive(queued, nap)? => {}
                _ if start.elapsed() < HOST_YIELD_WINDOW => std::thread::yield_now(),
                // Block until the executor posts (a host executor wakes this; a GPU
                // cannot, so the wait is as short as the sleep it replaces).
                _ => self.cq.wait_published(nap),
            }
        }
    }

    /// Results of every IOCB that completed and was not collected yet (returned to the pool).
    pub fn poll_cqe(&self) -> Result<Vec<IocbResult>> {
        let mut pool = self.pool()?;
        self.reap(&mut pool);
        let done = std::mem::take(&mut pool.done);
        let out = done.into_iter().filter_map(|i| Self::collect(&mut pool, i)).collect();
        drop(pool);
        self.exec.poll(!self.sq.is_empty())?;
        Ok(out)
    }

    /// Runs the executor's own wait (`tt_gio_wait`, what an engine's stream
    /// would run before attention) for `ids`; returns how many had completed
    /// within `timeout`. Does not collect them.
    pub fn wait_on_executor(&self, ids: &[IocbId], timeout: Duration) -> Result<u32> {
        let (idx, seqs): (Vec<u32>, Vec<u32>) = {
            let mut pool = self.pool()?;
            let mut out = Vec::with_capacity(ids.len());
            for &id in ids {
                let slot = Self::slot(&mut pool, id)?;
                if !matches!(slot.state, SlotState::InFlight | SlotState::Done(_)) {
                    return Err(GioError::WrongState { id, state: slot.state.name(), expected: "issued" });
                }
                out.push((id.index, slot.seq));
            }
            out.into_iter().unzip()
        };
        self.exec.wait_kernel(&idx, &seqs, timeout)
    }
}
