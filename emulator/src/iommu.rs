//! The emulated controller's IOMMU: the only way it can touch host memory.
//!
//! Every buffer the driver hands to the device is mapped here at an IOVA we
//! choose (far from any host address, with an unmapped guard page between
//! mappings). The controller translates every DMA through this table, so a
//! wrong pointer in a command is an IOMMU fault — counted and reported as a
//! Data Transfer Error — never a stray write into the host process.

//!
//! Regions may also belong to another process ([`EmuIommu::map_remote`]): a
//! client of a daemon that owns this controller. DMA into and out of those
//! goes through `process_vm_readv`/`process_vm_writev` on that process.
//!
//! # Permission model for remote regions
//! `process_vm_*` needs ptrace-attach rights over the client (see
//! ptrace(2), "Ptrace access mode checking"): the controller's process must
//! run as the same user as the client (and, under Yama `ptrace_scope` 1, be
//! its ancestor or be named by the client with `PR_SET_PTRACER`, which
//! [`allow_peer_access`] does), or hold `CAP_SYS_PTRACE` (root). Without
//! those rights every access to the client's regions faults, which the
//! client sees as Data Transfer Errors.
//!
//! Each remote region holds a pidfd of its process, opened when it was
//! mapped; an access first checks that this process is still alive, so a
//! region of a client that exited faults instead of reaching a later process
//! that happens to get the same pid. (A pid reused in the few instructions
//! between that check and the copy would be missed; the owner closes that
//! window by dropping a dead client's regions with [`EmuIommu::unmap_owner`].)

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use tutti_driver::transport::pages::HostPages;
use tutti_driver::transport::{DmaBuffer, DmaMapping, DmaSpace, IovaSegment};
use tutti_driver::{DriverError, Result};

const PAGE: usize = 4096;
/// First IOVA handed out: well above any address a test might confuse it with.
const IOVA_BASE: u64 = 0x10_0000_0000;
/// The owner of mappings this process made for itself ([`DmaSpace`]).
pub const LOCAL_OWNER: u64 = 0;
/// Remote regions one owner may hold at a time.
pub const MAX_REMOTE_REGIONS: usize = 1 << 16;
/// Highest user address + 1 a remote region may reach (57-bit virtual addresses).
const USER_ADDR_LIMIT: u64 = 1 << 57;

/// A process whose memory some regions map, and a pidfd that says whether it is still the same one.
struct Peer {
    pid: i32,
    pidfd: OwnedFd,
}

impl Peer {
    fn open(pid: i32) -> std::io::Result<Peer> {
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a new descriptor that nothing else owns.
        Ok(Peer { pid, pidfd: unsafe { OwnedFd::from_raw_fd(raw as i32) } })
    }

    /// Whether the process this pidfd was opened on has not exited.
    fn alive(&self) -> bool {
        let mut p = libc::pollfd { fd: self.pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, zero timeout. A pidfd polls readable once its process exits.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n == 0
    }
}

#[derive(Clone)]
struct Region {
    host: usize,
    len: usize,
    owner: u64,
    /// `None`: memory of this process.
    peer: Option<Arc<Peer>>,
    /// The IOVA `map_remote` returned (the caller's address, page offset kept).
    handle: u64,
    /// Mapped as device memory ([`DmaSpace::map_device`]): reached as
    /// [`EmuIommu::set_device_reach`] says, and counted apart from host memory.
    device: bool,
}

/// How the emulated platform routes DMA to regions mapped as device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeviceReach {
    /// Peer DMA works: reads and writes reach the memory.
    #[default]
    Reachable,
    /// Every access faults (the controller reports a Data Transfer Error).
    Fault,
    /// Accesses are dropped without an error (writes vanish, reads return
    /// zeros), as QEMU 7.2's NVMe model does when the IOMMU blocks its DMA:
    /// only a byte check can tell.
    SilentDrop,
}

/// Bytes the controller moved to and from device-memory regions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DeviceDmaCounts {
    /// Bytes the controller wrote into device memory (reads from the drive).
    pub written: u64,
    /// Bytes the controller read from device memory (writes to the drive).
    pub read: u64,
    /// Accesses faulted or dropped under [`DeviceReach`].
    pub blocked: u64,
}

#[derive(Default)]
struct Table {
    regions: RwLock<BTreeMap<u64, Region>>,
    /// Bumped whenever a region goes away, so a [`DmaView`]'s cached
    /// translations from before are no longer used.
    unmaps: AtomicU64,
    faults: AtomicU64,
    next: AtomicU64,
    /// Open pidfds by pid, shared by the regions of one process.
    peers: Mutex<HashMap<i32, std::sync::Weak<Peer>>>,
    /// [`DeviceReach`] as a number (0 reachable, 1 fault, 2 silent drop).
    device_reach: std::sync::atomic::AtomicU8,
    device_written: AtomicU64,
    device_read: AtomicU64,
    device_blocked: AtomicU64,
}

