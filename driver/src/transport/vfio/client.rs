//! A client process's side of a VFIO device that another process (tuttid)
//! owns: the container and device fds come over a Unix socket
//! ([`VfioDevice::client_fds`](super::VfioDevice::client_fds)).
//!
//! - [`ClientContainer`]: type1 pins the pages of the process that calls
//!   VFIO_IOMMU_MAP_DMA, so a client maps its own memory, at IOVAs the owner
//!   reserved for it, through its copy of the container fd.
//! - [`DoorbellBar`]: BAR0 as a client needs it. Only the doorbell part
//!   (from offset 0x1000) is mmapped; the registers below it (CAP, CSTS, ...)
//!   are read through the device fd and never written: enabling, resetting
//!   and the admin queue belong to the owner.

use super::container::Container;
use super::device::{Device, RegionInfo};
use crate::error::{DriverError, Result};
use crate::transport::{check_register, DoorbellKind, Registers};
use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use vfio_bindings::bindings::vfio::{VFIO_PCI_BAR0_REGION_INDEX, VFIO_REGION_INFO_FLAG_MMAP};

/// Where NVMe doorbells start in BAR0 (NVMe base spec §3.1.4, SQ0TDBL).
pub const DOORBELLS: usize = 0x1000;

/// A VFIO container set up by another process, used to map this process's memory.
pub struct ClientContainer {
    container: Container,
}

impl ClientContainer {
    /// Takes a container fd received from the device's owner.
    pub fn from_fd(fd: OwnedFd, name: &str) -> Result<ClientContainer> {
        Ok(ClientContainer { container: Container::from_fd(fd, name)? })
    }

    /// Maps `vaddr..vaddr+size` of this process at `iova` (both page aligned);
    /// the kernel pins the pages and charges them to this process.
    pub fn map_dma(&self, vaddr: *const u8, iova: u64, size: u64) -> Result<()> {
        self.container.map_dma(vaddr, iova, size)
    }

    /// Removes the mapping made by [`map_dma`](Self::map_dma) at `iova` with `size`.
    pub fn unmap_dma(&self, iova: u64, size: u64) -> Result<()> {
        self.container.unmap_dma(iova, size)
    }
}

/// BAR0 of a device another process owns: doorbells mapped, registers below
/// them read-only through the device fd.
pub struct DoorbellBar {
    name: String,
    device: Device,
    region: RegionInfo,
    /// The mapping of BAR0 `DOORBELLS..end`.
    ptr: NonNull<u8>,
    end: usize,
}

// SAFETY: the mapping is MMIO owned by this value; every access is one volatile,
// aligned, bounds-checked 32-bit load or store.
unsafe impl Send for DoorbellBar {}
// SAFETY: as above; no access creates a reference into the mapping.
unsafe impl Sync for DoorbellBar {}

impl DoorbellBar {
    /// Maps the doorbells of the device behind `device_fd` (received from its owner).
    pub fn open(device_fd: OwnedFd, name: &str) -> Result<DoorbellBar> {
        let device = Device::new(device_fd, name)?;
        let region = device.region(VFIO_PCI_BAR0_REGION_INDEX)?;
        if region.flags & VFIO_REGION_INFO_FLAG_MMAP == 0 {
            return Err(DriverError::Vfio(format!(
                "{name}: BAR0 cannot be mmapped (flags {:#x}): a client cannot ring its doorbells",
                region.flags
            )));
        }
        let start = DOORBELLS as u64;
        // The mmappable part that holds the first doorbell, to its end.
        let end = match &region.sparse {
            Some(areas) => areas
                .iter()
                .find(|a| a.0 <= start && a.0.saturating_add(a.1) > start)
                .map(|a| a.0 + a.1)
                .ok_or_else(|| {
                    DriverError::Vfio(format!(
                        "{name}: no mmappable part of BAR0 holds the doorbells at {start:#x}: {areas:x?}"
                    ))
                })?,
            None => region.size,
        };
        if end <= start || end > region.size {
            return Err(DriverError::Vfio(format!(
                "{name}: BAR0 of {:#x} bytes has no doorbell page to map (mappable to {end:#x})",
                region.size
            )));
        }
        let len = (end - start) as usize;
        // SAFETY: a fresh shared mapping of the device fd inside BAR0's region
        // (page-aligned offset; the kernel checks offset and length against the BAR).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                device.raw_fd(),
                (region.offset + start) as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            return Err(DriverError::io(
                format!("{name}: mmap of the doorbells of BAR0 ({start:#x}..{end:#x})"),
                e,
            ));
        }
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| DriverError::Vfio(format!("{name}: mmap of the doorbells returned null")))?;
        tracing::debug!(device = %name, start, end, "BAR0 doorbells mapped for a client");
        Ok(DoorbellBar { name: name.to_string(), device, region, ptr, end: end as usize })
    }

    /// The doorbell register at BAR0 `offset`, in the mapping.
    fn mapped(&self, offset: usize) -> Result<*mut u32> {
        check_register(&self.name, self.end, offset, 4)?;
        if offset < DOORBELLS {
            return Err(DriverError::NotOwner {
                device: self.name.clone(),
                what: format!(
                    "register {offset:#x}: only the doorbells (from {DOORBELLS:#x}) are a client's"
                ),
            });
        }
        // SAFETY: DOORBELLS <= offset and offset + 4 <= end (checked): inside the mapping.
        Ok(unsafe { self.ptr.as_ptr().add(offset - DOORBELLS).cast::<u32>() })
    }
}

impl Drop for DoorbellBar {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `open`; doorbells keep an Arc to this value.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.end - DOORBELLS) };
    }
}

impl Registers for DoorbellBar {
    fn name(&self) -> &str {
        &self.name
    }
    fn len(&self) -> usize {
        self.end
    }
    fn read32(&self, offset: usize) -> Result<u32> {
        check_register(&self.name, self.end, offset, 4)?;
        if offset < DOORBELLS {
            return self.device.region_read32(&self.region, offset as u64);
        }
        let p = self.mapped(offset)?;
        // SAFETY: an aligned register inside the live mapping; one volatile load.
        Ok(unsafe { p.read_volatile() })
    }
    fn write32(&self, offset: usize, value: u32) -> Result<()> {
        let p = self.mapped(offset)?;
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        // SAFETY: an aligned register inside the live mapping; one volatile store.
        unsafe { p.write_volatile(value) };
        Ok(())
    }
    fn doorbell_ptr(&self, offset: usize) -> Result<(NonNull<u32>, DoorbellKind)> {
        let p = self.mapped(offset)?;
        // SAFETY: inside a live mapping, so non-null.
        Ok((unsafe { NonNull::new_unchecked(p) }, DoorbellKind::Mmio))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_fd_that_is_not_a_vfio_container_or_device_is_refused_by_name() {
        let fd: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
        let e = ClientContainer::from_fd(fd, "0000:00:04.0").err().expect("/dev/null is no container");
        assert!(e.to_string().contains("0000:00:04.0") && e.to_string().contains("not one"), "{e}");
        let fd: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
        let e = DoorbellBar::open(fd, "0000:00:05.0").err().expect("/dev/null is no device");
        assert!(
            e.to_string().contains("0000:00:05.0") && e.to_string().contains("VFIO_DEVICE_GET_INFO"),
            "{e}"
        );
    }
}
