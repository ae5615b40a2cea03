//! Registering the engine's KV memory with the store: the layout checked
//! against the pool's geometry, the memory mapped for the drives (or the
//! staged path chosen), the I/O path attached to it; and dropping it again.

use super::{lock, KvStore};
use crate::error::{ObjError, Result};
use crate::hash::CacheIdentity;
use crate::layout::KvLayout;
use crate::memory::HostKvMemory;
use crate::p2p::{DeviceKvMemory, P2pPolicy};
use crate::registration::{KvMemoryKind, Registration, TableSizes};
use std::sync::Arc;

impl KvStore {
    /// Registers host memory the store keeps alive (tests, machines without a GPU).
    pub fn register_host(
        &self,
        memory: Arc<HostKvMemory>,
        layout: KvLayout,
        model: &str,
        tenant_salt: &[u8],
    ) -> Result<TableSizes> {
        self.register_host_as(memory, layout, model, tenant_salt, KvMemoryKind::Host)
    }

    /// [`register_host`](Self::register_host) with the memory's kind:
    /// [`KvMemoryKind::HostUnmapped`] keeps it out of every drive's DMA space
    /// and moves it on the staged data path (tests of that path without a GPU).
    pub fn register_host_as(
        &self,
        memory: Arc<HostKvMemory>,
        layout: KvLayout,
        model: &str,
        tenant_salt: &[u8],
        kind: KvMemoryKind,
    ) -> Result<TableSizes> {
        if kind == KvMemoryKind::Cuda {
            return Err(ObjError::invalid("memory", "host memory registered as CUDA memory"));
        }
        for r in layout.regions() {
            if !memory.contains(r.addr, r.len) {
                return Err(ObjError::invalid(
                    "layout",
                    format!(
                        "region {:#x}+{:#x} is outside the {:#x}-byte host memory",
                        r.addr,
                        r.len,
                        memory.len()
                    ),
                ));
            }
        }
        // SAFETY: every region lies inside `memory`, which the registration keeps alive.
        unsafe { self.register_inner(layout, model, tenant_salt, Some(memory), kind, Ok(None)) }
    }

    /// [`register`](Self::register) for memory of `kind`: `Host` is mapped for
    /// the drives (direct DMA); `Cuda` (device memory of the executor's GPU)
    /// and `HostUnmapped` go through staging slots, which needs the gio
    /// backend (the direct backend refuses them, naming why).
    ///
    /// # Safety
    /// As [`register`](Self::register); `Cuda` regions must be device memory
    /// of the CUDA executor's context.
    pub unsafe fn register_as(
        &self,
        layout: KvLayout,
        model: &str,
        tenant_salt: &[u8],
        kind: KvMemoryKind,
    ) -> Result<TableSizes> {
        // SAFETY: forwarded from the caller.
        unsafe { self.register_inner(layout, model, tenant_salt, None, kind, Ok(None)) }
    }

    /// Registers KV memory that lives in another device (a PCI BAR mapped
    /// through vfio-pci, GPU memory a provider maps) for peer-to-peer DMA:
    /// mapped for every drive with `DmaSpace::map_device`, then probed on
    /// every drive ([`crate::p2p`]). The data path is `p2p` when the probe
    /// passes; otherwise, under `P2pPolicy::Auto`, `staged` with the probe's
    /// verdict as `p2p_missing` (which needs the gio backend), and under
    /// `P2pPolicy::Require` an error naming it.
    ///
    /// # Safety
    /// As [`register`](Self::register): every region of `layout` is device
    /// memory `device.access` reaches, mapped in this process until the store
    /// is unregistered or dropped.
    pub unsafe fn register_device(
        &self,
        layout: KvLayout,
        model: &str,
        tenant_salt: &[u8],
        device: DeviceKvMemory,
    ) -> Result<TableSizes> {
        // SAFETY: forwarded from the caller.
        unsafe {
            self.register_inner(layout, model, tenant_salt, None, KvMemoryKind::DeviceP2p, Ok(Some(device)))
        }
    }

    /// Registers the engine's KV memory described by `layout` under a cache
    /// identity (model name and tenant salt; geometry, dtype and layout kind
    /// come from `layout`). Replaces an earlier registration when no job or
    /// store is in flight. Returns the table sizes.
    ///
    /// # Safety
    /// Every region of `layout` must stay allocated, and must not be memory the
    /// drives must not touch, until the store is unregistered or dropped.
    pub unsafe fn register(&self, layout: KvLayout, model: &str, tenant_salt: &[u8]) -> Result<TableSizes> {
        // SAFETY: forwarded from the caller.
        unsafe { self.register_inner(layout, model, tenant_salt, None, KvMemoryKind::Host, Ok(None)) }
    }