impl Table {
    /// Maps `len` bytes at `host` (page aligned) at a new IOVA; `first` is the
    /// offset of the caller's own address in it (kept in the IOVA).
    fn insert(
        &self,
        host: usize,
        len: usize,
        first: usize,
        owner: u64,
        peer: Option<Arc<Peer>>,
        device: bool,
    ) -> Result<u64> {
        let span = (len.next_multiple_of(PAGE) + PAGE) as u64; // one unmapped guard page after
        let off = self
            .next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                n.checked_add(span).filter(|end| end.checked_add(IOVA_BASE).is_some())
            })
            .map_err(|_| DriverError::dma("emulated iommu", "IOVA space exhausted"))?;
        let iova = IOVA_BASE + off;
        let mut regions =
            self.regions.write().map_err(|_| DriverError::dma("emulated iommu", "table lock poisoned"))?;
        regions.insert(iova, Region { host, len, owner, peer, handle: iova + first as u64, device });
        Ok(iova)
    }
    fn remove(&self, iova: u64) {
        if let Ok(mut regions) = self.regions.write() {
            regions.remove(&iova);
            self.unmaps.fetch_add(1, Ordering::Release);
        }
    }
}

/// Removes a mapping (and frees owned memory) when the buffer or mapping drops.
struct Release {
    table: Arc<Table>,
    iova: u64,
    /// Freed as it drops, after `drop` removed the mapping.
    _owned: Option<HostPages>,
}

impl Drop for Release {
    fn drop(&mut self) {
        // Unmap before freeing (`_owned` drops after this), so the device can never reach freed memory.
        self.table.remove(self.iova);
    }
}

/// An IOMMU DMA fault: the controller touched an address nobody mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IommuFault {
    pub iova: u64,
    pub len: usize,
}

/// The emulated controller's DMA space (a [`DmaSpace`]).
#[derive(Clone)]
pub struct EmuIommu {
    name: Arc<str>,
    table: Arc<Table>,
    /// Set on a view for one command ([`scoped`](Self::scoped)): only
    /// regions of this owner are reachable through it.
    scope: Option<u64>,
}

/// Where a translated DMA goes.
enum Target {
    Local(*mut u8),
    /// Memory of this process mapped as device memory.
    Device(*mut u8),
    Remote {
        peer: Arc<Peer>,
        addr: usize,
    },
    /// Memory of another process mapped as device memory.
    RemoteDevice {
        peer: Arc<Peer>,
        addr: usize,
    },
}

impl EmuIommu {
    pub fn new(device: &str) -> Self {
        EmuIommu { name: format!("emulated iommu {device}").into(), table: Arc::default(), scope: None }
    }

    /// How many DMA accesses faulted so far.
    pub fn fault_count(&self) -> u64 {
        self.table.faults.load(Ordering::Relaxed)
    }

    /// Sets how DMA to device-memory regions is routed (tests of the P2P
    /// probe: a platform that faults peer DMA, or drops it silently).
    pub fn set_device_reach(&self, reach: DeviceReach) {
        let v = match reach {
            DeviceReach::Reachable => 0,
            DeviceReach::Fault => 1,
            DeviceReach::SilentDrop => 2,
        };
        self.table.device_reach.store(v, Ordering::Relaxed);
    }

    /// Bytes moved to and from device-memory regions so far.
    pub fn device_counts(&self) -> DeviceDmaCounts {
        DeviceDmaCounts {
            written: self.table.device_written.load(Ordering::Relaxed),
            read: self.table.device_read.load(Ordering::Relaxed),
            blocked: self.table.device_blocked.load(Ordering::Relaxed),
        }
    }

    /// Whether an access of `len` bytes to device memory goes through (`true`),
    /// is dropped (`false`) or faults, under the current [`DeviceReach`]; counts it.
    fn device_access(&self, iova: u64, len: usize, write: bool) -> std::result::Result<bool, IommuFault> {
        match self.table.device_reach.load(Ordering::Relaxed) {
            0 => {
                let c = if write { &self.table.device_written } else { &self.table.device_read };
                c.fetch_add(len as u64, Ordering::Relaxed);
                Ok(true)
            }
            1 => {
                self.table.device_blocked.fetch_add(1, Ordering::Relaxed);
                Err(self.fault(iova, len, "device memory: peer DMA faulted (DeviceReach::Fault)"))
            }
            _ => {
                self.table.device_blocked.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(iommu = %self.name, iova, len, "device memory: peer DMA dropped silently");
                Ok(false)
            }
        }
    }

    fn fault(&self, iova: u64, len: usize, why: &str) -> IommuFault {
        self.table.faults.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(iommu = %self.name, iova = format_args!("{iova:#x}"), len, "DMA fault: {why}");
        IommuFault { iova, len }
    }

    /// A view that reaches only regions of `owner` (`None`: every region).
    /// The controller moves a command's data through the view of the owner
    /// of the command's submission queue, so a client's commands can reach
    /// only memory that client mapped, as if each client had its own IOMMU
    /// domain.
    pub fn scoped(&self, owner: Option<u64>) -> EmuIommu {
        EmuIommu { name: self.name.clone(), table: self.table.clone(), scope: owner }
    }

    /// The owner of the region `iova` lies in.
    pub fn owner_of(&self, iova: u64) -> Option<u64> {
        let regions = self.table.regions.read().ok()?;
        regions
            .range(..=iova)
            .next_back()
            .filter(|(&base, r)| iova - base < r.len as u64)
            .map(|(_, r)| r.owner)
    }

    /// Where `iova..iova+len` is, which must lie inside one mapping (of the
    /// view's owner, for a scoped view).
    fn resolve(&self, iova: u64, len: usize) -> std::result::Result<Target, IommuFault> {
        self.resolve_region(iova, len).map(|(t, _)| t)
    }

