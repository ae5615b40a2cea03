//! A VFIO group: the unit of isolation the IOMMU gives us. It must be viable
//! (every device in it bound to vfio-pci or to nothing) before it can join a
//! container, and the device's fd comes from it.

use super::container::{node_error, Container};
use super::ioctl;
use crate::error::{DriverError, Result};
use crate::pci::{Bdf, PciSystem};
use std::ffi::CString;
use std::fs::File;
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
        let what = format!("VFIO group {number} of {bdf}");
        let fd: OwnedFd = match File::options().read(true).write(true).open(path) {
            Ok(f) => f.into(),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                return Err(DriverError::InUse(busy_group_message(Path::new("/proc"), path, number, bdf)))
            }
            Err(e) => return Err(node_error(path, &what, e)),
        };
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

/// The message for a group node that is already open elsewhere (EBUSY): it names
/// the group, the device and the processes found holding the node under
/// `proc_root` (normally `/proc`).
pub(crate) fn busy_group_message(proc_root: &Path, node: &Path, number: u32, bdf: &Bdf) -> String {
    let holders = crate::owner::holders_of(proc_root, node);
    let by = if holders.is_empty() {
        format!(
            "another process (none visible in {} has {} open: it may run as another user or in \
             another PID namespace, or hold the group through a container)",
            proc_root.display(),
            node.display()
        )
    } else {
        holders.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    };
    format!(
        "{bdf}: VFIO group {number} ({}) is busy: it is already open in {by}; a VFIO group has one \
         owner, so stop that process or let it serve the drive",
        node.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn busy_group_names_group_device_and_holder() {
        let root = std::env::temp_dir().join(format!("tutti-vfio-busy-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let fd = root.join("4242/fd");
        std::fs::create_dir_all(&fd).unwrap();
        std::fs::write(root.join("4242/cmdline"), b"tutti\0serve\0").unwrap();
        symlink("/dev/vfio/vfio", fd.join("3")).unwrap();
        symlink("/dev/vfio/12", fd.join("4")).unwrap();
        let bdf: Bdf = "0000:01:00.0".parse().unwrap();
        let msg = busy_group_message(&root, Path::new("/dev/vfio/12"), 12, &bdf);
        assert!(
            msg.contains("0000:01:00.0")
                && msg.contains("VFIO group 12 (/dev/vfio/12)")
                && msg.contains("pid 4242 (tutti serve)"),
            "{msg}"
        );
        // Nobody visible holds group 13: the message says where it looked.
        let msg = busy_group_message(&root, Path::new("/dev/vfio/13"), 13, &bdf);
        assert!(
            msg.contains("group 13") && msg.contains("another process") && !msg.contains("4242"),
            "{msg}"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
