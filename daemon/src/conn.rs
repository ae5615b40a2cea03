//! One connection's life on tuttid's socket, from accept to close: the greeting, the limits on
//! a connection that has not said hello yet, then requests in order.
//!
//! Every state has a deadline. Before hello: the first byte within [`Limits::pre_hello_idle`] of
//! the greeting, the hello itself within [`Limits::hello_timeout`] of the accept, however slowly
//! its bytes come; a refused hello is answered and the connection closed. After hello: an idle
//! client waits without limit (an engine may stay for hours), but a frame that has begun must
//! end within [`Limits::frame_timeout`]. Connections that have not said hello are counted apart
//! from the clients ([`Limits::max_pre_hello`]; the accept loop drops the oldest beyond it), so
//! silent connections cannot take the places of engines.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::PollFlags;

use crate::error::DaemonError;
use crate::handler::Handler;
use crate::peer::PeerCred;
use crate::wire::{poll_once, recv_frame, send_frame, send_frame_by, Hello, PROTOCOL_VERSION};

/// How often an idle client's thread looks at the stop flag (stop also shuts its socket).
const IDLE_POLL: Duration = Duration::from_millis(250);
/// How long a refusal or a last error reply may take to send.
pub(crate) const LAST_WORD_TIMEOUT: Duration = Duration::from_secs(1);

/// Per-connection limits, copied into each connection's thread.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub max_clients: usize,
    pub malformed_limit: u32,
    pub frame_timeout: Duration,
    pub hello_timeout: Duration,
    pub pre_hello_idle: Duration,
    pub max_pre_hello: usize,
}

/// What the accept loop and a connection's thread share.
#[derive(Debug)]
pub(crate) struct ConnState {
    pub accepted: Instant,
    /// The connection said hello and is counted as a client.
    pub greeted: AtomicBool,
    /// A second handle on the socket, to shut it down from the accept loop (stop, eviction).
    /// The thread drops it when it ends, so the descriptor goes when the peer does.
    waker: Mutex<Option<UnixStream>>,
}

impl ConnState {
    pub fn new(waker: UnixStream) -> Arc<ConnState> {
        Arc::new(ConnState {
            accepted: Instant::now(),
            greeted: AtomicBool::new(false),
            waker: Mutex::new(Some(waker)),
        })
    }

    /// Shuts the socket down: the thread's next read sees the end.
    pub fn shut(&self) {
        let waker = self.waker.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(w) = waker.as_ref() {
            let _ = w.shutdown(std::net::Shutdown::Both);
        }
    }

    fn drop_waker(&self) {
        drop(self.waker.lock().unwrap_or_else(|p| p.into_inner()).take());
    }
}

/// One connection's thread, as the accept loop keeps it.
pub(crate) struct ConnThread {
    pub thread: JoinHandle<()>,
    pub state: Arc<ConnState>,
    /// The accept loop dropped it to make room for a newer connection without hello.
    pub evicted: bool,
}

/// The count of clients (connections that said hello) being served.
#[derive(Debug, Default)]
pub(crate) struct ClientCount(AtomicUsize);

impl ClientCount {
    pub fn now(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }

    /// One more client, unless `max` are served already.
    pub fn take(self: &Arc<Self>, max: usize) -> Option<Seat> {
        let mut cur = self.0.load(Ordering::Acquire);
        loop {
            if cur >= max {
                return None;
            }
            match self.0.compare_exchange(cur, cur + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Some(Seat(Arc::clone(self))),
                Err(now) => cur = now,
            }
        }
    }
}

/// One place in the count of clients; given back when dropped.
pub(crate) struct Seat(Arc<ClientCount>);

impl Drop for Seat {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connected peer: gives back its place, then calls `disconnect`, exactly once, however its
/// thread ends (return or panic).
struct Session<'h, H: Handler> {
    handler: &'h H,
    client: u64,
    seat: Option<Seat>,
}

impl<H: Handler> Drop for Session<'_, H> {
    fn drop(&mut self) {
        // The place first: once a client sees its disconnect, its place can be taken.
        drop(self.seat.take());
        tracing::debug!(client = self.client, "client gone");
        self.handler.disconnect(self.client);
    }
}

