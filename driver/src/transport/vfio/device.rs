//! The device fd: region information and PCI config space (BAR0 mapped as
//! the controller's registers is `bar0.rs`).

use super::ioctl::{self, InfoBuf};
use crate::error::{DriverError, Result};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use vfio_bindings::bindings::vfio::{
    vfio_device_info, vfio_region_info, VFIO_DEVICE_FLAGS_PCI, VFIO_PCI_CONFIG_REGION_INDEX,
    VFIO_REGION_INFO_CAP_SPARSE_MMAP, VFIO_REGION_INFO_FLAG_CAPS,
};

/// PCI configuration space: the Command register and its enable bits (PCI Local Bus 3.0 §6.2.2).
const PCI_COMMAND: u64 = 0x04;
const COMMAND_MEMORY: u16 = 1 << 1;
const COMMAND_BUS_MASTER: u16 = 1 << 2;

#[derive(Clone, Debug)]
pub struct RegionInfo {
    pub flags: u32,
    pub size: u64,
    /// Offset of the region in the device fd.
    pub offset: u64,
    /// Parts that may be mmapped, when not the whole region (e.g. around an MSI-X table).
    pub sparse: Option<Vec<(u64, u64)>>,
}

pub struct Device {
    fd: OwnedFd,
    name: String,
    config: RegionInfo,
}

impl Device {
    pub fn new(fd: OwnedFd, name: &str) -> Result<Device> {
        let mut info = vfio_device_info { argsz: size_of::<vfio_device_info>() as u32, ..Default::default() };
        // SAFETY: a complete vfio_device_info with argsz set; the kernel fills it.
        unsafe { ioctl::ioctl_ptr(fd.as_fd(), ioctl::DEVICE_GET_INFO, &mut info) }
            .map_err(|e| DriverError::Vfio(format!("{name}: VFIO_DEVICE_GET_INFO: {e}")))?;
        if info.flags & VFIO_DEVICE_FLAGS_PCI == 0 || info.num_regions <= VFIO_PCI_CONFIG_REGION_INDEX {
            return Err(DriverError::Vfio(format!(
                "{name}: not a PCI device with a config region (flags {:#x}, {} regions)",
                info.flags, info.num_regions
            )));
        }
        let mut dev = Device {
            fd,
            name: name.to_string(),
            config: RegionInfo { flags: 0, size: 0, offset: 0, sparse: None },
        };
        dev.config = dev.region(VFIO_PCI_CONFIG_REGION_INDEX)?;
        Ok(dev)
    }

    pub fn region(&self, index: u32) -> Result<RegionInfo> {
        let base = size_of::<vfio_region_info>();
        let mut info = vfio_region_info { argsz: base as u32, index, ..Default::default() };
        // SAFETY: a complete vfio_region_info with argsz set; the kernel fills it.
        unsafe { ioctl::ioctl_ptr(self.fd.as_fd(), ioctl::DEVICE_GET_REGION_INFO, &mut info) }.map_err(
            |e| DriverError::Vfio(format!("{}: VFIO_DEVICE_GET_REGION_INFO({index}): {e}", self.name)),
        )?;
        let mut sparse = None;
        if info.flags & VFIO_REGION_INFO_FLAG_CAPS != 0 && info.argsz as usize > base {
            let mut buf = InfoBuf::new(info.argsz as usize);
            // SAFETY: the buffer is argsz bytes, 8-aligned, and starts with the info structure.
            unsafe {
                let head: *mut vfio_region_info = buf.as_mut_ptr();
                head.write(vfio_region_info { argsz: info.argsz, index, ..Default::default() });
                ioctl::ioctl_ptr(self.fd.as_fd(), ioctl::DEVICE_GET_REGION_INFO, head)
            }
            .map_err(|e| {
                DriverError::Vfio(format!("{}: VFIO_DEVICE_GET_REGION_INFO({index}) caps: {e}", self.name))
            })?;
            let cap_offset = ioctl::u32_at(buf.bytes(), 12).unwrap_or(0);
            for cap in ioctl::capabilities(buf.bytes(), cap_offset)? {
                if cap.id as u32 == VFIO_REGION_INFO_CAP_SPARSE_MMAP {
                    // header (8) | nr_areas u32 | reserved u32 | { offset u64, size u64 }[nr]
                    let n = ioctl::u32_at(cap.bytes, 8).unwrap_or(0) as usize;
                    sparse = Some(
                        (0..n)
                            .filter_map(|i| {
                                Some((
                                    ioctl::u64_at(cap.bytes, 16 + 16 * i)?,
                                    ioctl::u64_at(cap.bytes, 24 + 16 * i)?,
                                ))
                            })
                            .collect(),
                    );
                }
            }
        }
        Ok(RegionInfo { flags: info.flags, size: info.size, offset: info.offset, sparse })
    }

