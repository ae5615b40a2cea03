//! An engine process's side: a [`KvStore`] whose pool lives in tuttid.
//!
//! [`connect`] asks the daemon for the pool, maps each emulated controller's
//! register file (the doorbells of the queues this process leases), and
//! builds a leased [`Controller`] per controller: queue management and DMA
//! mappings go to the daemon ([`QueueAdmin`], [`DmaBroker`]), commands and
//! doorbells stay in this process.
//!
//! On a VFIO controller the daemon sends its container and device fds: this
//! process mmaps the doorbell pages of BAR0 ([`DoorbellBar`]) and maps its own
//! memory with VFIO_IOMMU_MAP_DMA ([`VfioMaps`]) at IOVA ranges the daemon
//! reserves for it; type1 pins the pages of the process that maps them. The store's control path is the daemon's
//! ([`PoolControl`] over the socket); its data path is this process's own.

use crate::arbitration::SharedArbitration;
use crate::client::Connection;
use crate::error::{DaemonError, Result};
use crate::proto::{ControllerKind, ErrorKind, PoolReply, Request, Response, StatusReport, PROTOCOL};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tutti_driver::controller::{Controller, QueueAdmin};
use tutti_driver::transport::remote::{BrokeredDma, DmaBroker};
use tutti_driver::transport::vfio::{ClientContainer, DoorbellBar};
use tutti_driver::transport::{DmaSpace, Registers};
use tutti_driver::DriverError;
use tutti_emulator::RegisterFile;
use tutti_objstore::io::{LayerOutcome, LayerRequest, Pair};
use tutti_objstore::{
    Backend, BlockHash, ControlStats, DataPathReport, DriveSpec, FileId, Geometry, IdentityId, KvStore,
    Lookup, ObjError, PoolControl, Reserved, Verdict,
};

/// How long a control request may take before the client gives up on the daemon.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection to tuttid that has said hello.
pub struct Client {
    conn: Connection,
    id: u64,
    daemon_pid: u32,
    timeout: Duration,
}

impl Client {
    /// Connects to the daemon at `socket` and introduces this process as `name`.
    pub fn connect(socket: &Path, name: &str, timeout: Duration) -> Result<Client> {
        let conn = Connection::connect(socket, timeout)?;
        let mut c = Client { conn, id: 0, daemon_pid: 0, timeout };
        match c.call(Request::Hello { protocol: PROTOCOL, name: name.to_string() })? {
            Response::Welcome { client, daemon_pid, .. } => {
                c.id = client;
                c.daemon_pid = daemon_pid;
                Ok(c)
            }
            r => Err(unexpected("hello", &r)),
        }
    }

    /// This client's id at the daemon.
    pub fn id(&self) -> u64 {
        self.id
    }
    pub fn daemon_pid(&self) -> u32 {
        self.daemon_pid
    }

    /// One request, its reply (an error reply becomes [`DaemonError::Refused`]).
    pub fn call(&self, req: Request) -> Result<Response> {
        Ok(self.call_fds(req)?.0)
    }

    /// One request, its reply and the file descriptors that came with it.
    pub fn call_fds(&self, req: Request) -> Result<(Response, Vec<OwnedFd>)> {
        let name = req.name();
        let (resp, fds) = self.conn.call::<Request, Response>(&req, &[], self.timeout)?;
        match resp {
            Response::Error { kind, message } => Err(DaemonError::Rejected { request: name, kind, message }),
            r => Ok((r, fds)),
        }
    }

    /// Whether the connection is unusable (the daemon hung up, or a call broke it), and why.
    pub fn lost(&self) -> Option<DaemonError> {
        self.conn.lost()
    }

    /// The daemon's status report.
    pub fn status(&self) -> Result<StatusReport> {
        match self.call(Request::Status)? {
            Response::Status(s) => Ok(*s),
            r => Err(unexpected("status", &r)),
        }
    }
}

fn unexpected(request: &str, r: &Response) -> DaemonError {
    DaemonError::Unexpected(format!("tuttid answered {request} with {r:?}"))
}

/// A daemon error as the layers below report it.
fn driver_err(e: DaemonError) -> DriverError {
    match e {
        DaemonError::Rejected { kind: ErrorKind::Busy, message, .. } => DriverError::InUse(message),
        e => DriverError::NotOwner { device: "tuttid".into(), what: e.to_string() },
    }
}

