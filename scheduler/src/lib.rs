//! Slack-aware I/O scheduling for layer-wise KV-cache loading (Tutti paper §3.3, Algorithms 3 and 4).
//!
//! While the GPU computes layer `l`, the KV of layer `l+1` can be read from the SSDs for free as
//! long as the reads fit into the compute "slack" and are not slowed down by concurrent writes
//! (NVMe bandwidth collapses under mixed read/write traffic). This crate decides, per layer and per
//! decode step, how many read and write IOCBs go to each drive and how many SMs the I/O kernel may
//! use. It knows nothing about NVMe: it hands out budgets for an I/O path to execute.
//!
//! Where it runs: the IOCB-level [`Scheduler`] in the simulator ([`sim`], `tutti simulate`);
//! the same policy over whole layer units in the [`Arbiter`], which the C ABI's runtime
//! consults for every load and store layer it hands to the drives (in process and as a client
//! of tuttid). The C ABI's profiler hooks use [`Profiler`] to build the slack tables both read.
//!
//! - [`table`]: the slack table (input-length bucket, prefix-length bucket, layer) → slack,
//!   serialised as a versioned, checksummed JSON file tied to a model and GPU identity.
//! - [`profiler`]: builds a table from engine timings (`record_layer`) or from a [`ComputeModel`].
//! - [`arbiter`]: the policy on real I/O, per layer unit: per-drive arbitration, slack windows
//!   from engine timings, a bounded write backlog.
//! - [`policy`]: the [`Scheduler`] — reads first, writes only into slack left after reads, never
//!   reads and writes in flight on one drive, leftover writes deferred to decode, bounded backlog.
//! - [`online`]: *beyond the paper* — EWMA correction of the profiled slack from observed compute.
//! - [`sim`]: a discrete-event model of prefill/decode over an SSD array that compares policies.

// Libraries report through return values and `tracing`, never by printing.
#![warn(clippy::print_stdout, clippy::print_stderr)]

pub mod arbiter;
pub mod buckets;
pub mod compute;
pub mod error;
pub mod online;
pub mod policy;
pub mod profiler;
pub mod sim;
pub mod table;

pub use arbiter::{
    Arbiter, ArbiterConfig, ArbiterStats, BacklogFull, Decision, DriveCounts, Event, Mode, PeerVerdict,
    Peers, PolicyOff, PolicyState, Unit,
};
pub use compute::{ComputeModel, GpuModel, IoPartition, ModelGeometry};
pub use error::{Backpressure, SchedError};
pub use online::{OnlineConfig, OnlineSlack};
pub use policy::{DecodePlan, DriveSnapshot, IoRates, Issue, LayerPlan, Scheduler, SchedulerConfig};
pub use profiler::{FitReport, Profiler, TraceRecord};
pub use table::{Identity, SlackEntry, SlackTable, TableGrid};

/// Direction of an I/O the scheduler hands out budget for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IoKind {
    Read,
    Write,
}

impl std::fmt::Display for IoKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IoKind::Read => "read",
            IoKind::Write => "write",
        })
    }
}

/// Shape of a prefill request: tokens to compute and tokens whose KV comes from the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RequestShape {
    /// New tokens computed by this prefill (`L_input` in the paper).
    pub input_tokens: u32,
    /// Cached tokens whose KV is loaded from storage (`L_prefix`).
    pub prefix_tokens: u32,
}

impl RequestShape {
    pub fn new(input_tokens: u32, prefix_tokens: u32) -> Self {
        RequestShape { input_tokens, prefix_tokens }
    }
}
