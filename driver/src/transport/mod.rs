//! What the controller and queue code need from a transport, and nothing more.
//!
//! [`Registers`] is BAR0: bounds-checked 32/64-bit register access plus
//! doorbells that an executor (host lanes or a GPU) may ring directly.
//! [`DmaSpace`] is the device's view of memory: buffers it can DMA to, each
//! with an IOVA, released (and unmapped) when dropped.
//!
//! Implementations: `vfio` (a real PCI function bound to vfio-pci) and the
//! `tutti-emulator` crate's register file and IOMMU (a software controller in
//! this process). [`wake`] is the doorbell writer's side of waking a software
//! controller that parks.

pub mod dma;
pub mod pages;
pub mod remote;
pub mod vfio;
pub mod wake;

pub use dma::{DmaBuffer, DmaMapping, IovaSegment};

use crate::error::{DriverError, Result};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// BAR0 of one controller.
#[allow(clippy::len_without_is_empty, reason = "a mapped BAR0 is never empty")]
pub trait Registers: Send + Sync {
    /// The device's name in messages: a PCI address or `emu0`.
    fn name(&self) -> &str;
    /// Bytes of BAR0 that may be accessed.
    fn len(&self) -> usize;
    fn read32(&self, offset: usize) -> Result<u32>;
    fn write32(&self, offset: usize, value: u32) -> Result<()>;
    /// 64-bit registers (CAP, ASQ, ACQ). The default reads the low then the
    /// high dword, which §3.1 allows for every 64-bit register.
    fn read64(&self, offset: usize) -> Result<u64> {
        let lo = self.read32(offset)? as u64;
        let hi = self.read32(offset + 4)? as u64;
        Ok(lo | hi << 32)
    }
    fn write64(&self, offset: usize, value: u64) -> Result<()> {
        self.write32(offset, value as u32)?;
        self.write32(offset + 4, (value >> 32) as u32)
    }
    /// The address of a 32-bit doorbell register and how stores to it must be made.
    fn doorbell_ptr(&self, offset: usize) -> Result<(NonNull<u32>, DoorbellKind)>;
    /// A word that a doorbell writer hands to
    /// [`wake_controller`](wake::wake_controller) after its store, for a
    /// software controller that parks; `None` for a real BAR.
    fn wake_word(&self) -> Option<NonNull<u32>> {
        None
    }
}

/// Bounds check shared by every `Registers` implementation.
pub fn check_register(name: &str, len: usize, offset: usize, width: usize) -> Result<()> {
    if !offset.is_multiple_of(width) || offset.checked_add(width).is_none_or(|end| end > len) {
        return Err(DriverError::RegisterOutOfRange { device: name.to_string(), offset, width, len });
    }
    Ok(())
}

/// How a doorbell store reaches the device.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DoorbellKind {
    /// Memory-mapped I/O (a real BAR): a volatile store after a release fence.
    Mmio,
    /// Ordinary memory watched by a software controller: a release store.
    Memory,
}

/// One doorbell register, kept alive with the BAR it lives in.
///
/// Rings are `&self` so that a queue's doorbell can also be handed to an
/// executor as a raw pointer ([`Doorbell::as_ptr`]).
pub struct Doorbell {
    ptr: NonNull<u32>,
    kind: DoorbellKind,
    offset: usize,
    /// The controller's wake word ([`Registers::wake_word`]), in the same BAR.
    wake: Option<NonNull<u32>>,
    _bar: Arc<dyn Registers>,
}

// SAFETY: the pointer targets a register inside a BAR that `_bar` keeps mapped;
// stores to it are single 32-bit volatile or atomic writes, valid from any thread.
unsafe impl Send for Doorbell {}
// SAFETY: as above; `ring` takes `&self` and performs one atomic-width store.
unsafe impl Sync for Doorbell {}

impl Doorbell {
    pub fn new(bar: &Arc<dyn Registers>, offset: usize) -> Result<Doorbell> {
        check_register(bar.name(), bar.len(), offset, 4)?;
        let (ptr, kind) = bar.doorbell_ptr(offset)?;
        let wake = if kind == DoorbellKind::Memory { bar.wake_word() } else { None };
        Ok(Doorbell { ptr, kind, offset, wake, _bar: bar.clone() })
    }

