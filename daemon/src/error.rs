//! The daemon crate's one error type.

use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong on tuttid's socket: framing, peers, binding and calls.
///
/// Frame errors name what was wrong with the frame; socket errors name the path.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// A frame announced (or a caller tried to send) a body over [`crate::wire::MAX_FRAME`].
    #[error("frame of {len} bytes is over the {max}-byte limit")]
    FrameTooLarge { len: u64, max: usize },

    /// The body of a complete frame is not valid JSON for the expected message.
    #[error("frame body is not a valid message: {0}")]
    BadJson(String),

    /// A frame came (or was to be sent) with more descriptors than one frame may carry.
    #[error("frame carries more than {max} file descriptors ({count} seen)")]
    TooManyFds { count: usize, max: usize },

    /// Descriptors came with a later part of a frame instead of its first byte.
    #[error(
        "{count} file descriptor(s) arrived in the middle of a frame; they must come with its first byte"
    )]
    UnexpectedFds { count: usize },

    /// The peer closed the connection part-way through a frame.
    #[error("peer closed the connection in the middle of a frame ({got} of {want} bytes)")]
    Truncated { got: usize, want: usize },

    /// The peer closed the connection between frames.
    #[error("peer closed the connection")]
    Closed,

    /// A deadline passed while waiting for a peer.
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout { what: String, waited: Duration },

    /// A system call on a socket or file failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },

    /// Nothing listens at the socket path. `stale`: the socket file is there (a daemon that
    /// was killed leaves it), and who left it, when its owner record says.
    #[error("no tuttid listening at {}{} (start it with `tutti serve ...`)", path.display(),
        stale.as_ref().map(|s| format!(": {s}")).unwrap_or_default())]
    NotListening { path: PathBuf, stale: Option<String> },

    /// The daemon refused this client (access policy, client limit, or its own reason).
    #[error("tuttid at {} refused this client: {message}", path.display())]
    Refused { path: PathBuf, message: String },

    /// The daemon and this client do not speak the same protocol version.
    #[error("tuttid at {} speaks protocol {theirs}; this client speaks {ours}", path.display())]
    Protocol { path: PathBuf, theirs: u32, ours: u32 },

    /// A live daemon already listens at the socket path.
    #[error("socket {} is in use by a live tuttid ({}); stop it first", path.display(), holder(*pid))]
    InUse { path: PathBuf, pid: Option<i32> },

    /// Something other than a socket is at the socket path; it is left alone.
    #[error("{} exists and is not a socket ({kind}); refusing to replace it", path.display())]
    NotASocket { path: PathBuf, kind: &'static str },

    /// The socket path cannot be used (too long, no file name, ...).
    #[error("invalid socket path {}: {what}", path.display())]
    BadPath { path: PathBuf, what: String },

    /// The daemon answered a request with an error.
    #[error("tuttid refused {request}: {message}")]
    Rejected { request: &'static str, kind: crate::proto::ErrorKind, message: String },

    /// The daemon answered with something this client did not ask for.
    #[error("tuttid answered out of protocol: {0}")]
    Unexpected(String),

    /// The daemon's configuration cannot work.
    #[error("configuration: {0}")]
    Config(String),

    #[error(transparent)]
    Obj(#[from] tutti_objstore::ObjError),

    #[error(transparent)]
    Driver(#[from] tutti_driver::DriverError),

    /// The connection cannot be used any more: the daemon hung up (it stopped or died), or an
    /// earlier call failed in a way that left requests and replies out of step.
    #[error("tuttid at {} is gone: {why}; this connection is closed (connect again to go on)", path.display())]
    ConnectionLost { path: PathBuf, why: String },
}

impl DaemonError {
    /// Builds an [`DaemonError::Io`] that says what was being done.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        DaemonError::Io { what: what.into(), source }
    }

    /// True for a frame that was read to its end but could not be accepted: the stream is
    /// still in step, so the peer can be told and the connection kept.
    pub fn is_malformed_frame(&self) -> bool {
        matches!(
            self,
            DaemonError::BadJson(_) | DaemonError::TooManyFds { .. } | DaemonError::UnexpectedFds { .. }
        )
    }
}

fn holder(pid: Option<i32>) -> String {
    match pid {
        Some(pid) => format!("pid {pid}"),
        None => "its pid could not be read".to_string(),
    }
}

/// The crate's result type.
pub type Result<T, E = DaemonError> = std::result::Result<T, E>;
