//! The driver's one error type.

use crate::spec::Status;
use std::time::Duration;

/// Everything that can go wrong between the driver and a controller.
///
/// Messages name the device, and where there is one the queue, the command id
/// and the command, so a log line is enough to find what failed.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("nvme {device} qid {qid} cid {cid}: {command} failed: {status}")]
    CommandFailed { device: String, qid: u16, cid: u16, command: &'static str, status: Status },

    #[error("nvme {device} qid {qid} cid {cid}: {command} did not complete within {waited:?} (completion lost or controller hung)")]
    CommandTimeout { device: String, qid: u16, cid: u16, command: &'static str, waited: Duration },

    #[error("nvme {device}: timed out after {waited:?} waiting for {what}")]
    Timeout { device: String, what: String, waited: Duration },

    #[error("nvme {device}: controller fatal status (CSTS.CFS=1){context}")]
    ControllerFatal { device: String, context: String },

    #[error("nvme {device} qid {qid}: queue pair unusable: {reason}; its state on the controller is unknown and only a controller reset recovers it")]
    QueueUnusable { device: String, qid: u16, reason: String },

    #[error("nvme {device} qid {qid}: queue full ({depth} entries, {in_flight} in flight)")]
    QueueFull { device: String, qid: u16, depth: u32, in_flight: u32 },

    #[error(
        "nvme {device}: register access at {offset:#x} ({width} bytes) is outside BAR0 of {len:#x} bytes"
    )]
    RegisterOutOfRange { device: String, offset: usize, width: usize, len: usize },

    #[error("nvme {device}: {what}")]
    Unsupported { device: String, what: String },

    /// Every I/O queue pair the controller granted is taken.
    #[error("nvme {device}: no I/O queue pair left for {purpose}: the controller granted {granted} of the {requested} asked for with Set Features (Number of Queues), and all {granted} are in use")]
    NoQueuePair { device: String, purpose: String, granted: u16, requested: u16 },

    /// A namespace the driver cannot use as plain blocks of data.
    #[error("nvme {device} namespace {nsid} {what}; {remedy}")]
    UnusableNamespace { device: String, nsid: u32, what: String, remedy: String },

    #[error("nvme {device}: the controller returned malformed data: {what}")]
    BadDeviceResponse { device: String, what: String },

    #[error("DMA ({space}): {what}")]
    Dma { space: String, what: String },

    /// The kernel (or the emulated IOMMU) refused to map device memory (a
    /// PFN-mapped range: another device's BAR, a GDRCopy mapping) for a drive.
    #[error("DMA ({space}): device memory {what} at {vaddr:#x}+{len:#x} cannot be mapped for the drive: {call} failed with errno {errno}: {reason}")]
    DeviceMemoryRefused {
        space: String,
        what: String,
        vaddr: u64,
        len: u64,
        call: &'static str,
        errno: i32,
        reason: String,
    },

    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    #[error("VFIO: {0}")]
    Vfio(String),

    #[error("emulated controller: {0}")]
    Emulated(String),

    /// An operation only the controller's owner may do, asked of a leased controller.
    #[error("nvme {device}: {what} is for the owner of the controller; this process holds it on a lease")]
    NotOwner { device: String, what: String },

    /// Media or a device another owner holds (another process, or another
    /// runtime in this one); the message names it and, where known, the holder.
    #[error("already in use: {0}")]
    InUse(String),
}

impl DriverError {
    /// An I/O error with what was being done when it happened.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        DriverError::Io { context: context.into(), source }
    }
    pub fn dma(space: impl Into<String>, what: impl Into<String>) -> Self {
        DriverError::Dma { space: space.into(), what: what.into() }
    }
    pub fn invalid(what: impl Into<String>) -> Self {
        DriverError::InvalidArgument(what.into())
    }
    /// The NVMe status of a failed command, if this error carries one.
    pub fn status(&self) -> Option<Status> {
        match self {
            DriverError::CommandFailed { status, .. } => Some(*status),
            _ => None,
        }
    }
}

pub type Result<T, E = DriverError> = std::result::Result<T, E>;
