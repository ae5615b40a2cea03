//! BAR0 of an opened VFIO device mapped into this process: the controller's
//! registers and doorbells.

use super::shared::Shared;
use crate::error::{DriverError, Result};
use crate::transport::{check_register, DoorbellKind, Registers};
use std::ptr::NonNull;
use std::sync::Arc;
use vfio_bindings::bindings::vfio::{VFIO_PCI_BAR0_REGION_INDEX, VFIO_REGION_INFO_FLAG_MMAP};

/// BAR0 of a VFIO device mapped into this process: the controller's registers
/// and doorbells, accessed with volatile loads and stores.
pub struct Bar0 {
    name: String,
    ptr: NonNull<u8>,
    len: usize,
    _shared: Arc<Shared>,
}

// SAFETY: the mapping is MMIO owned by this value; every access is a single
// volatile load or store of an aligned, bounds-checked register.
unsafe impl Send for Bar0 {}
// SAFETY: as above; no access creates a reference into the mapping.
unsafe impl Sync for Bar0 {}

impl Bar0 {
    /// Maps BAR0 (or, when the kernel only allows parts of it, the part that
    /// starts at offset 0 and holds the registers and doorbells).
    pub fn map(shared: Arc<Shared>) -> Result<Bar0> {
        let name = shared.name.clone();
        let region = shared.device.region(VFIO_PCI_BAR0_REGION_INDEX)?;
        if region.flags & VFIO_REGION_INFO_FLAG_MMAP == 0 || region.size == 0 {
            return Err(DriverError::Vfio(format!(
                "{name}: BAR0 cannot be mmapped (flags {:#x}, size {:#x}); is it an I/O-port BAR?",
                region.flags, region.size
            )));
        }
        let len = match &region.sparse {
            Some(areas) => areas.iter().find(|a| a.0 == 0).map(|a| a.1).ok_or_else(|| {
                DriverError::Vfio(format!("{name}: no mmappable part of BAR0 starts at offset 0: {areas:x?}"))
            })?,
            None => region.size,
        } as usize;
        // SAFETY: a fresh shared mapping of the device fd at the region's offset; the
        // kernel checks offset and length against the BAR.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                shared.device.raw_fd(),
                region.offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            return Err(DriverError::io(format!("{name}: mmap of BAR0 ({len:#x} bytes)"), e));
        }
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| DriverError::Vfio(format!("{name}: mmap of BAR0 returned null")))?;
        tracing::debug!(device = %name, len, bar_size = region.size, "BAR0 mapped");
        Ok(Bar0 { name, ptr, len, _shared: shared })
    }
}

impl Drop for Bar0 {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; nothing refers to it any more
        // (doorbells hold an Arc to this value).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

impl Registers for Bar0 {
    fn name(&self) -> &str {
        &self.name
    }
    fn len(&self) -> usize {
        self.len
    }
    fn read32(&self, offset: usize) -> Result<u32> {
        check_register(&self.name, self.len, offset, 4)?;
        // SAFETY: in bounds and 4-byte aligned (checked); MMIO is read with one volatile load.
        Ok(unsafe { self.ptr.as_ptr().add(offset).cast::<u32>().read_volatile() })
    }
    fn write32(&self, offset: usize, value: u32) -> Result<()> {
        check_register(&self.name, self.len, offset, 4)?;
        // Queue memory written before a register store (ASQ/ACQ contents, SQ entries)
        // must reach memory first.
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        // SAFETY: in bounds and 4-byte aligned (checked); one volatile store.
        unsafe { self.ptr.as_ptr().add(offset).cast::<u32>().write_volatile(value) };
        Ok(())
    }
    fn doorbell_ptr(&self, offset: usize) -> Result<(NonNull<u32>, DoorbellKind)> {
        check_register(&self.name, self.len, offset, 4)?;
        // SAFETY: in bounds (checked) of a live mapping, so the pointer is non-null.
        let p = unsafe { NonNull::new_unchecked(self.ptr.as_ptr().add(offset).cast::<u32>()) };
        Ok((p, DoorbellKind::Mmio))
    }
}
