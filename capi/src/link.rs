//! How a client of tuttid gets back to its daemon after the daemon went away (stopped,
//! crashed, SIGKILLed, restarted by systemd or upgraded by an operator).
//!
//! The store of a connection is disconnected for good once its daemon is gone
//! (`KvStore::owner_gone`). The runtime's next call that needs the daemon reconnects instead of
//! failing: it connects again with the same name, executor and geometry, gets its queue pairs
//! leased again and its register files (or VFIO fds) passed again, starts a new executor on
//! them (new rings), takes a new slot on the new daemon's arbitration board, registers the
//! engine's KV memory again, and puts the new store in place of the old one. The new daemon
//! must serve the same pool (the pool id this runtime first connected to, so the same media and
//! format); one of another geometry or other media is refused with both named, and the runtime
//! stays disconnected.
//!
//! What is not carried over: jobs and store sessions keep the store they were made on, so those
//! in flight when the daemon died end as errors (their blocks misses, never stale bytes); pins
//! of the old connection are not held by the new daemon (unpinning one is a no-op, see `kv`).
//!
//! Attempts are spaced: the first at once when the outage is seen, then after a backoff that
//! doubles from [`FIRST_BACKOFF`] up to the configured ceiling, except that a socket file
//! replaced since the last attempt (a new daemon bound it) is tried at once. In between, calls
//! fail at once (`TUTTI_E_IO`, naming tuttid and the last attempt's reason): no call waits for a
//! daemon that is not there. After the deadline (from when the outage was seen) the runtime
//! stops trying; close it and connect again. The outage is logged once when seen, once when a
//! refusal is first met, and once when it ends (or the deadline passes), not per call.

use crate::error::{lock, CapiError, Result};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tutti_daemon::arbitration::SharedArbitration;
use tutti_objstore::{Backend, Geometry, KvLayout, KvMemoryKind, KvStore, ObjError};

/// The store in use, and which connection it is on (0: the first; each reconnect adds 1).
#[derive(Clone)]
pub(crate) struct Current {
    pub store: Arc<KvStore>,
    pub epoch: u64,
}

/// The current KV registration: what the C layer checks against, and what a reconnected client
/// registers again (the caller's memory stays registered until it unregisters or closes).
#[derive(Clone, Debug)]
pub(crate) struct Registered {
    pub model: String,
    pub num_blocks: u32,
    pub layout: KvLayout,
    pub salt: Vec<u8>,
    pub memory: KvMemoryKind,
}

/// What a link needs of the runtime it reconnects (the runtime implements it).
pub(crate) trait Host {
    /// The store in use.
    fn current(&self) -> Current;
    /// Puts the store of a new connection in place; returns the one it replaces.
    fn swap(&self, next: Current) -> Result<Current>;
    /// The registration in force.
    fn registered(&self) -> Result<Option<Registered>>;
    /// Installs the runtime's scheduler on a new connection's store.
    fn install_gate(&self, store: &KvStore, epoch: u64) -> Result<()>;
    /// Arbitrates through a new daemon's board from now on.
    fn reshare(&self, board: Arc<SharedArbitration>) -> Result<()>;
    /// Keeps the counters of a store put out of use.
    fn retire(&self, old: &KvStore);
    /// Drops the scheduler's record of every job of connections before `epoch`.
    fn abandon_before(&self, epoch: u64) -> Result<usize>;
}

/// The wait after the first failed attempt; it doubles after each failure up to the ceiling.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(10);

/// When and how long a client reconnects.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Policy {
    pub enabled: bool,
    /// The longest wait between two attempts.
    pub max_backoff: Duration,
    /// How long after the outage was seen attempts go on.
    pub deadline: Duration,
}

/// What a connection is opened with; the same each time.
pub(crate) enum Role {
    /// Moves its own bytes with this backend and arbitrates through the daemon's board.
    Data(Backend),
    /// Moves none (`TUTTI_EXECUTOR_CONTROL`).
    Control,
}

/// A client's way back to its daemon.
pub(crate) struct Link {
    socket: PathBuf,
    name: String,
    timeout: Duration,
    role: Role,
    geometry: Geometry,
    /// The pool of the first connection: every later one must serve it.
    pool_id: u128,
    policy: Policy,
    state: Mutex<State>,
    reconnects: AtomicU64,
    attempts: AtomicU64,
}

