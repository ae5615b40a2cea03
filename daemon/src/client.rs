//! The client end of tuttid's socket: one connection, one request at a time.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use rustix::event::PollFlags;
use rustix::io::Errno;
use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{DaemonError, Result};
use crate::wire::{poll_once, recv_frame, send_frame_by, Hello, PROTOCOL_VERSION};

/// How often a connect whose listen queue is full is retried.
const CONNECT_RETRY: Duration = Duration::from_millis(5);

/// A connection to tuttid. Calls are serialized: a reply always answers the request sent
/// just before it. A call that fails part-way (timeout, daemon gone) leaves the stream out
/// of step, so the connection is marked lost and every later call fails at once, naming why
/// ([`DaemonError::ConnectionLost`]: "tuttid ... is gone"). [`Connection::lost`] learns it
/// between calls too, without a call: the daemon never closes a connection it serves, so a
/// hang-up means it stopped or died.
#[derive(Debug)]
pub struct Connection {
    path: PathBuf,
    client: u64,
    daemon_pid: u32,
    state: Mutex<State>,
    /// A second handle on the socket, polled for a hang-up without taking `state`.
    watch: UnixStream,
    /// Why the connection is unusable, once it is; set once.
    lost: OnceLock<String>,
}

#[derive(Debug)]
struct State {
    stream: UnixStream,
}

impl Connection {
    /// Connects to the daemon at `path` and reads its greeting, all within `timeout`.
    pub fn connect(path: impl AsRef<Path>, timeout: Duration) -> Result<Connection> {
        let path = path.as_ref().to_path_buf();
        let deadline = Instant::now() + timeout;
        let stream = connect_by(&path, deadline)?;
        let (hello, _fds) = recv_frame::<Hello>(&stream, deadline).map_err(|e| match e {
            DaemonError::Closed => DaemonError::ConnectionLost {
                path: path.clone(),
                why: "the daemon closed the connection before greeting this client".into(),
            },
            DaemonError::Timeout { waited, .. } => {
                DaemonError::Timeout { what: format!("the greeting of tuttid at {}", path.display()), waited }
            }
            other => other,
        })?;
        match hello {
            Hello::Refused { message } => Err(DaemonError::Refused { path, message }),
            Hello::Welcome { protocol, .. } if protocol != PROTOCOL_VERSION => {
                Err(DaemonError::Protocol { path, theirs: protocol, ours: PROTOCOL_VERSION })
            }
            Hello::Welcome { client, daemon_pid, .. } => {
                tracing::debug!(path = %path.display(), client, daemon_pid, "connected to tuttid");
                let watch = stream.try_clone().map_err(|e| DaemonError::io("duplicating a socket", e))?;
                Ok(Connection {
                    path,
                    client,
                    daemon_pid,
                    state: Mutex::new(State { stream }),
                    watch,
                    lost: OnceLock::new(),
                })
            }
        }
    }

