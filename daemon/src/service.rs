//! The daemon's side of every request: the pool, the leases, and what each
//! client holds, so that a client that goes away (closed, crashed, killed)
//! gives everything back.

use crate::arbitration::{Board, Seat};
use crate::peer::PeerCred;
use crate::proto::{
    ArbitrationReply, ClientStatus, ControllerKind, ControllerReply, ControllerStatus, EmulatedIo, ErrorKind,
    PoolReply, Request, Response, StaleStatus, StatusReport, MAX_FILES, MAX_HASHES, MAX_IOVA_RANGES,
    MAX_MAP_LEN, MAX_NAME, PROTOCOL,
};
use crate::server::Handler;
use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;
use tutti_driver::controller::Controller;
use tutti_driver::emulated::EmulatedController;
use tutti_driver::transport::vfio::VfioDevice;
use tutti_objstore::io::proxy::LayerHost;
use tutti_objstore::{FileId, LocalPool, PoolControl, Verdict};

/// One controller the daemon owns.
pub(crate) struct Served {
    pub ctrl: Arc<Controller>,
    /// Set for emulated controllers (their register file and IOMMU serve clients).
    pub emulated: Option<EmulatedController>,
    /// Set for controllers bound to vfio-pci (their container and IOVA space serve clients).
    pub vfio: Option<VfioDevice>,
}

#[derive(Default, Clone)]
struct ClientState {
    name: String,
    peer: Option<PeerCred>,
    since: Option<Instant>,
    hello: bool,
    requests: u64,
    /// Claimed queue ids, and whether the queues exist on the controller.
    qids: HashMap<(u32, u16), bool>,
    /// IOVAs mapped for the client, per controller.
    maps: HashSet<(u32, u64)>,
    /// IOVA ranges reserved for the client on VFIO controllers: (ctrl, iova) →
    /// (length, whether the client said it mapped the range, from which of its addresses).
    iovas: HashMap<(u32, u64), (u64, bool, u64)>,
    /// Live queue pairs on VFIO controllers: (ctrl, qid) → the IOVA ranges
    /// (their starts) holding the SQ and CQ, which may not be given back while
    /// the queues exist.
    queue_ranges: HashMap<(u32, u16), [u64; 2]>,
    /// VFIO ranges (ctrl, iova) a proxied registration of the client points into.
    proxy_ranges: HashSet<(u32, u64)>,
    pins: HashSet<u64>,
    reservations: HashMap<u64, usize>,
    /// I/O references held for the client's loads (a file may be in several).
    loads: HashMap<FileId, u32>,
    /// Its slot on the arbitration board.
    seat: Option<Seat>,
}

pub(crate) struct Service {
    pool: Arc<LocalPool>,
    ctrls: Vec<Served>,
    drives: Vec<(u32, u32)>,
    socket: String,
    started: Instant,
    clients: Mutex<HashMap<u64, ClientState>>,
    /// Layer transfers the daemon runs for clients without queue pairs.
    proxies: Mutex<HashMap<u64, Arc<Mutex<LayerHost>>>>,
    next_client: AtomicU64,
    /// The per-drive arbitration board the clients share.
    board: Board,
}

fn err(kind: ErrorKind, message: impl Into<String>) -> Response {
    Response::Error { kind, message: message.into() }
}

fn invalid(message: impl Into<String>) -> Response {
    err(ErrorKind::Invalid, message)
}

fn from_obj(e: tutti_objstore::ObjError) -> Response {
    use tutti_objstore::ObjError;
    match e {
        ObjError::Invalid { .. } | ObjError::Unknown { .. } => invalid(e.to_string()),
        e => err(ErrorKind::Io, e.to_string()),
    }
}

fn from_driver(e: tutti_driver::DriverError) -> Response {
    use tutti_driver::DriverError;
    match e {
        DriverError::NoQueuePair { .. } | DriverError::InUse(_) => err(ErrorKind::Busy, e.to_string()),
        DriverError::InvalidArgument(_) => invalid(e.to_string()),
        e => err(ErrorKind::Io, e.to_string()),
    }
}