    /// [`resolve`](Self::resolve), plus the local region found, for a [`DmaView`] to cache.
    fn resolve_region(
        &self,
        iova: u64,
        len: usize,
    ) -> std::result::Result<(Target, Option<Cached>), IommuFault> {
        // Read before the lookup: an unmap racing with it makes the entry stale at once.
        let unmaps = self.table.unmaps.load(Ordering::Acquire);
        let regions = self.table.regions.read().map_err(|_| self.fault(iova, len, "table lock poisoned"))?;
        let (&base, region) =
            regions.range(..=iova).next_back().ok_or_else(|| self.fault(iova, len, "address not mapped"))?;
        let off = (iova - base) as usize;
        if off.checked_add(len).is_none_or(|end| end > region.len) {
            return Err(self.fault(iova, len, "address not mapped"));
        }
        if self.scope.is_some_and(|o| o != region.owner) {
            return Err(self.fault(iova, len, "address mapped for another owner than the command's queue"));
        }
        Ok(match &region.peer {
            None if region.device => (Target::Device((region.host + off) as *mut u8), None),
            None => {
                let cached =
                    Cached { unmaps, base, len: region.len as u64, host: region.host, owner: region.owner };
                (Target::Local((region.host + off) as *mut u8), Some(cached))
            }
            Some(peer) if region.device => {
                (Target::RemoteDevice { peer: peer.clone(), addr: region.host + off }, None)
            }
            Some(peer) => (Target::Remote { peer: peer.clone(), addr: region.host + off }, None),
        })
    }

    /// Whether `iova` lies in a region of another process (queue memory
    /// there may become unreachable at any time: its process can die).
    pub fn is_remote(&self, iova: u64) -> bool {
        let Ok(regions) = self.table.regions.read() else { return false };
        regions
            .range(..=iova)
            .next_back()
            .is_some_and(|(&base, r)| r.peer.is_some() && iova - base < r.len as u64)
    }

