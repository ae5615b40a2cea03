//! DMA space of a client whose device belongs to another process (a daemon).
//!
//! The client's memory is mapped for the device by its owner through a
//! [`DmaBroker`]; [`BrokeredDma`] is the [`DmaSpace`] a leased
//! [`Controller`](crate::controller::Controller) uses on top of it.

use crate::error::{DriverError, Result};
use crate::transport::pages::HostPages;
use crate::transport::{DmaBuffer, DmaMapping, DmaSpace, IovaSegment};
use std::sync::Arc;

/// Maps client memory into a device's IOMMU through its owner (the daemon).
pub trait DmaBroker: Send + Sync {
    /// Map `len` bytes at this process's `addr`; returns the IOVA (of `addr`
    /// itself: its offset in the page is kept).
    fn map(&self, addr: u64, len: usize) -> Result<u64>;
    /// Unmap what [`map`](Self::map) returned `iova` for. It must not return
    /// before the device can no longer reach that memory (the mapping is
    /// gone, or the owner has dropped every mapping of this client), because
    /// the memory is freed or reused right after.
    fn unmap(&self, iova: u64);
    /// [`unmap`](Self::unmap), telling whether the mapping is known to be
    /// gone. On an error [`BrokeredDma`] leaks the memory of a buffer rather
    /// than free memory the device might still write. The default trusts
    /// `unmap`.
    fn unmap_checked(&self, iova: u64) -> Result<()> {
        self.unmap(iova);
        Ok(())
    }
    /// Map `len` bytes of device memory (a PFN map: a BAR, a GDRCopy window)
    /// at this process's `addr`, named `what` in errors; unmapped with
    /// [`unmap`](Self::unmap) like host memory. The default refuses: a broker
    /// whose owner cannot reach device memory of this process.
    fn map_device(&self, addr: u64, len: usize, what: &str) -> Result<u64> {
        Err(DriverError::DeviceMemoryRefused {
            space: "brokered DMA".into(),
            what: what.to_string(),
            vaddr: addr,
            len: len as u64,
            call: "map_device",
            errno: libc::EOPNOTSUPP,
            reason: "the owner of this device maps no device memory for its clients".into(),
        })
    }
}

/// A [`DmaSpace`] whose mappings a [`DmaBroker`] makes.
pub struct BrokeredDma {
    name: String,
    broker: Arc<dyn DmaBroker>,
    page: usize,
}

impl BrokeredDma {
    /// `page_size` is the device's memory page size (a power of two, at
    /// least 4096); allocations are aligned and rounded to it.
    pub fn new(name: &str, broker: Arc<dyn DmaBroker>, page_size: usize) -> Result<Self> {
        if !page_size.is_power_of_two() || page_size < 4096 {
            return Err(DriverError::invalid(format!(
                "brokered DMA {name}: page size {page_size} is not a power of two >= 4096"
            )));
        }
        Ok(BrokeredDma { name: format!("brokered DMA {name}"), broker, page: page_size })
    }
}

/// Unmaps through the broker, then frees owned memory (if the unmap is known to have worked).
struct Release {
    broker: Arc<dyn DmaBroker>,
    space: String,
    iova: u64,
    owned: Option<HostPages>,
}

impl Drop for Release {
    fn drop(&mut self) {
        match self.broker.unmap_checked(self.iova) {
            // Unmapped: `owned`, if any, is freed as it drops.
            Ok(()) => {}
            Err(e) => {
                tracing::warn!(space = %self.space, iova = format_args!("{:#x}", self.iova), error = %e,
                    "unmap not confirmed; the buffer's memory is leaked rather than freed under the device");
                if let Some(pages) = self.owned.take() {
                    pages.leak();
                }
            }
        }
    }
}

impl DmaSpace for BrokeredDma {
    fn name(&self) -> &str {
        &self.name
    }
    fn page_size(&self) -> usize {
        self.page
    }

    fn alloc(&self, len: usize) -> Result<DmaBuffer> {
        let pages = HostPages::alloc(&self.name, len, self.page)?;
        let (ptr, size) = (pages.ptr(), pages.len());
        let iova = match self.broker.map(pages.addr(), size) {
            Ok(iova) if iova.is_multiple_of(self.page as u64) => iova,
            Ok(iova) => {
                // A broker that moved the page offset: unusable for queue memory.
                let r = Release {
                    broker: self.broker.clone(),
                    space: self.name.clone(),
                    iova,
                    owned: Some(pages),
                };
                drop(r);
                return Err(DriverError::dma(
                    &self.name,
                    format!("broker mapped a page-aligned buffer at IOVA {iova:#x}"),
                ));
            }
            // Never mapped: `pages` is freed as it drops.
            Err(e) => return Err(e),
        };
        let release =
            Release { broker: self.broker.clone(), space: self.name.clone(), iova, owned: Some(pages) };
        // SAFETY: zeroed, page-aligned, `size` bytes, mapped at `iova` until `release` drops.
        Ok(unsafe { DmaBuffer::from_raw(ptr, size, iova, Box::new(release)) })
    }

    unsafe fn map(&self, vaddr: *mut u8, len: usize) -> Result<DmaMapping> {
        if vaddr.is_null() || len == 0 {
            return Err(DriverError::dma(&self.name, "cannot map a null or empty range"));
        }
        (vaddr as usize)
            .checked_add(len)
            .ok_or_else(|| DriverError::dma(&self.name, "range wraps the address space"))?;
        let iova = self.broker.map(vaddr as u64, len)?;
        if iova % self.page as u64 != vaddr as u64 % self.page as u64 {
            let _ = self.broker.unmap_checked(iova);
            return Err(DriverError::dma(
                &self.name,
                format!("broker mapped {vaddr:p} at IOVA {iova:#x}, a different offset in the page"),
            ));
        }
        let release = Release { broker: self.broker.clone(), space: self.name.clone(), iova, owned: None };
        let segments = vec![IovaSegment { iova, len: len as u64 }];
        // SAFETY: the broker maps the range contiguously at `iova`; `release` unmaps it.
        Ok(unsafe { DmaMapping::from_raw(vaddr, len, segments, Box::new(release)) })
    }

    unsafe fn map_device(&self, vaddr: *mut u8, len: usize, what: &str) -> Result<DmaMapping> {
        crate::transport::check_device_range(&self.name, vaddr, len, what, self.page)?;
        let iova = self.broker.map_device(vaddr as u64, len, what)?;
        if !iova.is_multiple_of(self.page as u64) {
            let _ = self.broker.unmap_checked(iova);
            return Err(DriverError::dma(
                &self.name,
                format!("broker mapped device memory at IOVA {iova:#x}"),
            ));
        }
        let release = Release { broker: self.broker.clone(), space: self.name.clone(), iova, owned: None };
        let segments = vec![IovaSegment { iova, len: len as u64 }];
        // SAFETY: the broker maps the range contiguously at `iova`; `release` unmaps it.
        Ok(unsafe { DmaMapping::from_raw(vaddr, len, segments, Box::new(release)) })
    }
}
