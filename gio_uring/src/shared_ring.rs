//! The host's side of the rings it shares with the executor (`struct tt_ring`):
//! it produces the submission ring and consumes the completion ring. The
//! executor's side is `kernels/cuda/gio_ring.cuh`; both follow the
//! sequence-numbered cell protocol described in `tutti_gio.h`, and neither
//! read-modify-writes a word the other side does.

use crate::error::{GioError, Result};
use crate::mem::HostMemory;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;
use tutti_kernels::abi::{RingCell, RingHeader};

/// A ring in memory the host can address.
pub struct RingView {
    hdr: NonNull<RingHeader>,
    cap: u64,
}

// SAFETY: every access to ring memory is atomic; the memory outlives the view (see `init`).
unsafe impl Send for RingView {}
// SAFETY: as above.
unsafe impl Sync for RingView {}

impl RingView {
    /// Bytes a ring of `capacity` cells occupies.
    pub fn bytes(capacity: u32) -> usize {
        size_of::<RingHeader>() + capacity as usize * size_of::<RingCell>()
    }

    /// Lays out an empty ring at `at`.
    ///
    /// # Safety
    /// `at` must be 64-byte aligned memory of [`RingView::bytes`]`(capacity)` bytes that nothing
    /// else uses until initialised, and that stays valid while this view or the executor uses it.
    pub unsafe fn init(at: NonNull<u8>, capacity: u32) -> Result<Self> {
        if !capacity.is_power_of_two() || capacity < 2 {
            return Err(GioError::invalid(format!("ring capacity {capacity} is not a power of two >= 2")));
        }
        let hdr = at.cast::<RingHeader>();
        let header = RingHeader { capacity, mask: capacity - 1, ..Default::default() };
        // SAFETY: the caller gives us exclusive, large-enough, aligned memory.
        unsafe {
            hdr.as_ptr().write(header);
            let cells = at.as_ptr().add(size_of::<RingHeader>()).cast::<RingCell>();
            for i in 0..capacity as usize {
                cells.add(i).write(RingCell { seq: i as u64, value: 0 });
            }
        }
        Ok(RingView { hdr, cap: capacity as u64 })
    }

    pub fn capacity(&self) -> u32 {
        self.cap as u32
    }
    pub fn as_raw(&self) -> *mut RingHeader {
        self.hdr.as_ptr()
    }

    fn head(&self) -> &AtomicU64 {
        // SAFETY: inside the live header; all accesses to `head` are atomic.
        unsafe { AtomicU64::from_ptr(&raw mut (*self.hdr.as_ptr()).head) }
    }
    fn tail(&self) -> &AtomicU64 {
        // SAFETY: as for `head`.
        unsafe { AtomicU64::from_ptr(&raw mut (*self.hdr.as_ptr()).tail) }
    }
    fn cell(&self, pos: u64) -> (&AtomicU64, &AtomicU64) {
        // SAFETY: `pos & mask` < capacity, so the cell lies in the ring memory; cells are
        // accessed only atomically.
        unsafe {
            let cells = self.hdr.as_ptr().cast::<u8>().add(size_of::<RingHeader>()).cast::<RingCell>();
            let c = cells.add((pos & (self.cap - 1)) as usize);
            (AtomicU64::from_ptr(&raw mut (*c).seq), AtomicU64::from_ptr(&raw mut (*c).value))
        }
    }

    /// Appends `value`; false when the ring is full. Safe from several host threads.
    pub fn push(&self, value: u64) -> bool {
        let tail = self.tail();
        let mut pos = tail.load(Ordering::Relaxed);
        loop {
            let (seq, cell) = self.cell(pos);
            let dif = seq.load(Ordering::Acquire).wrapping_sub(pos) as i64;
            if dif == 0 {
                match tail.compare_exchange_weak(pos, pos + 1, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => {
                        cell.store(value, Ordering::Relaxed);
                        seq.store(pos + 1, Ordering::Release);
                        // SAFETY: the header is live for as long as `self`.
                        unsafe { tutti_kernels::host::wake_ring_sleepers(self.hdr.as_ptr()) };
                        return true;
                    }
                    Err(now) => pos = now,
                }
            } else if dif < 0 {
                return false;
            } else {
                pos = tail.load(Ordering::Relaxed);
            }
        }
    }

    /// Takes the oldest value, if one is published. Safe from several host threads.
    pub fn pop(&self) -> Option<u64> {
        let head = self.head();
        let mut pos = head.load(Ordering::Relaxed);
        loop {
            let (seq, cell) = self.cell(pos);
            let dif = seq.load(Ordering::Acquire).wrapping_sub(pos + 1) as i64;
            if dif == 0 {
                match head.compare_exchange_weak(pos, pos + 1, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => {
                        let v = cell.load(Ordering::Relaxed);
                        seq.store(pos + self.cap, Ordering::Release);
                        return Some(v);
                    }
                    Err(now) => pos = now,
                }
            } else if dif < 0 {
                return None;
            } else {
                pos = head.load(Ordering::Relaxed);
            }
        }
    }