    /// Sends `req` with `fds` and waits for the reply and the descriptors that came with it,
    /// all within `timeout`.
    pub fn call<Req, Resp>(
        &self,
        req: &Req,
        fds: &[BorrowedFd<'_>],
        timeout: Duration,
    ) -> Result<(Resp, Vec<OwnedFd>)>
    where
        Req: Serialize + ?Sized,
        Resp: DeserializeOwned,
    {
        let deadline = Instant::now() + timeout;
        let mut state = self.state.lock().map_err(|_| DaemonError::ConnectionLost {
            path: self.path.clone(),
            why: "a call on it panicked".into(),
        })?;
        if let Some(e) = self.lost() {
            return Err(e);
        }
        // A message refused before its first byte was sent leaves the stream in step.
        if let Err(e) = send_frame_by(&state.stream, req, fds, deadline) {
            let in_step = e.is_malformed_frame() || matches!(e, DaemonError::FrameTooLarge { .. });
            if in_step {
                return Err(e);
            }
            return Err(self.fail(&mut state, e));
        }
        match recv_frame(&state.stream, deadline) {
            Ok(reply) => Ok(reply),
            // A reply that was read to its end but did not decode leaves the stream in step.
            Err(e) if e.is_malformed_frame() => Err(e),
            Err(e) => Err(self.fail(&mut state, e)),
        }
    }

    /// Marks the connection lost after `e`; returns the error for the caller, a closed
    /// stream said as such.
    fn fail(&self, state: &mut State, e: DaemonError) -> DaemonError {
        let closed = matches!(e, DaemonError::Closed | DaemonError::Truncated { .. });
        let why = if closed { format!("it closed the connection during a call: {e}") } else { e.to_string() };
        self.lose(why.clone());
        // Nothing more will be read or written; let the daemon see the end now.
        let _ = state.stream.shutdown(std::net::Shutdown::Both);
        if closed {
            DaemonError::ConnectionLost { path: self.path.clone(), why }
        } else {
            e
        }
    }

    fn lose(&self, why: String) {
        if self.lost.set(why).is_ok() {
            tracing::warn!(path = %self.path.display(), why = self.lost.get().map(String::as_str),
                "connection to tuttid lost");
        }
    }

    /// Whether the connection is unusable, and why: a call failed part-way, or the daemon hung
    /// up (it stopped or died). Cheap (a `poll` of the socket with no wait, once the connection
    /// is known to be fine), and it takes no lock: it does not wait for a call in progress.
    pub fn lost(&self) -> Option<DaemonError> {
        // Asked for RDHUP alone, poll reports only a hang-up (RDHUP, HUP) or an error on the
        // socket, never a reply arriving. An error from poll itself says nothing about the peer.
        if self.lost.get().is_none()
            && matches!(poll_once(&self.watch, PollFlags::RDHUP, Duration::ZERO), Ok(true))
        {
            self.lose("it closed the connection (tuttid stopped, or its process died)".into());
        }
        self.lost.get().map(|why| DaemonError::ConnectionLost { path: self.path.clone(), why: why.clone() })
    }

    /// The socket path this connection was opened on.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The id the daemon gave this client.
    pub fn client_id(&self) -> u64 {
        self.client
    }

    /// The pid of the daemon, as it reported it.
    pub fn daemon_pid(&self) -> u32 {
        self.daemon_pid
    }
}

/// Why nobody listens on the socket file at `path`: it is stale, and who left it, when the
/// daemon's owner record (`<socket>.owner`) is still there.
fn stale_socket(path: &Path) -> String {
    let record = tutti_driver::owner::sidecar_path(path);
    match tutti_driver::owner::describe_record(&record) {
        Some(who) => format!("the socket file is stale, left by tuttid {who}"),
        None => {
            "the socket file is stale (nobody listens on it, and no owner record names who left it)".into()
        }
    }
}

/// Connects a stream socket to `path`, retrying while the listener's queue is full, until
/// `deadline`. A missing socket, or one nobody listens on, is [`DaemonError::NotListening`].
pub(crate) fn connect_by(path: &Path, deadline: Instant) -> Result<UnixStream> {
    let started = Instant::now();
    let addr = SocketAddrUnix::new(path).map_err(|e| DaemonError::BadPath {
        path: path.to_path_buf(),
        what: std::io::Error::from(e).to_string(),
    })?;
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )
    .map_err(|e| DaemonError::io("creating a Unix socket", e.into()))?;
    loop {
        match rustix::net::connect(&fd, &addr) {
            Ok(()) => break,
            Err(Errno::INTR) => {}
            // A Unix socket's connect does not go in progress: EAGAIN means the queue is full.
            Err(Errno::AGAIN) => {
                let now = Instant::now();
                if now >= deadline {
                    return Err(DaemonError::Timeout {
                        what: format!("room in the accept queue of {}", path.display()),
                        waited: now - started,
                    });
                }
                std::thread::sleep(CONNECT_RETRY.min(deadline - now));
            }
            Err(Errno::NOENT) => {
                return Err(DaemonError::NotListening { path: path.to_path_buf(), stale: None })
            }
            Err(Errno::CONNREFUSED) => {
                return Err(DaemonError::NotListening {
                    path: path.to_path_buf(),
                    stale: Some(stale_socket(path)),
                })
            }
            Err(e) => return Err(DaemonError::io(format!("connecting to {}", path.display()), e.into())),
        }
    }
    let stream = UnixStream::from(fd);
    stream.set_nonblocking(false).map_err(|e| DaemonError::io("making a socket blocking", e))?;
    Ok(stream)
}