/// Tells a peer why it is refused, then closes.
pub(crate) fn refuse(stream: &UnixStream, message: String) {
    let hello = Hello::Refused { message };
    if let Err(e) = send_frame_by(stream, &hello, &[], Instant::now() + LAST_WORD_TIMEOUT) {
        tracing::debug!(error = %e, "could not send a refusal");
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
}

/// The thread of one connection. `seat`: its place among the clients when the handler needs no
/// hello (taken at accept); otherwise it takes one when it says hello. The socket is shut down
/// at the end, so the peer sees the end even if a copy of the descriptor lives on in a forked
/// process, and both of this daemon's descriptors of it are closed when the thread returns.
#[allow(clippy::too_many_arguments)]
pub(crate) fn serve_connection<H: Handler>(
    stream: UnixStream,
    peer: PeerCred,
    handler: &H,
    stop: &AtomicBool,
    limits: Limits,
    clients: Arc<ClientCount>,
    seat: Option<Seat>,
    state: Arc<ConnState>,
) {
    serve(&stream, peer, handler, stop, limits, &clients, seat, &state);
    let _ = stream.shutdown(std::net::Shutdown::Both);
    state.drop_waker();
}

/// What the thread waits for next.
enum Wait {
    /// A frame, with no deadline (a client that is idle).
    Idle,
    /// A frame by this instant; `why` names the limit in the last word.
    By(Instant, String),
}

#[allow(clippy::too_many_arguments)]
fn serve<H: Handler>(
    stream: &UnixStream,
    peer: PeerCred,
    handler: &H,
    stop: &AtomicBool,
    limits: Limits,
    clients: &Arc<ClientCount>,
    seat: Option<Seat>,
    state: &ConnState,
) {
    let client = match handler.connect(&peer) {
        Ok(client) => client,
        Err(message) => {
            tracing::info!(pid = peer.pid, %message, "the handler refused a client");
            refuse(stream, message);
            return;
        }
    };
    let mut greeted = seat.is_some();
    let mut session = Session { handler, client, seat };
    tracing::debug!(client, pid = peer.pid, uid = peer.uid, "client connected");
    let hello = Hello::Welcome { protocol: PROTOCOL_VERSION, client, daemon_pid: std::process::id() };
    if let Err(e) = send_frame_by(stream, &hello, &[], Instant::now() + LAST_WORD_TIMEOUT) {
        tracing::debug!(client, error = %e, "could not greet a client");
        return;
    }
    let hello_by = state.accepted + limits.hello_timeout;
    let first_byte_by = Instant::now() + limits.pre_hello_idle;
    let mut heard = false;
    let mut malformed = 0u32;
    loop {
        let wait = if greeted {
            Wait::Idle
        } else if !heard && first_byte_by < hello_by {
            Wait::By(
                first_byte_by,
                format!("nothing was said within {:?} of the greeting", limits.pre_hello_idle),
            )
        } else {
            Wait::By(hello_by, format!("no hello within {:?} of connecting", limits.hello_timeout))
        };
        match wait_readable(stream, stop, &wait) {
            Readable::Yes => {}
            Readable::Stop => return,
            Readable::Late(why) => {
                tracing::info!(client, pid = peer.pid, %why, "dropping a connection that did not say hello");
                last_word(stream, &handler.refusal(client, &format!("{why}; closing the connection")));
                return;
            }
            Readable::Failed(e) => {
                tracing::warn!(client, error = %e, "waiting for a request failed");
                return;
            }
        }
        heard = true;
        let mut frame_by = Instant::now() + limits.frame_timeout;
        if !greeted {
            frame_by = frame_by.min(hello_by);
        }
        match recv_frame::<H::Req>(stream, frame_by) {
            Ok((req, fds)) => {
                let (mut resp, mut out) = handler.request(client, &peer, req, fds);
                if !greeted && handler.greeted(client) {
                    match clients.take(limits.max_clients) {
                        Some(seat) => {
                            session.seat = Some(seat);
                            greeted = true;
                            state.greeted.store(true, Ordering::Release);
                        }
                        None => {
                            tracing::warn!(
                                client,
                                pid = peer.pid,
                                "refused a hello: the client limit is reached"
                            );
                            resp = handler.refusal(client, &full(limits.max_clients));
                            out = Vec::new();
                        }
                    }
                }
                if !reply(stream, handler, client, &resp, &out) {
                    return;
                }
                if !greeted {
                    // The first request must be an accepted hello. Anything else (another
                    // protocol, a bad name, no room, a request before hello) was answered with
                    // why; nothing more is read from this connection.
                    tracing::info!(client, pid = peer.pid, "no accepted hello; closing the connection");
                    return;
                }
            }
            Err(DaemonError::Closed) => return,
            Err(e) if e.is_malformed_frame() => {
                malformed += 1;
                tracing::warn!(client, error = %e, malformed, "malformed frame");
                let last = malformed >= limits.malformed_limit || !greeted;
                let why = if !greeted {
                    format!("{e}; the first request must be hello, closing the connection")
                } else if last {
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
                last_word(stream, &handler.malformed(client, &format!("{e}; closing the connection")));
                return;
            }
        }
    }
}

fn full(max: usize) -> String {
    format!("tuttid serves at most {max} clients at once and is serving {max}; try again later")
}

/// What waiting for the next frame found.
enum Readable {
    Yes,
    Stop,
    Late(String),
    Failed(std::io::Error),
}

/// Waits until `stream` has something to read (a frame, or its end), the server stops, or the
/// wait's deadline passes.
fn wait_readable(stream: &UnixStream, stop: &AtomicBool, wait: &Wait) -> Readable {
    loop {
        if stop.load(Ordering::Acquire) {
            return Readable::Stop;
        }
        let step = match wait {
            Wait::Idle => IDLE_POLL,
            Wait::By(by, why) => {
                let now = Instant::now();
                if now >= *by {
                    return Readable::Late(why.clone());
                }
                (*by - now).min(IDLE_POLL)
            }
        };
        match poll_once(stream, PollFlags::IN, step) {
            Ok(true) if stop.load(Ordering::Acquire) => return Readable::Stop,
            Ok(true) => return Readable::Yes,
            Ok(false) => {}
            Err(e) => return Readable::Failed(e),
        }
    }
}

/// A last reply before closing, bounded by [`LAST_WORD_TIMEOUT`].
fn last_word<R: serde::Serialize>(stream: &UnixStream, resp: &R) {
    let _ = send_frame_by(stream, resp, &[], Instant::now() + LAST_WORD_TIMEOUT);
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