    /// One `process_vm_readv`/`writev` of `len` bytes between `local` and the peer's `addr`.
    fn remote_copy(
        &self,
        iova: u64,
        peer: &Peer,
        addr: usize,
        local: *mut u8,
        len: usize,
        write: bool,
    ) -> std::result::Result<(), IommuFault> {
        if !peer.alive() {
            return Err(self.fault(iova, len, &format!("process {} of this region has exited", peer.pid)));
        }
        let local_iov = libc::iovec { iov_base: local.cast(), iov_len: len };
        let remote_iov = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: len };
        // SAFETY: `local` is `len` bytes of this process the caller lends for
        // the call (a slice it holds); the kernel checks the remote range
        // against the peer's address space and our ptrace rights over it.
        let n = unsafe {
            if write {
                libc::process_vm_writev(peer.pid, &local_iov, 1, &remote_iov, 1, 0)
            } else {
                libc::process_vm_readv(peer.pid, &local_iov, 1, &remote_iov, 1, 0)
            }
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return Err(self.fault(iova, len, &format!("process {} not reachable: {e}", peer.pid)));
        }
        if n as usize != len {
            let what = format!("process {}: short transfer of {n} of {len} bytes", peer.pid);
            return Err(self.fault(iova, len, &what));
        }
        Ok(())
    }

    /// Device read: copies `dst.len()` bytes at `iova` out of host memory.
    pub fn dma_read(&self, iova: u64, dst: &mut [u8]) -> std::result::Result<(), IommuFault> {
        self.read_target(iova, self.resolve(iova, dst.len())?, dst)
    }

    fn read_target(&self, iova: u64, target: Target, dst: &mut [u8]) -> std::result::Result<(), IommuFault> {
        match target {
            // SAFETY: `resolve` checked that the whole range lies in a live mapping;
            // the host promised (DmaSpace::map) to keep it allocated while mapped.
            Target::Local(src) => unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) },
            Target::Device(src) => {
                if self.device_access(iova, dst.len(), false)? {
                    // SAFETY: as for `Local`: a live mapping of this process, kept allocated while mapped.
                    unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) }
                } else {
                    dst.fill(0)
                }
            }
            Target::Remote { peer, addr } => {
                self.remote_copy(iova, &peer, addr, dst.as_mut_ptr(), dst.len(), false)?
            }
            Target::RemoteDevice { peer, addr } => {
                if self.device_access(iova, dst.len(), false)? {
                    self.remote_copy(iova, &peer, addr, dst.as_mut_ptr(), dst.len(), false)?
                } else {
                    dst.fill(0)
                }
            }
        }
        Ok(())
    }

    /// Device write: copies `src` into host memory at `iova`.
    pub fn dma_write(&self, iova: u64, src: &[u8]) -> std::result::Result<(), IommuFault> {
        self.write_target(iova, self.resolve(iova, src.len())?, src)
    }

    fn write_target(&self, iova: u64, target: Target, src: &[u8]) -> std::result::Result<(), IommuFault> {
        match target {
            // SAFETY: as in `dma_read`; the destination is device-writable memory by contract.
            Target::Local(dst) => unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) },
            Target::Device(dst) => {
                if self.device_access(iova, src.len(), true)? {
                    // SAFETY: as for `Local`.
                    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) }
                }
            }
            // process_vm_writev only reads the local buffer, despite the `*mut` in iovec.
            Target::Remote { peer, addr } => {
                self.remote_copy(iova, &peer, addr, src.as_ptr().cast_mut(), src.len(), true)?
            }
            Target::RemoteDevice { peer, addr } => {
                if self.device_access(iova, src.len(), true)? {
                    self.remote_copy(iova, &peer, addr, src.as_ptr().cast_mut(), src.len(), true)?
                }
            }
        }
        Ok(())
    }

    /// Release store of a 32-bit word (queue memory the host polls).
    ///
    /// In another process's region this is a 4-byte `process_vm_writev` to a
    /// 4-byte aligned address: the kernel's copy makes that a single aligned
    /// store on x86-64 (no torn word), and it happens after every earlier
    /// DMA of this thread (each is a completed system call). It is not an
    /// atomic read-modify-write, which no queue protocol here needs.
    pub fn dma_store_u32(&self, iova: u64, value: u32) -> std::result::Result<(), IommuFault> {
        if !iova.is_multiple_of(4) {
            return Err(IommuFault { iova, len: 4 });
        }
        self.store_target(self.resolve(iova, 4)?, iova, value)
    }

    fn store_target(&self, target: Target, iova: u64, value: u32) -> std::result::Result<(), IommuFault> {
        match target {
            Target::Device(p) => {
                if self.device_access(iova, 4, true)? {
                    // SAFETY: in a live mapping and 4-byte aligned (IOVA and host share the page offset).
                    unsafe { std::sync::atomic::AtomicU32::from_ptr(p.cast()) }
                        .store(value, Ordering::Release)
                }
            }
            Target::Local(p) => {
                // SAFETY: in a live mapping and 4-byte aligned (IOVA and host share the page offset).
                unsafe { std::sync::atomic::AtomicU32::from_ptr(p.cast()) }.store(value, Ordering::Release)
            }
            Target::Remote { peer, addr } => {
                let bytes = value.to_ne_bytes();
                self.remote_copy(iova, &peer, addr, bytes.as_ptr().cast_mut(), 4, true)?
            }
            Target::RemoteDevice { peer, addr } => {
                if self.device_access(iova, 4, true)? {
                    let bytes = value.to_ne_bytes();
                    self.remote_copy(iova, &peer, addr, bytes.as_ptr().cast_mut(), 4, true)?
                }
            }
        }
        Ok(())
    }

    /// Maps `len` bytes at `addr` in process `pid` for `owner` (any id but
    /// [`LOCAL_OWNER`]; the daemon uses one per client). Like
    /// [`DmaSpace::map`], the region is whole pages with an unmapped guard
    /// page after it, and the returned IOVA is that of `addr` (its page
    /// offset kept). Nothing of the peer is touched now: an address it has
    /// not mapped faults when the controller first uses it. Fails if `pid`
    /// does not exist.
    pub fn map_remote(&self, pid: i32, addr: u64, len: usize, owner: u64) -> Result<u64> {
        let bad = |what: String| DriverError::dma(&*self.name, what);
        if owner == LOCAL_OWNER {
            return Err(bad(format!("owner id {LOCAL_OWNER} is reserved for this process's own mappings")));
        }
        if pid <= 0 {
            return Err(bad(format!("pid {pid} is not a process")));
        }
        let end = addr.checked_add(len as u64).filter(|&e| len > 0 && addr > 0 && e <= USER_ADDR_LIMIT);
        let Some(end) = end else {
            return Err(bad(format!("{len} bytes at {addr:#x} is not a non-empty range of user addresses")));
        };
        if self.regions_of(owner) >= MAX_REMOTE_REGIONS {
            return Err(bad(format!("owner {owner} already holds {MAX_REMOTE_REGIONS} regions")));
        }
        let peer = self.peer(pid)?;
        let start = addr & !(PAGE as u64 - 1);
        let end = end.next_multiple_of(PAGE as u64);
        let first = (addr - start) as usize;
        let base =
            self.table.insert(start as usize, (end - start) as usize, first, owner, Some(peer), false)?;
        tracing::debug!(iommu = %self.name, pid, owner, addr = format_args!("{addr:#x}"), len,
            iova = format_args!("{:#x}", base + first as u64), "remote region mapped");
        Ok(base + first as u64)
    }

    /// [`map_remote`](Self::map_remote) for device memory of process `pid` (a GDRCopy
    /// window or a BAR it mapped; page-aligned whole pages): reached under
    /// [`EmuIommu::set_device_reach`] and counted apart from host memory, as
    /// [`DmaSpace::map_device`] is for this process's own.
    pub fn map_remote_device(&self, pid: i32, addr: u64, len: usize, owner: u64, what: &str) -> Result<u64> {
        tutti_driver::transport::check_device_range(&self.name, addr as *mut u8, len, what, PAGE)?;
        if owner == LOCAL_OWNER
            || pid <= 0
            || addr.checked_add(len as u64).is_none_or(|e| e > USER_ADDR_LIMIT)
        {
            return Err(DriverError::dma(
                &*self.name,
                format!("{what}: {len} bytes at {addr:#x} of pid {pid} owner {owner}"),
            ));
        }
        if self.regions_of(owner) >= MAX_REMOTE_REGIONS {
            return Err(DriverError::dma(
                &*self.name,
                format!("owner {owner} already holds {MAX_REMOTE_REGIONS} regions"),
            ));
        }
        let peer = self.peer(pid)?;
        let base = self.table.insert(addr as usize, len, 0, owner, Some(peer), true)?;
        tracing::debug!(iommu = %self.name, pid, owner, what, iova = format_args!("{base:#x}"), len,
            "remote device memory mapped");
        Ok(base)
    }

    /// The shared pidfd of `pid`, opened anew if the one we had is of a process that exited.
    fn peer(&self, pid: i32) -> Result<Arc<Peer>> {
        let mut peers =
            self.table.peers.lock().map_err(|_| DriverError::dma(&*self.name, "peer table lock poisoned"))?;
        peers.retain(|_, w| w.strong_count() > 0);
        if let Some(p) = peers.get(&pid).and_then(std::sync::Weak::upgrade) {
            if p.alive() {
                return Ok(p);
            }
        }
        let p =
            Arc::new(Peer::open(pid).map_err(|e| {
                DriverError::dma(&*self.name, format!("process {pid} cannot be mapped: {e}"))
            })?);
        peers.insert(pid, Arc::downgrade(&p));
        Ok(p)
    }

    /// Unmaps the region [`map_remote`](Self::map_remote) returned `iova` for;
    /// refused (and nothing unmapped) unless it is a region of `owner`.
    pub fn unmap(&self, iova: u64, owner: u64) -> Result<()> {
        let mut regions =
            self.table.regions.write().map_err(|_| DriverError::dma(&*self.name, "table lock poisoned"))?;
        let found = regions
            .range(..=iova)
            .next_back()
            .filter(|(_, r)| r.handle == iova && r.peer.is_some() && r.owner == owner && owner != LOCAL_OWNER)
            .map(|(&base, _)| base);
        match found {
            Some(base) => {
                regions.remove(&base);
                self.table.unmaps.fetch_add(1, Ordering::Release);
                Ok(())
            }
            None => Err(DriverError::dma(
                &*self.name,
                format!("IOVA {iova:#x} is not a region that owner {owner} mapped"),
            )),
        }
    }

    /// Drops every region of `owner` (a client that went away); returns how many.
    pub fn unmap_owner(&self, owner: u64) -> usize {
        if owner == LOCAL_OWNER {
            return 0;
        }
        let Ok(mut regions) = self.table.regions.write() else { return 0 };
        let before = regions.len();
        regions.retain(|_, r| r.owner != owner);
        let n = before - regions.len();
        if n > 0 {
            self.table.unmaps.fetch_add(1, Ordering::Release);
        }
        if n > 0 {
            tracing::info!(iommu = %self.name, owner, regions = n, "regions of owner unmapped");
        }
        n
    }

    /// Whether `iova..iova+len` lies inside one region of `owner` (for an
    /// owner checking that queue memory a client names is the client's own).
    pub fn owned_by(&self, iova: u64, len: usize, owner: u64) -> bool {
        let Ok(regions) = self.table.regions.read() else { return false };
        regions.range(..=iova).next_back().is_some_and(|(&base, r)| {
            r.owner == owner && ((iova - base) as usize).checked_add(len).is_some_and(|end| end <= r.len)
        })
    }

    /// How many regions other processes hold (every owner but [`LOCAL_OWNER`]).
    pub fn client_regions(&self) -> usize {
        self.table.regions.read().map_or(0, |r| r.values().filter(|r| r.owner != LOCAL_OWNER).count())
    }

    /// How many regions `owner` holds.
    pub fn regions_of(&self, owner: u64) -> usize {
        self.table.regions.read().map_or(0, |r| r.values().filter(|r| r.owner == owner).count())
    }
}

