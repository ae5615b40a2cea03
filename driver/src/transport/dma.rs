//! DMA memory handed out by a [`super::DmaSpace`].
//!
//! The device may read or write this memory at any time, so it is never
//! exposed as a Rust slice: objects go in and out through volatile copies and
//! single words through atomics, which is where the ordering with the device
//! is written down.

use crate::error::{DriverError, Result};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use zerocopy::{FromBytes, Immutable, IntoBytes};

/// A contiguous run of device addresses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct IovaSegment {
    pub iova: u64,
    pub len: u64,
}

/// Zeroed, page-aligned, IOVA-contiguous memory the device can reach.
/// Dropping it releases the memory and its IOMMU mapping.
pub struct DmaBuffer {
    ptr: NonNull<u8>,
    len: usize,
    iova: u64,
    _release: Box<dyn Send + Sync>,
}

// SAFETY: the buffer is plain memory owned by this value; all access goes
// through methods that use volatile or atomic operations.
unsafe impl Send for DmaBuffer {}
// SAFETY: as above; shared access only performs volatile/atomic reads and writes.
unsafe impl Sync for DmaBuffer {}

impl DmaBuffer {
    /// Wraps memory a `DmaSpace` allocated. `release` is dropped with the buffer
    /// and must free the memory and remove the device mapping.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be valid, zeroed, page-aligned memory that lives until
    /// `release` is dropped, and the device must see it at `iova..iova+len`.
    pub unsafe fn from_raw(ptr: NonNull<u8>, len: usize, iova: u64, release: Box<dyn Send + Sync>) -> Self {
        DmaBuffer { ptr, len, iova, _release: release }
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Device address of the first byte.
    pub fn iova(&self) -> u64 {
        self.iova
    }
    /// Device address of byte `offset` (which may equal `len`).
    pub fn iova_at(&self, offset: usize) -> u64 {
        self.iova + offset as u64
    }

    fn check(&self, offset: usize, size: usize) -> Result<()> {
        match offset.checked_add(size) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(DriverError::invalid(format!(
                "DMA buffer access at {offset:#x}+{size:#x} is outside its {:#x} bytes",
                self.len
            ))),
        }
    }

    /// Writes `value` at `offset` with a volatile store.
    pub fn write_obj<T: IntoBytes + Immutable + Copy>(&self, offset: usize, value: &T) -> Result<()> {
        self.check(offset, size_of::<T>())?;
        if !offset.is_multiple_of(align_of::<T>()) {
            return Err(DriverError::invalid(format!("unaligned DMA write at {offset:#x}")));
        }
        // SAFETY: in bounds and aligned (checked above); the memory lives as long as `self`.
        unsafe { self.ptr.as_ptr().add(offset).cast::<T>().write_volatile(*value) };
        Ok(())
    }

    /// Reads a `T` at `offset` with a volatile load.
    pub fn read_obj<T: FromBytes + Copy>(&self, offset: usize) -> Result<T> {
        self.check(offset, size_of::<T>())?;
        if !offset.is_multiple_of(align_of::<T>()) {
            return Err(DriverError::invalid(format!("unaligned DMA read at {offset:#x}")));
        }
        // SAFETY: in bounds and aligned (checked above); any bit pattern is a valid `T` (FromBytes).
        Ok(unsafe { self.ptr.as_ptr().add(offset).cast::<T>().read_volatile() })
    }

    /// Acquire load of the 32-bit word at `offset` (e.g. a completion's phase dword).
    pub fn load_u32(&self, offset: usize) -> Result<u32> {
        self.check(offset, 4)?;
        Ok(self.atomic_u32(offset)?.load(Ordering::Acquire))
    }

    /// Release store of the 32-bit word at `offset`.
    pub fn store_u32(&self, offset: usize, value: u32) -> Result<()> {
        self.check(offset, 4)?;
        self.atomic_u32(offset)?.store(value, Ordering::Release);
        Ok(())
    }

    fn atomic_u32(&self, offset: usize) -> Result<&AtomicU32> {
        if !offset.is_multiple_of(4) {
            return Err(DriverError::invalid(format!("unaligned DMA word at {offset:#x}")));
        }
        // SAFETY: in bounds (callers check) and 4-byte aligned; the memory lives as long as `self`.
        Ok(unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(offset).cast()) })
    }

    /// Copies `src` into the buffer at `offset`.
    pub fn copy_in(&self, offset: usize, src: &[u8]) -> Result<()> {
        self.check(offset, src.len())?;
        // SAFETY: destination in bounds (checked); `src` is a separate Rust slice so they cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len()) };
        Ok(())
    }

    /// Copies bytes at `offset` out of the buffer into `dst`.
    pub fn copy_out(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check(offset, dst.len())?;
        // SAFETY: source in bounds (checked); `dst` is a separate Rust slice so they cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Sets every byte to `byte`.
    pub fn fill(&self, byte: u8) {
        // SAFETY: the whole buffer is ours and in bounds.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr(), byte, self.len) };
    }
}