fn obj_err(e: DaemonError) -> ObjError {
    match e {
        e @ DaemonError::ConnectionLost { .. } => ObjError::PeerGone(e.to_string()),
        DaemonError::Rejected { kind: ErrorKind::Invalid, message, request } => {
            ObjError::Invalid { field: request, what: message }
        }
        e => ObjError::Peer(e.to_string()),
    }
}

/// Queue management of one controller, done by the daemon.
struct RemoteQueues {
    client: Arc<Client>,
    ctrl: u32,
}

impl QueueAdmin for RemoteQueues {
    fn claim_qid(&self, purpose: &str) -> tutti_driver::Result<u16> {
        match self.client.call(Request::ClaimQueue { ctrl: self.ctrl, purpose: purpose.to_string() }) {
            Ok(Response::Qid(q)) => Ok(q),
            Ok(r) => Err(driver_err(unexpected("claim-queue", &r))),
            Err(DaemonError::Rejected { kind: ErrorKind::Busy, message, .. }) => {
                Err(DriverError::InUse(message))
            }
            Err(e) => Err(driver_err(e)),
        }
    }
    fn release_qid(&self, qid: u16) {
        if let Err(e) = self.client.call(Request::ReleaseQueue { ctrl: self.ctrl, qid }) {
            tracing::warn!(ctrl = self.ctrl, qid, error = %e, "releasing a leased queue id failed");
        }
    }
    fn create_queues(&self, qid: u16, depth: u32, sq_iova: u64, cq_iova: u64) -> tutti_driver::Result<()> {
        let req = Request::CreateQueues { ctrl: self.ctrl, qid, depth, sq_iova, cq_iova };
        self.client.call(req).map(|_| ()).map_err(driver_err)
    }
    fn delete_queues(&self, qid: u16) -> tutti_driver::Result<()> {
        self.client.call(Request::DeleteQueues { ctrl: self.ctrl, qid }).map(|_| ()).map_err(driver_err)
    }
    fn free(&self) -> u16 {
        match self.client.call(Request::FreeQueues { ctrl: self.ctrl }) {
            Ok(Response::Count(n)) => n.min(u16::MAX as u64) as u16,
            Ok(r) => {
                tracing::warn!(reply = ?r, "free-queues: unexpected reply; counting none free");
                0
            }
            Err(e) => {
                tracing::warn!(error = %e, "free-queues failed; counting none free");
                0
            }
        }
    }
}

/// DMA mappings of one controller, made by the daemon.
struct RemoteMaps {
    client: Arc<Client>,
    ctrl: u32,
}

impl DmaBroker for RemoteMaps {
    fn map(&self, addr: u64, len: usize) -> tutti_driver::Result<u64> {
        match self.client.call(Request::Map { ctrl: self.ctrl, addr, len: len as u64 }) {
            Ok(Response::Iova(i)) => Ok(i),
            Ok(r) => Err(driver_err(unexpected("map", &r))),
            Err(e) => Err(driver_err(e)),
        }
    }
    fn unmap(&self, iova: u64) {
        if let Err(e) = self.unmap_checked(iova) {
            tracing::warn!(ctrl = self.ctrl, iova, error = %e, "unmapping client memory failed");
        }
    }
    fn unmap_checked(&self, iova: u64) -> tutti_driver::Result<()> {
        self.client.call(Request::Unmap { ctrl: self.ctrl, iova }).map(|_| ()).map_err(driver_err)
    }
    fn map_device(&self, addr: u64, len: usize, what: &str) -> tutti_driver::Result<u64> {
        let req = Request::MapDevice { ctrl: self.ctrl, addr, len: len as u64, what: what.to_string() };
        match self.client.call(req) {
            Ok(Response::Iova(i)) => Ok(i),
            Ok(r) => Err(driver_err(unexpected("map-device", &r))),
            Err(e) => Err(driver_err(e)),
        }
    }
}

/// DMA mappings of one VFIO controller, made by this process in IOVA ranges
/// the daemon reserves: reserve → VFIO_IOMMU_MAP_DMA → tell the daemon; and
/// back: unmap → give the range back (the daemon unmaps whatever is left).
struct VfioMaps {
    client: Arc<Client>,
    ctrl: u32,
    container: ClientContainer,
    /// IOVA handed out by `map` → (range start, range length).
    ranges: Mutex<HashMap<u64, (u64, u64)>>,
}

const PAGE: u64 = 4096;

