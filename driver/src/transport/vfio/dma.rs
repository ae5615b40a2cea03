//! The device's view of memory through VFIO (a [`DmaSpace`]).
//!
//! Type1: memory is mapped into the device's IOMMU domain at IOVAs we choose,
//! contiguous in IOVA space whatever the physical pages are; dropping a buffer
//! or mapping unmaps it (then frees it). No-IOMMU: the device sees physical
//! addresses, so only hugepages (memory the kernel does not move) are used and
//! a buffer larger than one hugepage must be physically contiguous.

use super::iova::IovaAllocator;
use super::mem::{Memory, Pagemap, HUGE, PAGE};
use super::options::{HugepagePolicy, IommuMode};
use super::shared::Shared;
use crate::error::{DriverError, Result};
use crate::transport::{check_device_range, DmaBuffer, DmaMapping, DmaSpace, IovaSegment};
use std::sync::{Arc, Mutex};

pub struct VfioDma {
    name: String,
    shared: Arc<Shared>,
    hugepages: HugepagePolicy,
    kind: Kind,
    /// One page of this process's memory, mapped for an instant to see whether
    /// an IOVA is free ([`VfioDma::release_iova`]).
    probe: Mutex<Option<Memory>>,
    /// Ranges reserved for other processes and not released.
    client_ranges: std::sync::atomic::AtomicU64,
    /// IOVAs of mappings [`DmaSpace::revoke`]d: already unmapped, freed when they drop.
    revoked: Arc<Mutex<Vec<u64>>>,
}

enum Kind {
    Type1 { iova: Arc<Mutex<IovaAllocator>> },
    NoIommu { pagemap: Pagemap },
}

/// Unmaps a type1 mapping, then returns its IOVA range and frees its memory.
struct Type1Release {
    shared: Arc<Shared>,
    iova_space: Arc<Mutex<IovaAllocator>>,
    iova: u64,
    size: u64,
    memory: Option<Memory>,
    revoked: Arc<Mutex<Vec<u64>>>,
}

impl Drop for Type1Release {
    fn drop(&mut self) {
        let was_revoked = self.revoked.lock().is_ok_and(|mut r| {
            let at = r.iter().position(|&i| i == self.iova);
            at.map(|i| r.swap_remove(i)).is_some()
        });
        let unmapped =
            if was_revoked { Ok(()) } else { self.shared.container.unmap_dma(self.iova, self.size) };
        if let Err(e) = unmapped {
            // The device may still reach these pages: keep them (and the IOVA range)
            // out of circulation rather than hand them to someone else.
            tracing::error!(device = %self.shared.name, error = %e, "DMA unmap failed; leaking the memory");
            std::mem::forget(self.memory.take());
            return;
        }
        if let Ok(mut space) = self.iova_space.lock() {
            space.free(self.iova, self.size);
        }
        drop(self.memory.take());
    }
}

impl VfioDma {
    pub(super) fn new(shared: Arc<Shared>, hugepages: HugepagePolicy) -> Result<VfioDma> {
        let kind = match shared.mode {
            IommuMode::Type1 => {
                let (windows, pgsize) = shared.container.iova_windows()?;
                if pgsize > PAGE as u64 {
                    return Err(DriverError::Vfio(format!(
                        "{}: the IOMMU's smallest page is {pgsize:#x} bytes; this driver maps 4 KiB pages",
                        shared.name
                    )));
                }
                tracing::debug!(device = %shared.name, ?windows, "type1 IOVA windows");
                Kind::Type1 { iova: Arc::new(Mutex::new(IovaAllocator::new(&windows))) }
            }
            IommuMode::NoIommu => {
                if hugepages == HugepagePolicy::Never {
                    return Err(DriverError::Vfio(format!(
                        "{}: no-IOMMU mode needs hugepages (memory the kernel does not move); \
                         hugepages were disabled",
                        shared.name
                    )));
                }
                Kind::NoIommu { pagemap: Pagemap::open()? }
            }
        };
        let name = format!("vfio {} {}", shared.mode.label(), shared.name);
        Ok(VfioDma {
            name,
            shared,
            hugepages,
            kind,
            probe: Mutex::new(None),
            client_ranges: Default::default(),
            revoked: Default::default(),
        })
    }

    fn type1_space(&self) -> Result<&Arc<Mutex<IovaAllocator>>> {
        match &self.kind {
            Kind::Type1 { iova } => Ok(iova),
            Kind::NoIommu { .. } => Err(DriverError::Vfio(format!(
                "{}: no-IOMMU mode has no IOVA space to share with other processes (clients need type1)",
                self.shared.name
            ))),
        }
    }

