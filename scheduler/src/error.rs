//! The crate's one error type.

use crate::IoKind;

/// The write backlog is full: the engine must stall (keep the KV pages in HBM, wait for write
/// completions) before handing over more writes. Returned instead of silently dropping writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backpressure {
    /// Write IOCBs queued, armed or in flight when the enqueue was refused.
    pub outstanding: u64,
    /// Write IOCBs the refused call asked to add.
    pub requested: u64,
    /// The backlog bound.
    pub capacity: u64,
}

impl std::fmt::Display for Backpressure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "write backlog full: {} write IOCBs outstanding + {} requested > capacity {}; \
             stall until writes complete",
            self.outstanding, self.requested, self.capacity
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SchedError {
    #[error("slack table {path}: cannot read or write: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("slack table {path}: not a valid slack table file: {detail}")]
    Corrupt { path: String, detail: String },
    #[error("slack table {path}: format version {found}, this build reads version {expected}")]
    Version { path: String, found: u64, expected: u32 },
    #[error(
        "slack table {path}: checksum mismatch (stored {stored:08x}, computed {computed:08x}); \
         the file is corrupt"
    )]
    Checksum { path: String, stored: u32, computed: u32 },
    #[error("slack table {path} was made for a different setup: {mismatch}; re-run `tutti profile`")]
    IdentityMismatch { path: String, mismatch: String },
    #[error("invalid slack table: {0}")]
    InvalidTable(String),
    #[error("invalid model: {0}")]
    InvalidModel(String),
    #[error("invalid scheduler configuration: {0}")]
    InvalidConfig(String),
    #[error("{0}")]
    Backpressure(Backpressure),
    #[error(
        "write backlog full: {held} bytes of engine memory held by stores not yet written + \
         {requested} requested > the bound of {capacity} bytes; wait for stores to finish \
         (or a decode step to drain them) and submit again"
    )]
    BacklogFull { held: u64, requested: u64, capacity: u64 },
    #[error("the I/O arbiter has no {what} {id}")]
    UnknownUnit { what: &'static str, id: u64 },
    #[error("drive {drive}: completion of {completed} {kind} IOCBs but only {in_flight} in flight")]
    CompletionMismatch { drive: usize, kind: IoKind, completed: u32, in_flight: u32 },
    #[error("no drive {drive}: the scheduler manages {drives} drives")]
    NoSuchDrive { drive: usize, drives: usize },
    #[error("expected one count per drive ({expected} drives), got {got}")]
    DriveCount { expected: usize, got: usize },
    #[error("layer {layer} out of range: the model has {layers} layers")]
    LayerOutOfRange { layer: u32, layers: u32 },
    #[error("trace line {line}: {detail}")]
    Trace { line: usize, detail: String },
    #[error("profile: {0}")]
    Profile(String),
    #[error("simulation: {0}")]
    Sim(String),
}

impl SchedError {
    /// The back-pressure details if this error is a full write backlog.
    pub fn backpressure(&self) -> Option<&Backpressure> {
        match self {
            SchedError::Backpressure(b) => Some(b),
            _ => None,
        }
    }
}
