//! The object store's one error type.

use tutti_driver::DriverError;

/// Everything that can go wrong in the object store.
///
/// Registration and configuration errors name the field that was wrong;
/// device errors carry the driver's message (device, queue, command, status).
#[derive(Debug, thiserror::Error)]
pub enum ObjError {
    #[error("invalid {field}: {what}")]
    Invalid { field: &'static str, what: String },

    /// The I/O gate refused a store (its write backlog is full); nothing was done.
    #[error("{0}")]
    Backpressure(String),

    #[error(transparent)]
    Driver(#[from] DriverError),

    #[error("gio_uring: {0}")]
    Gio(String),

    #[error("drive {device}: {what}")]
    Drive { device: String, what: String },

    #[error("pool {pool}: {what}")]
    Pool { pool: String, what: String },

    #[error("the pool is full: {wanted} files wanted, {available} free or evictable ({pinned} pinned or in flight)")]
    PoolFull { wanted: usize, available: usize, pinned: usize },

    #[error("no KV memory is registered with this store")]
    NotRegistered,

    #[error("unknown {what} {id}")]
    Unknown { what: &'static str, id: u64 },

    #[error("job {job} did not finish within {waited:?}")]
    Timeout { job: u64, waited: std::time::Duration },

    #[error("internal lock poisoned ({0}); the store is unusable")]
    Poisoned(&'static str),
    /// The pool's owner (tuttid) refused a request or could not be reached.
    #[error("the pool's owner (tuttid): {0}")]
    Peer(String),

    /// The pool's owner (tuttid) is gone: it stopped or died, or stopped answering. The store
    /// learnt it once and fails every later call at once with this; nothing new goes to the
    /// drives, and no drive is blamed or recovered for it. Reconnect to go on.
    #[error("{0}")]
    PeerGone(String),
}

impl ObjError {
    pub(crate) fn invalid(field: &'static str, what: impl Into<String>) -> Self {
        ObjError::Invalid { field, what: what.into() }
    }
    pub(crate) fn drive(device: impl Into<String>, what: impl Into<String>) -> Self {
        ObjError::Drive { device: device.into(), what: what.into() }
    }
}

pub type Result<T, E = ObjError> = std::result::Result<T, E>;
