//! What a store's data path counted, in a form its pool's owner can collect.
//!
//! A [`crate::KvStore`] moves its own bytes; the owner of the pool (tuttid, for a client) sees
//! only the control path. So the data-path counters of a client (bytes moved, NVMe commands,
//! their errors and timeouts, queue recoveries, layer latencies, staging, arbitration waits)
//! exist only in the client: it hands a [`DataPathReport`] to its [`crate::PoolControl`] just
//! before each end of a load and each settle of a store (see
//! [`crate::PoolControl::wants_reports`]), and a daemon adds the reports of its clients up.
//!
//! Every count is cumulative since the store was opened, so a report replaces the one before it
//! (a lost report loses nothing) and the owner can check that counts never go down.

use serde::{Deserialize, Serialize};

/// Upper bounds (seconds) of the latency buckets of a layer transfer; the last bucket is +Inf.
/// From 50 µs (a layer of a few blocks on RAM drives) to 10 s (the command deadline's order).
pub const LATENCY_BOUNDS_S: [f64; 16] = [
    50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0, 2.5,
    10.0,
];

/// Buckets of a [`LatencyHistogram`]: one per bound, then +Inf.
pub const LATENCY_BUCKETS: usize = LATENCY_BOUNDS_S.len() + 1;

/// Most drives a report may describe (a pool's drives are counted in a `u32`, but a report
/// from a peer is bounded before anything is allocated for it).
pub const MAX_REPORT_DRIVES: usize = 4096;

/// Layer transfer times: from the layer's submission to the poll that saw it finished
/// (what the engine waits, polling included), in [`LATENCY_BOUNDS_S`] buckets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyHistogram {
    /// Count per bucket (not cumulative); `LATENCY_BUCKETS` entries.
    pub buckets: Vec<u64>,
    /// Sum of every observation, ns.
    pub sum_ns: u64,
}

impl LatencyHistogram {
    /// The number of observations.
    pub fn count(&self) -> u64 {
        self.buckets.iter().fold(0u64, |a, b| a.saturating_add(*b))
    }

    /// Whether it has the right shape (a report from a peer is checked before use).
    pub fn is_well_formed(&self) -> bool {
        self.buckets.is_empty() || self.buckets.len() == LATENCY_BUCKETS
    }

    /// `self += other`, bucket by bucket (saturating).
    pub fn add(&mut self, other: &LatencyHistogram) {
        if other.buckets.is_empty() {
            return;
        }
        if self.buckets.len() != LATENCY_BUCKETS {
            self.buckets = vec![0; LATENCY_BUCKETS];
        }
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a = a.saturating_add(*b);
        }
        self.sum_ns = self.sum_ns.saturating_add(other.sum_ns);
    }

    /// Whether no count of `self` is below `before`'s.
    pub fn not_below(&self, before: &LatencyHistogram) -> bool {
        let mine = |i: usize| self.buckets.get(i).copied().unwrap_or(0);
        self.sum_ns >= before.sum_ns && before.buckets.iter().enumerate().all(|(i, b)| mine(i) >= *b)
    }
}

/// The bucket an observation of `ns` nanoseconds falls in.
pub fn latency_bucket(ns: u64) -> usize {
    let s = ns as f64 * 1e-9;
    LATENCY_BOUNDS_S.iter().position(|b| s <= *b).unwrap_or(LATENCY_BOUNDS_S.len())
}

/// One pool drive's data-path counters, as one client moved its bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriveIo {
    /// KV bytes of objects on this drive read (loads) and written (stores) successfully.
    pub bytes_loaded: u64,
    pub bytes_stored: u64,
    /// NVMe commands completed on this client's queue pairs of the drive (gio_uring path;
    /// 0 on paths that keep no per-queue counters).
    pub commands: u64,
    /// Of those, completions with an NVMe error status.
    pub status_errors: u64,
    /// Commands that reached their deadline without a completion.
    pub timeouts: u64,
}

impl DriveIo {
    fn add(&mut self, o: &DriveIo) {
        self.bytes_loaded = self.bytes_loaded.saturating_add(o.bytes_loaded);
        self.bytes_stored = self.bytes_stored.saturating_add(o.bytes_stored);
        self.commands = self.commands.saturating_add(o.commands);
        self.status_errors = self.status_errors.saturating_add(o.status_errors);
        self.timeouts = self.timeouts.saturating_add(o.timeouts);
    }