    /// Reserves `len` bytes (whole pages, followed by a guard page) of this
    /// container's IOVA space for another process holding the container fd,
    /// which maps its own memory there (type1 pins the pages of the process
    /// that calls MAP_DMA). Disjoint from every range this process maps.
    pub fn reserve_iova(&self, len: u64) -> Result<u64> {
        let space = self.type1_space()?;
        let iova = space
            .lock()
            .map_err(|_| DriverError::dma(&self.name, "IOVA allocator poisoned"))?
            .alloc(len, PAGE as u64)?;
        self.client_ranges.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::debug!(device = %self.shared.name, iova, len, "IOVA range reserved for a client");
        Ok(iova)
    }

    /// Ranges from [`reserve_iova`](Self::reserve_iova) not yet released
    /// (held by clients, or kept out of use after a failed release).
    pub fn client_ranges(&self) -> u64 {
        self.client_ranges.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Takes back a range from [`reserve_iova`](Self::reserve_iova): unmaps
    /// whatever is mapped inside it (whoever mapped it), checks that the
    /// range's first page is free, and returns the range to the allocator.
    /// Returns the bytes unmapped. On an error the range stays reserved for
    /// good, so that nothing else is ever mapped where the device may still
    /// reach another process's pages.
    pub fn release_iova(&self, iova: u64, len: u64) -> Result<u64> {
        let space = self.type1_space()?;
        let size = len
            .checked_next_multiple_of(PAGE as u64)
            .ok_or_else(|| DriverError::invalid(format!("IOVA range {iova:#x}+{len:#x} is too large")))?;
        let unmapped = self.shared.container.unmap_range(iova, size)?;
        if self.still_mapped(iova)? {
            return Err(DriverError::Vfio(format!(
                "{}: IOVA {iova:#x} is still mapped after VFIO_IOMMU_UNMAP_DMA of {iova:#x}+{size:#x} \
                 ({unmapped:#x} bytes unmapped): the kernel did not let this process remove another \
                 process's mapping; the range stays out of use",
                self.shared.name
            )));
        }
        if let Ok(mut s) = space.lock() {
            s.free(iova, size);
        }
        self.client_ranges.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        tracing::debug!(device = %self.shared.name, iova, len, unmapped, "client IOVA range released");
        Ok(unmapped)
    }

    /// Whether something is mapped at the page `iova`: a one-page MAP_DMA of
    /// our probe page there fails with EEXIST exactly then (and is undone
    /// at once otherwise).
    fn still_mapped(&self, iova: u64) -> Result<bool> {
        let mut probe = self.probe.lock().map_err(|_| DriverError::dma(&self.name, "probe page poisoned"))?;
        if probe.is_none() {
            *probe = Some(Memory::anonymous(PAGE, false)?);
        }
        let page = probe.as_ref().map(|m| m.ptr().as_ptr() as *const u8).unwrap_or(std::ptr::null());
        match self.shared.container.map_raw(page, iova, PAGE as u64) {
            Ok(()) => {
                self.shared.container.unmap_dma(iova, PAGE as u64)?;
                Ok(false)
            }
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(true),
            Err(e) => Err(DriverError::Vfio(format!(
                "{}: probing whether IOVA {iova:#x} is mapped (VFIO_IOMMU_MAP_DMA of one page): {e}",
                self.shared.name
            ))),
        }
    }

    /// Memory for a buffer of `len` bytes under the hugepage policy.
    fn memory(&self, len: usize) -> Result<Memory> {
        let must = matches!(self.kind, Kind::NoIommu { .. }) || self.hugepages == HugepagePolicy::Always;
        let want = must || (self.hugepages == HugepagePolicy::Auto && len >= HUGE);
        if !want {
            return Memory::anonymous(len, false);
        }
        match Memory::anonymous(len, true) {
            Ok(m) => Ok(m),
            Err(e) if must => Err(DriverError::dma(
                &self.name,
                format!(
                    "{e}; reserve hugepages first, e.g. `echo 64 > /proc/sys/vm/nr_hugepages`{}",
                    if matches!(self.kind, Kind::NoIommu { .. }) {
                        " (no-IOMMU mode refuses memory that can move)"
                    } else {
                        ""
                    }
                ),
            )),
            Err(e) => {
                tracing::debug!(dma = %self.name, error = %e, "no hugepages; using locked 4 KiB pages");
                Memory::anonymous(len, false)
            }
        }
    }

    fn map_type1(
        &self,
        space: &Arc<Mutex<IovaAllocator>>,
        vaddr: *const u8,
        size: u64,
        align: u64,
    ) -> Result<u64> {
        let iova = space
            .lock()
            .map_err(|_| DriverError::dma(&self.name, "IOVA allocator poisoned"))?
            .alloc(size, align)?;
        if let Err(e) = self.shared.container.map_dma(vaddr, iova, size) {
            if let Ok(mut s) = space.lock() {
                s.free(iova, size);
            }
            return Err(e);
        }
        Ok(iova)
    }
}

impl DmaSpace for VfioDma {
    fn name(&self) -> &str {
        &self.name
    }

