//! Client memory the controllers may reach: mappings in an emulated controller's IOMMU,
//! and the IOVA ranges a client reserves, maps itself and gives back on a VFIO one.

use super::reply::{from_driver, invalid, ok, Reply};
use super::state::IovaRange;
use super::Service;
use crate::peer::PeerCred;
use crate::proto::{Response, MAX_IOVA_RANGES, MAX_MAP_LEN};

impl Service {
    /// `Map`: maps `addr..addr+len` of the client's process in an emulated controller's IOMMU.
    pub(super) fn map(&self, client: u64, peer: &PeerCred, ctrl: u32, addr: u64, len: u64) -> Reply {
        let emu = self.emulated(ctrl)?;
        if len == 0 || len > MAX_MAP_LEN || addr.checked_add(len).is_none() {
            return Err(invalid(format!("mapping {addr:#x}+{len:#x} is empty, too large or wraps")));
        }
        let iova = emu.iommu().map_remote(peer.pid, addr, len as usize, client).map_err(from_driver)?;
        self.with_client(client, |c| c.maps.insert((ctrl, iova)));
        ok(Response::Iova(iova))
    }

    /// `MapDevice`: the client's device memory (a PFN map in its address space) into an
    /// emulated controller's IOMMU, reached as device memory.
    pub(super) fn map_device(
        &self,
        client: u64,
        peer: &PeerCred,
        ctrl: u32,
        addr: u64,
        len: u64,
        what: &str,
    ) -> Reply {
        if self.served(ctrl)?.vfio.is_some() {
            return Err(invalid(format!(
                "controller {ctrl} is a VFIO device: a client maps its device memory there itself                  (VFIO_IOMMU_MAP_DMA in a range reserve-iova gives), as its host memory"
            )));
        }
        let emu = self.emulated(ctrl)?;
        if len == 0 || len > MAX_MAP_LEN || addr.checked_add(len).is_none() || what.len() > 256 {
            return Err(invalid(format!(
                "device mapping {addr:#x}+{len:#x} is empty, too large or wraps, or its name is too long"
            )));
        }
        let iova =
            emu.iommu().map_remote_device(peer.pid, addr, len as usize, client, what).map_err(from_driver)?;
        self.with_client(client, |c| {
            c.maps.insert((ctrl, iova));
            c.device_maps.insert((ctrl, iova));
        });
        ok(Response::Iova(iova))
    }

    /// `Unmap`: gives back a mapping (emulated) or a reserved range (VFIO).
    pub(super) fn unmap(&self, client: u64, ctrl: u32, iova: u64) -> Reply {
        if self.served(ctrl)?.vfio.is_some() {
            self.unmap_vfio(client, ctrl, iova)
        } else {
            self.unmap_emulated(client, ctrl, iova)
        }
    }

    fn unmap_emulated(&self, client: u64, ctrl: u32, iova: u64) -> Reply {
        let emu = self.emulated(ctrl)?;
        let known = self.with_client(client, |c| {
            c.device_maps.remove(&(ctrl, iova));
            c.maps.remove(&(ctrl, iova))
        });
        if !known.unwrap_or(false) {
            return Err(invalid(format!("IOVA {iova:#x} of controller {ctrl} is not this client's")));
        }
        emu.iommu().unmap(iova, client).map_err(from_driver)?;
        ok(Response::Ok)
    }

    fn unmap_vfio(&self, client: u64, ctrl: u32, iova: u64) -> Reply {
        let dev = self.vfio(ctrl)?;
        // Not while a queue of the client lives there: the controller would go on
        // reading and writing whatever is mapped at that IOVA next.
        let busy = self
            .with_client(client, |c| {
                c.queue_ranges.iter().find(|(k, r)| k.0 == ctrl && r.contains(&iova)).map(|(k, _)| k.1)
            })
            .flatten();
        if let Some(qid) = busy {
            return Err(invalid(format!(
                "IOVA range {iova:#x} of controller {ctrl} holds the rings of queue {qid}; delete the queues first"
            )));
        }
        if self.with_client(client, |c| c.proxy_ranges.contains(&(ctrl, iova))).unwrap_or(false) {
            return Err(invalid(format!(
                "IOVA range {iova:#x} of controller {ctrl} holds memory tuttid moves layers into for this client; unregister first"
            )));
        }
        let Some(range) = self.with_client(client, |c| c.iovas.remove(&(ctrl, iova))).flatten() else {
            return Err(invalid(format!("IOVA {iova:#x} of controller {ctrl} is not this client's")));
        };
        // Whatever the client left mapped there goes now; on an error the
        // range stays out of use (release_iova).
        dev.vfio_dma().release_iova(iova, range.len).map_err(from_driver)?;
        ok(Response::Ok)
    }

    /// `VfioFds`: the container and device fds of a VFIO controller.
    pub(super) fn vfio_fds(&self, ctrl: u32) -> Reply {
        let dev = self.vfio(ctrl)?;
        let (container, device) = dev.client_fds().map_err(from_driver)?;
        Ok((Response::Ok, vec![container, device]))
    }

    /// `ReserveIova`: an IOVA range of `len` bytes on a VFIO controller for the client to map.
    pub(super) fn reserve_iova(&self, client: u64, ctrl: u32, len: u64) -> Reply {
        let dev = self.vfio(ctrl)?;
        if len == 0 || len > MAX_MAP_LEN {
            return Err(invalid(format!("IOVA range of {len:#x} bytes is empty or over {MAX_MAP_LEN:#x}")));
        }
        let held = self.with_client(client, |c| c.iovas.keys().filter(|k| k.0 == ctrl).count()).unwrap_or(0);
        if held >= MAX_IOVA_RANGES {
            return Err(invalid(format!(
                "this client already holds {held} IOVA ranges on controller {ctrl}; at most {MAX_IOVA_RANGES}"
            )));
        }
        let iova = dev.vfio_dma().reserve_iova(len).map_err(from_driver)?;
        self.with_client(client, |c| {
            c.iovas.insert((ctrl, iova), IovaRange { len, mapped: false, vaddr: 0 })
        });
        ok(Response::Iova(iova))
    }

    /// `Mapped`: the client mapped its reserved range at `iova` from its address `vaddr`.
    pub(super) fn mapped(&self, client: u64, ctrl: u32, iova: u64, vaddr: u64) -> Reply {
        self.vfio(ctrl)?;
        if !vaddr.is_multiple_of(4096) {
            return Err(invalid(format!("mapped address {vaddr:#x} is not page aligned")));
        }
        let marked = self
            .with_client(client, |c| {
                c.iovas.get_mut(&(ctrl, iova)).map(|r| {
                    r.mapped = true;
                    r.vaddr = vaddr;
                })
            })
            .is_some_and(|m| m.is_some());
        if !marked {
            return Err(invalid(format!(
                "IOVA {iova:#x} of controller {ctrl} was not reserved for this client"
            )));
        }
        ok(Response::Ok)
    }

    /// The start of the IOVA range of controller `ctrl` that `client`
    /// reserved and mapped and that holds all of `at..at+len`, if any.
    pub(super) fn client_range(&self, client: u64, ctrl: u32, at: u64, len: u64) -> Option<u64> {
        self.with_client(client, |c| {
            c.iovas.iter().find_map(|(&(cc, base), r)| {
                (cc == ctrl
                    && r.mapped
                    && at >= base
                    && at.checked_add(len).is_some_and(|e| e <= base + r.len))
                .then_some(base)
            })
        })
        .flatten()
    }
}