    fn not_below(&self, b: &DriveIo) -> bool {
        self.bytes_loaded >= b.bytes_loaded
            && self.bytes_stored >= b.bytes_stored
            && self.commands >= b.commands
            && self.status_errors >= b.status_errors
            && self.timeouts >= b.timeouts
    }
}

/// Times the I/O gate (the runtime's scheduler) held a unit back, by reason, and what it saw
/// of other processes on the arbitration board. All zero without a gate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateWaits {
    /// Reads held for writes in flight on their drives (this process's).
    pub reads_for_writes: u64,
    /// Writes held for reads in flight or ready on their drives (this process's).
    pub writes_for_reads: u64,
    /// Writes held for lack of slack in the engine's compute window.
    pub writes_for_slack: u64,
    /// Units the local policy let go that waited for another process's I/O on the board.
    pub cross_process: u64,
    /// Other clients marked stale on the board (their row blocked I/O unchanged too long).
    pub stale_marks: u64,
    /// Checks that skipped a client marked stale.
    pub stale_skips: u64,
}

impl GateWaits {
    fn fields(&self) -> [u64; 6] {
        [
            self.reads_for_writes,
            self.writes_for_reads,
            self.writes_for_slack,
            self.cross_process,
            self.stale_marks,
            self.stale_skips,
        ]
    }

    fn add(&mut self, o: &GateWaits) {
        self.reads_for_writes = self.reads_for_writes.saturating_add(o.reads_for_writes);
        self.writes_for_reads = self.writes_for_reads.saturating_add(o.writes_for_reads);
        self.writes_for_slack = self.writes_for_slack.saturating_add(o.writes_for_slack);
        self.cross_process = self.cross_process.saturating_add(o.cross_process);
        self.stale_marks = self.stale_marks.saturating_add(o.stale_marks);
        self.stale_skips = self.stale_skips.saturating_add(o.stale_skips);
    }
}

/// A staged registration's slots now (gauges) and its waits (a counter).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagingNow {
    pub slots: u64,
    /// Slots a lane holds now (taken, not yet given back or withheld).
    pub in_use: u64,
    /// Slots withheld now: their command's outcome is unknown, so the drive may still use them.
    pub withheld: u64,
    /// Times a lane found no free slot and waited (cumulative).
    pub waits: u64,
}

/// A store's data-path counters since it was opened.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataPathReport {
    /// Layer transfers finished (successfully or not), loads and stores.
    pub layers_loaded: u64,
    pub layers_stored: u64,
    /// KV bytes of blocks moved successfully.
    pub bytes_loaded: u64,
    pub bytes_stored: u64,
    /// NVMe commands the layers took.
    pub commands: u64,
    /// (block, layer) transfers that failed.
    pub failed_blocks: u64,
    /// Drive recoveries (queue pairs deleted and created again after commands of unknown
    /// outcome), and those that failed or could not run.
    pub queue_recoveries: u64,
    pub queue_recovery_failures: u64,
    pub load_latency: LatencyHistogram,
    pub store_latency: LatencyHistogram,
    /// Per pool drive, in pool order (empty when the store has not moved anything yet).
    pub drives: Vec<DriveIo>,
    pub gate: GateWaits,
    /// The staged registration's slots, if the store's KV memory is staged.
    pub staging: Option<StagingNow>,
}

impl DataPathReport {
    /// Checks a report from a peer: shapes within bounds, at most `drives` drives.
    pub fn check(&self, drives: usize) -> std::result::Result<(), String> {
        if self.drives.len() > drives.min(MAX_REPORT_DRIVES) {
            return Err(format!("the report describes {} drives; the pool has {drives}", self.drives.len()));
        }
        for (name, h) in [("load_latency", &self.load_latency), ("store_latency", &self.store_latency)] {
            if !h.is_well_formed() {
                return Err(format!("{name} has {} buckets, not {LATENCY_BUCKETS}", h.buckets.len()));
            }
        }
        Ok(())
    }

