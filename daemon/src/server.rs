//! tuttid's listening socket: binding it safely, admitting peers, one thread per client.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::PollFlags;

use crate::client::connect_by;
use crate::conn::{refuse, serve_connection, ClientCount, ConnState, ConnThread, Limits};
use crate::error::{DaemonError, Result};
pub use crate::handler::Handler;
use crate::peer::{own_uid, AccessPolicy, PeerCred};
use crate::wire::poll_once;

/// Clients served at once unless [`Server::with_max_clients`] says otherwise.
pub const DEFAULT_MAX_CLIENTS: usize = 256;
/// Malformed frames after which a client is dropped, unless [`Server::with_malformed_limit`] says otherwise.
pub const DEFAULT_MALFORMED_LIMIT: u32 = 8;
/// How long the rest of a frame may take once its first byte came, unless
/// [`Server::with_frame_timeout`] says otherwise. Idle clients (after hello) wait without limit.
pub const DEFAULT_FRAME_TIMEOUT: Duration = Duration::from_secs(5);
/// How long after connecting a peer has to say hello (however slowly its bytes come), unless
/// [`Server::with_hello_timeout`] says otherwise. Only for a [`Handler::hello_first`] handler.
pub const DEFAULT_HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long after the greeting a peer that has not said hello may stay silent (no byte at all),
/// unless [`Server::with_pre_hello_idle`] says otherwise. An engine says hello at once.
pub const DEFAULT_PRE_HELLO_IDLE: Duration = Duration::from_secs(2);
/// Connections that have not said hello yet, at most, apart from the clients; beyond it the
/// oldest is dropped. Unless [`Server::with_max_pre_hello`] says otherwise.
pub const DEFAULT_MAX_PRE_HELLO: usize = 64;

