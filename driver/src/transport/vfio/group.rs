//! A VFIO group: the unit of isolation the IOMMU gives us. It must be viable
//! (every device in it bound to vfio-pci or to nothing) before it can join a
//! container, and the device's fd comes from it.

use super::container::{open_node, Container};
use super::ioctl;
use crate::error::{DriverError, Result};
use crate::pci::{Bdf, PciSystem};
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use vfio_bindings::bindings::vfio::{vfio_group_status, VFIO_GROUP_FLAGS_VIABLE};

pub struct Group {
    fd: OwnedFd,
    number: u32,
}

impl Group {
    /// Opens the group file and checks viability, naming the devices that break it.
    pub fn open(path: &Path, number: u32, sys: &PciSystem, bdf: &Bdf) -> Result<Group> {
        let fd = open_node(path, &format!("VFIO group {number} of {bdf}"))?;
        let group = Group { fd, number };
        let mut status = vfio_group_status { argsz: size_of::<vfio_group_status>() as u32, flags: 0 };
        // SAFETY: a complete vfio_group_status with argsz set; the kernel fills `flags`.
        unsafe { ioctl::ioctl_ptr(group.fd.as_fd(), ioctl::GROUP_GET_STATUS, &mut status) }
            .map_err(|e| DriverError::Vfio(format!("{bdf}: VFIO_GROUP_GET_STATUS on group {number}: {e}")))?;
        if status.flags & VFIO_GROUP_FLAGS_VIABLE == 0 {
            let others: Vec<String> = sys
                .group_members(number)
                .unwrap_or_default()
                .into_iter()
                .filter(|m| {
                    m.bdf != *bdf && m.driver.as_deref().is_some_and(|d| d != "vfio-pci" && d != "pcieport")
                })
                .map(|m| format!("{} (bound to {})", m.bdf, m.driver.unwrap_or_default()))
                .collect();
            return Err(DriverError::Vfio(format!(
                "{bdf}: IOMMU group {number} is not viable: {} must be bound to vfio-pci or to no driver \
                 first (`tutti admin bind` explains; `ls /sys/kernel/iommu_groups/{number}/devices`)",
                if others.is_empty() { "every other device in it".to_string() } else { others.join(", ") }
            )));
        }
        Ok(group)
    }

    pub fn number(&self) -> u32 {
        self.number
    }

    /// Attaches the group to `container`.
    pub fn set_container(&self, container: &Container) -> Result<()> {
        let cfd = container.fd().as_raw_fd();
        // SAFETY: VFIO_GROUP_SET_CONTAINER reads one int (the container fd) through the pointer.
        unsafe {
            ioctl::ioctl_ptr(self.fd.as_fd(), ioctl::GROUP_SET_CONTAINER, &cfd as *const i32 as *mut i32)
        }
        .map_err(|e| DriverError::Vfio(format!("VFIO_GROUP_SET_CONTAINER for group {}: {e}", self.number)))?;
        Ok(())
    }

    /// The device fd of `bdf`, a member of this group.
    pub fn device_fd(&self, bdf: &Bdf) -> Result<OwnedFd> {
        let name =
            CString::new(bdf.as_str()).map_err(|_| DriverError::invalid(format!("PCI address {bdf}")))?;
        // SAFETY: the argument is a NUL-terminated device name the kernel only reads.
        let fd = unsafe {
            ioctl::ioctl_ptr(self.fd.as_fd(), ioctl::GROUP_GET_DEVICE_FD, name.as_ptr() as *mut u8)
        }
        .map_err(|e| {
            DriverError::Vfio(format!(
                "{bdf}: VFIO_GROUP_GET_DEVICE_FD: {e}{}",
                if e.raw_os_error() == Some(libc::EBUSY) {
                    " (another process has the device open)"
                } else {
                    ""
                }
            ))
        })?;
        // SAFETY: on success the ioctl returns a new fd that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}