    /// Whether no counter is below `before`'s (gauges aside): reports are cumulative.
    pub fn not_below(&self, before: &DataPathReport) -> bool {
        let scalars = |r: &DataPathReport| {
            [
                r.layers_loaded,
                r.layers_stored,
                r.bytes_loaded,
                r.bytes_stored,
                r.commands,
                r.failed_blocks,
                r.queue_recoveries,
                r.queue_recovery_failures,
            ]
        };
        let d = |i: usize| self.drives.get(i).cloned().unwrap_or_default();
        scalars(self).iter().zip(scalars(before)).all(|(a, b)| *a >= b)
            && self.load_latency.not_below(&before.load_latency)
            && self.store_latency.not_below(&before.store_latency)
            && before.drives.iter().enumerate().all(|(i, b)| d(i).not_below(b))
            && self.gate.fields().iter().zip(before.gate.fields()).all(|(a, b)| *a >= b)
            && self.staging.map_or(0, |s| s.waits) >= before.staging.map_or(0, |s| s.waits)
    }

    /// Adds `other`'s counters and gauges to `self` (saturating).
    pub fn add(&mut self, o: &DataPathReport) {
        self.layers_loaded = self.layers_loaded.saturating_add(o.layers_loaded);
        self.layers_stored = self.layers_stored.saturating_add(o.layers_stored);
        self.bytes_loaded = self.bytes_loaded.saturating_add(o.bytes_loaded);
        self.bytes_stored = self.bytes_stored.saturating_add(o.bytes_stored);
        self.commands = self.commands.saturating_add(o.commands);
        self.failed_blocks = self.failed_blocks.saturating_add(o.failed_blocks);
        self.queue_recoveries = self.queue_recoveries.saturating_add(o.queue_recoveries);
        self.queue_recovery_failures = self.queue_recovery_failures.saturating_add(o.queue_recovery_failures);
        self.load_latency.add(&o.load_latency);
        self.store_latency.add(&o.store_latency);
        if self.drives.len() < o.drives.len() {
            self.drives.resize(o.drives.len(), DriveIo::default());
        }
        for (a, b) in self.drives.iter_mut().zip(&o.drives) {
            a.add(b);
        }
        self.gate.add(&o.gate);
        if let Some(s) = o.staging {
            let mine = self.staging.get_or_insert_with(StagingNow::default);
            mine.slots = mine.slots.saturating_add(s.slots);
            mine.in_use = mine.in_use.saturating_add(s.in_use);
            mine.withheld = mine.withheld.saturating_add(s.withheld);
            mine.waits = mine.waits.saturating_add(s.waits);
        }
    }

    /// The same report with its gauges (staging slots now) zeroed: what stays of a client
    /// that left.
    pub fn counters_only(&self) -> DataPathReport {
        let mut r = self.clone();
        if let Some(s) = r.staging.as_mut() {
            *s = StagingNow { waits: s.waits, ..StagingNow::default() };
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_take_each_observation_at_its_first_bound_at_or_above() {
        assert_eq!(latency_bucket(0), 0);
        assert_eq!(latency_bucket(50_000), 0);
        assert_eq!(latency_bucket(50_001), 1);
        assert_eq!(latency_bucket(1_000_000), 4);
        assert_eq!(latency_bucket(10_000_000_000), LATENCY_BOUNDS_S.len() - 1);
        assert_eq!(latency_bucket(u64::MAX), LATENCY_BOUNDS_S.len());
    }

    #[test]
    fn adding_and_checking_reports() {
        let mut a = DataPathReport {
            bytes_loaded: 10,
            load_latency: LatencyHistogram { buckets: vec![1; LATENCY_BUCKETS], sum_ns: 5 },
            drives: vec![DriveIo { commands: 3, ..Default::default() }],
            staging: Some(StagingNow { slots: 8, in_use: 2, withheld: 1, waits: 4 }),
            ..Default::default()
        };
        let mut total = DataPathReport::default();
        total.add(&a);
        total.add(&a);
        assert_eq!(total.bytes_loaded, 20);
        assert_eq!(total.load_latency.count(), 2 * LATENCY_BUCKETS as u64);
        assert_eq!(total.drives[0].commands, 6);
        assert_eq!(total.staging.map(|s| (s.slots, s.in_use, s.waits)), Some((16, 4, 8)));
        let left = a.counters_only();
        assert_eq!(left.staging, Some(StagingNow { waits: 4, ..Default::default() }));
        assert!(a.check(1).is_ok());
        assert!(a.check(0).unwrap_err().contains("1 drives"));
        let before = a.clone();
        a.bytes_loaded += 1;
        assert!(a.not_below(&before));
        a.drives[0].commands = 2;
        assert!(!a.not_below(&before), "a drive's commands went down");
        a.drives[0].commands = 3;
        a.load_latency.buckets = vec![1; 3];
        assert!(a.check(1).unwrap_err().contains("3 buckets"));
    }
}
