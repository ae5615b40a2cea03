//! What the daemon reports about itself: `tutti status` and the counters of
//! `tutti serve --metrics`.

use super::Service;
use crate::proto::{ClientStatus, ControllerStatus, EmulatedIo, StaleStatus, StatusReport};
use std::sync::atomic::Ordering;
use tutti_objstore::PoolControl;

impl Service {
    /// The status report: the pool, the controllers, and every greeted client with what it holds.
    pub fn status(&self) -> StatusReport {
        self.board.observe();
        let stale = self.board.stale();
        let clients = self.clients();
        let name_of =
            |ctrl: u32| self.ctrls.get(ctrl as usize).map_or("?".into(), |s| s.ctrl.name().to_string());
        let waiting_for_hello = clients.values().filter(|c| !c.hello).count();
        let mut list: Vec<ClientStatus> = clients
            .iter()
            .filter(|(_, c)| c.hello)
            .map(|(&id, c)| ClientStatus {
                id,
                name: c.name.clone(),
                pid: c.peer.map_or(0, |p| p.pid),
                uid: c.peer.map_or(0, |p| p.uid),
                connected_s: c.since.map_or(0, |t| t.elapsed().as_secs()),
                requests: c.requests,
                queues: {
                    let mut q: Vec<(String, u16)> =
                        c.qids.keys().map(|&(ctrl, qid)| (name_of(ctrl), qid)).collect();
                    q.sort();
                    q
                },
                mappings: c.maps.len() + c.iovas.len(),
                device_mappings: c.device_maps.len(),
                pins: c.pins.len(),
                reservations: c.reservations.len(),
                loading_files: c.loads.len(),
                proxied: false,
                arbitration_slot: c.seat.map(|s| s.slot as u32),
                stale: c.seat.and_then(|seat| {
                    stale.iter().find(|s| s.slot == seat.slot).map(|s| StaleStatus {
                        unchanged_ms: s.unchanged_for.as_millis() as u64,
                        skipped_by_holds: s.skipped_by_holds,
                    })
                }),
            })
            .collect();
        drop(clients);
        let proxied: Vec<u64> = self.proxies().keys().copied().collect();
        for c in &mut list {
            c.proxied = proxied.contains(&c.id);
        }
        list.sort_by_key(|c| c.id);
        StatusReport {
            pid: std::process::id(),
            socket: self.socket.clone(),
            pool: self.pool.name().to_string(),
            uptime_s: self.started.elapsed().as_secs(),
            clients_served: self.next_client.load(Ordering::Relaxed).saturating_sub(1),
            stats: self.pool.stats().unwrap_or_default(),
            controllers: self
                .ctrls
                .iter()
                .map(|s| ControllerStatus {
                    name: s.ctrl.name().to_string(),
                    granted_pairs: s.ctrl.info().io_queue_pairs,
                    free_pairs: s.ctrl.free_io_queue_pairs(),
                    client_mappings: match (&s.emulated, &s.vfio) {
                        (Some(emu), _) => emu.iommu().client_regions() as u64,
                        (None, Some(dev)) => dev.vfio_dma().client_ranges(),
                        (None, None) => 0,
                    },
                })
                .collect(),
            emulated_io: self
                .ctrls
                .iter()
                .filter_map(|s| {
                    let st = s.emulated.as_ref()?.stats();
                    Some(EmulatedIo {
                        name: s.ctrl.name().to_string(),
                        commands: st.commands,
                        mixed_commands: st.mixed_commands,
                        bytes_read: st.bytes_read,
                        bytes_written: st.bytes_written,
                        errors: st.errors,
                    })
                })
                .collect(),
            clients: list,
            waiting_for_hello,
            arbitration: self.board.hold_stats(),
            geometry: Some(self.pool.shape().geometry),
        }
    }

    /// The status report and the counters of `tutti serve --metrics`.
    pub fn metrics(&self) -> crate::metrics::MetricsReport {
        let drives = self
            .drives
            .iter()
            .map(|&(c, ns)| {
                (self.ctrls.get(c as usize).map_or("?".into(), |s| s.ctrl.name().to_string()), ns)
            })
            .collect();
        self.counters.snapshot(self.status(), Some(self.pool.shape().geometry), drives)
    }
}