#[derive(Default)]
struct State {
    /// When the current outage was seen; `None` while connected.
    down_since: Option<Instant>,
    /// No attempt before this (unless the socket file was replaced).
    next_attempt: Option<Instant>,
    backoff: Duration,
    /// The socket file at the last attempt.
    seen_socket: Option<SocketId>,
    /// Why the last attempt failed.
    last_error: Option<String>,
    /// Attempts in this outage.
    tries: u64,
    /// Refusals already logged in this outage.
    refusal_logged: bool,
    gave_up: bool,
    /// Time disconnected in earlier outages.
    past: Duration,
}

/// Counters of a link, for `tutti_stats_t`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LinkStats {
    pub reconnects: u64,
    pub attempts: u64,
    pub disconnected_ns: u64,
    pub disconnected: bool,
}

impl Link {
    pub(crate) fn new(
        socket: &Path,
        name: &str,
        timeout: Duration,
        role: Role,
        geometry: Geometry,
        pool_id: u128,
        policy: Policy,
    ) -> Link {
        Link {
            socket: socket.to_path_buf(),
            name: name.to_string(),
            timeout,
            role,
            geometry,
            pool_id,
            policy,
            state: Mutex::new(State::default()),
            reconnects: AtomicU64::new(0),
            attempts: AtomicU64::new(0),
        }
    }

    pub(crate) fn stats(&self) -> LinkStats {
        let (past, now, down) = match self.state.lock() {
            Ok(s) => (s.past, s.down_since.map(|t| t.elapsed()).unwrap_or_default(), s.down_since.is_some()),
            Err(_) => (Duration::ZERO, Duration::ZERO, false),
        };
        LinkStats {
            reconnects: self.reconnects.load(Ordering::Relaxed),
            attempts: self.attempts.load(Ordering::Relaxed),
            disconnected_ns: u64::try_from((past + now).as_nanos()).unwrap_or(u64::MAX),
            disconnected: down,
        }
    }

    /// `cur` if its daemon is there; else the store of a new connection when an attempt is due
    /// and works; else an error naming tuttid, at once.
    pub(crate) fn ensure(&self, rt: &dyn Host, cur: Current) -> Result<Current> {
        let Some(why) = cur.store.owner_gone() else { return Ok(cur) };
        if !self.policy.enabled {
            // As before reconnecting existed: the store's own calls fail naming tuttid.
            return Ok(cur);
        }
        let mut st = lock(&self.state, "reconnect")?;
        let latest = rt.current();
        if latest.epoch != cur.epoch {
            // Another thread reconnected meanwhile.
            return Ok(latest);
        }
        let now = Instant::now();
        let since = match st.down_since {
            Some(t) => t,
            None => {
                tracing::warn!(socket = %self.socket.display(), reason = %why,
                    max_backoff_ms = self.policy.max_backoff.as_millis() as u64,
                    deadline_s = self.policy.deadline.as_secs_f64(),
                    "tuttid went away; this client reconnects on its next calls");
                st.down_since = Some(now);
                st.backoff = Duration::ZERO;
                st.next_attempt = None;
                st.tries = 0;
                st.refusal_logged = false;
                st.gave_up = false;
                st.last_error = None;
                st.seen_socket = None;
                now
            }
        };
        if st.gave_up || now.duration_since(since) > self.policy.deadline {
            if !st.gave_up {
                st.gave_up = true;
                tracing::error!(socket = %self.socket.display(), tries = st.tries,
                    last = st.last_error.as_deref().unwrap_or("none"),
                    "tuttid did not come back within the reconnect deadline; this client stops trying");
            }
            return Err(CapiError::Io(format!(
                "{why}; not reconnected within the reconnect deadline of {:.1} s ({} attempts{}): \
                 close the runtime and connect again",
                self.policy.deadline.as_secs_f64(),
                st.tries,
                st.last_error.as_ref().map(|e| format!(", the last: {e}")).unwrap_or_default()
            )));
        }
        let socket = socket_identity(&self.socket);
        let replaced = socket.is_some() && socket != st.seen_socket;
        let due = st.next_attempt.is_none_or(|t| now >= t) || replaced;
        if !due {
            return Err(self.down(&why, &st, now));
        }
        st.tries += 1;
        st.seen_socket = socket;
        self.attempts.fetch_add(1, Ordering::Relaxed);
        match self.attempt(rt, cur.epoch + 1) {
            Ok(next) => {
                let old = rt.swap(next.clone())?;
                let outage = since.elapsed();
                st.past += outage;
                st.down_since = None;
                let tries = st.tries;
                drop(st);
                self.reconnects.fetch_add(1, Ordering::Relaxed);
                rt.retire(&old.store);
                // The old connection's units in flight never complete: they must not hold
                // their drives in the scheduler (a read would keep every write waiting).
                let abandoned = rt.abandon_before(next.epoch).unwrap_or_else(|e| {
                    tracing::error!(error = %e, "could not drop the old connection's jobs from the scheduler");
                    0
                });
                tracing::warn!(socket = %self.socket.display(), tries,
                    disconnected_ms = outage.as_millis() as u64, epoch = next.epoch, abandoned,
                    "reconnected to tuttid: queue pairs leased, KV memory registered again");
                // The old store goes here, or with the last job or store session made on it.
                drop(old);
                Ok(next)
            }
            Err(e) => {
                let msg = e.to_string();
                if refusal(&e) && !st.refusal_logged {
                    st.refusal_logged = true;
                    tracing::error!(socket = %self.socket.display(), error = %msg,
                        "tuttid is back but this client cannot go on with it; it keeps trying");
                }
                st.backoff = if st.backoff.is_zero() { FIRST_BACKOFF } else { st.backoff * 2 }
                    .min(self.policy.max_backoff);
                st.next_attempt = Some(now + st.backoff);
                st.last_error = Some(msg);
                Err(self.down(&why, &st, now))
            }
        }
    }

