//! The emulated controller's IOMMU: the only way it can touch host memory.
//!
//! Every buffer the driver hands to the device is mapped here at an IOVA we
//! choose (far from any host address, with an unmapped guard page between
//! mappings). The controller translates every DMA through this table, so a
//! wrong pointer in a command is an IOMMU fault — counted and reported as a
//! Data Transfer Error — never a stray write into the host process.

use crate::error::{DriverError, Result};
use crate::transport::{DmaBuffer, DmaMapping, DmaSpace, IovaSegment};
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

const PAGE: usize = 4096;
/// First IOVA handed out: well above any address a test might confuse it with.
const IOVA_BASE: u64 = 0x10_0000_0000;

#[derive(Clone, Copy)]
struct Region {
    host: usize,
    len: usize,
}

#[derive(Default)]
struct Table {
    regions: RwLock<BTreeMap<u64, Region>>,
    faults: AtomicU64,
    next: AtomicU64,
}

impl Table {
    fn insert(&self, host: usize, len: usize) -> Result<u64> {
        let span = (len.next_multiple_of(PAGE) + PAGE) as u64; // one unmapped guard page after
        let iova = IOVA_BASE + self.next.fetch_add(span, Ordering::Relaxed);
        let mut regions =
            self.regions.write().map_err(|_| DriverError::dma("emulated iommu", "table lock poisoned"))?;
        regions.insert(iova, Region { host, len });
        Ok(iova)
    }
    fn remove(&self, iova: u64) {
        if let Ok(mut regions) = self.regions.write() {
            regions.remove(&iova);
        }
    }
}

/// Removes a mapping (and frees owned memory) when the buffer or mapping drops.
struct Release {
    table: Arc<Table>,
    iova: u64,
    owned: Option<(NonNull<u8>, std::alloc::Layout)>,
}

// SAFETY: `owned` is memory this value alone frees; the table is thread-safe.
unsafe impl Send for Release {}
// SAFETY: as above; no method reads through the pointer.
unsafe impl Sync for Release {}

impl Drop for Release {
    fn drop(&mut self) {
        // Unmap before freeing, so the device can never reach freed memory.
        self.table.remove(self.iova);
        if let Some((ptr, layout)) = self.owned {
            // SAFETY: allocated in `alloc` with exactly this layout and freed only here.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
        }
    }
}

/// An IOMMU DMA fault: the controller touched an address nobody mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IommuFault {
    pub iova: u64,
    pub len: usize,
}

/// The emulated controller's DMA space (a [`DmaSpace`]).
#[derive(Clone)]
pub struct EmuIommu {
    name: String,
    table: Arc<Table>,
}

impl EmuIommu {
    pub fn new(device: &str) -> Self {
        EmuIommu { name: format!("emulated iommu {device}"), table: Arc::default() }
    }

    /// How many DMA accesses faulted so far.
    pub fn fault_count(&self) -> u64 {
        self.table.faults.load(Ordering::Relaxed)
    }

    /// Host address of `iova..iova+len`, which must lie inside one mapping.
    fn resolve(&self, iova: u64, len: usize) -> std::result::Result<*mut u8, IommuFault> {
        let fault = || {
            self.table.faults.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(iommu = %self.name, iova = format_args!("{iova:#x}"), len, "DMA fault: address not mapped");
            IommuFault { iova, len }
        };
        let regions = self.table.regions.read().map_err(|_| fault())?;
        let (&base, region) = regions.range(..=iova).next_back().ok_or_else(fault)?;
        let off = (iova - base) as usize;
        if off.checked_add(len).is_none_or(|end| end > region.len) {
            return Err(fault());
        }
        Ok((region.host + off) as *mut u8)
    }

    /// Device read: copies `dst.len()` bytes at `iova` out of host memory.
    pub fn dma_read(&self, iova: u64, dst: &mut [u8]) -> std::result::Result<(), IommuFault> {
        let src = self.resolve(iova, dst.len())?;
        // SAFETY: `resolve` checked that the whole range lies in a live mapping;
        // the host promised (DmaSpace::map) to keep it allocated while mapped.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Device write: copies `src` into host memory at `iova`.
    pub fn dma_write(&self, iova: u64, src: &[u8]) -> std::result::Result<(), IommuFault> {
        let dst = self.resolve(iova, src.len())?;
        // SAFETY: as in `dma_read`; the destination is device-writable memory by contract.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        Ok(())
    }

    /// Release load of a 32-bit word (queue memory the host polls).
    pub fn dma_store_u32(&self, iova: u64, value: u32) -> std::result::Result<(), IommuFault> {
        if !iova.is_multiple_of(4) {
            return Err(IommuFault { iova, len: 4 });
        }
        let p = self.resolve(iova, 4)?;
        // SAFETY: in a live mapping and 4-byte aligned (IOVA and host share the page offset).
        unsafe { std::sync::atomic::AtomicU32::from_ptr(p.cast()) }.store(value, Ordering::Release);
        Ok(())
    }
}

impl DmaSpace for EmuIommu {
    fn name(&self) -> &str {
        &self.name
    }