    /// Reads exactly `buf.len()` bytes of config space at `off`; a short read is an error.
    pub fn config_read(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        self.check_config(off, buf.len())?;
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe {
            libc::pread(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                (self.config.offset + off) as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return Err(DriverError::io(format!("{}: reading config space at {off:#x}", self.name), e));
        }
        if n as usize != buf.len() {
            return Err(DriverError::Vfio(format!(
                "{}: short config space read at {off:#x}: {n} of {} bytes",
                self.name,
                buf.len()
            )));
        }
        Ok(())
    }

    /// Writes all of `buf` to config space at `off`; a short write is an error.
    pub fn config_write(&self, off: u64, buf: &[u8]) -> Result<()> {
        self.check_config(off, buf.len())?;
        // SAFETY: `buf` is valid for reads of its length.
        let n = unsafe {
            libc::pwrite(
                self.fd.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                (self.config.offset + off) as libc::off_t,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return Err(DriverError::io(format!("{}: writing config space at {off:#x}", self.name), e));
        }
        if n as usize != buf.len() {
            return Err(DriverError::Vfio(format!(
                "{}: short config space write at {off:#x}: {n} of {} bytes",
                self.name,
                buf.len()
            )));
        }
        Ok(())
    }

    fn check_config(&self, off: u64, len: usize) -> Result<()> {
        if off + len as u64 > self.config.size {
            return Err(DriverError::Vfio(format!(
                "{}: config access {off:#x}+{len} is outside the {:#x}-byte config space",
                self.name, self.config.size
            )));
        }
        Ok(())
    }

    /// Turns on memory-space decoding (for BAR0) and bus mastering (for DMA),
    /// and reads the Command register back to see that both took.
    pub fn enable_memory_and_bus_master(&self) -> Result<()> {
        let mut cmd = [0u8; 2];
        self.config_read(PCI_COMMAND, &mut cmd)?;
        let before = u16::from_le_bytes(cmd);
        let wanted = before | COMMAND_MEMORY | COMMAND_BUS_MASTER;
        if wanted != before {
            self.config_write(PCI_COMMAND, &wanted.to_le_bytes())?;
        }
        self.config_read(PCI_COMMAND, &mut cmd)?;
        let after = u16::from_le_bytes(cmd);
        if after & (COMMAND_MEMORY | COMMAND_BUS_MASTER) != COMMAND_MEMORY | COMMAND_BUS_MASTER {
            return Err(DriverError::Vfio(format!(
                "{}: PCI Command register is {after:#06x} after writing {wanted:#06x}: memory space or bus \
                 master did not enable",
                self.name
            )));
        }
        tracing::debug!(device = %self.name, before, after, "memory space and bus master enabled");
        Ok(())
    }

    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// A duplicate of the device fd, for a client process.
    pub fn try_clone_fd(&self) -> Result<OwnedFd> {
        self.fd
            .try_clone()
            .map_err(|e| DriverError::io(format!("{}: duplicating the VFIO device fd", self.name), e))
    }

    /// Reads a 32-bit register of region `region` at `off` through the fd
    /// (vfio-pci's read path; no mapping needed).
    pub fn region_read32(&self, region: &RegionInfo, off: u64) -> Result<u32> {
        if !off.is_multiple_of(4) || off.checked_add(4).is_none_or(|end| end > region.size) {
            return Err(DriverError::Vfio(format!(
                "{}: register read at {off:#x} is outside the {:#x}-byte region or unaligned",
                self.name, region.size
            )));
        }
        let mut buf = [0u8; 4];
        // SAFETY: `buf` is valid for writes of 4 bytes.
        let n = unsafe {
            libc::pread(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), 4, (region.offset + off) as libc::off_t)
        };
        if n != 4 {
            let e = std::io::Error::last_os_error();
            return Err(DriverError::io(format!("{}: reading BAR0 at {off:#x} ({n} bytes)", self.name), e));
        }
        Ok(u32::from_le_bytes(buf))
    }
}