impl VfioMaps {
    /// Gives a reserved range back; the daemon unmaps what is still mapped in it.
    fn give_back(&self, base: u64) -> tutti_driver::Result<()> {
        self.client.call(Request::Unmap { ctrl: self.ctrl, iova: base }).map(|_| ()).map_err(driver_err)
    }
}

impl DmaBroker for VfioMaps {
    fn map(&self, addr: u64, len: usize) -> tutti_driver::Result<u64> {
        let start = addr & !(PAGE - 1);
        let end = addr
            .checked_add(len as u64)
            .and_then(|e| e.checked_next_multiple_of(PAGE))
            .filter(|_| len > 0)
            .ok_or_else(|| DriverError::invalid(format!("cannot map {len} bytes at {addr:#x}")))?;
        let size = end - start;
        let base = match self.client.call(Request::ReserveIova { ctrl: self.ctrl, len: size }) {
            Ok(Response::Iova(i)) if i.is_multiple_of(PAGE) => i,
            Ok(r) => return Err(driver_err(unexpected("reserve-iova", &r))),
            Err(e) => return Err(driver_err(e)),
        };
        if let Err(e) = self.container.map_dma(start as *const u8, base, size) {
            if let Err(g) = self.give_back(base) {
                tracing::warn!(iova = base, error = %g, "giving back an IOVA range after a failed map failed");
            }
            return Err(e);
        }
        if let Err(e) = self.client.call(Request::Mapped { ctrl: self.ctrl, iova: base, vaddr: start }) {
            // Unmapped here before the caller frees the memory; the daemon would also
            // unmap it when it takes the range back (here or at disconnect).
            if let Err(u) = self.container.unmap_dma(base, size) {
                tracing::warn!(iova = base, error = %u, "unmapping after a refused map failed");
            }
            if let Err(g) = self.give_back(base) {
                tracing::warn!(iova = base, error = %g, "giving back an IOVA range after a refused map failed");
            }
            return Err(driver_err(e));
        }
        let iova = base + (addr - start);
        self.ranges
            .lock()
            .map_err(|_| DriverError::invalid("VFIO mapping table poisoned"))?
            .insert(iova, (base, size));
        Ok(iova)
    }
    fn unmap(&self, iova: u64) {
        if let Err(e) = self.unmap_checked(iova) {
            tracing::warn!(ctrl = self.ctrl, iova, error = %e, "unmapping client memory failed");
        }
    }
    fn unmap_checked(&self, iova: u64) -> tutti_driver::Result<()> {
        let range = self
            .ranges
            .lock()
            .map_err(|_| DriverError::invalid("VFIO mapping table poisoned"))?
            .remove(&iova);
        let Some((base, size)) = range else {
            return Err(DriverError::invalid(format!("IOVA {iova:#x} was not mapped here")));
        };
        // Unmapped here first: once that worked the device cannot reach the memory,
        // whatever the daemon answers (it takes the range back at disconnect at the latest).
        self.container.unmap_dma(base, size)?;
        if let Err(e) = self.give_back(base) {
            tracing::warn!(ctrl = self.ctrl, iova = base, error = %e, "giving an IOVA range back to tuttid failed");
        }
        Ok(())
    }
    /// Device memory goes the way host memory does: this process maps it in the container
    /// itself, and VFIO_IOMMU_MAP_DMA follows its PFN map (a BAR, a GDRCopy window).
    fn map_device(&self, addr: u64, len: usize, _what: &str) -> tutti_driver::Result<u64> {
        self.map(addr, len)
    }
}

/// The pool's control path, over the socket.
pub struct RemotePool {
    client: Arc<Client>,
    /// The store's latest data-path counters, sent with the next end-load or settle.
    report: Mutex<Option<Box<DataPathReport>>>,
}

impl RemotePool {
    fn new(client: Arc<Client>) -> RemotePool {
        RemotePool { client, report: Mutex::new(None) }
    }

    fn ask(&self, req: Request) -> tutti_objstore::Result<Response> {
        self.client.call(req).map_err(obj_err)
    }

    fn take_report(&self) -> Option<Box<DataPathReport>> {
        self.report.lock().ok().and_then(|mut r| r.take())
    }
}