/// A translation a [`DmaView`] remembers: a region of this process's memory.
#[derive(Clone, Copy, Default)]
struct Cached {
    /// `Table::unmaps` when it was looked up; 0 marks an empty entry.
    unmaps: u64,
    base: u64,
    len: u64,
    host: usize,
    owner: u64,
}

/// Entries of a [`DmaView`]: a command touches its SQ, its data buffer and its CQ.
const VIEW_ENTRIES: usize = 4;

/// The IOMMU as one DMA user (the controller's thread) sees it, with the last
/// few translations remembered, as a device's IOTLB does: most accesses then
/// take no lock and walk no table. Any unmap since an entry was made
/// (`Table::unmaps`) makes every entry unusable, so an unmapped buffer faults
/// exactly as through [`EmuIommu`]. Regions of other processes are never
/// cached (their liveness is checked per access). Not `Sync`: one per thread.
pub struct DmaView {
    iommu: EmuIommu,
    entries: [std::cell::Cell<Cached>; VIEW_ENTRIES],
    /// The entry the next miss replaces.
    next: std::cell::Cell<usize>,
}

impl DmaView {
    pub fn new(iommu: &EmuIommu) -> Self {
        DmaView { iommu: iommu.scoped(None), entries: Default::default(), next: std::cell::Cell::new(0) }
    }

    /// Reaches only regions of `owner` from now on (`None`: every region); see [`EmuIommu::scoped`].
    pub fn set_scope(&mut self, owner: Option<u64>) {
        self.iommu.scope = owner;
    }

    pub fn iommu(&self) -> &EmuIommu {
        &self.iommu
    }