    /// Registers CUDA KV memory (the CUDA executor's): peer to peer when
    /// `provider` maps it for the drives (GDRCopy) and the probe passes, as
    /// [`register_device`](Self::register_device) does; staged otherwise, with
    /// the provider's failure (`Err`) or the probe's verdict as `p2p_missing`.
    ///
    /// # Safety
    /// As [`register_as`](Self::register_as) with `KvMemoryKind::Cuda`; the
    /// provider's mappings stay valid until the registration drops (it holds them).
    pub unsafe fn register_cuda(
        &self,
        layout: KvLayout,
        model: &str,
        tenant_salt: &[u8],
        provider: std::result::Result<DeviceKvMemory, String>,
    ) -> Result<TableSizes> {
        // SAFETY: forwarded from the caller.
        unsafe {
            self.register_inner(layout, model, tenant_salt, None, KvMemoryKind::Cuda, provider.map(Some))
        }
    }

    /// `device`: the provider of device memory, if any; `Err` says why CUDA
    /// memory has none (the staged registration's reason).
    unsafe fn register_inner(
        &self,
        layout: KvLayout,
        model: &str,
        tenant_salt: &[u8],
        memory: Option<Arc<HostKvMemory>>,
        kind: KvMemoryKind,
        device: std::result::Result<Option<DeviceKvMemory>, String>,
    ) -> Result<TableSizes> {
        let (device, no_provider) = match device {
            Ok(d) => (d, None),
            Err(why) => (None, Some(why)),
        };
        if *layout.geometry() != self.geometry {
            return Err(ObjError::invalid(
                "layout",
                format!("geometry {} differs from the pool's {}", layout.geometry(), self.geometry),
            ));
        }
        if model.is_empty() {
            return Err(ObjError::invalid("model", "the cache identity needs a model name"));
        }
        self.ensure_idle()?;
        lock(&self.io, "io")?.accepts(kind)?;
        let identity = CacheIdentity::new(model, self.geometry, layout.kind(), tenant_salt);
        let spaces = self
            .drives
            .iter()
            .map(|d| {
                d.spec.as_ref().map(|s| s.ctrl.dma().clone()).ok_or_else(|| {
                    ObjError::invalid(
                        "memory",
                        format!("drive {} is not reachable from this store", d.device),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        // Refused before anything is mapped or built: tables past the bound, and host memory
        // this process does not have (the drives, or the executor's copies, would use every byte).
        let views = if kind.p2p_obstacle().is_some() && device.is_none() {
            1
        } else {
            crate::registration::distinct_spaces(&spaces)
        };
        crate::registration::check_table_bounds(&layout, self.map.chunks(), views)?;
        if kind != KvMemoryKind::Cuda {
            crate::mapped::check_host_mapped(layout.regions())?;
        }
        // SAFETY: forwarded from the caller.
        let mut reg =
            unsafe { Registration::new(layout, identity, &spaces, &self.map, memory, kind, device)? };
        if let Some(why) = no_provider {
            reg.set_p2p_missing(why);
        }
        if let Some(dev) = reg.device.clone().filter(|_| !reg.staged()) {
            if let Err(why) = crate::probe::probe(&reg, &self.drives, &dev) {
                if dev.policy == P2pPolicy::Require {
                    return Err(ObjError::invalid("memory", format!("{why} (the p2p setting requires P2P)")));
                }
                tracing::warn!(provider = %dev.provider, %why, "P2P probe failed; KV memory moves through staging");
                reg = reg.into_staged(why);
            }
        }
        let reg = Arc::new(reg);
        // The old registration goes first, whether or not the new one is accepted.
        let mut slot = self.reg.write().map_err(|_| ObjError::Poisoned("registration"))?;
        let mut io = lock(&self.io, "io")?;
        io.detach()?;
        *slot = None;
        io.attach(&reg, &self.map)?;
        let sizes = reg.sizes;
        *slot = Some(reg);
        Ok(sizes)
    }

    /// Drops the registration (and its DMA mappings).
    pub fn unregister(&self) -> Result<()> {
        self.ensure_idle()?;
        lock(&self.io, "io")?.detach()?;
        *self.reg.write().map_err(|_| ObjError::Poisoned("registration"))? = None;
        Ok(())
    }

    pub(super) fn ensure_idle(&self) -> Result<()> {
        let busy_jobs = lock(&self.jobs, "jobs")?.running();
        let sessions = lock(&self.sessions, "sessions")?.len();
        if busy_jobs > 0 || sessions > 0 {
            return Err(ObjError::invalid(
                "registration",
                format!("{busy_jobs} jobs and {sessions} stores are in flight; finish them first"),
            ));
        }
        Ok(())
    }

    pub(super) fn registration(&self) -> Result<Arc<Registration>> {
        self.reg
            .read()
            .map_err(|_| ObjError::Poisoned("registration"))?
            .clone()
            .ok_or(ObjError::NotRegistered)
    }

    /// The cache identity of the current registration.
    pub fn identity(&self) -> Result<CacheIdentity> {
        Ok(self.registration()?.identity.clone())
    }

    /// Table sizes of the current registration.
    pub fn table_sizes(&self) -> Result<TableSizes> {
        Ok(self.registration()?.sizes)
    }
}
