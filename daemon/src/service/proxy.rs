//! Layers the daemon moves for a client without queue pairs of its own: attaching the
//! client's memory layout, registering pairs, submitting and polling layer transfers.

use super::reply::{err, from_obj, invalid, ok, Reply};
use super::Service;
use crate::peer::PeerCred;
use crate::proto::{ErrorKind, Response};
use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use tutti_driver::transport::{DmaBuffer, DmaMapping, DmaSpace, IovaSegment};
use tutti_objstore::io::proxy::{LayerHost, LayoutSpec};
use tutti_objstore::io::{Direction, Pair};
use tutti_objstore::{FileId, ObjError};

/// Locks a client's proxied I/O path. A panic inside a transfer leaves it in an unknown
/// state, so a poisoned lock is an I/O error for that client, not one to serve through.
fn lock(host: &Mutex<LayerHost>) -> Result<MutexGuard<'_, LayerHost>, Response> {
    host.lock().map_err(|_| err(ErrorKind::Io, "proxy state poisoned"))
}

impl Service {
    /// The client's proxied I/O path, if it attached one.
    fn proxy(&self, client: u64) -> Result<Arc<Mutex<LayerHost>>, Response> {
        self.proxies()
            .get(&client)
            .cloned()
            .ok_or_else(|| invalid("no proxied layout attached (proxy-attach first)"))
    }

    /// Runs `f` on the client's attached proxied I/O path.
    fn with_proxy<T>(
        &self,
        client: u64,
        f: impl FnOnce(&mut LayerHost) -> Result<T, ObjError>,
    ) -> Result<T, Response> {
        let host = self.proxy(client)?;
        let mut h = lock(&host)?;
        f(&mut h).map_err(from_obj)
    }

    /// `ProxyAttach`: the daemon's view of the client's memory `layout`, through the
    /// client's own mappings (emulated: its IOMMU space; VFIO: the ranges it mapped).
    pub(super) fn proxy_attach(&self, client: u64, peer: &PeerCred, layout: &LayoutSpec) -> Reply {
        let mut spaces_of_ctrl: Vec<Arc<dyn DmaSpace>> = Vec::new();
        let mut used = HashSet::new();
        for (i, s) in self.ctrls.iter().enumerate() {
            match &s.emulated {
                Some(emu) => spaces_of_ctrl.push(Arc::new(emu.iommu().space_of(peer.pid, client))),
                None => {
                    // VFIO: the client mapped its memory in the controller's container
                    // itself; the daemon's commands use the client's own IOVAs.
                    let ranges: Vec<ClientRange> = self
                        .with_client(client, |c| {
                            c.iovas
                                .iter()
                                .filter(|(k, r)| k.0 == i as u32 && r.mapped)
                                .map(|(k, r)| ClientRange { vaddr: r.vaddr, iova: k.1, len: r.len })
                                .collect()
                        })
                        .unwrap_or_default();
                    used.extend(ranges.iter().map(|r| (i as u32, r.iova)));
                    spaces_of_ctrl.push(Arc::new(ClientRanges { name: s.ctrl.name().to_string(), ranges }));
                }
            }
        }
        let spaces: Vec<_> = self.drives.iter().map(|&(c, _)| spaces_of_ctrl[c as usize].clone()).collect();
        let host = match self.proxies().get(&client).cloned() {
            Some(h) => h,
            None => {
                let drives: Vec<_> =
                    self.drives.iter().map(|&(c, ns)| (self.ctrls[c as usize].ctrl.clone(), ns)).collect();
                let geometry = self.pool.shape().geometry;
                let h = LayerHost::new(&drives, self.pool.stripe_map().clone(), geometry, 64)
                    .map_err(from_obj)?;
                Arc::new(Mutex::new(h))
            }
        };
        {
            let mut h = lock(&host)?;
            // SAFETY: every space maps addresses of the client's process (process_vm), never this one's.
            unsafe { h.attach(layout, &spaces) }.map_err(from_obj)?;
        }
        self.proxies().insert(client, host);
        // Ranges the proxied registration points into may not be given back until it goes.
        self.with_client(client, |c| c.proxy_ranges = used);
        ok(Response::Ok)
    }

    /// `ProxyDetach`: drops the client's layout (nothing attached is nothing to detach:
    /// a store detaches before it attaches).
    pub(super) fn proxy_detach(&self, client: u64) -> Reply {
        let Ok(host) = self.proxy(client) else { return ok(Response::Ok) };
        lock(&host)?.detach().map_err(from_obj)?;
        self.with_client(client, |c| c.proxy_ranges.clear());
        ok(Response::Ok)
    }