impl std::fmt::Debug for DmaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DmaBuffer({:p}, iova {:#x}, {:#x} bytes)", self.ptr, self.iova, self.len)
    }
}

/// A caller's memory made reachable by the device. Dropping it unmaps it.
pub struct DmaMapping {
    vaddr: *mut u8,
    len: usize,
    /// Device segments covering `vaddr..vaddr+len` in order; the first starts
    /// at `vaddr`'s device address, not at its page.
    segments: Vec<IovaSegment>,
    _release: Box<dyn Send + Sync>,
}

// SAFETY: the mapping only records addresses; it never dereferences `vaddr`.
unsafe impl Send for DmaMapping {}
// SAFETY: as above.
unsafe impl Sync for DmaMapping {}

impl DmaMapping {
    /// # Safety
    /// `segments` must describe where the device sees `vaddr..vaddr+len`, and
    /// `release` must undo that mapping when dropped.
    pub unsafe fn from_raw(
        vaddr: *mut u8,
        len: usize,
        segments: Vec<IovaSegment>,
        release: Box<dyn Send + Sync>,
    ) -> Self {
        DmaMapping { vaddr, len, segments, _release: release }
    }
    pub fn vaddr(&self) -> *mut u8 {
        self.vaddr
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn segments(&self) -> &[IovaSegment] {
        &self.segments
    }

    /// Device segments for `offset..offset+len` of the mapped range.
    pub fn translate(&self, offset: usize, len: usize) -> Result<Vec<IovaSegment>> {
        let end = offset.checked_add(len).filter(|&e| e <= self.len).ok_or_else(|| {
            DriverError::invalid(format!(
                "range {offset:#x}+{len:#x} is outside the {:#x}-byte mapping",
                self.len
            ))
        })?;
        let mut out = Vec::new();
        let mut pos = 0u64;
        for seg in &self.segments {
            let (s, e) = (pos, pos + seg.len);
            pos = e;
            let lo = s.max(offset as u64);
            let hi = e.min(end as u64);
            if lo < hi {
                let iova = seg.iova + (lo - s);
                match out.last_mut() {
                    Some(IovaSegment { iova: li, len: ll }) if *li + *ll == iova => *ll += hi - lo,
                    _ => out.push(IovaSegment { iova, len: hi - lo }),
                }
            }
            if e >= end as u64 {
                break;
            }
        }
        Ok(out)
    }
}

impl std::fmt::Debug for DmaMapping {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DmaMapping({:p}, {:#x} bytes, {} segments)", self.vaddr, self.len, self.segments.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(segs: &[(u64, u64)]) -> DmaMapping {
        let len = segs.iter().map(|s| s.1).sum::<u64>() as usize;
        let segments = segs.iter().map(|&(iova, len)| IovaSegment { iova, len }).collect();
        // SAFETY: the mapping never dereferences its address; nothing to release.
        unsafe { DmaMapping::from_raw(std::ptr::null_mut(), len, segments, Box::new(())) }
    }

    #[test]
    fn translate_walks_segments() {
        let m = mapping(&[(0x10_0800, 0x800), (0x50_0000, 0x1000), (0x90_0000, 0x1000)]);
        assert_eq!(
            m.translate(0, 0x800).unwrap_or_default(),
            vec![IovaSegment { iova: 0x10_0800, len: 0x800 }]
        );
        assert_eq!(
            m.translate(0x700, 0x200).unwrap_or_default(),
            vec![IovaSegment { iova: 0x10_0f00, len: 0x100 }, IovaSegment { iova: 0x50_0000, len: 0x100 }]
        );
        assert_eq!(m.translate(0x1800, 0x1000).unwrap_or_default().len(), 1);
        assert!(m.translate(0x2000, 0x1000).is_err());
    }

    #[test]
    fn translate_merges_adjacent_segments() {
        let m = mapping(&[(0x1000, 0x1000), (0x2000, 0x1000)]);
        assert_eq!(
            m.translate(0, 0x2000).unwrap_or_default(),
            vec![IovaSegment { iova: 0x1000, len: 0x2000 }]
        );
    }
}
