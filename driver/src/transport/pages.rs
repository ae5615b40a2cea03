//! Page-aligned, zeroed host memory owned by one value: what a software DMA
//! space (the emulated IOMMU, a client's brokered space) allocates before it
//! maps the memory for a device.

use crate::error::{DriverError, Result};
use std::alloc::Layout;
use std::ptr::NonNull;

/// `len` bytes rounded up to whole pages, zeroed; freed when dropped. Memory
/// a device may still reach is given up with [`leak`](Self::leak) instead.
#[derive(Debug)]
pub struct HostPages {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: plain memory owned by this value alone; no method of it reads or writes through the
// pointer. A type that accesses the memory through `ptr` (a `DmaBuffer`, objstore's
// `HostKvMemory`) states why its own accesses are sound.
unsafe impl Send for HostPages {}
// SAFETY: as above.
unsafe impl Sync for HostPages {}

impl HostPages {
    /// Allocates at least `len` (> 0) bytes aligned to and a multiple of
    /// `page` (a power of two). Errors name DMA space `space`.
    pub fn alloc(space: &str, len: usize, page: usize) -> Result<HostPages> {
        if len == 0 {
            return Err(DriverError::dma(space, "zero-length allocation"));
        }
        let size = len
            .checked_next_multiple_of(page)
            .ok_or_else(|| DriverError::dma(space, format!("allocation of {len} bytes is too large")))?;
        let layout = Layout::from_size_align(size, page)
            .map_err(|e| DriverError::dma(space, format!("bad allocation of {len} bytes: {e}")))?;
        // SAFETY: non-zero size (checked above).
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| DriverError::dma(space, format!("out of memory allocating {size} bytes")))?;
        Ok(HostPages { ptr, layout })
    }

    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }
    /// Bytes allocated (`len` rounded up to whole pages).
    pub fn len(&self) -> usize {
        self.layout.size()
    }
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Gives the memory up without freeing it: for memory a device may still
    /// reach (an unmap that was not confirmed).
    pub fn leak(self) {
        std::mem::forget(self)
    }
}

impl Drop for HostPages {
    fn drop(&mut self) {
        // SAFETY: allocated in `alloc` with exactly this layout, freed only here.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::HostPages;

    #[test]
    fn pages_are_whole_zeroed_and_aligned_and_bad_sizes_are_errors() {
        let p = HostPages::alloc("t", 5000, 4096).unwrap();
        assert_eq!((p.len(), p.addr() % 4096), (8192, 0));
        // SAFETY: `p` owns 8192 readable bytes.
        let bytes = unsafe { std::slice::from_raw_parts(p.ptr().as_ptr(), p.len()) };
        assert!(bytes.iter().all(|&b| b == 0));
        assert!(HostPages::alloc("t", 0, 4096).unwrap_err().to_string().contains("zero-length"));
        assert!(HostPages::alloc("t", usize::MAX, 4096).unwrap_err().to_string().contains("too large"));
    }
}