    fn alloc(&self, len: usize) -> Result<DmaBuffer> {
        if len == 0 {
            return Err(DriverError::dma(&self.name, "zero-length allocation"));
        }
        let size = len.next_multiple_of(PAGE);
        let layout = std::alloc::Layout::from_size_align(size, PAGE)
            .map_err(|e| DriverError::dma(&self.name, format!("bad allocation of {len} bytes: {e}")))?;
        // SAFETY: non-zero size (checked above).
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| DriverError::dma(&self.name, format!("out of memory allocating {size} bytes")))?;
        let iova = match self.table.insert(ptr.as_ptr() as usize, size) {
            Ok(iova) => iova,
            Err(e) => {
                // SAFETY: just allocated with this layout, not shared.
                unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
                return Err(e);
            }
        };
        let release = Release { table: self.table.clone(), iova, owned: Some((ptr, layout)) };
        // SAFETY: zeroed, page-aligned, `size` bytes, mapped at `iova` until `release` drops.
        Ok(unsafe { DmaBuffer::from_raw(ptr, size, iova, Box::new(release)) })
    }

    unsafe fn map(&self, vaddr: *mut u8, len: usize) -> Result<DmaMapping> {
        if vaddr.is_null() || len == 0 {
            return Err(DriverError::dma(&self.name, "cannot map a null or empty range"));
        }
        let start = vaddr as usize & !(PAGE - 1);
        let end = (vaddr as usize)
            .checked_add(len)
            .ok_or_else(|| DriverError::dma(&self.name, "range wraps the address space"))?
            .next_multiple_of(PAGE);
        let base = self.table.insert(start, end - start)?;
        let iova = base + (vaddr as usize - start) as u64;
        let release = Release { table: self.table.clone(), iova: base, owned: None };
        let segments = vec![IovaSegment { iova, len: len as u64 }];
        // SAFETY: the segment is where `resolve` will find this range; `release` unmaps it.
        Ok(unsafe { DmaMapping::from_raw(vaddr, len, segments, Box::new(release)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_is_reachable_and_unmapped_on_drop() -> Result<()> {
        let mmu = EmuIommu::new("t");
        let buf = mmu.alloc(100)?;
        assert_eq!(buf.len(), 4096);
        assert!(buf.iova() >= IOVA_BASE);
        mmu.dma_write(buf.iova() + 8, b"hello").map_err(|_| DriverError::invalid("fault"))?;
        let mut out = [0u8; 5];
        buf.copy_out(8, &mut out)?;
        assert_eq!(&out, b"hello");
        let iova = buf.iova();
        drop(buf);
        assert!(mmu.dma_read(iova, &mut out).is_err());
        assert_eq!(mmu.fault_count(), 1);
        Ok(())
    }

    #[test]
    fn access_past_a_mapping_faults() -> Result<()> {
        let mmu = EmuIommu::new("t");
        let a = mmu.alloc(4096)?;
        let _b = mmu.alloc(4096)?;
        let mut two = [0u8; 2];
        assert!(mmu.dma_read(a.iova() + 4095, &mut two).is_err());
        assert!(mmu.dma_read(a.iova() + 4094, &mut two).is_ok());
        Ok(())
    }

    #[test]
    fn mapped_caller_memory_keeps_its_page_offset() -> Result<()> {
        let mmu = EmuIommu::new("t");
        let mut v = vec![0u8; 10_000];
        let p = v.as_mut_ptr().wrapping_add(100);
        // SAFETY: `v` outlives the mapping, which is dropped at the end of this scope.
        let m = unsafe { mmu.map(p, 5000)? };
        let seg = m.segments()[0];
        assert_eq!(seg.iova % 4096, p as u64 % 4096);
        mmu.dma_write(seg.iova + 4999, &[7]).map_err(|_| DriverError::invalid("fault"))?;
        drop(m);
        assert_eq!(v[100 + 4999], 7);
        Ok(())
    }
}