    /// Whether the oldest value is published (a pop would find it).
    pub fn ready(&self) -> bool {
        let pos = self.head().load(Ordering::Relaxed);
        self.cell(pos).0.load(Ordering::Acquire) == pos + 1
    }

    /// Blocks until a producer may have published (its wake, `tt_ring_wake` on a
    /// host-built executor) or `timeout` passes, unless a value is ready now.
    /// Spurious returns are allowed: callers look at the ring again. A GPU
    /// producer wakes nobody, so `timeout` is how late such a waiter can be.
    pub fn wait_published(&self, timeout: Duration) {
        // SAFETY: the fields lie in the live header; every access to them is atomic.
        let (sleepers, seq) = unsafe {
            (
                AtomicU32::from_ptr(&raw mut (*self.hdr.as_ptr()).sleepers),
                AtomicU32::from_ptr(&raw mut (*self.hdr.as_ptr()).wake_seq),
            )
        };
        let seen = seq.load(Ordering::Acquire);
        sleepers.fetch_add(1, Ordering::SeqCst);
        // Pairs with the producer's fence between publishing and reading `sleepers`:
        // either it sees us and bumps wake_seq, or we see its value here.
        fence(Ordering::SeqCst);
        if !self.ready() {
            tutti_driver::futex::wait(seq, seen, timeout);
        }
        sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    /// Values pushed and not yet popped (a snapshot).
    pub fn len(&self) -> u64 {
        self.tail().load(Ordering::Acquire).saturating_sub(self.head().load(Ordering::Acquire))
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A ring in its own host memory (tests, benchmarks, host-only use).
pub struct OwnedRing {
    view: RingView,
    _mem: HostMemory,
}

impl OwnedRing {
    pub fn new(capacity: u32) -> Result<Self> {
        let mem = HostMemory::new(RingView::bytes(capacity))?;
        let at = NonNull::new(mem.as_ptr()).ok_or_else(|| GioError::invalid("null allocation"))?;
        // SAFETY: fresh page-aligned memory of the right size, owned alongside the view.
        let view = unsafe { RingView::init(at, capacity)? };
        Ok(OwnedRing { view, _mem: mem })
    }
}

impl std::ops::Deref for OwnedRing {
    type Target = RingView;
    fn deref(&self) -> &RingView {
        &self.view
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tutti_kernels::host::{executor_ring_pop, executor_ring_push};

    #[test]
    fn fifo_wraps_and_reports_full_and_empty() {
        let r = OwnedRing::new(4).unwrap();
        assert_eq!(r.pop(), None);
        for round in 0..10u64 {
            for i in 0..4 {
                assert!(r.push(round * 10 + i));
            }
            assert!(!r.push(99), "a full ring took a fifth value");
            assert_eq!(r.len(), 4);
            for i in 0..4 {
                assert_eq!(r.pop(), Some(round * 10 + i));
            }
            assert_eq!(r.pop(), None);
        }
    }

    #[test]
    fn host_and_executor_sides_interoperate() {
        // The executor code (compiled from gio_ring.cuh) pops what Rust pushed and vice versa.
        let r = OwnedRing::new(8).unwrap();
        for round in 0..5u64 {
            for i in 0..8 {
                assert!(r.push(round << 8 | i));
            }
            // SAFETY: `r` is a live, initialised ring.
            assert!(!unsafe { executor_ring_push(r.as_raw(), 1) }, "executor pushed into a full ring");
            for i in 0..8 {
                // SAFETY: as above.
                assert_eq!(unsafe { executor_ring_pop(r.as_raw()) }, Some(round << 8 | i));
            }
            // SAFETY: as above.
            assert_eq!(unsafe { executor_ring_pop(r.as_raw()) }, None);
            for i in 0..8 {
                // SAFETY: as above.
                assert!(unsafe { executor_ring_push(r.as_raw(), 1000 + i) });
            }
            for i in 0..8 {
                assert_eq!(r.pop(), Some(1000 + i));
            }
        }
    }

    #[test]
    fn concurrent_producers_and_consumers_lose_and_duplicate_nothing() {
        let r = std::sync::Arc::new(OwnedRing::new(64).unwrap());
        let per = 20_000u64;
        let producers: Vec<_> = (0..2u64)
            .map(|p| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for i in 0..per {
                        while !r.push(p << 32 | i) {
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let consumers: Vec<_> = (0..2)
            .map(|c| {
                let r = r.clone();
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    while got.len() < per as usize {
                        // One consumer uses the executor's code, the other the host's.
                        // SAFETY: the ring lives as long as the Arc held by this thread.
                        let v = if c == 0 { r.pop() } else { unsafe { executor_ring_pop(r.as_raw()) } };
                        match v {
                            Some(v) => got.push(v),
                            None => std::thread::yield_now(),
                        }
                    }
                    got
                })
            })
            .collect();
        for p in producers {
            p.join().unwrap();
        }
        let mut all: Vec<u64> = consumers.into_iter().flat_map(|c| c.join().unwrap()).collect();
        all.sort_unstable();
        let mut want: Vec<u64> = (0..2u64).flat_map(|p| (0..per).map(move |i| p << 32 | i)).collect();
        want.sort_unstable();
        assert_eq!(all, want);
    }
}