    /// Writes `value` to the doorbell. Every store to queue memory made by this
    /// thread before the call is visible to the device before the doorbell.
    #[inline]
    pub fn ring(&self, value: u32) {
        match self.kind {
            DoorbellKind::Mmio => {
                std::sync::atomic::fence(Ordering::Release);
                // SAFETY: `ptr` is a 4-byte aligned register in a live BAR mapping (checked in `new`).
                unsafe { self.ptr.as_ptr().write_volatile(value) }
            }
            DoorbellKind::Memory => {
                // SAFETY: `ptr` is 4-byte aligned memory owned by the software register file that
                // `_bar` keeps alive; every access to it goes through atomics.
                unsafe { AtomicU32::from_ptr(self.ptr.as_ptr()) }.store(value, Ordering::Release);
                if let Some(w) = self.wake {
                    // SAFETY: as above: an aligned word of the same register file.
                    wake::wake_controller(unsafe { AtomicU32::from_ptr(w.as_ptr()) });
                }
            }
        }
    }

    /// The controller's wake word, for an executor that rings this doorbell
    /// itself ([`Registers::wake_word`]); `None` for a real BAR.
    pub fn wake_ptr(&self) -> Option<NonNull<u32>> {
        self.wake
    }

    pub fn as_ptr(&self) -> *mut u32 {
        self.ptr.as_ptr()
    }
    pub fn kind(&self) -> DoorbellKind {
        self.kind
    }
    pub fn offset(&self) -> usize {
        self.offset
    }
}

/// The device's view of memory.
pub trait DmaSpace: Send + Sync {
    /// A name for messages (`emulated iommu`, `vfio type1 0000:00:03.0`).
    fn name(&self) -> &str;
    /// The host page size mappings are made in.
    fn page_size(&self) -> usize {
        4096
    }
    /// Allocates `len` bytes (rounded up to pages) of zeroed memory that is
    /// contiguous in IOVA space and page aligned.
    fn alloc(&self, len: usize) -> Result<DmaBuffer>;
    /// Makes a caller's memory reachable by the device.
    ///
    /// # Safety
    /// `vaddr..vaddr+len` must be memory of this process that stays allocated,
    /// and is not used for anything the device must not see, until the returned
    /// mapping is dropped.
    unsafe fn map(&self, vaddr: *mut u8, len: usize) -> Result<DmaMapping>;

    /// Makes a caller's *device* memory reachable by the device: a range of
    /// this process mapped with PFNs rather than pages (another PCI device's
    /// BAR mmapped through vfio-pci, a GPU BAR1 window GDRCopy mapped), which
    /// vfio type1 follows (`vaddr_get_pfns`), so the drive's DMA is routed
    /// peer to peer. `vaddr` and `len` must be page aligned; `what` names the
    /// memory in errors ([`DriverError::DeviceMemoryRefused`]). A successful
    /// mapping says nothing about whether the platform routes the traffic:
    /// callers probe it with real transfers.
    ///
    /// The default refuses: a DMA space that cannot tell device memory apart.
    ///
    /// # Safety
    /// As [`map`](Self::map): the range stays mapped in this process until
    /// the returned mapping is dropped.
    unsafe fn map_device(&self, vaddr: *mut u8, len: usize, what: &str) -> Result<DmaMapping> {
        Err(DriverError::DeviceMemoryRefused {
            space: self.name().to_string(),
            what: what.to_string(),
            vaddr: vaddr as u64,
            len: len as u64,
            call: "map_device",
            errno: libc::EOPNOTSUPP,
            reason: "this DMA space has no way to map device memory".into(),
        })
    }

    /// Testing a target the drives cannot reach: removes the device's view of
    /// `mapping` (made by this space) now, keeping its IOVAs out of use until
    /// it drops, so DMA to it faults as DMA to a range the IOMMU never mapped
    /// does. The default refuses.
    fn revoke(&self, mapping: &DmaMapping) -> Result<()> {
        Err(DriverError::dma(self.name(), format!("{mapping:?} cannot be revoked by this DMA space")))
    }
}

/// Checks what every `map_device` implementation requires: a non-empty,
/// page-aligned range that does not wrap.
pub fn check_device_range(space: &str, vaddr: *mut u8, len: usize, what: &str, page: usize) -> Result<()> {
    let a = vaddr as usize;
    let bad = len == 0
        || a == 0
        || !a.is_multiple_of(page)
        || !len.is_multiple_of(page)
        || a.checked_add(len).is_none();
    if bad {
        return Err(DriverError::DeviceMemoryRefused {
            space: space.to_string(),
            what: what.to_string(),
            vaddr: a as u64,
            len: len as u64,
            call: "map_device",
            errno: libc::EINVAL,
            reason: format!("device memory must be a non-empty range of whole {page}-byte pages"),
        });
    }
    Ok(())
}
