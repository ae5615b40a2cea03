//! IOVA space for type1 mappings: we choose where the device sees memory.
//!
//! First fit over the windows the IOMMU reports as usable (the MSI window at
//! 0xfee00000 and other reserved ranges are outside them). Every allocation
//! is followed by an unmapped guard page, so a device running off the end of
//! a buffer faults instead of touching the neighbour.

use crate::error::{DriverError, Result};
use std::collections::BTreeMap;

pub const PAGE: u64 = 4096;
/// Nothing below this: a zero or tiny address in a command is a bug, and should fault.
const LOWEST: u64 = 1 << 20;

#[derive(Debug)]
pub struct IovaAllocator {
    /// Free ranges: start → length.
    free: BTreeMap<u64, u64>,
}

impl IovaAllocator {
    /// `windows` are inclusive `(start, end)` ranges the IOMMU can translate.
    pub fn new(windows: &[(u64, u64)]) -> IovaAllocator {
        let mut free = BTreeMap::new();
        for &(start, end) in windows {
            let s = start.max(LOWEST).next_multiple_of(PAGE);
            let e = end.saturating_add(1) & !(PAGE - 1);
            if e > s {
                free.insert(s, e - s);
            }
        }
        IovaAllocator { free }
    }

    /// Reserves `len` bytes (rounded to pages) at an `align`-aligned IOVA.
    /// The guard page after it is reserved too; [`Self::free`] takes the same `len`.
    pub fn alloc(&mut self, len: u64, align: u64) -> Result<u64> {
        let span = Self::span(len)?;
        let align = align.max(PAGE);
        let found = self.free.iter().find_map(|(&start, &flen)| {
            let at = start.checked_next_multiple_of(align)?;
            (at.checked_add(span)? <= start + flen).then_some((start, flen, at))
        });
        let (start, flen, at) = found.ok_or_else(|| {
            DriverError::dma(
                "vfio iova",
                format!("no free IOVA range of {span:#x} bytes aligned to {align:#x}"),
            )
        })?;
        self.free.remove(&start);
        if at > start {
            self.free.insert(start, at - start);
        }
        let end = at + span;
        if end < start + flen {
            self.free.insert(end, start + flen - end);
        }
        Ok(at)
    }

    /// Returns a range from [`Self::alloc`], merging it with free neighbours.
    pub fn free(&mut self, iova: u64, len: u64) {
        let Ok(span) = Self::span(len) else { return };
        let (mut start, mut end) = (iova, iova + span);
        if let Some((&ps, &pl)) = self.free.range(..start).next_back() {
            if ps + pl == start {
                self.free.remove(&ps);
                start = ps;
            }
        }
        if let Some(&nl) = self.free.get(&end) {
            self.free.remove(&end);
            end += nl;
        }
        self.free.insert(start, end - start);
    }

    fn span(len: u64) -> Result<u64> {
        if len == 0 {
            return Err(DriverError::invalid("zero-length IOVA allocation"));
        }
        len.checked_next_multiple_of(PAGE)
            .and_then(|l| l.checked_add(PAGE))
            .ok_or_else(|| DriverError::invalid(format!("IOVA allocation of {len:#x} bytes is too large")))
    }

    #[cfg(test)]
    fn free_bytes(&self) -> u64 {
        self.free.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_within_windows_with_guard_pages() {
        // Two windows around the x86 MSI range, as type1 reports them.
        let mut a = IovaAllocator::new(&[(0, 0xfedf_ffff), (0xfef0_0000, 0x7f_ffff_ffff)]);
        let total = a.free_bytes();
        let x = a.alloc(100, PAGE).unwrap();
        assert_eq!(x, LOWEST);
        let y = a.alloc(PAGE, PAGE).unwrap();
        assert_eq!(y, x + 2 * PAGE, "one guard page between allocations");
        let big = a.alloc(2 << 20, 2 << 20).unwrap();
        assert_eq!(big % (2 << 20), 0);
        a.free(x, 100);
        a.free(big, 2 << 20);
        a.free(y, PAGE);
        assert_eq!(a.free_bytes(), total, "everything merges back");
        assert_eq!(a.free.len(), 2);
    }

    #[test]
    fn a_range_never_crosses_a_hole() {
        let mut a = IovaAllocator::new(&[(0x10_0000, 0x10_3fff), (0x20_0000, 0x2f_ffff)]);
        let x = a.alloc(0x4000, PAGE).unwrap();
        assert_eq!(x, 0x20_0000, "16 KiB + guard does not fit in the first 16 KiB window");
        let small = a.alloc(0x1000, PAGE).unwrap();
        assert_eq!(small, 0x10_0000);
        assert!(a.alloc(1 << 30, PAGE).is_err());
        assert!(a.alloc(0, PAGE).is_err());
    }

    #[test]
    fn reuses_freed_space() {
        let mut a = IovaAllocator::new(&[(0, (1 << 24) - 1)]);
        let mut got = Vec::new();
        for _ in 0..100 {
            let x = a.alloc(3 * PAGE, PAGE).unwrap();
            got.push(x);
        }
        for x in got.drain(..) {
            a.free(x, 3 * PAGE);
        }
        assert_eq!(a.free.len(), 1);
        assert_eq!(a.alloc(3 * PAGE, PAGE).unwrap(), LOWEST);
    }
}