impl PoolControl for RemotePool {
    fn lookup(&self, identity: IdentityId, hashes: &[BlockHash]) -> tutti_objstore::Result<Lookup> {
        match self.ask(Request::Lookup { identity, hashes: hashes.to_vec() })? {
            Response::Lookup(l) if l.files.len() <= hashes.len() => Ok(l),
            r => Err(obj_err(unexpected("lookup", &r))),
        }
    }
    fn contains(&self, identity: IdentityId, hashes: &[BlockHash]) -> tutti_objstore::Result<usize> {
        match self.ask(Request::Contains { identity, hashes: hashes.to_vec() })? {
            Response::Count(n) if n as usize <= hashes.len() => Ok(n as usize),
            r => Err(obj_err(unexpected("contains", &r))),
        }
    }
    fn unpin(&self, pin: u64) -> tutti_objstore::Result<()> {
        self.ask(Request::Unpin { pin }).map(|_| ())
    }
    fn begin_load(&self, identity: IdentityId, files: &[FileId]) -> tutti_objstore::Result<()> {
        self.ask(Request::BeginLoad { identity, files: files.to_vec() }).map(|_| ())
    }
    fn end_load(&self, files: &[FileId]) -> tutti_objstore::Result<()> {
        self.ask(Request::EndLoad { files: files.to_vec(), report: self.take_report() }).map(|_| ())
    }
    fn reserve(
        &self,
        identity: IdentityId,
        hashes: &[BlockHash],
    ) -> tutti_objstore::Result<(u64, Vec<Reserved>)> {
        match self.ask(Request::Reserve { identity, hashes: hashes.to_vec() })? {
            Response::Reserved { id, entries } => Ok((id, entries)),
            r => Err(obj_err(unexpected("reserve", &r))),
        }
    }
    fn settle(
        &self,
        id: u64,
        verdicts: &[Verdict],
    ) -> tutti_objstore::Result<Vec<std::result::Result<(), String>>> {
        match self.ask(Request::Settle { id, verdicts: verdicts.to_vec(), report: self.take_report() })? {
            Response::Settled(r) if r.len() == verdicts.len() => Ok(r),
            r => Err(obj_err(unexpected("settle", &r))),
        }
    }
    fn stats(&self) -> tutti_objstore::Result<ControlStats> {
        match self.ask(Request::Stats)? {
            Response::Stats(s) => Ok(s),
            r => Err(obj_err(unexpected("stats", &r))),
        }
    }
    fn gone(&self) -> Option<String> {
        self.client.lost().map(|e| e.to_string())
    }
    fn wants_reports(&self) -> bool {
        true
    }
    fn report(&self, report: DataPathReport) {
        if let Ok(mut r) = self.report.lock() {
            *r = Some(Box::new(report));
        }
    }
}

/// Layer transfers the daemon runs for this client, over the socket.
struct RemoteLayers {
    client: Arc<Client>,
}

impl tutti_objstore::io::proxy::LayerService for RemoteLayers {
    fn attach(&self, layout: &tutti_objstore::io::proxy::LayoutSpec) -> tutti_objstore::Result<()> {
        self.client.call(Request::ProxyAttach { layout: layout.clone() }).map(|_| ()).map_err(obj_err)
    }
    fn detach(&self) -> tutti_objstore::Result<()> {
        self.client.call(Request::ProxyDetach).map(|_| ()).map_err(obj_err)
    }
    fn register_pairs(&self, pairs: &[Pair]) -> tutti_objstore::Result<Option<u64>> {
        match self.client.call(Request::ProxyRegisterPairs { pairs: pairs.to_vec() }).map_err(obj_err)? {
            Response::Handle(h) => Ok(h),
            r => Err(obj_err(unexpected("proxy-register-pairs", &r))),
        }
    }
    fn unregister_pairs(&self, handle: u64) -> tutti_objstore::Result<()> {
        self.client.call(Request::ProxyUnregisterPairs { handle }).map(|_| ()).map_err(obj_err)
    }
    fn submit(&self, req: LayerRequest<'_>) -> tutti_objstore::Result<Option<u64>> {
        let LayerRequest { layer, pairs, dir, registered } = req;
        let req = Request::ProxySubmit { layer, pairs: pairs.to_vec(), dir, registered };
        match self.client.call(req).map_err(obj_err)? {
            Response::Handle(h) => Ok(h),
            r => Err(obj_err(unexpected("proxy-submit", &r))),
        }
    }
    fn poll(&self, token: u64) -> tutti_objstore::Result<Option<LayerOutcome>> {
        match self.client.call(Request::ProxyPoll { token }).map_err(obj_err)? {
            Response::Outcome(o) => Ok(o),
            r => Err(obj_err(unexpected("proxy-poll", &r))),
        }
    }
}