impl Service {
    pub fn new(
        pool: Arc<LocalPool>,
        ctrls: Vec<Served>,
        drives: Vec<(u32, u32)>,
        socket: String,
    ) -> crate::Result<Self> {
        let board = Board::new(drives.len())?;
        Ok(Service {
            pool,
            ctrls,
            drives,
            socket,
            started: Instant::now(),
            clients: Mutex::new(HashMap::new()),
            proxies: Mutex::new(HashMap::new()),
            next_client: AtomicU64::new(1),
            board,
        })
    }

    fn clients(&self) -> MutexGuard<'_, HashMap<u64, ClientState>> {
        // A panic while holding this lock cannot leave a client half-updated in a way
        // that matters more than losing the daemon: keep serving with the data as is.
        self.clients.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn proxies(&self) -> MutexGuard<'_, HashMap<u64, Arc<Mutex<LayerHost>>>> {
        self.proxies.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The client's proxied I/O path, if it attached one.
    fn proxy(&self, client: u64) -> Result<Arc<Mutex<LayerHost>>, Response> {
        self.proxies()
            .get(&client)
            .cloned()
            .ok_or_else(|| invalid("no proxied layout attached (proxy-attach first)"))
    }

    fn proxy_attach(
        &self,
        client: u64,
        peer: &PeerCred,
        layout: &tutti_objstore::io::proxy::LayoutSpec,
    ) -> Result<(), Response> {
        let mut spaces_of_ctrl: Vec<Arc<dyn tutti_driver::transport::DmaSpace>> = Vec::new();
        let mut used = HashSet::new();
        for (i, s) in self.ctrls.iter().enumerate() {
            match &s.emulated {
                Some(emu) => spaces_of_ctrl.push(Arc::new(emu.iommu().space_of(peer.pid, client))),
                None => {
                    // VFIO: the client mapped its memory in the controller's container
                    // itself; the daemon's commands use the client's own IOVAs.
                    let ranges: Vec<(u64, u64, u64)> = self
                        .with_client(client, |c| {
                            c.iovas
                                .iter()
                                .filter(|(k, r)| k.0 == i as u32 && r.1)
                                .map(|(k, r)| (r.2, k.1, r.0))
                                .collect()
                        })
                        .unwrap_or_default();
                    used.extend(ranges.iter().map(|r| (i as u32, r.1)));
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
            let mut h = host.lock().map_err(|_| err(ErrorKind::Io, "proxy state poisoned"))?;
            // SAFETY: every space maps addresses of the client's process (process_vm), never this one's.
            unsafe { h.attach(layout, &spaces) }.map_err(from_obj)?;
        }
        self.proxies().insert(client, host);
        // Ranges the proxied registration points into may not be given back until it goes.
        self.with_client(client, |c| c.proxy_ranges = used);
        Ok(())
    }

    /// Holds the drives for a metadata write made for `client` (see [`Board::hold_for_metadata`]).
    fn hold_for_metadata(&self, client: u64) -> crate::arbitration::MetaHold<'_> {
        let slot = self.with_client(client, |c| c.seat.map(|s| s.slot)).flatten();
        self.board.hold_for_metadata(slot, crate::arbitration::METADATA_WAIT)
    }

    /// Looks at the arbitration board (see [`Board::observe`]).
    pub fn observe_board(&self) {
        self.board.observe();
    }

    fn with_client<T>(&self, client: u64, f: impl FnOnce(&mut ClientState) -> T) -> Option<T> {
        self.clients().get_mut(&client).map(f)
    }

    fn served(&self, ctrl: u32) -> Result<&Served, Response> {
        self.ctrls.get(ctrl as usize).ok_or_else(|| {
            invalid(format!("controller {ctrl} does not exist (the pool has {})", self.ctrls.len()))
        })
    }

    fn emulated(&self, ctrl: u32) -> Result<&EmulatedController, Response> {
        self.served(ctrl)?.emulated.as_ref().ok_or_else(|| {
            invalid(format!("controller {ctrl} is not emulated; its memory is mapped by the client"))
        })
    }

    fn vfio(&self, ctrl: u32) -> Result<&VfioDevice, Response> {
        self.served(ctrl)?.vfio.as_ref().ok_or_else(|| {
            invalid(format!("controller {ctrl} is not a VFIO device; the daemon maps client memory for it"))
        })
    }

    /// The start of the IOVA range of controller `ctrl` that `client`
    /// reserved and mapped and that holds all of `at..at+len`, if any.
    fn client_range(&self, client: u64, ctrl: u32, at: u64, len: u64) -> Option<u64> {
        self.with_client(client, |c| {
            c.iovas.iter().find_map(|(&(cc, base), &(l, mapped, _))| {
                (cc == ctrl && mapped && at >= base && at.checked_add(len).is_some_and(|e| e <= base + l))
                    .then_some(base)
            })
        })
        .flatten()
    }

    fn owns_qid(&self, client: u64, ctrl: u32, qid: u16) -> Result<bool, Response> {
        self.with_client(client, |c| c.qids.get(&(ctrl, qid)).copied())
            .flatten()
            .ok_or_else(|| invalid(format!("queue {qid} of controller {ctrl} is not leased to this client")))
    }

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
                    })
                })
                .collect(),
            clients: list,
            waiting_for_hello,
            arbitration: self.board.hold_stats(),
        }
    }

    fn pool_reply(&self) -> Result<(Response, Vec<OwnedFd>), Response> {
        let mut fds = Vec::new();
        let mut controllers = Vec::new();
        for (i, s) in self.ctrls.iter().enumerate() {
            if let Some(dev) = &s.vfio {
                // Its fds come with VfioFds (two per controller; a frame carries at most 8).
                controllers.push(ControllerReply {
                    kind: ControllerKind::Vfio { group: dev.iommu_group() },
                    info: s.ctrl.info().clone(),
                });
                continue;
            }
            let Some(emu) = &s.emulated else {
                return Err(err(
                    ErrorKind::Io,
                    format!("controller {i} ({}) is neither emulated nor a VFIO device", s.ctrl.name()),
                ));
            };
            let regs = emu.register_file();
            let fd = regs.memfd().try_clone_to_owned().map_err(|e| {
                err(ErrorKind::Io, format!("duplicating the register file of {}: {e}", s.ctrl.name()))
            })?;
            fds.push(fd);
            controllers.push(ControllerReply {
                kind: ControllerKind::Emulated {
                    register_len: tutti_driver::transport::Registers::len(&**regs) as u64,
                },
                info: s.ctrl.info().clone(),
            });
        }
        let reply = PoolReply { shape: self.pool.shape().clone(), controllers, drives: self.drives.clone() };
        Ok((Response::Pool(Box::new(reply)), fds))
    }

    fn handle(
        &self,
        client: u64,
        peer: &PeerCred,
        req: Request,
    ) -> Result<(Response, Vec<OwnedFd>), Response> {
        let ok = |r: Response| Ok((r, Vec::new()));
        if let Request::Hello { protocol, name } = &req {
            if *protocol != PROTOCOL {
                return Err(err(
                    ErrorKind::Protocol,
                    format!("this tuttid speaks protocol {PROTOCOL}, the client {protocol}; use matching versions"),
                ));
            }
            if name.len() > MAX_NAME {
                return Err(invalid(format!("client name of {} bytes; at most {MAX_NAME}", name.len())));
            }
            self.with_client(client, |c| {
                c.hello = true;
                c.name = name.clone();
            });
            return ok(Response::Welcome { protocol: PROTOCOL, client, daemon_pid: std::process::id() });
        }
        if !self.with_client(client, |c| c.hello).unwrap_or(false) {
            return Err(err(ErrorKind::Protocol, format!("{} before hello", req.name())));
        }
        match req {
            Request::Hello { .. } => unreachable_reply(),
            Request::Pool => self.pool_reply(),
            Request::Status => ok(Response::Status(Box::new(self.status()))),
            Request::Stats => ok(self.pool.stats().map(Response::Stats).map_err(from_obj)?),
            Request::Map { ctrl, addr, len } => {
                let emu = self.emulated(ctrl)?;
                if len == 0 || len > MAX_MAP_LEN || addr.checked_add(len).is_none() {
                    return Err(invalid(format!("mapping {addr:#x}+{len:#x} is empty, too large or wraps")));
                }
                let iova =
                    emu.iommu().map_remote(peer.pid, addr, len as usize, client).map_err(from_driver)?;
                self.with_client(client, |c| c.maps.insert((ctrl, iova)));
                ok(Response::Iova(iova))
            }
            Request::Unmap { ctrl, iova } if self.served(ctrl)?.vfio.is_some() => {
                let dev = self.vfio(ctrl)?;
                // Not while a queue of the client lives there: the controller would go on
                // reading and writing whatever is mapped at that IOVA next.
                let busy = self
                    .with_client(client, |c| {
                        c.queue_ranges
                            .iter()
                            .find(|(k, r)| k.0 == ctrl && r.contains(&iova))
                            .map(|(k, _)| k.1)
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
                let Some((len, _, _)) = self.with_client(client, |c| c.iovas.remove(&(ctrl, iova))).flatten()
                else {
                    return Err(invalid(format!("IOVA {iova:#x} of controller {ctrl} is not this client's")));
                };
                // Whatever the client left mapped there goes now; on an error the
                // range stays out of use (release_iova).
                dev.vfio_dma().release_iova(iova, len).map_err(from_driver)?;
                ok(Response::Ok)
            }
            Request::VfioFds { ctrl } => {
                let dev = self.vfio(ctrl)?;
                let (container, device) = dev.client_fds().map_err(from_driver)?;
                Ok((Response::Ok, vec![container, device]))
            }
            Request::ReserveIova { ctrl, len } => {
                let dev = self.vfio(ctrl)?;
                if len == 0 || len > MAX_MAP_LEN {
                    return Err(invalid(format!(
                        "IOVA range of {len:#x} bytes is empty or over {MAX_MAP_LEN:#x}"
                    )));
                }
                let held =
                    self.with_client(client, |c| c.iovas.keys().filter(|k| k.0 == ctrl).count()).unwrap_or(0);
                if held >= MAX_IOVA_RANGES {
                    return Err(invalid(format!(
                        "this client already holds {held} IOVA ranges on controller {ctrl}; at most {MAX_IOVA_RANGES}"
                    )));
                }
                let iova = dev.vfio_dma().reserve_iova(len).map_err(from_driver)?;
                self.with_client(client, |c| c.iovas.insert((ctrl, iova), (len, false, 0)));
                ok(Response::Iova(iova))
            }
            Request::Mapped { ctrl, iova, vaddr } => {
                self.vfio(ctrl)?;
                if !vaddr.is_multiple_of(4096) {
                    return Err(invalid(format!("mapped address {vaddr:#x} is not page aligned")));
                }
                let marked = self
                    .with_client(client, |c| {
                        c.iovas.get_mut(&(ctrl, iova)).map(|r| {
                            r.1 = true;
                            r.2 = vaddr;
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
            Request::Unmap { ctrl, iova } => {
                let emu = self.emulated(ctrl)?;
                if !self.with_client(client, |c| c.maps.remove(&(ctrl, iova))).unwrap_or(false) {
                    return Err(invalid(format!("IOVA {iova:#x} of controller {ctrl} is not this client's")));
                }
                emu.iommu().unmap(iova, client).map_err(from_driver)?;
                ok(Response::Ok)
            }
            Request::ClaimQueue { ctrl, purpose } => {
                let s = self.served(ctrl)?;
                if purpose.len() > MAX_NAME {
                    return Err(invalid("queue purpose too long"));
                }
                let qid = s.ctrl.claim_io_qid(&format!("client {client}: {purpose}")).map_err(from_driver)?;
                self.with_client(client, |c| c.qids.insert((ctrl, qid), false));
                ok(Response::Qid(qid))
            }
            Request::ReleaseQueue { ctrl, qid } => {
                let s = self.served(ctrl)?;
                if self.owns_qid(client, ctrl, qid)? {
                    return Err(invalid(format!("queue {qid} still exists; delete it first")));
                }
                self.with_client(client, |c| c.qids.remove(&(ctrl, qid)));
                s.ctrl.release_io_qid(qid);
                ok(Response::Ok)
            }
            Request::FreeQueues { ctrl } => {
                ok(Response::Count(self.served(ctrl)?.ctrl.free_io_queue_pairs() as u64))
            }
            Request::CreateQueues { ctrl, qid, depth, sq_iova, cq_iova } => {
                let s = self.served(ctrl)?;
                if self.owns_qid(client, ctrl, qid)? {
                    return Err(invalid(format!("queue {qid} already exists")));
                }
                // The rings must be this client's own memory: a client may not put its
                // queues over memory the daemon or another client mapped.
                if let Some(emu) = &s.emulated {
                    let d = depth as usize;
                    if !emu.iommu().owned_by(sq_iova, d * 64, client)
                        || !emu.iommu().owned_by(cq_iova, d * 16, client)
                    {
                        return Err(invalid(format!(
                            "queue memory at SQ {sq_iova:#x} / CQ {cq_iova:#x} ({depth} entries) is not mapped for this client"
                        )));
                    }
                }
                let mut rings = None;
                if s.vfio.is_some() {
                    let d = depth as u64;
                    match (
                        self.client_range(client, ctrl, sq_iova, d * 64),
                        self.client_range(client, ctrl, cq_iova, d * 16),
                    ) {
                        (Some(sq), Some(cq)) => rings = Some([sq, cq]),
                        _ => {
                            return Err(invalid(format!(
                                "queue memory at SQ {sq_iova:#x} / CQ {cq_iova:#x} ({depth} entries) is not inside \
                                 IOVA ranges this client reserved and mapped"
                            )))
                        }
                    }
                }
                s.ctrl.create_queues_at(qid, depth, sq_iova, cq_iova).map_err(from_driver)?;
                self.with_client(client, |c| {
                    c.qids.insert((ctrl, qid), true);
                    if let Some(r) = rings {
                        c.queue_ranges.insert((ctrl, qid), r);
                    }
                });
                ok(Response::Ok)
            }
            Request::DeleteQueues { ctrl, qid } => {
                let s = self.served(ctrl)?;
                if !self.owns_qid(client, ctrl, qid)? {
                    return Err(invalid(format!("queue {qid} does not exist")));
                }
                // Whatever the outcome, the client may not use the queues any more.
                self.with_client(client, |c| c.qids.insert((ctrl, qid), false));
                s.ctrl.delete_io_queues(qid).map_err(from_driver)?;
                // Deleted: the controller no longer touches their rings.
                self.with_client(client, |c| c.queue_ranges.remove(&(ctrl, qid)));
                ok(Response::Ok)
            }
            Request::Lookup { identity, hashes } => {
                cap("hashes", hashes.len(), MAX_HASHES)?;
                let found = self.pool.lookup(identity, &hashes).map_err(from_obj)?;
                if found.pin != 0 {
                    self.with_client(client, |c| c.pins.insert(found.pin));
                }
                ok(Response::Lookup(found))
            }
            Request::Contains { identity, hashes } => {
                cap("hashes", hashes.len(), MAX_HASHES)?;
                ok(Response::Count(self.pool.contains(identity, &hashes).map_err(from_obj)? as u64))
            }
            Request::Unpin { pin } => {
                if pin == 0 {
                    return ok(Response::Ok);
                }
                if !self.with_client(client, |c| c.pins.remove(&pin)).unwrap_or(false) {
                    return Err(invalid(format!("pin {pin} is not this client's")));
                }
                self.pool.unpin(pin).map_err(from_obj)?;
                ok(Response::Ok)
            }
            Request::BeginLoad { identity, files } => {
                cap("files", files.len(), MAX_FILES)?;
                self.pool.begin_load(identity, &files).map_err(from_obj)?;
                self.with_client(client, |c| {
                    for f in &files {
                        *c.loads.entry(*f).or_default() += 1;
                    }
                });
                ok(Response::Ok)
            }
            Request::EndLoad { files } => {
                cap("files", files.len(), MAX_FILES)?;
                // Only references this client holds, all or nothing.
                let held = self
                    .with_client(client, |c| {
                        let mut need: HashMap<FileId, u32> = HashMap::new();
                        for f in &files {
                            *need.entry(*f).or_default() += 1;
                        }
                        if need.iter().any(|(f, n)| c.loads.get(f).copied().unwrap_or(0) < *n) {
                            return false;
                        }
                        for (f, n) in need {
                            if let Some(h) = c.loads.get_mut(&f) {
                                *h -= n;
                                if *h == 0 {
                                    c.loads.remove(&f);
                                }
                            }
                        }
                        true
                    })
                    .unwrap_or(false);
                if !held {
                    return Err(invalid("end-load names files this client holds no load reference on"));
                }
                self.pool.end_load(&files).map_err(from_obj)?;
                ok(Response::Ok)
            }
            Request::Reserve { identity, hashes } => {
                cap("hashes", hashes.len(), MAX_HASHES)?;
                let (id, entries) = {
                    // Evictions may append to the journals.
                    let _held = self.hold_for_metadata(client);
                    self.pool.reserve(identity, &hashes).map_err(from_obj)?
                };
                let news =
                    entries.iter().filter(|e| matches!(e, tutti_objstore::Reserved::New { .. })).count();
                self.with_client(client, |c| c.reservations.insert(id, news));
                ok(Response::Reserved { id, entries })
            }
            Request::Arbitration => {
                if let Some(s) = self.with_client(client, |c| c.seat).flatten() {
                    return Err(invalid(format!("this client holds arbitration slot {} already", s.slot)));
                }
                let fd = self.board.fd().try_clone_to_owned().map_err(|e| {
                    err(ErrorKind::Io, format!("duplicating the arbitration board's fd: {e}"))
                })?;
                let Some(seat) = self.board.assign() else {
                    return Err(err(
                        ErrorKind::Busy,
                        format!("all {} arbitration slots are held by connected clients", self.board.slots()),
                    ));
                };
                self.with_client(client, |c| c.seat = Some(seat));
                let reply = ArbitrationReply {
                    slot: seat.slot as u32,
                    generation: seat.generation,
                    slots: self.board.slots() as u32,
                    drives: self.board.drives() as u32,
                };
                tracing::debug!(
                    client,
                    slot = seat.slot,
                    generation = seat.generation,
                    "arbitration slot given"
                );
                Ok((Response::Arbitration(reply), vec![fd]))
            }
            Request::ProxyAttach { layout } => {
                self.proxy_attach(client, peer, &layout)?;
                ok(Response::Ok)
            }
            Request::ProxyDetach => {
                // Nothing attached yet is nothing to detach (a store detaches before it attaches).
                let Ok(host) = self.proxy(client) else { return ok(Response::Ok) };
                let mut h = host.lock().map_err(|_| err(ErrorKind::Io, "proxy state poisoned"))?;
                h.detach().map_err(from_obj)?;
                self.with_client(client, |c| c.proxy_ranges.clear());
                ok(Response::Ok)
            }
            Request::ProxyRegisterPairs { pairs } => {
                let host = self.proxy(client)?;
                let mut h = host.lock().map_err(|_| err(ErrorKind::Io, "proxy state poisoned"))?;
                ok(Response::Handle(h.register_pairs(&pairs).map_err(from_obj)?))
            }
            Request::ProxyUnregisterPairs { handle } => {
                let host = self.proxy(client)?;
                let mut h = host.lock().map_err(|_| err(ErrorKind::Io, "proxy state poisoned"))?;
                h.unregister_pairs(handle).map_err(from_obj)?;
                ok(Response::Ok)
            }
            Request::ProxySubmit { layer, pairs, dir, registered } => {
                let store = dir == tutti_objstore::Direction::Store;
                // Only files this client may move: its reservations' files for a store, files
                // it holds a load reference on for a load.
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
                    let mine: Vec<u64> = self
                        .with_client(client, |c| c.reservations.keys().copied().collect())
                        .unwrap_or_default();
                    let files: Vec<FileId> = pairs.iter().map(|p| p.file).collect();
                    if !self.pool.reserved_by(&mine, &files) {
                        return Err(invalid(
                            "proxy-submit stores into files no reservation of this client holds",
                        ));
                    }
                }
                let host = self.proxy(client)?;
                let mut h = host.lock().map_err(|_| err(ErrorKind::Io, "proxy state poisoned"))?;
                ok(Response::Handle(h.submit(layer, &pairs, dir, registered).map_err(from_obj)?))
            }
            Request::ProxyPoll { token } => {
                let host = self.proxy(client)?;
                let mut h = host.lock().map_err(|_| err(ErrorKind::Io, "proxy state poisoned"))?;
                ok(Response::Outcome(h.poll(token).map_err(from_obj)?))
            }
            Request::Settle { id, verdicts } => {
                let news = self.with_client(client, |c| c.reservations.get(&id).copied()).flatten();
                let Some(news) = news else {
                    return Err(invalid(format!("reservation {id} is not this client's")));
                };
                if verdicts.len() != news {
                    return Err(invalid(format!(
                        "reservation {id} has {news} new files, {} verdicts given",
                        verdicts.len()
                    )));
                }
                let results = {
                    // Committing flushes the drives and appends to the journals.
                    let _held = self.hold_for_metadata(client);
                    self.pool.settle(id, &verdicts).map_err(from_obj)?
                };
                self.with_client(client, |c| c.reservations.remove(&id));
                ok(Response::Settled(results))
            }
        }
    }

    /// Gives back everything `client` held. Its queues go first: deleting a
    /// submission queue completes or aborts every command in it (§5.6), so
    /// after that no write of the client can still land in a file that is
    /// freed here, and no read into its (maybe freed) memory can happen.
    fn release(&self, client: u64, state: ClientState) {
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
        // IOVA ranges holding rings of queues that could not be deleted stay out of use.
        let mut live_rings = HashSet::new();
        for (&(ctrl, qid), &exists) in &state.qids {
            let Some(s) = self.ctrls.get(ctrl as usize) else { continue };
            if exists {
                if let Err(e) = s.ctrl.delete_io_queues(qid) {
                    tracing::error!(client, device = %s.ctrl.name(), qid, error = %e,
                        "deleting a departed client's queues failed; the queue id stays claimed");
                    if let Some(r) = state.queue_ranges.get(&(ctrl, qid)) {
                        live_rings.extend(r.iter().map(|&base| (ctrl, base)));
                    }
                    continue;
                }
            }
            s.ctrl.release_io_qid(qid);
        }
        // Its queues are gone, so none of its commands is still on a drive: what it announced
        // on the arbitration board stops counting, and nothing it held blocks a drive.
        if let Some(seat) = state.seat {
            self.board.release(seat);
            tracing::debug!(client, slot = seat.slot, "arbitration slot taken back");
        }
        for s in &self.ctrls {
            if let Some(emu) = &s.emulated {
                emu.iommu().unmap_owner(client);
            }
        }
        // The client's own MAP_DMAs: the container is shared, so the daemon can
        // unmap them (and so unpin the pages of a client that died).
        for (&(ctrl, iova), &(len, mapped, _)) in &state.iovas {
            let Some(dev) = self.ctrls.get(ctrl as usize).and_then(|s| s.vfio.as_ref()) else { continue };
            if live_rings.contains(&(ctrl, iova)) {
                tracing::error!(client, device = %dev.bdf(), iova, len,
                    "a departed client's IOVA range holds rings of queues that could not be deleted; it stays mapped and out of use");
                continue;
            }
            match dev.vfio_dma().release_iova(iova, len) {
                Ok(0) => tracing::debug!(
                    client,
                    ctrl,
                    iova,
                    len,
                    mapped,
                    "a departed client's IOVA range released"
                ),
                Ok(unmapped) => tracing::info!(client, device = %dev.bdf(), iova, unmapped,
                    "unmapped what a departed client had mapped itself (its pages are unpinned); range released"),
                Err(e) => tracing::error!(client, ctrl, iova, len, error = %e,
                    "releasing a departed client's IOVA range failed; the range stays out of use"),
            }
        }
        for (id, news) in state.reservations {
            // Not committed, so never visible; its files are free again.
            let _held = self.board.hold_for_metadata(None, crate::arbitration::METADATA_WAIT);
            if let Err(e) = self.pool.settle(id, &vec![Verdict::GiveUp; news]) {
                tracing::error!(client, reservation = id, error = %e, "aborting a departed client's store failed");
            }
        }
        for (f, n) in state.loads {
            for _ in 0..n {
                if let Err(e) = self.pool.end_load(&[f]) {
                    tracing::error!(client, file = f, error = %e, "dropping a departed client's load reference failed");
                }
            }
        }
        for pin in state.pins {
            if let Err(e) = self.pool.unpin(pin) {
                tracing::error!(client, pin, error = %e, "dropping a departed client's pin failed");
            }
        }
        tracing::info!(client, name = %state.name, "client released");
    }
}

/// A client's memory as its own VFIO mappings place it: (client address,
/// IOVA, length) of each range it mapped in a controller's container. The
/// daemon registers a proxied client's layout through it; nothing is mapped
/// or unmapped here (the client owns the mappings).
struct ClientRanges {
    name: String,
    ranges: Vec<(u64, u64, u64)>,
}

impl tutti_driver::transport::DmaSpace for ClientRanges {
    fn name(&self) -> &str {
        &self.name
    }
    fn alloc(&self, _len: usize) -> tutti_driver::Result<tutti_driver::transport::DmaBuffer> {
        Err(tutti_driver::DriverError::dma(self.name.clone(), "a client's ranges allocate nothing"))
    }
    /// # Safety
    /// None beyond the trait's: the range is the client's, mapped by the client.
    unsafe fn map(
        &self,
        vaddr: *mut u8,
        len: usize,
    ) -> tutti_driver::Result<tutti_driver::transport::DmaMapping> {
        let a = vaddr as u64;
        let end = a.checked_add(len as u64);
        let found = self.ranges.iter().find(|&&(v, _, l)| a >= v && end.is_some_and(|e| e <= v + l));
        let Some(&(v, iova, _)) = found else {
            return Err(tutti_driver::DriverError::dma(
                self.name.clone(),
                format!("the client mapped no range holding {a:#x}+{len:#x}"),
            ));
        };
        let segments = vec![tutti_driver::transport::IovaSegment { iova: iova + (a - v), len: len as u64 }];
        // SAFETY: the segment is where the client's own mapping puts this range; nothing to undo.
        Ok(unsafe { tutti_driver::transport::DmaMapping::from_raw(vaddr, len, segments, Box::new(())) })
    }
}

fn unreachable_reply() -> Result<(Response, Vec<OwnedFd>), Response> {
    Err(err(ErrorKind::Protocol, "hello handled above"))
}

fn cap(what: &str, n: usize, max: usize) -> Result<(), Response> {
    if n > max {
        return Err(invalid(format!("{n} {what}; at most {max} per request")));
    }
    Ok(())
}

impl Handler for Service {
    type Req = Request;
    type Resp = Response;

    fn connect(&self, peer: &PeerCred) -> Result<u64, String> {
        let id = self.next_client.fetch_add(1, Ordering::Relaxed);
        self.clients()
            .insert(id, ClientState { peer: Some(*peer), since: Some(Instant::now()), ..Default::default() });
        tracing::info!(client = id, pid = peer.pid, uid = peer.uid, "client connected");
        Ok(id)
    }

    fn request(
        &self,
        client: u64,
        peer: &PeerCred,
        req: Request,
        fds: Vec<OwnedFd>,
    ) -> (Response, Vec<OwnedFd>) {
        self.with_client(client, |c| c.requests += 1);
        if !fds.is_empty() {
            return (
                invalid(format!("{} carries {} file descriptors; it takes none", req.name(), fds.len())),
                Vec::new(),
            );
        }
        let name = req.name();
        match self.handle(client, peer, req) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(client, request = name, reply = ?e, "request refused");
                (e, Vec::new())
            }
        }
    }

    fn malformed(&self, client: u64, why: &str) -> Response {
        tracing::warn!(client, why, "malformed request");
        invalid(format!("malformed request: {why}"))
    }

    fn hello_first(&self) -> bool {
        true
    }

    fn greeted(&self, client: u64) -> bool {
        self.with_client(client, |c| c.hello).unwrap_or(false)
    }

    fn refusal(&self, _client: u64, why: &str) -> Response {
        err(ErrorKind::Busy, why)
    }

    fn disconnect(&self, client: u64) {
        // The client stays listed (in `tutti status`) until everything it held is given
        // back, so that a client no longer listed holds nothing.
        let state = self.clients().get(&client).cloned();
        if let Some(state) = state {
            self.release(client, state);
        }
        self.clients().remove(&client);
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let all: Vec<(u64, ClientState)> = self.clients().drain().collect();
        for (id, state) in all {
            self.release(id, state);
        }
    }
}
