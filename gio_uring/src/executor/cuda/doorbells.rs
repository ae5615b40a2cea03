//! How the kernels reach the drives' doorbells: the registers mapped for the
//! GPU, or the host relay (configured, or the fallback where the driver
//! refuses to register the doorbell page).

use super::registry::MapError;
use super::{CudaExecutor, Relay};
use crate::error::{GioError, Result};
use crate::executor::relay::{DoorbellMode, DoorbellRelay, RelayConfig, Watch};
use crate::mem::{HostMapping, HostRange};
use std::ptr::NonNull;
use tutti_driver::transport::DoorbellKind;

/// A relayed doorbell: the kernels store into its mailbox.
struct Relayed {
    _watch: Watch,
    exec: u64,
}

impl HostMapping for Relayed {
    fn exec_addr(&self) -> u64 {
        self.exec
    }
}

impl CudaExecutor {
    /// [`crate::executor::Executor::map_doorbell`]: direct where the driver registers the
    /// doorbell page, else (or when configured) through the relay.
    ///
    /// # Safety
    /// `doorbell` stays valid until the returned mapping is dropped.
    pub(super) unsafe fn map_doorbell_or_relay(
        &self,
        doorbell: NonNull<u32>,
        kind: DoorbellKind,
    ) -> Result<Box<dyn HostMapping>> {
        self.live_check()?;
        if matches!(self.cfg.doorbells, DoorbellMode::Relay(_)) {
            // SAFETY: forwarded contract.
            return unsafe { self.relay_doorbell(doorbell, kind, "configured") };
        }
        // Once one doorbell page was refused, the others go the same way (one path per executor).
        if self.relayed_name.get().is_some() {
            // SAFETY: forwarded contract.
            return unsafe { self.relay_doorbell(doorbell, kind, "fallback") };
        }
        let range = match kind {
            DoorbellKind::Mmio => HostRange::Io,
            DoorbellKind::Memory => HostRange::Memory,
        };
        // SAFETY: forwarded contract.
        match unsafe { self.registry.map(doorbell.as_ptr().cast(), 4, range) } {
            Ok(m) => Ok(m),
            // The driver will not map the doorbell page for the GPU (a BAR on a kernel whose
            // driver refuses IOMEMORY registration, or any doorbell page it would not
            // register): the host relays instead.
            Err(MapError::IoRefused(e) | MapError::Other(e)) => {
                tracing::warn!(executor = %self.name, error = %e, "doorbell registration refused; relaying");
                // SAFETY: forwarded contract.
                unsafe { self.relay_doorbell(doorbell, kind, &format!("registration refused: {e}")) }
            }
        }
    }

    /// The doorbell relay's counters, once doorbells are relayed.
    pub fn relay_stats(&self) -> Option<crate::executor::RelayStats> {
        self.relay.lock().ok()?.as_ref().map(|r| r.relay.stats())
    }

    /// Watches `doorbell` through the relay, starting it (and mapping its
    /// mailboxes for the GPU) on first use.
    ///
    /// # Safety
    /// `doorbell` stays valid until the returned mapping is dropped.
    unsafe fn relay_doorbell(
        &self,
        doorbell: NonNull<u32>,
        kind: DoorbellKind,
        why: &str,
    ) -> Result<Box<dyn HostMapping>> {
        let mut relay = self.relay.lock().map_err(|_| self.err("relay lock poisoned"))?;
        if relay.is_none() {
            let cfg = match &self.cfg.doorbells {
                DoorbellMode::Relay(c) => c.clone(),
                DoorbellMode::Direct => RelayConfig::default(),
            };
            let r = DoorbellRelay::new(cfg)?;
            let (ptr, len) = r.mailboxes();
            // SAFETY: the region lives as long as the relay, which outlives this mapping
            // (both are dropped together, the mapping first).
            let region = unsafe { self.registry.map(ptr, len, HostRange::Memory) }.map_err(GioError::from)?;
            let mailboxes = region.exec_addr();
            *relay = Some(Relay { relay: r, mailboxes, _region: region });
            let _ =
                self.relayed_name.set(format!("{}, doorbells relayed by a host thread ({why})", self.name));
            tracing::warn!(executor = %self.name, why, "NVMe doorbells go through the host relay thread");
        }
        let r = relay.as_ref().ok_or_else(|| self.err("relay missing"))?;
        // SAFETY: the caller's contract, passed on; the watch lives in the mapping.
        let watch = unsafe { r.relay.watch(doorbell, kind)? };
        let exec = r.mailboxes + watch.offset() as u64;
        Ok(Box::new(Relayed { _watch: watch, exec }))
    }
}