    /// The error of a call while disconnected.
    fn down(&self, why: &str, st: &State, now: Instant) -> CapiError {
        let next = st.next_attempt.map(|t| t.saturating_duration_since(now)).unwrap_or_default();
        CapiError::Io(format!(
            "{why}; reconnecting: attempt {} failed: {}; the next within {} ms (at once when a new \
             daemon replaces the socket)",
            st.tries,
            st.last_error.as_deref().unwrap_or("not tried yet"),
            next.as_millis()
        ))
    }

    /// One attempt: a new connection, back in this runtime's state.
    fn attempt(&self, rt: &dyn Host, epoch: u64) -> Result<Current> {
        let (store, board) = match &self.role {
            Role::Control => (
                tutti_daemon::remote::connect_control(
                    &self.socket,
                    &self.name,
                    self.timeout,
                    Some(&self.geometry),
                )?,
                None,
            ),
            Role::Data(backend) => {
                let (store, board) = tutti_daemon::remote::connect_arbitrated(
                    &self.socket,
                    &self.name,
                    backend,
                    self.timeout,
                    Some(&self.geometry),
                )?;
                (store, Some(board))
            }
        };
        if store.pool_id() != self.pool_id {
            return Err(CapiError::Obj(ObjError::Invalid {
                field: "pool",
                what: format!(
                    "tuttid at {} now serves pool {:032x} (other media, or formatted again), this runtime \
                     was connected to pool {:032x}: it does not go on with another pool; restart tuttid \
                     on the media it served, or close the runtime and connect again",
                    self.socket.display(),
                    store.pool_id(),
                    self.pool_id
                ),
            }));
        }
        rt.install_gate(&store, epoch)?;
        if let Some(r) = rt.registered()? {
            // SAFETY: the caller of `tutti_kv_register` keeps this memory allocated and
            // dedicated until it unregisters, registers again, or releases the runtime (its
            // contract), none of which happened: it is still the registration in force. CUDA
            // memory was accepted only with the GPU's executor, which this connection has too.
            unsafe { store.register_as(r.layout, &r.model, &r.salt, r.memory)? };
        }
        if let Some(board) = board {
            rt.reshare(board)?;
        }
        Ok(Current { store: Arc::new(store), epoch })
    }
}

/// The daemon answered, but this client cannot go on with it (another geometry or pool, a
/// refused hello): what an operator must fix, logged once per outage.
fn refusal(e: &CapiError) -> bool {
    matches!(e, CapiError::Obj(ObjError::Invalid { field: "geometry" | "pool", .. }))
        || matches!(e, CapiError::Io(m) if m.contains("refused"))
}

/// The socket file's (device, inode, change time), if it is there: a new daemon binds a new
/// file (an inode number may be reused, its change time is not the same).
fn socket_identity(path: &Path) -> Option<SocketId> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

type SocketId = (u64, u64, i64, i64);