    /// A remembered local translation of `iova..iova+len` that is still valid.
    fn hit(&self, iova: u64, len: usize) -> Option<Target> {
        let unmaps = self.iommu.table.unmaps.load(Ordering::Acquire);
        // `unmaps` starts at 0 and entries are made with the count + 1 (see `remember`).
        let now = unmaps.wrapping_add(1);
        for e in &self.entries {
            let c = e.get();
            if c.unmaps != now || iova < c.base {
                continue;
            }
            let off = iova - c.base;
            if off.checked_add(len as u64).is_some_and(|end| end <= c.len)
                && self.iommu.scope.is_none_or(|o| o == c.owner)
            {
                return Some(Target::Local((c.host + off as usize) as *mut u8));
            }
        }
        None
    }

    fn resolve(&self, iova: u64, len: usize) -> std::result::Result<Target, IommuFault> {
        if let Some(t) = self.hit(iova, len) {
            return Ok(t);
        }
        let (target, cached) = self.iommu.resolve_region(iova, len)?;
        if let Some(mut c) = cached {
            c.unmaps = c.unmaps.wrapping_add(1);
            let i = self.next.get();
            self.entries[i].set(c);
            self.next.set((i + 1) % VIEW_ENTRIES);
        }
        Ok(target)
    }

    /// [`EmuIommu::dma_read`] through the remembered translations.
    pub fn dma_read(&self, iova: u64, dst: &mut [u8]) -> std::result::Result<(), IommuFault> {
        self.iommu.read_target(iova, self.resolve(iova, dst.len())?, dst)
    }
    /// [`EmuIommu::dma_write`] through the remembered translations.
    pub fn dma_write(&self, iova: u64, src: &[u8]) -> std::result::Result<(), IommuFault> {
        self.iommu.write_target(iova, self.resolve(iova, src.len())?, src)
    }
    /// [`EmuIommu::dma_store_u32`] through the remembered translations.
    pub fn dma_store_u32(&self, iova: u64, value: u32) -> std::result::Result<(), IommuFault> {
        if !iova.is_multiple_of(4) {
            return Err(IommuFault { iova, len: 4 });
        }
        self.iommu.store_target(self.resolve(iova, 4)?, iova, value)
    }
}

/// What the media copies through: the IOMMU itself or a [`DmaView`] of it.
pub(crate) trait DeviceDma {
    fn dma_read(&self, iova: u64, dst: &mut [u8]) -> std::result::Result<(), IommuFault>;
    fn dma_write(&self, iova: u64, src: &[u8]) -> std::result::Result<(), IommuFault>;
}

impl DeviceDma for EmuIommu {
    fn dma_read(&self, iova: u64, dst: &mut [u8]) -> std::result::Result<(), IommuFault> {
        EmuIommu::dma_read(self, iova, dst)
    }
    fn dma_write(&self, iova: u64, src: &[u8]) -> std::result::Result<(), IommuFault> {
        EmuIommu::dma_write(self, iova, src)
    }
}

impl DeviceDma for DmaView {
    fn dma_read(&self, iova: u64, dst: &mut [u8]) -> std::result::Result<(), IommuFault> {
        DmaView::dma_read(self, iova, dst)
    }
    fn dma_write(&self, iova: u64, src: &[u8]) -> std::result::Result<(), IommuFault> {
        DmaView::dma_write(self, iova, src)
    }
}

/// A DMA space reaching the memory of process `pid` for `owner`: what the
/// owner of the drives registers a client's memory through when it moves
/// that client's data itself ([`EmuIommu::space_of`]).
pub struct RemoteSpace {
    iommu: EmuIommu,
    pid: i32,
    owner: u64,
}

impl EmuIommu {
    pub fn space_of(&self, pid: i32, owner: u64) -> RemoteSpace {
        RemoteSpace { iommu: self.scoped(None), pid, owner }
    }
}

struct RemoteRelease {
    iommu: EmuIommu,
    iova: u64,
    owner: u64,
}

impl Drop for RemoteRelease {
    fn drop(&mut self) {
        if let Err(e) = self.iommu.unmap(self.iova, self.owner) {
            tracing::debug!(error = %e, "remote region already gone");
        }
    }
}

impl DmaSpace for RemoteSpace {
    fn name(&self) -> &str {
        &self.iommu.name
    }
    fn alloc(&self, _len: usize) -> Result<DmaBuffer> {
        Err(DriverError::dma(
            &*self.iommu.name,
            "a remote space maps another process's memory; it allocates none",
        ))
    }
    /// Maps `len` bytes at `vaddr` of process `pid` (not of this process).
    ///
    /// # Safety
    /// None beyond the trait's: the range is in another process, which the
    /// controller reaches with process_vm_readv/writev (a range that process
    /// no longer has is a DMA fault, never memory of this one).
    unsafe fn map(&self, vaddr: *mut u8, len: usize) -> Result<DmaMapping> {
        let iova = self.iommu.map_remote(self.pid, vaddr as u64, len, self.owner)?;
        let release = RemoteRelease { iommu: self.iommu.clone(), iova, owner: self.owner };
        let segments = vec![IovaSegment { iova, len: len as u64 }];
        // SAFETY: the segment is where the IOMMU finds the remote range; `release` unmaps it.
        Ok(unsafe { DmaMapping::from_raw(vaddr, len, segments, Box::new(release)) })
    }
}