    /// `ProxyRegisterPairs`: registers `pairs` for later submits; the reply is their handle.
    pub(super) fn proxy_register_pairs(&self, client: u64, pairs: &[Pair]) -> Reply {
        ok(Response::Handle(self.with_proxy(client, |h| h.register_pairs(pairs))?))
    }

    /// `ProxyUnregisterPairs`: forgets registered pairs.
    pub(super) fn proxy_unregister_pairs(&self, client: u64, handle: u64) -> Reply {
        self.with_proxy(client, |h| h.unregister_pairs(handle))?;
        ok(Response::Ok)
    }

    /// `ProxySubmit`: starts moving layer `layer` of `pairs`, only of files the client may
    /// move: its reservations' files for a store, files it holds a load reference on for a load.
    pub(super) fn proxy_submit(
        &self,
        client: u64,
        layer: u32,
        pairs: &[Pair],
        dir: Direction,
        registered: Option<u64>,
    ) -> Reply {
        let store = dir == Direction::Store;
        let allowed = self
            .with_client(client, |c| {
                if store {
                    return true; // checked below against the pool's reservations
                }
                pairs.iter().all(|p| c.loads.contains_key(&p.file))
            })
            .unwrap_or(false);
        if !allowed {
            return Err(invalid("proxy-submit loads files this client holds no load reference on"));
        }
        if store {
            let mine: Vec<u64> =
                self.with_client(client, |c| c.reservations.keys().copied().collect()).unwrap_or_default();
            let files: Vec<FileId> = pairs.iter().map(|p| p.file).collect();
            if !self.pool.reserved_by(&mine, &files) {
                return Err(invalid("proxy-submit stores into files no reservation of this client holds"));
            }
        }
        ok(Response::Handle(self.with_proxy(client, |h| h.submit(layer, pairs, dir, registered))?))
    }

    /// `ProxyPoll`: the outcome of a submitted layer, if it finished.
    pub(super) fn proxy_poll(&self, client: u64, token: u64) -> Reply {
        ok(Response::Outcome(self.with_proxy(client, |h| h.poll(token))?))
    }

    /// Stops and detaches a departed client's proxied I/O path, if it had one.
    pub(super) fn drop_proxy(&self, client: u64) {
        let proxy = self.proxies().remove(&client);
        if let Some(host) = proxy {
            if let Ok(mut h) = host.lock() {
                // Layers run to completion inside each request; nothing should be left.
                if !h.drain(std::time::Duration::from_secs(10)) {
                    tracing::error!(client, "proxied transfers still in flight after 10 s");
                }
                let _ = h.detach();
            }
        }
    }
}

/// One range a client mapped in a controller's container itself.
struct ClientRange {
    /// The client's address the range starts at.
    vaddr: u64,
    iova: u64,
    len: u64,
}

/// A client's memory as its own VFIO mappings place it. The daemon registers a
/// proxied client's layout through it; nothing is mapped or unmapped here (the
/// client owns the mappings).
struct ClientRanges {
    name: String,
    ranges: Vec<ClientRange>,
}

impl DmaSpace for ClientRanges {
    fn name(&self) -> &str {
        &self.name
    }
    fn alloc(&self, _len: usize) -> tutti_driver::Result<DmaBuffer> {
        Err(tutti_driver::DriverError::dma(self.name.clone(), "a client's ranges allocate nothing"))
    }
    /// # Safety
    /// None beyond the trait's: the range is the client's, mapped by the client.
    unsafe fn map(&self, vaddr: *mut u8, len: usize) -> tutti_driver::Result<DmaMapping> {
        let a = vaddr as u64;
        let end = a.checked_add(len as u64);
        let found = self.ranges.iter().find(|r| a >= r.vaddr && end.is_some_and(|e| e <= r.vaddr + r.len));
        let Some(r) = found else {
            return Err(tutti_driver::DriverError::dma(
                self.name.clone(),
                format!("the client mapped no range holding {a:#x}+{len:#x}"),
            ));
        };
        let segments = vec![IovaSegment { iova: r.iova + (a - r.vaddr), len: len as u64 }];
        // SAFETY: the segment is where the client's own mapping puts this range; nothing to undo.
        Ok(unsafe { DmaMapping::from_raw(vaddr, len, segments, Box::new(())) })
    }
}
