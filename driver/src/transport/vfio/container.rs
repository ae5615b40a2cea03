//! A VFIO container: the IOMMU context that groups are attached to, and the
//! type1 DMA map/unmap calls that decide what the device can reach.

use super::ioctl::{self, InfoBuf, IommuType1Info};
use super::options::IommuMode;
use crate::error::{DriverError, Result};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use vfio_bindings::bindings::vfio::{
    vfio_iommu_type1_dma_map, vfio_iommu_type1_dma_unmap, VFIO_TYPE1v2_IOMMU, VFIO_API_VERSION,
    VFIO_DMA_MAP_FLAG_READ, VFIO_DMA_MAP_FLAG_WRITE, VFIO_NOIOMMU_IOMMU,
};

pub struct Container {
    fd: OwnedFd,
    name: String,
}

/// Opens a device node read-write, turning the usual failures into advice.
pub fn open_node(path: &Path, what: &str) -> Result<OwnedFd> {
    let file = File::options().read(true).write(true).open(path).map_err(|e| node_error(path, what, e))?;
    Ok(file.into())
}

/// The error for a failed open of a device node, with advice for the usual causes.
pub fn node_error(path: &Path, what: &str, e: std::io::Error) -> DriverError {
    {
        let advice = match e.raw_os_error() {
            Some(libc::ENOENT) => "it does not exist: load the modules with `modprobe vfio-pci`",
            Some(libc::EACCES) | Some(libc::EPERM) => {
                "permission denied: run as root, or give this user the group file (chown/udev rule) and a \
                 large enough locked-memory limit (ulimit -l)"
            }
            Some(libc::EBUSY) => {
                "it is busy: another process (or another container) already has this VFIO group open"
            }
            _ => "",
        };
        DriverError::Vfio(format!(
            "cannot open {} ({what}): {e}{}{advice}",
            path.display(),
            if advice.is_empty() { "" } else { "; " }
        ))
    }
}

impl Container {
    /// Opens `/dev/vfio/vfio` (under `dev_root`) and checks the API version and
    /// that the kernel offers `mode`.
    pub fn open(dev_root: &Path, mode: IommuMode, name: &str) -> Result<Container> {
        let fd = open_node(&dev_root.join("vfio/vfio"), "the VFIO container")?;
        let c = Container { fd, name: name.to_string() };
        let version = ioctl::ioctl_val(c.fd(), ioctl::GET_API_VERSION, 0)
            .map_err(|e| DriverError::Vfio(format!("VFIO_GET_API_VERSION: {e}")))?;
        if version != VFIO_API_VERSION as i32 {
            return Err(DriverError::Vfio(format!(
                "the kernel's VFIO API version is {version}, this driver speaks {VFIO_API_VERSION}"
            )));
        }
        let ext = c.iommu_type(mode);
        let supported =
            ioctl::ioctl_val(c.fd(), ioctl::CHECK_EXTENSION, ext as libc::c_ulong).unwrap_or(0) > 0;
        if !supported {
            return Err(DriverError::Vfio(match mode {
                IommuMode::Type1 => {
                    "the kernel's VFIO has no type1v2 IOMMU driver: `modprobe vfio_iommu_type1`".into()
                }
                IommuMode::NoIommu => {
                    "the kernel's VFIO has no no-IOMMU mode: it needs CONFIG_VFIO_NOIOMMU and \
                                       `modprobe vfio enable_unsafe_noiommu_mode=1`"
                        .into()
                }
            }));
        }
        Ok(c)
    }

    /// A container fd another process opened and set up (a daemon passed it
    /// with SCM_RIGHTS): checked to be a VFIO container of this API version.
    pub fn from_fd(fd: OwnedFd, name: &str) -> Result<Container> {
        let c = Container { fd, name: name.to_string() };
        let version = ioctl::ioctl_val(c.fd(), ioctl::GET_API_VERSION, 0).map_err(|e| {
            DriverError::Vfio(format!("{name}: the fd passed as a VFIO container is not one: {e}"))
        })?;
        if version != VFIO_API_VERSION as i32 {
            return Err(DriverError::Vfio(format!(
                "{name}: the passed container speaks VFIO API version {version}, this driver {VFIO_API_VERSION}"
            )));
        }
        Ok(c)
    }