/// Lets process `pid` (the owner of the drives, a daemon) reach this
/// process's memory with `process_vm_readv`/`writev` under Yama
/// `ptrace_scope` 1, where only ancestors may otherwise (`PR_SET_PTRACER`).
/// A kernel without Yama needs nothing, and its refusal is not an error.
pub fn allow_peer_access(pid: i32) -> Result<()> {
    if pid <= 0 {
        return Err(DriverError::invalid(format!("allow_peer_access: pid {pid} is not a process")));
    }
    // SAFETY: prctl with integer arguments only.
    let r = unsafe { libc::prctl(libc::PR_SET_PTRACER, pid as libc::c_ulong, 0, 0, 0) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINVAL) | Some(libc::ENOENT) => {
                tracing::debug!(pid, error = %e, "PR_SET_PTRACER refused (no Yama); nothing to allow")
            }
            _ => return Err(DriverError::io(format!("prctl(PR_SET_PTRACER, {pid})"), e)),
        }
    }
    Ok(())
}

impl DmaSpace for EmuIommu {
    fn name(&self) -> &str {
        &self.name
    }

    fn alloc(&self, len: usize) -> Result<DmaBuffer> {
        let pages = HostPages::alloc(&self.name, len, PAGE)?;
        let (ptr, size) = (pages.ptr(), pages.len());
        // Not mapped on failure: `pages` is freed as it drops.
        let iova = self.table.insert(ptr.as_ptr() as usize, size, 0, LOCAL_OWNER, None, false)?;
        let release = Release { table: self.table.clone(), iova, _owned: Some(pages) };
        // SAFETY: zeroed, page-aligned, `size` bytes, mapped at `iova` until `release` drops.
        Ok(unsafe { DmaBuffer::from_raw(ptr, size, iova, Box::new(release)) })
    }

    unsafe fn map(&self, vaddr: *mut u8, len: usize) -> Result<DmaMapping> {
        if vaddr.is_null() || len == 0 {
            return Err(DriverError::dma(&*self.name, "cannot map a null or empty range"));
        }
        let start = vaddr as usize & !(PAGE - 1);
        let end = (vaddr as usize)
            .checked_add(len)
            .ok_or_else(|| DriverError::dma(&*self.name, "range wraps the address space"))?
            .next_multiple_of(PAGE);
        let base = self.table.insert(start, end - start, vaddr as usize - start, LOCAL_OWNER, None, false)?;
        let iova = base + (vaddr as usize - start) as u64;
        let release = Release { table: self.table.clone(), iova: base, _owned: None };
        let segments = vec![IovaSegment { iova, len: len as u64 }];
        // SAFETY: the segment is where `resolve` will find this range; `release` unmaps it.
        Ok(unsafe { DmaMapping::from_raw(vaddr, len, segments, Box::new(release)) })
    }

    /// Maps memory a test marks as device memory: any page-aligned range of
    /// this process, reached under [`EmuIommu::set_device_reach`] and counted
    /// in [`EmuIommu::device_counts`], never as host memory.
    unsafe fn map_device(&self, vaddr: *mut u8, len: usize, what: &str) -> Result<DmaMapping> {
        tutti_driver::transport::check_device_range(&self.name, vaddr, len, what, PAGE)?;
        let base = self.table.insert(vaddr as usize, len, 0, LOCAL_OWNER, None, true)?;
        let release = Release { table: self.table.clone(), iova: base, _owned: None };
        let segments = vec![IovaSegment { iova: base, len: len as u64 }];
        tracing::debug!(iommu = %self.name, what, iova = format_args!("{base:#x}"), len, "device memory mapped");
        // SAFETY: the segment is where `resolve` will find this range; `release` unmaps it.
        Ok(unsafe { DmaMapping::from_raw(vaddr, len, segments, Box::new(release)) })
    }