/// Opens a store on the pool tuttid serves at `socket`: this process gets
/// its own queue pairs on every drive and moves its own bytes. On a pool
/// with a controller that has no queue pair left to lease (one granting a
/// single pair, which the daemon's metadata path holds), the daemon moves
/// this process's layers on its shared pairs instead, straight into and out
/// of this process's memory (slower: a round trip per layer).
pub fn connect(socket: &Path, name: &str, backend: &Backend, timeout: Duration) -> Result<KvStore> {
    Ok(open(socket, name, backend, timeout, false, None)?.0)
}

/// As [`connect`], and takes a slot on the daemon's arbitration board
/// ([`crate::arbitration`]): the caller's scheduler announces this process's I/O there and
/// defers to the other clients'. (A store from [`connect`] takes no slot: its I/O is not
/// arbitrated against other processes.) With `geometry`, a pool of another geometry is
/// refused before anything is leased, mapped or started.
pub fn connect_arbitrated(
    socket: &Path,
    name: &str,
    backend: &Backend,
    timeout: Duration,
    geometry: Option<&Geometry>,
) -> Result<(KvStore, Arc<SharedArbitration>)> {
    let (store, board) = open(socket, name, backend, timeout, true, geometry)?;
    let board = board.ok_or_else(|| DaemonError::Unexpected("no arbitration board".into()))?;
    Ok((store, board))
}

/// A store on the pool tuttid serves at `socket` that moves no bytes: its
/// lookups, pins and stats go to the daemon; it leases no queue pair, maps no
/// register file, memory or doorbell, and takes no arbitration slot. For an
/// engine's scheduler process. `geometry` as in [`connect_arbitrated`].
pub fn connect_control(
    socket: &Path,
    name: &str,
    timeout: Duration,
    geometry: Option<&Geometry>,
) -> Result<KvStore> {
    let client = Arc::new(Client::connect(socket, name, timeout)?);
    // The register files sent with the reply are dropped (closed) unmapped.
    let (reply, _fds) = client.call_fds(Request::Pool)?;
    let Response::Pool(pool) = reply else { return Err(unexpected("pool", &reply)) };
    check_geometry(&pool, geometry)?;
    let drives = pool
        .drives
        .iter()
        .map(|&(c, nsid)| {
            let ctrl = pool.controllers.get(c as usize).ok_or_else(|| {
                DaemonError::Unexpected(format!("pool drive on controller {c}, which was not described"))
            })?;
            Ok((&ctrl.info, nsid))
        })
        .collect::<Result<Vec<_>>>()?;
    let control: Arc<dyn PoolControl> = Arc::new(RemotePool::new(client.clone()));
    Ok(KvStore::attach_control(&drives, pool.shape.clone(), control)?)
}

/// Refuses a pool whose geometry is not `want`'s (if given), naming both.
fn check_geometry(pool: &PoolReply, want: Option<&Geometry>) -> Result<()> {
    match want {
        Some(g) if *g != pool.shape.geometry => Err(DaemonError::Obj(ObjError::Invalid {
            field: "geometry",
            what: format!(
                "the daemon's pool is formatted for {} (`tutti serve {}`), this process has {g}: \
                 its KV needs a tuttid started with `tutti serve {}` on other drives or another pool \
                 directory (under tensor parallelism the KV heads are per rank)",
                pool.shape.geometry,
                pool.shape.geometry.serve_flags(),
                g.serve_flags()
            ),
        })),
        _ => Ok(()),
    }
}