/// How often the accept loop looks at the stop flag, and reaps finished connection threads.
const STOP_POLL: Duration = Duration::from_millis(100);
/// How long stopping waits for client threads to finish.
const JOIN_TIMEOUT: Duration = Duration::from_secs(5);
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
                hello_timeout: DEFAULT_HELLO_TIMEOUT,
                pre_hello_idle: DEFAULT_PRE_HELLO_IDLE,
                max_pre_hello: DEFAULT_MAX_PRE_HELLO,
            },
        };
        // From here an error drops `server`, which removes the socket file again. Until the
        // mode is set the file may be wider open than asked; the peer check still applies.
        set_mode(&server.path, mode)?;
        // Names this process to whoever finds the socket stale after it was killed.
        let record = tutti_driver::owner::sidecar_path(&server.path);
        if let Err(e) = tutti_driver::owner::write_record(&record) {
            tracing::warn!(file = %record.display(), error = %e, "writing the socket's owner record failed");
        }
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

    /// Sets how long after connecting a peer has to say hello.
    pub fn with_hello_timeout(mut self, timeout: Duration) -> Server {
        self.limits.hello_timeout = timeout;
        self
    }

    /// Sets how long after the greeting a peer that has not said hello may send nothing.
    pub fn with_pre_hello_idle(mut self, idle: Duration) -> Server {
        self.limits.pre_hello_idle = idle;
        self
    }

    /// Sets how many connections may be waiting to say hello at once (at least 1); the oldest
    /// is dropped to make room for a new one beyond that.
    pub fn with_max_pre_hello(mut self, max: usize) -> Server {
        self.limits.max_pre_hello = max.max(1);
        self
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serves clients until `stop` is set, then closes the listener, removes the socket
    /// file, shuts every client's socket and waits (a bounded time) for their threads.
    /// Every client that was accepted by `handler.connect` gets exactly one `disconnect`.
    /// Threads of connections that ended are joined within [`STOP_POLL`] of their end, and
    /// their descriptors are closed when they end, whether or not another peer connects.
    pub fn run<H: Handler>(self, handler: Arc<H>, stop: Arc<AtomicBool>) -> Result<()> {
        let own_uid = own_uid();
        let clients = Arc::new(ClientCount::default());
        let mut conns: Vec<ConnThread> = Vec::new();
        let result = loop {
            if stop.load(Ordering::Acquire) {
                break Ok(());
            }
            let ready = poll_once(&self.listener, PollFlags::IN, STOP_POLL);
            reap(&mut conns);
            match ready {
                Ok(false) => continue,
                Ok(true) => {}
                Err(e) => break Err(DaemonError::io("waiting for connections", e)),
            }
            loop {
                match self.listener.accept() {
                    Ok((stream, _)) => {
                        if handler.hello_first() {
                            self.make_room(&mut conns);
                        }
                        if let Some(c) = self.admit(stream, &handler, &stop, &clients, own_uid) {
                            conns.push(c);
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
        tracing::info!(path = %self.path.display(), clients = conns.len(), "tuttid socket stopping");
        let path = self.path.clone();
        drop(self);
        shut_down(conns);
        tracing::info!(path = %path.display(), "tuttid socket stopped");
        result
    }

    /// Before a new connection: when as many connections as allowed are waiting to say hello,
    /// drops the oldest of them. An engine says hello as soon as it is greeted, so it is never
    /// the oldest for long; silent or slow peers make room for each other, never for a client.
    fn make_room(&self, conns: &mut [ConnThread]) {
        let waiting = |c: &&mut ConnThread| {
            !c.evicted && !c.thread.is_finished() && !c.state.greeted.load(Ordering::Acquire)
        };
        if conns.iter_mut().filter(waiting).count() < self.limits.max_pre_hello {
            return;
        }
        if let Some(oldest) = conns.iter_mut().filter(waiting).min_by_key(|c| c.state.accepted) {
            tracing::warn!(
                max = self.limits.max_pre_hello,
                waited_ms = oldest.state.accepted.elapsed().as_millis() as u64,
                "dropping the oldest connection that has not said hello, to make room"
            );
            oldest.evicted = true;
            oldest.state.shut();
        }
    }

    /// Checks a new connection and starts its thread, or refuses it.
    fn admit<H: Handler>(
        &self,
        stream: UnixStream,
        handler: &Arc<H>,
        stop: &Arc<AtomicBool>,
        clients: &Arc<ClientCount>,
        own_uid: u32,
    ) -> Option<ConnThread> {
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
        let max = self.limits.max_clients;
        let full = || {
            format!(
                "tuttid serves at most {max} clients at once and is serving {}; try again later",
                clients.now()
            )
        };
        // Without a hello, a connection is a client from here; with one, it takes its place
        // when it says hello (and is refused now only if there is no place to take).
        let seat = if handler.hello_first() {
            if clients.now() >= max {
                let message = full();
                tracing::warn!(pid = peer.pid, %message, "refused a client");
                refuse(&stream, message);
                return None;
            }
            None
        } else {
            match clients.take(max) {
                Some(seat) => Some(seat),
                None => {
                    let message = full();
                    tracing::warn!(pid = peer.pid, %message, "refused a client");
                    refuse(&stream, message);
                    return None;
                }
            }
        };
        let waker = match stream.try_clone() {
            Ok(s) => s,
            Err(e) => {
                refuse(&stream, format!("tuttid cannot take this connection: {e}"));
                return None;
            }
        };
        let state = ConnState::new(waker);
        if seat.is_some() {
            state.greeted.store(true, Ordering::Release);
        }
        let (handler, stop, limits, clients, st) =
            (Arc::clone(handler), Arc::clone(stop), self.limits, Arc::clone(clients), Arc::clone(&state));
        let spawned = std::thread::Builder::new()
            .name(format!("tuttid-peer-{}", peer.pid))
            .spawn(move || serve_connection(stream, peer, &*handler, &stop, limits, clients, seat, st));
        match spawned {
            Ok(thread) => Some(ConnThread { thread, state, evicted: false }),
            Err(e) => {
                // The closure, its seat and socket included, was dropped: the count is back.
                tracing::warn!(pid = peer.pid, error = %e, "tuttid cannot start a thread for a client");
                state.shut();
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
        tutti_driver::owner::remove_own_record(&tutti_driver::owner::sidecar_path(&self.path));
    }
}

/// Joins the threads of connections that ended.
fn reap(conns: &mut Vec<ConnThread>) {
    let (done, running): (Vec<_>, Vec<_>) =
        std::mem::take(conns).into_iter().partition(|c| c.thread.is_finished());
    *conns = running;
    for c in done {
        if c.thread.join().is_err() {
            tracing::error!("a client thread panicked");
        }
    }
}

/// Shuts every connection's socket and waits up to [`JOIN_TIMEOUT`] for the threads.
fn shut_down(conns: Vec<ConnThread>) {
    for c in &conns {
        c.state.shut();
    }
    let deadline = Instant::now() + JOIN_TIMEOUT;
    for c in conns {
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
        Err(DaemonError::NotListening { stale, .. }) => {
            if let Some(why) = stale {
                tracing::info!(path = %path.display(), %why, "replacing a stale socket file");
            }
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
