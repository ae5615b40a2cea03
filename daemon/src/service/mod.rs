//! The daemon's side of every request: the pool, the leases, and what each
//! client holds, so that a client that goes away (closed, crashed, killed)
//! gives everything back.
//!
//! [`Service::handle`] only dispatches; each request has a handler method next to
//! the others of its area, and each validates its request before it touches state:
//! - `session.rs`: hello, the arbitration seat, and what a departed client gives back;
//! - `iova.rs`: client memory the controllers reach (IOMMU mappings, VFIO IOVA ranges);
//! - `queues.rs`: queue pairs a client runs itself;
//! - `pool.rs`: the pool's shape, lookups, pins, loads, reservations;
//! - `proxy.rs`: layers the daemon moves for a client without queue pairs;
//! - `status.rs`: `tutti status` and the metrics;
//! - `state.rs`: what the daemon serves and what each client holds;
//! - `reply.rs`: the error replies.

mod iova;
mod pool;
mod proxy;
mod queues;
mod reply;
mod session;
mod state;
mod status;

use self::reply::{err, invalid, ok, Reply};
use self::state::ClientState;
pub(crate) use self::state::Served;
use crate::arbitration::Board;
use crate::handler::Handler;
use crate::peer::PeerCred;
use crate::proto::{ErrorKind, Request, Response};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;
use tutti_driver::transport::vfio::VfioDevice;
use tutti_emulator::EmulatedController;
use tutti_objstore::io::proxy::LayerHost;
use tutti_objstore::LocalPool;

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
    /// What `tutti serve --metrics` exports beyond the status report.
    counters: crate::metrics::Counters,
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
            counters: crate::metrics::Counters::default(),
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

    /// Hands `req` to its handler; nothing but `Hello` is served before `Hello`.
    fn handle(&self, client: u64, peer: &PeerCred, req: Request) -> Reply {
        if !matches!(req, Request::Hello { .. }) && !self.greeted(client) {
            return Err(err(ErrorKind::Protocol, format!("{} before hello", req.name())));
        }
        match req {
            Request::Hello { protocol, name } => self.hello(client, protocol, name),
            Request::Arbitration => self.arbitration_seat(client),
            Request::Pool => self.pool_reply(),
            Request::Status => ok(Response::Status(Box::new(self.status()))),
            Request::Stats => self.stats(),
            Request::Map { ctrl, addr, len } => self.map(client, peer, ctrl, addr, len),
            Request::MapDevice { ctrl, addr, len, what } => {
                self.map_device(client, peer, ctrl, addr, len, &what)
            }
            Request::Unmap { ctrl, iova } => self.unmap(client, ctrl, iova),
            Request::VfioFds { ctrl } => self.vfio_fds(ctrl),
            Request::ReserveIova { ctrl, len } => self.reserve_iova(client, ctrl, len),
            Request::Mapped { ctrl, iova, vaddr } => self.mapped(client, ctrl, iova, vaddr),
            Request::ClaimQueue { ctrl, purpose } => self.claim_queue(client, ctrl, &purpose),
            Request::ReleaseQueue { ctrl, qid } => self.release_queue(client, ctrl, qid),
            Request::FreeQueues { ctrl } => self.free_queues(ctrl),
            Request::CreateQueues { ctrl, qid, depth, sq_iova, cq_iova } => {
                self.create_queues(client, ctrl, qid, depth, sq_iova, cq_iova)
            }
            Request::DeleteQueues { ctrl, qid } => self.delete_queues(client, ctrl, qid),
            Request::Lookup { identity, hashes } => self.lookup(client, identity, &hashes),
            Request::Contains { identity, hashes } => self.contains(identity, &hashes),
            Request::Unpin { pin } => self.unpin(client, pin),
            Request::BeginLoad { identity, files } => self.begin_load(client, identity, &files),
            Request::EndLoad { files, report } => {
                self.note_report(client, report);
                self.end_load(client, &files)
            }
            Request::Reserve { identity, hashes } => self.reserve(client, identity, &hashes),
            Request::Settle { id, verdicts, report } => {
                self.note_report(client, report);
                self.settle(client, id, &verdicts)
            }
            Request::ProxyAttach { layout } => self.proxy_attach(client, peer, &layout),
            Request::ProxyDetach => self.proxy_detach(client),
            Request::ProxyRegisterPairs { pairs } => self.proxy_register_pairs(client, &pairs),
            Request::ProxyUnregisterPairs { handle } => self.proxy_unregister_pairs(client, handle),
            Request::ProxySubmit { layer, pairs, dir, registered } => {
                self.proxy_submit(client, layer, &pairs, dir, registered)
            }
            Request::ProxyPoll { token } => self.proxy_poll(client, token),
        }
    }
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
        self.counters.request(name);
        match self.handle(client, peer, req) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(client, request = name, reply = ?e, "request refused");
                if let Response::Error { kind, .. } = &e {
                    self.counters.error(kind.name());
                }
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
        self.counters.departed(client);
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