fn open(
    socket: &Path,
    name: &str,
    backend: &Backend,
    timeout: Duration,
    arbitrated: bool,
    geometry: Option<&Geometry>,
) -> Result<(KvStore, Option<Arc<SharedArbitration>>)> {
    let client = Arc::new(Client::connect(socket, name, timeout)?);
    let (reply, fds) = client.call_fds(Request::Pool)?;
    let Response::Pool(pool) = reply else { return Err(unexpected("pool", &reply)) };
    check_geometry(&pool, geometry)?;
    if pool.controllers.iter().any(|c| matches!(c.kind, ControllerKind::Emulated { .. })) {
        // The daemon's emulated controllers reach this process's memory with
        // process_vm_readv/writev, which Yama may restrict to ancestors.
        tutti_emulator::allow_peer_access(client.daemon_pid as i32)?;
    }
    let ctrls = leased_controllers(&client, &pool, fds)?;
    let mut drives = Vec::with_capacity(pool.drives.len());
    for &(c, nsid) in &pool.drives {
        let ctrl = ctrls.get(c as usize).ok_or_else(|| {
            DaemonError::Unexpected(format!("pool drive on controller {c}, which was not described"))
        })?;
        drives.push(DriveSpec::new(ctrl.clone(), nsid));
    }
    let board = if arbitrated {
        let (reply, fds) = client.call_fds(Request::Arbitration)?;
        let Response::Arbitration(a) = reply else { return Err(unexpected("arbitration", &reply)) };
        let [fd]: [OwnedFd; 1] = fds.try_into().map_err(|got: Vec<OwnedFd>| {
            DaemonError::Unexpected(format!("arbitration: {} file descriptors; want the board's", got.len()))
        })?;
        Some(Arc::new(SharedArbitration::attach(fd, &a, pool.drives.len())?))
    } else {
        None
    };
    let control: Arc<dyn PoolControl> = Arc::new(RemotePool::new(client.clone()));
    let starved = ctrls.iter().find(|c| c.free_io_queue_pairs() == 0);
    if let (Some(c), Backend::Gio(g)) = (starved, backend) {
        if matches!(g.executor, tutti_objstore::GioExecutor::Cuda(_)) {
            return Err(DaemonError::Obj(ObjError::Invalid {
                field: "executor",
                what: format!(
                    "{} has no I/O queue pair left to lease (it granted {}, and tuttid holds or has leased them all): \
                     a CUDA-executor client needs pairs of its own for its kernels; free a pair (fewer clients), \
                     or connect with the host executor, which tuttid can move on its shared pair",
                    c.name(),
                    c.info().io_queue_pairs
                ),
            }));
        }
    }
    if let Some(c) = starved {
        tracing::warn!(device = %c.name(), granted = c.info().io_queue_pairs,
            "no I/O queue pair left to lease; tuttid moves this client's layers on its shared pair");
        let service = Arc::new(RemoteLayers { client: client.clone() });
        return Ok((KvStore::attach_proxied(drives, pool.shape, control, service)?, board));
    }
    Ok((KvStore::attach(drives, pool.shape, control, backend)?, board))
}

fn leased_controllers(
    client: &Arc<Client>,
    pool: &PoolReply,
    fds: Vec<OwnedFd>,
) -> Result<Vec<Arc<Controller>>> {
    let emulated =
        pool.controllers.iter().filter(|c| matches!(c.kind, ControllerKind::Emulated { .. })).count();
    if fds.len() != emulated {
        return Err(DaemonError::Unexpected(format!(
            "{emulated} emulated controllers described but {} register files sent",
            fds.len()
        )));
    }
    let mut fds = fds.into_iter();
    let mut out = Vec::with_capacity(pool.controllers.len());
    for (i, c) in pool.controllers.iter().enumerate() {
        let name = c.info.device.clone();
        let (regs, broker): (Arc<dyn Registers>, Arc<dyn DmaBroker>) = match c.kind {
            ControllerKind::Emulated { register_len } => {
                let fd =
                    fds.next().ok_or_else(|| DaemonError::Unexpected("register files ran out".into()))?;
                let regs = Arc::new(RegisterFile::from_fd(&name, fd, register_len as usize)?);
                (regs, Arc::new(RemoteMaps { client: client.clone(), ctrl: i as u32 }))
            }
            ControllerKind::Vfio { .. } => {
                let (reply, got) = client.call_fds(Request::VfioFds { ctrl: i as u32 })?;
                let [container, device]: [OwnedFd; 2] = got.try_into().map_err(|got: Vec<OwnedFd>| {
                    DaemonError::Unexpected(format!(
                        "vfio-fds of {name}: {} file descriptors with {reply:?}; want the container and the device",
                        got.len()
                    ))
                })?;
                let container = ClientContainer::from_fd(container, &name)?;
                let regs = Arc::new(DoorbellBar::open(device, &name)?);
                let maps =
                    VfioMaps { client: client.clone(), ctrl: i as u32, container, ranges: Mutex::default() };
                (regs, Arc::new(maps))
            }
        };
        let dma: Arc<dyn DmaSpace> = Arc::new(BrokeredDma::new(&name, broker, 4096)?);
        let admin = Arc::new(RemoteQueues { client: client.clone(), ctrl: i as u32 });
        out.push(Controller::leased(regs, dma, c.info.clone(), admin)?);
    }
    Ok(out)
}
