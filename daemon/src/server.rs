//! tuttid's listening socket: binding it safely, admitting peers, one thread per client.

use std::fs;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::PollFlags;

use crate::client::connect_by;
use crate::error::{DaemonError, Result};
use crate::peer::{own_uid, AccessPolicy, PeerCred};
use crate::wire::{poll_once, recv_frame, send_frame, send_frame_by, Hello, PROTOCOL_VERSION};

/// Clients served at once unless [`Server::with_max_clients`] says otherwise.
pub const DEFAULT_MAX_CLIENTS: usize = 256;
/// Malformed frames after which a client is dropped, unless [`Server::with_malformed_limit`] says otherwise.
pub const DEFAULT_MALFORMED_LIMIT: u32 = 8;
/// How long the rest of a frame may take once its first byte came, unless
/// [`Server::with_frame_timeout`] says otherwise. Idle clients wait without limit.
pub const DEFAULT_FRAME_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the accept loop looks at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(100);
/// How often an idle client's thread looks at the stop flag (stop also shuts its socket).
const IDLE_POLL: Duration = Duration::from_millis(250);
/// How long stopping waits for client threads to finish.
const JOIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a refusal or a last error reply may take to send.
const LAST_WORD_TIMEOUT: Duration = Duration::from_secs(1);
/// How long probing an existing socket file may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// `sun_path` holds 108 bytes including the terminating NUL.
const MAX_SOCKET_PATH: usize = 107;

/// Who may open the socket file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketMode {
    /// The daemon's user only: socket 0600, a created parent directory 0700.
    Owner,
    /// The daemon's user and this group: socket 0660 and group-owned by it, a created
    /// parent directory 0750 and group-owned by it.
    Group(u32),
}

/// What the daemon does with clients. The server calls it from one thread per client;
/// requests of one client come in order, requests of different clients concurrently.
pub trait Handler: Send + Sync + 'static {
    type Req: serde::de::DeserializeOwned + Send;
    type Resp: serde::Serialize + Send;
    /// A new client connected (after the access check). Returns its id, or a refusal message.
    fn connect(&self, peer: &PeerCred) -> Result<u64, String>;
    /// One request of client `client`; `fds` came with it. Returns the reply and fds to send with it.
    fn request(
        &self,
        client: u64,
        peer: &PeerCred,
        req: Self::Req,
        fds: Vec<OwnedFd>,
    ) -> (Self::Resp, Vec<OwnedFd>);
    /// Reply to a frame that could not be decoded (so the peer gets a clear error, not silence).
    fn malformed(&self, client: u64, why: &str) -> Self::Resp;
    /// The client is gone (closed, crashed, or dropped for a protocol error): release everything it held.
    fn disconnect(&self, client: u64);
}

/// A bound, listening socket, ready to [`run`](Server::run).
///
/// Dropping it (or `run` returning) removes the socket file, if it is still the one this
/// server bound.
#[derive(Debug)]
pub struct Server {
    listener: UnixListener,
    path: PathBuf,
    /// Device and inode of the socket file this server created.
    file_id: (u64, u64),
    policy: AccessPolicy,
    limits: Limits,
}

/// Per-client limits, copied into each client's thread.
#[derive(Debug, Clone, Copy)]
struct Limits {
    max_clients: usize,
    malformed_limit: u32,
    frame_timeout: Duration,
}

impl Server {
    /// Binds a listening socket at `path`.
    ///
    /// A missing parent directory is created. A stale socket file (nobody listening) is
    /// replaced; a live one is refused naming the pid that holds it; anything else at the
    /// path is refused and left in place.
    pub fn bind(path: impl AsRef<Path>, mode: SocketMode) -> Result<Server> {
        let path = path.as_ref().to_path_buf();
        check_path(&path)?;
        prepare_parent(&path, mode)?;
        clear_stale(&path)?;

        let listener = UnixListener::bind(&path)
            .map_err(|e| DaemonError::io(format!("binding the socket {}", path.display()), e))?;
        let meta = fs::symlink_metadata(&path)
            .map_err(|e| DaemonError::io(format!("inspecting the new socket {}", path.display()), e))?;
        let policy = match mode {
            SocketMode::Owner => AccessPolicy::OwnerOnly,
            SocketMode::Group(gid) => AccessPolicy::OwnerAndGroup(gid),
        };
        let server = Server {
            listener,
            path,
            file_id: (meta.dev(), meta.ino()),
            policy,
            limits: Limits {
                max_clients: DEFAULT_MAX_CLIENTS,
                malformed_limit: DEFAULT_MALFORMED_LIMIT,
                frame_timeout: DEFAULT_FRAME_TIMEOUT,
            },
        };
        // From here an error drops `server`, which removes the socket file again. Until the
        // mode is set the file may be wider open than asked; the peer check still applies.
        set_mode(&server.path, mode)?;
        server
            .listener
            .set_nonblocking(true)
            .map_err(|e| DaemonError::io("making the listening socket non-blocking", e))?;
        tracing::info!(path = %server.path.display(), ?mode, "tuttid socket bound");
        Ok(server)
    }

