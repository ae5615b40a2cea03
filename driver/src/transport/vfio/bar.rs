//! Another PCI device's memory BAR, opened through vfio-pci and mapped into
//! this process: device memory the drives can DMA into peer to peer once a
//! drive's DMA space maps it ([`crate::transport::DmaSpace::map_device`]).
//!
//! The device is opened in a type1 container of its own (its group must be
//! viable, as a drive's), memory decoding is enabled, and the BAR is
//! mmapped. The mapping is a PFN map of the BAR's bus addresses: vfio type1
//! follows it when a drive's container maps it, and the IOMMU then routes
//! the drive's DMA to the BAR.

use super::container::Container;
use super::device::Device;
use super::group::Group;
use super::options::{IommuMode, VfioOptions};
use crate::error::{DriverError, Result};
use crate::pci::{Bdf, PciSystem};
use std::ptr::NonNull;
use vfio_bindings::bindings::vfio::VFIO_REGION_INFO_FLAG_MMAP;

/// A memory BAR of a vfio-pci device, mapped read-write into this process.
pub struct VfioBar {
    name: String,
    ptr: NonNull<u8>,
    len: usize,
    // Dropped after the mapping is gone (see `Drop`): device, group, container.
    _device: Device,
    _group: Group,
    _container: Container,
}

// SAFETY: the mapping is device memory owned by this value; callers access it
// through raw pointers with volatile operations.
unsafe impl Send for VfioBar {}
// SAFETY: as above; no reference into the mapping is ever created here.
unsafe impl Sync for VfioBar {}

impl VfioBar {
    /// Opens the device at `bdf` (bound to vfio-pci) and maps BAR `index` (0..=5) whole.
    pub fn open(bdf: &Bdf, index: u32, opts: &VfioOptions) -> Result<VfioBar> {
        if index > 5 {
            return Err(DriverError::invalid(format!("{bdf}: BAR {index} does not exist (0..=5)")));
        }
        if opts.mode != IommuMode::Type1 {
            return Err(DriverError::Vfio(format!(
                "{bdf}: device memory is only mapped for drives through type1 (no-IOMMU mode has no \
                 translation to route peer DMA)"
            )));
        }
        let sys = PciSystem::with_root(&opts.root);
        let function = sys.function(bdf)?;
        if function.driver.as_deref() != Some("vfio-pci") {
            return Err(DriverError::Vfio(format!(
                "{bdf} ({}) is bound to {}, not vfio-pci: bind it first (`tutti admin bind {bdf}`)",
                function.kind(),
                function.driver.as_deref().unwrap_or("no driver")
            )));
        }
        let group_path = sys.vfio_group(bdf)?;
        let name = format!("{bdf} BAR{index}");
        let container = Container::open(&opts.root.join("dev"), opts.mode, &name)?;
        let group = Group::open(&group_path.path, group_path.group, &sys, bdf)?;
        group.set_container(&container)?;
        container.set_iommu(opts.mode)?;
        let device = Device::new(group.device_fd(bdf)?, &name)?;
        device.enable_memory_and_bus_master()?;
        let region = device.region(index)?;
        if region.flags & VFIO_REGION_INFO_FLAG_MMAP == 0 || region.size == 0 || region.sparse.is_some() {
            return Err(DriverError::Vfio(format!(
                "{name}: the BAR cannot be mmapped whole (flags {:#x}, size {:#x}, sparse areas {:x?}); \
                 is it an I/O-port BAR, absent, or split around an MSI-X table?",
                region.flags, region.size, region.sparse
            )));
        }
        let len = usize::try_from(region.size)
            .map_err(|_| DriverError::Vfio(format!("{name}: BAR of {:#x} bytes", region.size)))?;
        // SAFETY: a fresh shared mapping of the device fd at the region's offset; the
        // kernel checks offset and length against the BAR.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                device.raw_fd(),
                region.offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            return Err(DriverError::io(format!("{name}: mmap of {len:#x} bytes"), e));
        }
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| DriverError::Vfio(format!("{name}: mmap returned null")))?;
        tracing::info!(device = %name, len, group = group_path.group, "device BAR mapped");
        Ok(VfioBar { name, ptr, len, _device: device, _group: group, _container: container })
    }

    /// `0000:00:09.0 BAR2`.
    pub fn name(&self) -> &str {
        &self.name
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
}

impl Drop for VfioBar {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `open`. Callers drop every
        // drive mapping of it first (it outlives the registrations that use it).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

impl std::fmt::Debug for VfioBar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VfioBar({}, {:#x} bytes)", self.name, self.len)
    }
}