    /// A duplicate of the container fd, for a client process.
    pub fn try_clone_fd(&self) -> Result<OwnedFd> {
        self.fd
            .try_clone()
            .map_err(|e| DriverError::io(format!("{}: duplicating the VFIO container fd", self.name), e))
    }

    fn iommu_type(&self, mode: IommuMode) -> u32 {
        match mode {
            IommuMode::Type1 => VFIO_TYPE1v2_IOMMU,
            IommuMode::NoIommu => VFIO_NOIOMMU_IOMMU,
        }
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Selects the IOMMU driver; valid once a group is attached.
    pub fn set_iommu(&self, mode: IommuMode) -> Result<()> {
        ioctl::ioctl_val(self.fd(), ioctl::SET_IOMMU, self.iommu_type(mode) as libc::c_ulong)
            .map_err(|e| DriverError::Vfio(format!("{}: VFIO_SET_IOMMU({mode:?}): {e}", self.name)))?;
        Ok(())
    }

    /// Usable IOVA windows (inclusive) and the smallest IOMMU page size.
    pub fn iova_windows(&self) -> Result<(Vec<(u64, u64)>, u64)> {
        let mut info = IommuType1Info { argsz: size_of::<IommuType1Info>() as u32, ..Default::default() };
        // SAFETY: IommuType1Info is struct vfio_iommu_type1_info with argsz set to its size.
        unsafe { ioctl::ioctl_ptr(self.fd(), ioctl::IOMMU_GET_INFO, &mut info) }
            .map_err(|e| DriverError::Vfio(format!("{}: VFIO_IOMMU_GET_INFO: {e}", self.name)))?;
        let pgsize = if info.iova_pgsizes == 0 { 4096 } else { 1u64 << info.iova_pgsizes.trailing_zeros() };
        // Without the IOVA range capability (kernels before 5.4) assume the
        // 39-bit space every VT-d implementation has, minus the MSI window.
        let mut windows = vec![(0, 0xfedf_ffff), (0xfef0_0000, (1 << 39) - 1)];
        // The kernel says how much room its capability chain needs; a few
        // hundred bytes in practice, refused past 64 KiB.
        if info.flags & ioctl::IOMMU_INFO_CAPS != 0 && info.argsz as usize > size_of::<IommuType1Info>() {
            if info.argsz > 1 << 16 {
                return Err(DriverError::Vfio(format!(
                    "{}: VFIO_IOMMU_GET_INFO wants {} bytes for its capabilities (64 KiB at most expected)",
                    self.name, info.argsz
                )));
            }
            let mut buf = InfoBuf::new(info.argsz as usize);
            // SAFETY: the buffer is argsz bytes, 8-aligned, and starts with the info structure.
            unsafe {
                let head: *mut IommuType1Info = buf.as_mut_ptr();
                head.write(IommuType1Info { argsz: info.argsz, ..Default::default() });
                ioctl::ioctl_ptr(self.fd(), ioctl::IOMMU_GET_INFO, head)
            }
            .map_err(|e| DriverError::Vfio(format!("{}: VFIO_IOMMU_GET_INFO (caps): {e}", self.name)))?;
            let cap_offset = ioctl::u32_at(buf.bytes(), 16).unwrap_or(0);
            for cap in ioctl::capabilities(buf.bytes(), cap_offset)? {
                if cap.id != ioctl::IOMMU_TYPE1_INFO_CAP_IOVA_RANGE {
                    continue;
                }
                // header (8) | nr_iovas u32 | reserved u32 | { start u64, end u64 }[nr]
                // No more ranges than the capability has bytes for.
                let n = (ioctl::u32_at(cap.bytes, 8).unwrap_or(0) as usize).min(cap.bytes.len() / 16);
                let ranges: Vec<(u64, u64)> = (0..n)
                    .filter_map(|i| {
                        Some((ioctl::u64_at(cap.bytes, 16 + 16 * i)?, ioctl::u64_at(cap.bytes, 24 + 16 * i)?))
                    })
                    .collect();
                if !ranges.is_empty() {
                    windows = ranges;
                }
            }
        }
        Ok((windows, pgsize))
    }

    /// Makes `vaddr..vaddr+size` of this process visible to the device at
    /// `iova`, readable and writable. The kernel pins the pages.
    pub fn map_dma(&self, vaddr: *const u8, iova: u64, size: u64) -> Result<()> {
        self.map_raw(vaddr, iova, size).map_err(|e| {
            let advice = match e.raw_os_error() {
                Some(libc::ENOMEM) => {
                    "; pinning failed: raise the locked-memory limit (ulimit -l / RLIMIT_MEMLOCK) or free memory"
                }
                Some(libc::ENOSPC) => "; too many DMA mappings (vfio_iommu_type1 dma_entry_limit)",
                Some(libc::EEXIST) => "; the IOVA range is already mapped (driver bug)",
                _ => "",
            };
            DriverError::Vfio(format!(
                "{}: VFIO_IOMMU_MAP_DMA of {size:#x} bytes at iova {iova:#x}: {e}{advice}",
                self.name
            ))
        })?;
        tracing::trace!(device = %self.name, iova, size, "dma mapped");
        Ok(())
    }

    /// VFIO_IOMMU_MAP_DMA with the kernel's error as is.
    pub fn map_raw(&self, vaddr: *const u8, iova: u64, size: u64) -> std::io::Result<()> {
        let mut map = vfio_iommu_type1_dma_map {
            argsz: size_of::<vfio_iommu_type1_dma_map>() as u32,
            flags: VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE,
            vaddr: vaddr as u64,
            iova,
            size,
        };
        // SAFETY: a complete vfio_iommu_type1_dma_map; the kernel only reads it.
        unsafe { ioctl::ioctl_ptr(self.fd(), ioctl::IOMMU_MAP_DMA, &mut map) }.map(|_| ())
    }

    /// Removes every mapping inside `iova..iova+size` (type1 v2: none may
    /// stick out of it) and returns how many bytes were unmapped: 0 when
    /// nothing was mapped there. The kernel unpins the pages.
    pub fn unmap_range(&self, iova: u64, size: u64) -> Result<u64> {
        let mut unmap = vfio_iommu_type1_dma_unmap {
            argsz: size_of::<vfio_iommu_type1_dma_unmap>() as u32,
            flags: 0,
            iova,
            size,
        };
        // SAFETY: a complete vfio_iommu_type1_dma_unmap; the kernel writes back `size`.
        unsafe { ioctl::ioctl_ptr(self.fd(), ioctl::IOMMU_UNMAP_DMA, &mut unmap) }.map_err(|e| {
            DriverError::Vfio(format!(
                "{}: VFIO_IOMMU_UNMAP_DMA of the range {iova:#x}+{size:#x}: {e}",
                self.name
            ))
        })?;
        Ok(unmap.size)
    }

    /// Removes the mapping made at `iova` with `size`; the kernel unpins the pages.
    pub fn unmap_dma(&self, iova: u64, size: u64) -> Result<()> {
        let unmapped = self.unmap_range(iova, size)?;
        if unmapped != size {
            return Err(DriverError::Vfio(format!(
                "{}: VFIO_IOMMU_UNMAP_DMA at {iova:#x} unmapped {unmapped:#x} of {size:#x} bytes",
                self.name
            )));
        }
        tracing::trace!(device = %self.name, iova, size, "dma unmapped");
        Ok(())
    }
}
