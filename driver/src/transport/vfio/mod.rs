//! A real PCI NVMe controller bound to vfio-pci, driven from userspace.
//!
//! [`VfioDevice::open`] walks the VFIO setup sequence of
//! Documentation/driver-api/vfio.rst: open a container, open the device's
//! group and check it is viable, attach the group, select the IOMMU driver,
//! get the device fd, enable memory decoding and bus mastering, map BAR0.
//! The result offers the same two objects the emulated controller does, so
//! `Controller::new(dev.registers(), dev.dma_space(), opts)` is the same call.
//!
//! Two IOMMU modes:
//! - [`IommuMode::Type1`] (the default and the production path): the IOMMU
//!   translates every DMA; we map each buffer at an IOVA we choose and unmap it
//!   when the buffer drops.
//! - [`IommuMode::NoIommu`], only when asked for: no translation and no
//!   protection; the device is given physical addresses of hugepages.

mod bar;
mod bar0;
mod client;
mod container;
mod device;
mod dma;
pub mod faultlog;
mod group;
mod ioctl;
mod iova;
mod mem;
mod options;
mod shared;

pub use bar::VfioBar;
pub use bar0::Bar0;
pub use client::{ClientContainer, DoorbellBar};
pub use dma::VfioDma;
pub use faultlog::{FaultLog, IommuFault};
pub use options::{HugepagePolicy, IommuMode, VfioOptions};
pub use shared::Shared;

use crate::error::{DriverError, Result};
use crate::pci::{Bdf, PciSystem};
use crate::transport::{DmaSpace, Registers};
use container::Container;
use device::Device;
use group::Group;
use std::os::fd::OwnedFd;
use std::sync::Arc;

/// An NVMe controller opened through VFIO.
pub struct VfioDevice {
    bdf: Bdf,
    mode: IommuMode,
    group: u32,
    regs: Arc<Bar0>,
    dma: Arc<VfioDma>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for VfioDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VfioDevice({} group {} {})", self.bdf, self.group, self.mode.label())
    }
}

impl VfioDevice {
    /// Opens the NVMe controller at `bdf`, which must be bound to vfio-pci.
    pub fn open(bdf: &Bdf, opts: &VfioOptions) -> Result<VfioDevice> {
        let sys = PciSystem::with_root(&opts.root);
        let function = sys.function(bdf)?;
        if !function.is_nvme() {
            return Err(DriverError::Vfio(format!(
                "{bdf} is a {} (class {:#08x}), not an NVMe controller",
                function.kind(),
                function.class
            )));
        }
        let group_path = sys.vfio_group(bdf)?;
        match (group_path.noiommu, opts.mode) {
            (true, IommuMode::Type1) => {
                return Err(DriverError::Vfio(format!(
                    "{bdf} is in a no-IOMMU VFIO group ({}): its DMA cannot be confined; open it in no-IOMMU \
                     mode (--noiommu) only if you accept that",
                    group_path.path.display()
                )))
            }
            (false, IommuMode::NoIommu) => {
                return Err(DriverError::Vfio(format!(
                    "{bdf} is behind an IOMMU (group {}): no-IOMMU mode is only for machines without one; \
                     drop --noiommu",
                    group_path.group
                )))
            }
            _ => {}
        }
        if opts.mode == IommuMode::NoIommu {
            tracing::warn!(
                device = %bdf,
                "VFIO NO-IOMMU MODE: {bdf} can DMA anywhere in physical memory and nothing checks the \
                 addresses it is given; a driver bug can corrupt the kernel. Use only for testing."
            );
        }
        let name = bdf.to_string();
        let container = Container::open(&opts.root.join("dev"), opts.mode, &name)?;
        let group = Group::open(&group_path.path, group_path.group, &sys, bdf)?;
        group.set_container(&container)?;
        container.set_iommu(opts.mode)?;
        let device = Device::new(group.device_fd(bdf)?, &name)?;
        device.enable_memory_and_bus_master()?;
        let shared = Arc::new(Shared { device, group, container, name, mode: opts.mode });
        let regs = Arc::new(Bar0::map(shared.clone())?);
        let dma = Arc::new(VfioDma::new(shared.clone(), opts.hugepages)?);
        tracing::info!(device = %bdf, group = shared.group.number(), mode = opts.mode.label(), "opened through VFIO");
        Ok(VfioDevice { bdf: bdf.clone(), mode: opts.mode, group: group_path.group, regs, dma, shared })
    }

    pub fn bdf(&self) -> &Bdf {
        &self.bdf
    }
    pub fn mode(&self) -> IommuMode {
        self.mode
    }
    pub fn iommu_group(&self) -> u32 {
        self.group
    }
    /// BAR0, for `Controller::new`.
    pub fn registers(&self) -> Arc<dyn Registers> {
        self.regs.clone()
    }
    /// The device's DMA space, for `Controller::new`.
    pub fn dma_space(&self) -> Arc<dyn DmaSpace> {
        self.dma.clone()
    }
    /// The same DMA space with its calls for other processes' IOVA ranges
    /// ([`VfioDma::reserve_iova`], [`VfioDma::release_iova`]).
    pub fn vfio_dma(&self) -> &Arc<VfioDma> {
        &self.dma
    }

    /// Duplicates of the container fd and the device fd, for a client
    /// process of a daemon that owns this device (sent with SCM_RIGHTS): with
    /// the container it maps its own memory (type1 only), with the device fd
    /// it maps the doorbells of BAR0 ([`DoorbellBar`]).
    ///
    /// What a holder of these fds can do is everything this process can do
    /// with the device: map and unmap any IOVA of the container (the daemon's
    /// own ranges included), read and write config space and all of BAR0
    /// through the fd, reset the device. Give them only to trusted processes.
    pub fn client_fds(&self) -> Result<(OwnedFd, OwnedFd)> {
        if self.mode != IommuMode::Type1 {
            return Err(DriverError::Vfio(format!(
                "{}: clients of a daemon need type1 (their memory is mapped through the shared \
                 container); this device is open in no-IOMMU mode",
                self.bdf
            )));
        }
        Ok((self.shared.container.try_clone_fd()?, self.shared.device.try_clone_fd()?))
    }
}
