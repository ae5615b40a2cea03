//! The VFIO ioctls we use (linux/vfio.h), and parsing of their capability chains.
//!
//! Every VFIO ioctl is `_IO(VFIO_TYPE, VFIO_BASE + n)`: no size in the number,
//! the structure's `argsz` field says how much the kernel may read or write.

use crate::error::{DriverError, Result};
use std::os::fd::{AsRawFd, BorrowedFd};
use vfio_bindings::bindings::vfio::{VFIO_BASE, VFIO_TYPE};

const fn io(n: u32) -> libc::Ioctl {
    ((VFIO_TYPE << 8) | (VFIO_BASE + n)) as libc::Ioctl
}

pub const GET_API_VERSION: libc::Ioctl = io(0);
pub const CHECK_EXTENSION: libc::Ioctl = io(1);
pub const SET_IOMMU: libc::Ioctl = io(2);
pub const GROUP_GET_STATUS: libc::Ioctl = io(3);
pub const GROUP_SET_CONTAINER: libc::Ioctl = io(4);
pub const GROUP_GET_DEVICE_FD: libc::Ioctl = io(6);
pub const DEVICE_GET_INFO: libc::Ioctl = io(7);
pub const DEVICE_GET_REGION_INFO: libc::Ioctl = io(8);
pub const IOMMU_GET_INFO: libc::Ioctl = io(12);
pub const IOMMU_MAP_DMA: libc::Ioctl = io(13);
pub const IOMMU_UNMAP_DMA: libc::Ioctl = io(14);

/// `vfio_iommu_type1_info.flags`: a capability chain follows (Linux 5.4+).
pub const IOMMU_INFO_CAPS: u32 = 1 << 1;
/// Capability: the IOVA ranges the IOMMU can translate.
pub const IOMMU_TYPE1_INFO_CAP_IOVA_RANGE: u16 = 1;

/// `struct vfio_iommu_type1_info` as of Linux 5.4 (the bindings predate `cap_offset`).
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub struct IommuType1Info {
    pub argsz: u32,
    pub flags: u32,
    pub iova_pgsizes: u64,
    pub cap_offset: u32,
    pub pad: u32,
}

/// An ioctl whose argument is a value (an fd or a constant).
pub fn ioctl_val(fd: BorrowedFd<'_>, req: libc::Ioctl, arg: libc::c_ulong) -> std::io::Result<libc::c_int> {
    // SAFETY: the request takes its argument by value; no memory is passed to the kernel.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), req, arg) };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// An ioctl whose argument points at `arg`, which the kernel may read and write.
///
/// # Safety
/// `T` must be the structure (with `argsz` at most `size_of::<T>()` or of the
/// buffer `arg` heads) that `req` expects.
pub unsafe fn ioctl_ptr<T>(
    fd: BorrowedFd<'_>,
    req: libc::Ioctl,
    arg: *mut T,
) -> std::io::Result<libc::c_int> {
    // SAFETY: the caller guarantees `arg` is the right structure for `req` and is
    // valid for the kernel to access for `argsz` bytes.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), req, arg) };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// One capability in an info structure's chain: its id, version and bytes.
pub struct Capability<'a> {
    pub id: u16,
    pub bytes: &'a [u8],
}

/// Walks the chain starting at `first` in `buf` (each header: id u16, version
/// u16, next u32 as an offset from the start of `buf`; 0 ends the chain).
pub fn capabilities(buf: &[u8], first: u32) -> Result<Vec<Capability<'_>>> {
    let mut caps = Vec::new();
    let mut at = first as usize;
    while at != 0 {
        if caps.len() > 64 || at + 8 > buf.len() {
            return Err(DriverError::Vfio(format!(
                "malformed capability chain at offset {at} of {}",
                buf.len()
            )));
        }
        let id = u16::from_ne_bytes([buf[at], buf[at + 1]]);
        let next = u32::from_ne_bytes([buf[at + 4], buf[at + 5], buf[at + 6], buf[at + 7]]) as usize;
        let end = if next > at { next.min(buf.len()) } else { buf.len() };
        caps.push(Capability { id, bytes: &buf[at..end] });
        if next != 0 && next <= at {
            return Err(DriverError::Vfio(format!("capability chain loops back from {at} to {next}")));
        }
        at = next;
    }
    Ok(caps)
}

pub fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

pub fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// A zeroed buffer of `len` bytes with 8-byte alignment for variable-size ioctl structures.
pub struct InfoBuf(Vec<u64>);

impl InfoBuf {
    pub fn new(len: usize) -> InfoBuf {
        InfoBuf(vec![0u64; len.div_ceil(8)])
    }
    pub fn as_mut_ptr<T>(&mut self) -> *mut T {
        self.0.as_mut_ptr().cast()
    }
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: a u64 slice viewed as bytes: same memory, alignment 1 is weaker.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast(), self.0.len() * 8) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_linux() {
        // _IO(';', 100) = 0x3b64 ... from linux/vfio.h.
        assert_eq!(GET_API_VERSION, 0x3b64);
        assert_eq!(GROUP_GET_DEVICE_FD, 0x3b6a);
        assert_eq!(IOMMU_GET_INFO, 0x3b70);
        assert_eq!(IOMMU_MAP_DMA, 0x3b71);
        assert_eq!(IOMMU_UNMAP_DMA, 0x3b72);
    }

    #[test]
    fn walks_a_capability_chain() {
        let mut buf = vec![0u8; 64];
        // cap at 16: id 1, next 40; cap at 40: id 3, next 0.
        buf[16..18].copy_from_slice(&1u16.to_ne_bytes());
        buf[20..24].copy_from_slice(&40u32.to_ne_bytes());
        buf[40..42].copy_from_slice(&3u16.to_ne_bytes());
        let caps = capabilities(&buf, 16).unwrap();
        assert_eq!(caps.iter().map(|c| (c.id, c.bytes.len())).collect::<Vec<_>>(), [(1, 24), (3, 24)]);
        // A chain pointing backwards is rejected instead of looping.
        buf[44..48].copy_from_slice(&16u32.to_ne_bytes());
        assert!(capabilities(&buf, 16).is_err());
        assert!(capabilities(&buf, 60).is_err());
    }
}