    /// Replaces the access policy that `bind` derived from the socket mode.
    pub fn with_policy(mut self, policy: AccessPolicy) -> Server {
        self.policy = policy;
        self
    }

    /// Sets how many clients are served at once; a client beyond that is refused.
    pub fn with_max_clients(mut self, max_clients: usize) -> Server {
        self.limits.max_clients = max_clients;
        self
    }

    /// Sets after how many malformed frames a client is dropped (at least 1).
    pub fn with_malformed_limit(mut self, limit: u32) -> Server {
        self.limits.malformed_limit = limit.max(1);
        self
    }

    /// Sets how long the rest of a frame may take once its first byte came.
    pub fn with_frame_timeout(mut self, timeout: Duration) -> Server {
        self.limits.frame_timeout = timeout;
        self
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serves clients until `stop` is set, then closes the listener, removes the socket
    /// file, shuts every client's socket and waits (a bounded time) for their threads.
    /// Every client that was accepted by `handler.connect` gets exactly one `disconnect`.
    pub fn run<H: Handler>(self, handler: Arc<H>, stop: Arc<AtomicBool>) -> Result<()> {
        let own_uid = own_uid();
        let live = Arc::new(AtomicUsize::new(0));
        let mut clients: Vec<ClientThread> = Vec::new();
        let result = loop {
            if stop.load(Ordering::Acquire) {
                break Ok(());
            }
            match poll_once(&self.listener, PollFlags::IN, STOP_POLL) {
                Ok(false) => continue,
                Ok(true) => {}
                Err(e) => break Err(DaemonError::io("waiting for connections", e)),
            }
            reap(&mut clients);
            loop {
                match self.listener.accept() {
                    Ok((stream, _)) => {
                        if let Some(c) = self.admit(stream, &handler, &stop, &live, own_uid) {
                            clients.push(c);
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        // Out of descriptors or memory: let clients finish before trying again.
                        tracing::warn!(error = %e, "accepting a connection failed");
                        std::thread::sleep(STOP_POLL);
                        break;
                    }
                }
            }
        };
        tracing::info!(path = %self.path.display(), clients = clients.len(), "tuttid socket stopping");
        let path = self.path.clone();
        drop(self);
        shut_down(clients);
        tracing::info!(path = %path.display(), "tuttid socket stopped");
        result
    }

    /// Checks a new connection and starts its thread, or refuses it.
    fn admit<H: Handler>(
        &self,
        stream: UnixStream,
        handler: &Arc<H>,
        stop: &Arc<AtomicBool>,
        live: &Arc<AtomicUsize>,
        own_uid: u32,
    ) -> Option<ClientThread> {
        let peer = match PeerCred::of(&stream) {
            Ok(peer) => peer,
            Err(e) => {
                tracing::warn!(error = %e, "dropping a connection whose peer is unknown");
                return None;
            }
        };
        if let Err(message) = self.policy.check(&peer, own_uid) {
            tracing::warn!(pid = peer.pid, uid = peer.uid, %message, "refused a client");
            refuse(&stream, message);
            return None;
        }
        let serving = live.load(Ordering::Acquire);
        if serving >= self.limits.max_clients {
            let message = format!(
                "tuttid serves at most {} clients at once and is serving {serving}; try again later",
                self.limits.max_clients
            );
            tracing::warn!(pid = peer.pid, %message, "refused a client");
            refuse(&stream, message);
            return None;
        }
        let waker = match stream.try_clone() {
            Ok(s) => s,
            Err(e) => {
                refuse(&stream, format!("tuttid cannot take this connection: {e}"));
                return None;
            }
        };
        live.fetch_add(1, Ordering::AcqRel);
        let slot = Slot(Arc::clone(live));
        let (handler, stop, limits) = (Arc::clone(handler), Arc::clone(stop), self.limits);
        let spawned = std::thread::Builder::new()
            .name(format!("tuttid-peer-{}", peer.pid))
            .spawn(move || serve_client(stream, peer, &*handler, &stop, limits, slot));
        match spawned {
            Ok(thread) => Some(ClientThread { thread, waker }),
            Err(e) => {
                // The closure, its slot included, was dropped: the count is back.
                refuse(&waker, format!("tuttid cannot start a thread for this client: {e}"));
                None
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Remove the socket file only if it is still ours: a successor may have replaced it.
        match fs::symlink_metadata(&self.path) {
            Ok(m) if (m.dev(), m.ino()) == self.file_id => {
                if let Err(e) = fs::remove_file(&self.path) {
                    tracing::warn!(path = %self.path.display(), error = %e, "could not remove the socket file");
                }
            }
            _ => {}
        }
    }
}

/// One client's thread and a second handle on its socket, to shut it down on stop.
struct ClientThread {
    thread: JoinHandle<()>,
    waker: UnixStream,
}

/// One place in the count of clients being served; given back when dropped.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connected client: gives back its slot, then calls `disconnect`, exactly once, however
/// its thread ends (return or panic).
struct Session<'h, H: Handler> {
    handler: &'h H,
    client: u64,
    slot: Option<Slot>,
}

impl<H: Handler> Drop for Session<'_, H> {
    fn drop(&mut self) {
        // The slot first: once a client sees its disconnect, its place can be taken.
        drop(self.slot.take());
        tracing::debug!(client = self.client, "client gone");
        self.handler.disconnect(self.client);
    }
}

/// Joins the threads of clients that are gone.
fn reap(clients: &mut Vec<ClientThread>) {
    let (done, running): (Vec<_>, Vec<_>) =
        std::mem::take(clients).into_iter().partition(|c| c.thread.is_finished());
    *clients = running;
    for c in done {
        if c.thread.join().is_err() {
            tracing::error!("a client thread panicked");
        }
    }
}

/// Shuts every client's socket and waits up to [`JOIN_TIMEOUT`] for the threads.
fn shut_down(clients: Vec<ClientThread>) {
    for c in &clients {
        let _ = c.waker.shutdown(std::net::Shutdown::Both);
    }
    let deadline = Instant::now() + JOIN_TIMEOUT;
    for c in clients {
        while !c.thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if c.thread.is_finished() {
            if c.thread.join().is_err() {
                tracing::error!("a client thread panicked");
            }
        } else {
            tracing::warn!("a client thread is still in its handler after {JOIN_TIMEOUT:?}; leaving it");
        }
    }
}

/// Tells a peer why it is refused, then closes.
fn refuse(stream: &UnixStream, message: String) {
    let hello = Hello::Refused { message };
    if let Err(e) = send_frame_by(stream, &hello, &[], Instant::now() + LAST_WORD_TIMEOUT) {
        tracing::debug!(error = %e, "could not send a refusal");
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// One client's life: greeting, then requests in order until it goes, breaks the protocol,
/// or the server stops. The socket is shut down at the end, so the client sees the end
/// even if a copy of the descriptor lives on in a forked process.
fn serve_client<H: Handler>(
    stream: UnixStream,
    peer: PeerCred,
    handler: &H,
    stop: &AtomicBool,
    limits: Limits,
    slot: Slot,
) {
    serve(&stream, peer, handler, stop, limits, slot);
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

fn serve<H: Handler>(
    stream: &UnixStream,
    peer: PeerCred,
    handler: &H,
    stop: &AtomicBool,
    limits: Limits,
    slot: Slot,
) {
    let client = match handler.connect(&peer) {
        Ok(client) => client,
        Err(message) => {
            tracing::info!(pid = peer.pid, %message, "the handler refused a client");
            refuse(stream, message);
            return;
        }
    };
    let _session = Session { handler, client, slot: Some(slot) };
    tracing::debug!(client, pid = peer.pid, uid = peer.uid, "client connected");
    let hello = Hello::Welcome { protocol: PROTOCOL_VERSION, client, daemon_pid: std::process::id() };
    if let Err(e) = send_frame_by(stream, &hello, &[], Instant::now() + LAST_WORD_TIMEOUT) {
        tracing::debug!(client, error = %e, "could not greet a client");
        return;
    }

    let mut malformed = 0u32;
    loop {
        // An idle client may stay for hours: wait for its next frame without a deadline.
        match poll_once(stream, PollFlags::IN, IDLE_POLL) {
            Ok(true) => {}
            Ok(false) if stop.load(Ordering::Acquire) => return,
            Ok(false) => continue,
            Err(e) => {
                tracing::warn!(client, error = %e, "waiting for a request failed");
                return;
            }
        }
        if stop.load(Ordering::Acquire) {
            return;
        }
        match recv_frame::<H::Req>(stream, Instant::now() + limits.frame_timeout) {
            Ok((req, fds)) => {
                let (resp, out) = handler.request(client, &peer, req, fds);
                if !reply(stream, handler, client, &resp, &out) {
                    return;
                }
            }
            Err(DaemonError::Closed) => return,
            Err(e) if e.is_malformed_frame() => {
                malformed += 1;
                tracing::warn!(client, error = %e, malformed, "malformed frame");
                let last = malformed >= limits.malformed_limit;
                let why = if last {
                    format!("{e}; {malformed} malformed frames, closing the connection")
                } else {
                    e.to_string()
                };
                if !reply(stream, handler, client, &handler.malformed(client, &why), &[]) || last {
                    return;
                }
            }
            Err(e) => {
                // Oversized, truncated or stalled: the stream is out of step. Say why, then drop it.
                tracing::warn!(client, error = %e, "dropping a client for a protocol error");
                let resp = handler.malformed(client, &format!("{e}; closing the connection"));
                let _ = send_frame_by(stream, &resp, &[], Instant::now() + LAST_WORD_TIMEOUT);
                return;
            }
        }
    }
}

/// Sends a reply; one that cannot be encoded or carries too many fds becomes a malformed
/// reply instead, so the client is never left waiting. False when the client is gone.
fn reply<H: Handler>(stream: &UnixStream, handler: &H, client: u64, resp: &H::Resp, fds: &[OwnedFd]) -> bool {
    let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
    match send_frame(stream, resp, &borrowed) {
        Ok(()) => true,
        Err(e) if e.is_malformed_frame() || matches!(e, DaemonError::FrameTooLarge { .. }) => {
            tracing::error!(client, error = %e, "the handler's reply cannot be sent");
            let resp = handler.malformed(client, &format!("tuttid could not send its reply: {e}"));
            send_frame(stream, &resp, &[]).is_ok()
        }
        Err(e) => {
            tracing::debug!(client, error = %e, "could not send a reply");
            false
        }
    }
}

/// Refuses paths a Unix socket cannot have.
fn check_path(path: &Path) -> Result<()> {
    let bad = |what: &str| Err(DaemonError::BadPath { path: path.to_path_buf(), what: what.to_string() });
    if path.file_name().is_none() {
        return bad("it names no file");
    }
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return bad(&format!("{len} bytes; a Unix socket path holds at most {MAX_SOCKET_PATH}"));
    }
    Ok(())
}

/// Creates the socket's parent directory if it is missing, closed to others.
fn prepare_parent(path: &Path, mode: SocketMode) -> Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => return Ok(()),
    };
    if parent.exists() {
        return Ok(());
    }
    let bits = match mode {
        SocketMode::Owner => 0o700,
        SocketMode::Group(_) => 0o750,
    };
    let fail = |what: &str, e| DaemonError::io(format!("{what} {}", parent.display()), e);
    fs::DirBuilder::new()
        .recursive(true)
        .mode(bits)
        .create(parent)
        .map_err(|e| fail("creating the socket directory", e))?;
    // The umask may have narrowed the mode; set it exactly.
    fs::set_permissions(parent, fs::Permissions::from_mode(bits))
        .map_err(|e| fail("setting the mode of", e))?;
    if let SocketMode::Group(gid) = mode {
        std::os::unix::fs::chown(parent, None, Some(gid))
            .map_err(|e| fail(&format!("giving group {gid} the directory"), e))?;
    }
    Ok(())
}

/// Removes a socket file nobody listens on; refuses a live one, or anything else.
fn clear_stale(path: &Path) -> Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(DaemonError::io(format!("inspecting {}", path.display()), e)),
    };
    let ft = meta.file_type();
    if !ft.is_socket() {
        let kind = if ft.is_file() {
            "a regular file"
        } else if ft.is_dir() {
            "a directory"
        } else if ft.is_symlink() {
            "a symbolic link"
        } else {
            "a special file"
        };
        return Err(DaemonError::NotASocket { path: path.to_path_buf(), kind });
    }
    match connect_by(path, Instant::now() + PROBE_TIMEOUT) {
        Ok(probe) => {
            // The peer of a connected client socket is the process that listens.
            let pid = PeerCred::of(&probe).ok().map(|c| c.pid).filter(|&pid| pid > 0);
            Err(DaemonError::InUse { path: path.to_path_buf(), pid })
        }
        Err(DaemonError::Timeout { .. }) => Err(DaemonError::InUse { path: path.to_path_buf(), pid: None }),
        Err(DaemonError::NotListening { .. }) => {
            match fs::remove_file(path) {
                Ok(()) => {}
                // Someone else removed it first: the path is free either way.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(DaemonError::io(format!("removing the stale socket {}", path.display()), e))
                }
            }
            tracing::info!(path = %path.display(), "removed a stale socket file");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Sets the socket file's mode (and group).
fn set_mode(path: &Path, mode: SocketMode) -> Result<()> {
    let bits = match mode {
        SocketMode::Owner => 0o600,
        SocketMode::Group(_) => 0o660,
    };
    fs::set_permissions(path, fs::Permissions::from_mode(bits))
        .map_err(|e| DaemonError::io(format!("setting the mode of {}", path.display()), e))?;
    if let SocketMode::Group(gid) = mode {
        std::os::unix::fs::chown(path, None, Some(gid))
            .map_err(|e| DaemonError::io(format!("giving group {gid} the socket {}", path.display()), e))?;
    }
    Ok(())
}
