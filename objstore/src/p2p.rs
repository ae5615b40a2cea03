//! KV memory in another device (a PCI BAR, GPU memory a provider exposes)
//! that the drives DMA into peer to peer, and the probe that decides whether
//! they really can.
//!
//! A mapping the kernel accepts says nothing about the platform: PCIe routing
//! (ACS, a root complex that does not forward peer traffic) can fault the
//! transfers or drop them, and QEMU's NVMe model completes a command whose
//! DMA the IOMMU blocked with success status. So registration probes every
//! drive with real commands and checks bytes through the provider's own
//! access path ([`DeviceAccess`]; the probe itself is `crate::probe`):
//!
//! 1. The drive's LBA 0 is read through host memory (the expected bytes).
//! 2. The first chunk of the target is filled with their complement through
//!    the provider; the drive Reads LBA 0 straight into the target's IOVA;
//!    every byte must now equal the expected ones (the drive → device path).
//! 3. The drive Writes LBA 0 from the target (which holds exactly LBA 0's
//!    bytes, so correct DMA leaves the media as it was); LBA 0 is read back
//!    through host memory and must be unchanged (the device → drive path).
//!    If it changed, the expected bytes are written back at once.
//! 4. The target's bytes from before the probe are restored.
//!
//! Any failure, error or timeout (each command is bounded by the
//! controller's I/O timeout) is the probe's verdict, in words: under
//! [`P2pPolicy::Auto`] the registration falls back to the staged path with
//! that verdict as `p2p_missing`; under [`P2pPolicy::Require`] it fails.

use crate::error::{ObjError, Result};
use std::sync::Arc;

/// Whether KV memory a provider maps for the drives goes peer to peer.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum P2pPolicy {
    /// Probe; fall back to staging when the probe fails.
    #[default]
    Auto,
    /// Probe; fail the registration instead of falling back.
    Require,
    /// Never P2P: staged from the start.
    Off,
}

impl P2pPolicy {
    /// `auto`, `require` / `on`, `off`.
    pub fn parse(s: &str) -> Result<P2pPolicy> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(P2pPolicy::Auto),
            "require" | "on" | "force" => Ok(P2pPolicy::Require),
            "off" | "forbid" | "never" => Ok(P2pPolicy::Off),
            other => Err(ObjError::invalid("p2p", format!("{other:?}: expected auto, require or off"))),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            P2pPolicy::Auto => "auto",
            P2pPolicy::Require => "require",
            P2pPolicy::Off => "off",
        }
    }
}

/// How the provider of device memory reaches it from this process: the
/// probe checks bytes through it, and the staged fallback (host executor)
/// copies through it.
pub trait DeviceAccess: Send + Sync {
    /// Copies `dst.len()` bytes at KV address `addr` out of the device memory.
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<()>;
    /// Copies `src` into the device memory at KV address `addr`.
    fn write(&self, addr: u64, src: &[u8]) -> Result<()>;
    /// The address in this process of a PFN mapping of `addr..addr+len` that
    /// a drive's DMA space can map ([`tutti_driver::transport::DmaSpace::map_device`]).
    fn drive_view(&self, addr: u64, len: u64) -> Result<*mut u8>;
}

/// Device memory mapped into this process at its KV addresses (a BAR
/// mmapped through vfio-pci, a GDRCopy mapping, or memory a test marks as
/// device memory): accessed with volatile byte copies.
pub struct CpuMapped {
    pub base: u64,
    pub len: u64,
}

impl CpuMapped {
    fn check(&self, addr: u64, len: usize) -> Result<*mut u8> {
        let ok = addr >= self.base && addr.checked_add(len as u64).is_some_and(|e| e <= self.base + self.len);
        if !ok {
            return Err(ObjError::invalid(
                "memory",
                format!("{addr:#x}+{len:#x} is outside the device memory {:#x}+{:#x}", self.base, self.len),
            ));
        }
        Ok(addr as *mut u8)
    }
}

impl DeviceAccess for CpuMapped {
    fn read(&self, addr: u64, dst: &mut [u8]) -> Result<()> {
        let p = self.check(addr, dst.len())?;
        // SAFETY: `dst.len()` bytes at `p` are inside the mapping (checked).
        unsafe { volatile_read(p, dst) };
        Ok(())
    }
    fn write(&self, addr: u64, src: &[u8]) -> Result<()> {
        let p = self.check(addr, src.len())?;
        // SAFETY: as in `read`.
        unsafe { volatile_write(p, src) };
        Ok(())
    }
    fn drive_view(&self, addr: u64, len: u64) -> Result<*mut u8> {
        self.check(addr, len as usize)
    }
}

/// KV memory in another device, as registered.
#[derive(Clone)]
pub struct DeviceKvMemory {
    /// Who maps it, in reports: `vfio-pci 0000:00:09.0 BAR2`, `gdrcopy`.
    pub provider: String,
    pub policy: P2pPolicy,
    pub access: Arc<dyn DeviceAccess>,
    /// Testing the fallback: every drive's mapping of the memory is revoked
    /// right after it is made (`DmaSpace::revoke`: IOVAs kept, IOMMU entries
    /// gone), so the drives' DMA to it faults as DMA to a range the IOMMU
    /// never mapped does; the probe must catch it.
    pub unreachable: bool,
}

impl std::fmt::Debug for DeviceKvMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceKvMemory({}, p2p {})", self.provider, self.policy.name())
    }
}

/// Copies `dst.len()` bytes out of device memory at `p`: whole aligned words
/// where possible (device memory may be uncached), volatile throughout.
///
/// # Safety
/// `p .. p + dst.len()` is mapped readable memory.
pub(crate) unsafe fn volatile_read(p: *mut u8, dst: &mut [u8]) {
    let mut i = 0;
    while i < dst.len() {
        if (p as usize + i).is_multiple_of(8) && dst.len() - i >= 8 {
            // SAFETY: in bounds (the caller's contract) and 8-byte aligned.
            let w = unsafe { p.add(i).cast::<u64>().read_volatile() };
            dst[i..i + 8].copy_from_slice(&w.to_ne_bytes());
            i += 8;
        } else {
            // SAFETY: in bounds (the caller's contract).
            dst[i] = unsafe { p.add(i).read_volatile() };
            i += 1;
        }
    }
}

/// Copies `src` into device memory at `p`, as [`volatile_read`] reads.
///
/// # Safety
/// `p .. p + src.len()` is mapped writable memory.
pub(crate) unsafe fn volatile_write(p: *mut u8, src: &[u8]) {
    let mut i = 0;
    while i < src.len() {
        if (p as usize + i).is_multiple_of(8) && src.len() - i >= 8 {
            let mut w = [0u8; 8];
            w.copy_from_slice(&src[i..i + 8]);
            // SAFETY: in bounds (the caller's contract) and 8-byte aligned.
            unsafe { p.add(i).cast::<u64>().write_volatile(u64::from_ne_bytes(w)) };
            i += 8;
        } else {
            // SAFETY: in bounds (the caller's contract).
            unsafe { p.add(i).write_volatile(src[i]) };
            i += 1;
        }
    }
}