    fn alloc(&self, len: usize) -> Result<DmaBuffer> {
        if len == 0 {
            return Err(DriverError::invalid("zero-length DMA allocation"));
        }
        let memory = self.memory(len)?;
        let ptr = memory.ptr();
        let visible = len.next_multiple_of(PAGE);
        match &self.kind {
            Kind::Type1 { iova: space } => {
                let size = memory.len() as u64;
                let align = if memory.is_huge() { HUGE as u64 } else { PAGE as u64 };
                let iova = self.map_type1(space, ptr.as_ptr(), size, align)?;
                let release = Type1Release {
                    shared: self.shared.clone(),
                    iova_space: space.clone(),
                    iova,
                    size,
                    memory: Some(memory),
                    revoked: self.revoked.clone(),
                };
                // SAFETY: `ptr..ptr+visible` is zeroed, page-aligned memory owned by
                // `release`, mapped for the device at `iova` until `release` drops.
                Ok(unsafe { DmaBuffer::from_raw(ptr, visible, iova, Box::new(release)) })
            }
            Kind::NoIommu { pagemap } => {
                let base = ptr.as_ptr() as usize;
                let phys = pagemap.phys(base)?;
                for k in (HUGE..memory.len()).step_by(HUGE) {
                    if pagemap.phys(base + k)? != phys + k as u64 {
                        return Err(DriverError::dma(
                            &self.name,
                            format!(
                                "a {len:#x}-byte buffer spans hugepages that are not physically contiguous; \
                                 no-IOMMU mode can only give out buffers of up to {HUGE:#x} bytes here"
                            ),
                        ));
                    }
                }
                // SAFETY: zeroed, page-aligned hugepage memory owned by the release box;
                // without an IOMMU the device sees it at its physical address.
                Ok(unsafe { DmaBuffer::from_raw(ptr, visible, phys, Box::new(memory)) })
            }
        }
    }

    unsafe fn map(&self, vaddr: *mut u8, len: usize) -> Result<DmaMapping> {
        if len == 0 || vaddr.is_null() {
            return Err(DriverError::invalid(format!("cannot map {len} bytes at {vaddr:p} for DMA")));
        }
        let start = vaddr as usize & !(PAGE - 1);
        let end = (vaddr as usize)
            .checked_add(len)
            .map(|e| e.next_multiple_of(PAGE))
            .ok_or_else(|| DriverError::invalid(format!("DMA range {vaddr:p}+{len:#x} overflows")))?;
        match &self.kind {
            Kind::Type1 { iova: space } => {
                let size = (end - start) as u64;
                let iova = self.map_type1(space, start as *const u8, size, PAGE as u64)?;
                let release = Type1Release {
                    shared: self.shared.clone(),
                    iova_space: space.clone(),
                    iova,
                    size,
                    memory: None,
                    revoked: self.revoked.clone(),
                };
                let segments =
                    vec![IovaSegment { iova: iova + (vaddr as usize - start) as u64, len: len as u64 }];
                // SAFETY: the device sees `vaddr..vaddr+len` at `segments` until `release`
                // (which unmaps it) drops; the caller keeps the memory alive (DmaSpace::map).
                Ok(unsafe { DmaMapping::from_raw(vaddr, len, segments, Box::new(release)) })
            }
            Kind::NoIommu { pagemap } => {
                let mut segments: Vec<IovaSegment> = Vec::new();
                for page in (start..end).step_by(PAGE) {
                    let phys = pagemap.phys(page)?;
                    if pagemap.is_huge(phys) != Some(true) {
                        return Err(DriverError::dma(
                            &self.name,
                            format!(
                                "page {page:#x} is not (or cannot be shown to be) in a hugepage; no-IOMMU mode \
                                 only maps memory the kernel cannot move"
                            ),
                        ));
                    }
                    let lo = page.max(vaddr as usize);
                    let hi = (page + PAGE).min(vaddr as usize + len);
                    let seg = IovaSegment { iova: phys + (lo - page) as u64, len: (hi - lo) as u64 };
                    match segments.last_mut() {
                        Some(last) if last.iova + last.len == seg.iova => last.len += seg.len,
                        _ => segments.push(seg),
                    }
                }
                // SAFETY: the segments are where the device sees the pages (physical
                // addresses of hugepages, which do not move); nothing to undo on drop.
                Ok(unsafe { DmaMapping::from_raw(vaddr, len, segments, Box::new(())) })
            }
        }
    }