    /// Unmaps the region now; IOVAs are never handed out twice here, so
    /// nothing else can appear at them before the mapping drops.
    fn revoke(&self, mapping: &DmaMapping) -> Result<()> {
        let [seg] = mapping.segments() else {
            return Err(DriverError::dma(&*self.name, "only a one-segment mapping can be revoked"));
        };
        let base = seg.iova & !(PAGE as u64 - 1);
        self.table.remove(base);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_memory_is_counted_apart_and_obeys_its_reach() -> Result<()> {
        let mmu = EmuIommu::new("t");
        let host = mmu.alloc(4096)?;
        let dev = HostPages::alloc("dev", 8192, PAGE)?;
        let ptr = dev.ptr().as_ptr();
        // SAFETY: `dev` outlives the mapping (dropped at the end of the test, after `m`).
        let m = unsafe { mmu.map_device(ptr, 8192, "test device memory")? };
        let at = m.segments()[0].iova;
        let fault = |_| DriverError::invalid("fault");
        mmu.dma_write(host.iova(), b"host").map_err(fault)?;
        mmu.dma_write(at + 16, b"device").map_err(fault)?;
        let mut back = [0u8; 6];
        mmu.dma_read(at + 16, &mut back).map_err(fault)?;
        assert_eq!(&back, b"device");
        assert_eq!(mmu.device_counts(), DeviceDmaCounts { written: 6, read: 6, blocked: 0 });
        // SAFETY: reading 6 bytes of our own 8 KiB allocation.
        assert_eq!(unsafe { std::slice::from_raw_parts(ptr.add(16), 6) }, b"device");
        mmu.set_device_reach(DeviceReach::SilentDrop);
        mmu.dma_write(at + 16, b"XXXXXX").map_err(fault)?;
        mmu.dma_read(at + 16, &mut back).map_err(fault)?;
        assert_eq!(back, [0; 6], "dropped reads return zeros");
        // SAFETY: as above.
        assert_eq!(unsafe { std::slice::from_raw_parts(ptr.add(16), 6) }, b"device", "dropped write");
        mmu.set_device_reach(DeviceReach::Fault);
        assert!(mmu.dma_write(at, b"x").is_err());
        assert_eq!(mmu.device_counts().blocked, 3);
        mmu.dma_write(host.iova(), b"host").map_err(fault)?;
        // Unaligned or empty ranges are refused with the range named.
        // SAFETY: refused before anything is mapped.
        let e = unsafe { mmu.map_device(ptr.add(1), 4096, "odd") }.map(|_| ()).unwrap_err();
        assert!(matches!(e, DriverError::DeviceMemoryRefused { errno: libc::EINVAL, .. }), "{e}");
        drop(m);
        drop(dev);
        Ok(())
    }

    #[test]
    fn alloc_is_reachable_and_unmapped_on_drop() -> Result<()> {
        let mmu = EmuIommu::new("t");
        let buf = mmu.alloc(100)?;
        assert_eq!(buf.len(), 4096);
        assert!(buf.iova() >= IOVA_BASE);
        mmu.dma_write(buf.iova() + 8, b"hello").map_err(|_| DriverError::invalid("fault"))?;
        let mut out = [0u8; 5];
        buf.copy_out(8, &mut out)?;
        assert_eq!(&out, b"hello");
        let iova = buf.iova();
        drop(buf);
        assert!(mmu.dma_read(iova, &mut out).is_err());
        assert_eq!(mmu.fault_count(), 1);
        Ok(())
    }

    #[test]
    fn access_past_a_mapping_faults() -> Result<()> {
        let mmu = EmuIommu::new("t");
        let a = mmu.alloc(4096)?;
        let _b = mmu.alloc(4096)?;
        let mut two = [0u8; 2];
        assert!(mmu.dma_read(a.iova() + 4095, &mut two).is_err());
        assert!(mmu.dma_read(a.iova() + 4094, &mut two).is_ok());
        Ok(())
    }

    #[test]
    fn a_view_forgets_translations_on_unmap() -> Result<()> {
        let mmu = EmuIommu::new("t");
        let view = DmaView::new(&mmu);
        let mut v = vec![0u8; 8192];
        // SAFETY: `v` outlives both mappings, dropped before it.
        let m = unsafe { mmu.map(v.as_mut_ptr(), v.len())? };
        let iova = m.segments()[0].iova;
        let other = mmu.alloc(4096)?;
        // The translation is now remembered (a second access hits it).
        view.dma_write(iova, &[1]).map_err(|_| DriverError::invalid("fault"))?;
        view.dma_write(iova + 1, &[2]).map_err(|_| DriverError::invalid("fault"))?;
        drop(m);
        // Unmapped: the view must fault like the IOMMU, not reach `v` through its memory.
        assert!(view.dma_write(iova + 2, &[3]).is_err(), "a view wrote through a stale translation");
        let mut b = [0u8; 1];
        assert!(view.dma_read(iova, &mut b).is_err());
        assert!(view.dma_store_u32(iova + 4, 5).is_err());
        // Mapped again: a new IOVA that reaches the same memory; other mappings stay reachable.
        // SAFETY: as above.
        let m2 = unsafe { mmu.map(v.as_mut_ptr(), v.len())? };
        let iova2 = m2.segments()[0].iova;
        assert_ne!(iova2, iova);
        view.dma_write(iova2 + 3, &[4]).map_err(|_| DriverError::invalid("fault"))?;
        view.dma_write(other.iova(), &[9]).map_err(|_| DriverError::invalid("fault"))?;
        drop(m2);
        assert_eq!(&v[..4], &[1, 2, 0, 4]);
        Ok(())
    }

    #[test]
    fn a_scoped_view_does_not_reach_other_owners_through_its_cache() -> Result<()> {
        let mmu = EmuIommu::new("t");
        let mut view = DmaView::new(&mmu);
        let buf = mmu.alloc(4096)?;
        view.dma_write(buf.iova(), &[1]).map_err(|_| DriverError::invalid("fault"))?;
        // The local buffer is remembered for owner 0; a command of owner 7 must not reach it.
        view.set_scope(Some(7));
        assert!(view.dma_write(buf.iova(), &[2]).is_err());
        view.set_scope(Some(LOCAL_OWNER));
        view.dma_write(buf.iova(), &[3]).map_err(|_| DriverError::invalid("fault"))?;
        let mut out = [0u8; 1];
        buf.copy_out(0, &mut out)?;
        assert_eq!(out, [3]);
        Ok(())
    }

    #[test]
    fn mapped_caller_memory_keeps_its_page_offset() -> Result<()> {
        let mmu = EmuIommu::new("t");
        let mut v = vec![0u8; 10_000];
        let p = v.as_mut_ptr().wrapping_add(100);
        // SAFETY: `v` outlives the mapping, which is dropped at the end of this scope.
        let m = unsafe { mmu.map(p, 5000)? };
        let seg = m.segments()[0];
        assert_eq!(seg.iova % 4096, p as u64 % 4096);
        mmu.dma_write(seg.iova + 4999, &[7]).map_err(|_| DriverError::invalid("fault"))?;
        drop(m);
        assert_eq!(v[100 + 4999], 7);
        Ok(())
    }
}
