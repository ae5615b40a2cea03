//! The arbiter's vocabulary: its configuration ([`Mode`], [`BacklogFull`], [`ArbiterConfig`]),
//! the unit it is asked about ([`Unit`]) and its answer ([`Decision`]), and what it reports
//! ([`PolicyState`], [`ArbiterStats`], recorded [`Event`]s). The decisions are in the parent
//! module ([`super::Arbiter`]).

use crate::online::OnlineConfig;
use crate::policy::IoRates;
use crate::{IoKind, SchedError};

/// How much of the policy applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Units go as they are asked for (the layer-wise baseline: reads and writes mix).
    Pass,
    /// Per-drive arbitration, reads first; writes are not held for slack.
    Arbitrate,
    /// Arbitration plus slack windows from the table.
    Slack,
    /// Slack windows corrected online from observed compute.
    SlackOnline,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Pass => "pass",
            Mode::Arbitrate => "arbitrate",
            Mode::Slack => "slack",
            Mode::SlackOnline => "slack-online",
        })
    }
}

/// What happens to a store that does not fit the backlog bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BacklogFull {
    /// Refuse it ([`SchedError::BacklogFull`]); the engine keeps its pages and submits again.
    Backpressure,
    /// Accept it as dropped: none of it is written, its blocks stay misses; counted.
    Drop,
}

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ArbiterConfig {
    pub mode: Mode,
    pub drives: usize,
    /// One drive's rates; `iocb_bytes` turns bytes into the table's IOCB budgets.
    pub rates: IoRates,
    /// Bytes of engine memory that stores not yet written may hold.
    pub backlog_bytes: u64,
    pub on_full: BacklogFull,
    /// Fraction of every window withheld from writes.
    pub write_guard: f64,
    /// No window announced for this long: the engine is idle (or gives no timings).
    pub idle_after_ns: u64,
    pub online: OnlineConfig,
}

impl ArbiterConfig {
    pub fn validate(&self) -> Result<(), SchedError> {
        if self.drives == 0 {
            return Err(SchedError::InvalidConfig("the arbiter needs at least one drive".into()));
        }
        self.rates.validate()?;
        if self.backlog_bytes == 0 {
            return Err(SchedError::InvalidConfig("write backlog bound is 0 bytes".into()));
        }
        if !(0.0..1.0).contains(&self.write_guard) {
            return Err(SchedError::InvalidConfig(format!(
                "write guard must be in [0, 1), got {}",
                self.write_guard
            )));
        }
        if self.idle_after_ns == 0 {
            return Err(SchedError::InvalidConfig("idle_after_ns is 0".into()));
        }
        self.online.validate()
    }
}

/// One unit of I/O: one layer of one job, with its bytes per drive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    pub job: u64,
    pub layer: u32,
    pub kind: IoKind,
    /// Bytes on each drive (as many entries as the arbiter has drives).
    pub drive_bytes: Vec<u64>,
}

/// The answer to [`Arbiter::request`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Hand it to the drives now; report [`Arbiter::complete`] when it finished.
    Go,
    /// Not now: ask again later (the arbiter remembers a read as ready).
    Wait,
}

/// Why writes are not held for slack right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyOff {
    /// The mode does not hold writes for slack (`Pass`, `Arbitrate`).
    Mode,
    /// The engine has announced no compute window yet.
    NoTimings,
    /// The engine announced none for `idle_after_ns`.
    Idle,
}

/// The policy in force, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PolicyState {
    pub mode: Mode,
    /// Whether writes are held for slack right now.
    pub slack_active: bool,
    pub off: Option<PolicyOff>,
    /// Why not, when `slack_active` is false.
    pub off_reason: Option<String>,
}

/// Counters since the arbiter was made.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ArbiterStats {
    pub reads_issued: u64,
    pub writes_issued: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Requests answered `Wait` because of the other direction on a drive.
    pub read_waits: u64,
    pub write_waits_for_reads: u64,
    /// Writes answered `Wait` for lack of slack in the current window (or of any window).
    pub write_waits_for_slack: u64,
    /// Writes that started inside a decode step's window.
    pub writes_in_decode: u64,
    /// Writes that started because the engine blocked on them or was idle.
    pub writes_urgent_or_idle: u64,
    /// Units issued onto a drive with the other direction in flight (0 unless `Mode::Pass`).
    pub mixed_issues: u64,
    /// Requests the local policy let go that were answered `Wait` because a peer (another
    /// process) had the other direction in flight, or a read ready, on their drives.
    pub xproc_waits: u64,
    pub backlog_bytes: u64,
    pub backlog_peak_bytes: u64,
    pub stores_refused: u64,
    pub stores_dropped: u64,
    pub bytes_dropped: u64,
    /// Windows the engine announced.
    pub prefill_windows: u64,
    pub decode_windows: u64,
}

/// One recorded decision (see [`Arbiter::record`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum Event {
    /// A read was asked for the first time (it is ready from now on).
    Ready {
        seq: u64,
        job: u64,
        layer: u32,
        drives: Vec<usize>,
    },
    /// A unit started. `reads_in_flight`/`writes_in_flight` are its drives' counts after it.
    Issue {
        seq: u64,
        job: u64,
        layer: u32,
        kind: IoKind,
        drives: Vec<usize>,
        in_flight: Vec<(u32, u32)>,
    },
    Complete {
        seq: u64,
        job: u64,
        layer: u32,
        kind: IoKind,
    },
    /// A store's bytes left the backlog (`held` is the backlog after).
    Release {
        seq: u64,
        job: u64,
        bytes: u64,
        held: u64,
    },
    Accept {
        seq: u64,
        job: u64,
        bytes: u64,
        held: u64,
    },
}