    unsafe fn map_device(&self, vaddr: *mut u8, len: usize, what: &str) -> Result<DmaMapping> {
        check_device_range(&self.name, vaddr, len, what, PAGE)?;
        let refused = |errno: i32, reason: String| DriverError::DeviceMemoryRefused {
            space: self.name.clone(),
            what: what.to_string(),
            vaddr: vaddr as u64,
            len: len as u64,
            call: "VFIO_IOMMU_MAP_DMA",
            errno,
            reason,
        };
        let space =
            match &self.kind {
                Kind::Type1 { iova } => iova,
                Kind::NoIommu { .. } => return Err(refused(
                    libc::EOPNOTSUPP,
                    "no-IOMMU mode gives the drive physical addresses, and a device's bus address is not \
                     known from its mapping here; device memory needs type1"
                        .into(),
                )),
            };
        let size = len as u64;
        let iova = space
            .lock()
            .map_err(|_| DriverError::dma(&self.name, "IOVA allocator poisoned"))?
            .alloc(size, PAGE as u64)?;
        if let Err(e) = self.shared.container.map_raw(vaddr, iova, size) {
            if let Ok(mut s) = space.lock() {
                s.free(iova, size);
            }
            let errno = e.raw_os_error().unwrap_or(0);
            let reason = match errno {
                libc::EFAULT => "the kernel could not follow the range to page frames: it is not mapped in \
                                 this process, or not a PFN map type1 accepts (vaddr_get_pfns)"
                    .to_string(),
                libc::EINVAL => "the range or its IOVA was refused as malformed (alignment, size, or a \
                                 window the IOMMU does not offer)"
                    .to_string(),
                libc::EEXIST => format!("IOVA {iova:#x} is already mapped (driver bug)"),
                libc::ENOMEM | libc::ENOSPC => {
                    "the container is out of DMA mappings or locked memory (dma_entry_limit, ulimit -l)"
                        .to_string()
                }
                libc::EPERM | libc::EACCES => {
                    "not permitted (run as root or give this user the VFIO group)".into()
                }
                _ => format!("{e}"),
            };
            return Err(refused(errno, format!("{e}; {reason}")));
        }
        tracing::info!(device = %self.shared.name, what, iova = format_args!("{iova:#x}"), len, "device memory mapped for DMA");
        let release = Type1Release {
            shared: self.shared.clone(),
            iova_space: space.clone(),
            iova,
            size,
            memory: None,
            revoked: self.revoked.clone(),
        };
        let segments = vec![IovaSegment { iova, len: size }];
        // SAFETY: the device sees `vaddr..vaddr+len` at `iova` until `release` (which
        // unmaps it) drops; the caller keeps the range mapped (DmaSpace::map_device).
        Ok(unsafe { DmaMapping::from_raw(vaddr, len, segments, Box::new(release)) })
    }

    fn revoke(&self, mapping: &DmaMapping) -> Result<()> {
        let [seg] = mapping.segments() else {
            return Err(DriverError::dma(&self.name, "only a one-segment type1 mapping can be revoked"));
        };
        if !matches!(self.kind, Kind::Type1 { .. }) || !seg.iova.is_multiple_of(PAGE as u64) {
            return Err(DriverError::dma(&self.name, "only a page-aligned type1 mapping can be revoked"));
        }
        let size = seg.len.next_multiple_of(PAGE as u64);
        let mut revoked =
            self.revoked.lock().map_err(|_| DriverError::dma(&self.name, "revoked list poisoned"))?;
        self.shared.container.unmap_dma(seg.iova, size)?;
        revoked.push(seg.iova);
        tracing::warn!(device = %self.shared.name, iova = seg.iova, size, "mapping revoked (testing): DMA to it faults");
        Ok(())
    }
}
