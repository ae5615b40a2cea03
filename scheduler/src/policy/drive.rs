//! Per-drive state of the scheduler and the cost model it budgets with.

use std::collections::VecDeque;

use crate::{IoKind, SchedError};

/// Throughput figures of one drive as the scheduler sees them: plain numbers, no NVMe.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct IoRates {
    /// Read bandwidth of one drive with no writes in flight, bytes/s.
    pub read_bytes_per_sec: f64,
    /// Write bandwidth of one drive with no reads in flight, bytes/s.
    pub write_bytes_per_sec: f64,
    /// Time from issue to the first completion of a batch, nanoseconds.
    pub command_latency_ns: u64,
    /// Bytes moved by one IOCB.
    pub iocb_bytes: u64,
}

impl IoRates {
    pub fn validate(&self) -> Result<(), SchedError> {
        let ok = |v: f64| v.is_finite() && v > 0.0;
        if !ok(self.read_bytes_per_sec) || !ok(self.write_bytes_per_sec) || self.iocb_bytes == 0 {
            return Err(SchedError::InvalidConfig(format!(
                "I/O rates must be positive: read {} B/s, write {} B/s, IOCB {} B",
                self.read_bytes_per_sec, self.write_bytes_per_sec, self.iocb_bytes
            )));
        }
        Ok(())
    }

    fn bandwidth(&self, kind: IoKind) -> f64 {
        match kind {
            IoKind::Read => self.read_bytes_per_sec,
            IoKind::Write => self.write_bytes_per_sec,
        }
    }

    /// Time for `iocbs` of one kind on an otherwise idle drive.
    pub fn time_ns(&self, kind: IoKind, iocbs: u64) -> f64 {
        if iocbs == 0 {
            return 0.0;
        }
        self.command_latency_ns as f64 + iocbs as f64 * self.iocb_bytes as f64 / self.bandwidth(kind) * 1e9
    }

    /// Most IOCBs of `kind` that complete within `ns` on an idle drive.
    pub fn fitting(&self, kind: IoKind, ns: f64) -> u64 {
        let transfer_ns = ns - self.command_latency_ns as f64;
        if transfer_ns <= 0.0 {
            return 0;
        }
        (transfer_ns / 1e9 * self.bandwidth(kind) / self.iocb_bytes as f64).floor() as u64
    }
}

/// What a drive has in flight and waiting, as reported by [`crate::Scheduler::drive`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DriveSnapshot {
    pub reads_in_flight: u32,
    pub writes_in_flight: u32,
    /// Reads granted but held until this drive's in-flight writes drain.
    pub gated_reads: u64,
    /// Writes granted in the current window, issued once this drive's reads drain.
    pub armed_writes: u64,
    /// Deferred writes not yet granted (the backlog on this drive).
    pub queued_writes: u64,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Drive {
    pub reads_in_flight: u32,
    pub writes_in_flight: u32,
    /// (layer, IOCBs) held behind in-flight writes, in grant order.
    pub gated_reads: VecDeque<(u32, u32)>,
    pub armed_writes: u64,
    pub armed_deadline_ns: u64,
    pub queued_writes: u64,
}

impl Drive {
    pub fn gated_read_count(&self) -> u64 {
        self.gated_reads.iter().map(|&(_, n)| u64::from(n)).sum()
    }

    /// Reads in flight or held: writes may not start on this drive while any exist.
    pub fn has_reads(&self) -> bool {
        self.reads_in_flight > 0 || !self.gated_reads.is_empty()
    }

    /// Write IOCBs this drive holds in HBM-pinned state (everything not yet completed).
    pub fn outstanding_writes(&self) -> u64 {
        self.queued_writes + self.armed_writes + u64::from(self.writes_in_flight)
    }

    /// Estimated time until the drive is idle: in-flight writes first (reads are held behind
    /// them), then in-flight and held reads. Progress already made is ignored — conservative.
    pub fn busy_ns(&self, rates: &IoRates) -> f64 {
        let reads = u64::from(self.reads_in_flight) + self.gated_read_count();
        rates.time_ns(IoKind::Write, u64::from(self.writes_in_flight)) + rates.time_ns(IoKind::Read, reads)
    }

    pub fn snapshot(&self) -> DriveSnapshot {
        DriveSnapshot {
            reads_in_flight: self.reads_in_flight,
            writes_in_flight: self.writes_in_flight,
            gated_reads: self.gated_read_count(),
            armed_writes: self.armed_writes,
            queued_writes: self.queued_writes,
        }
    }
}

/// Split `budget` over drives wanting `want[d]`, max-min fair: nobody gets more than it wants,
/// and no drive is short while another got more than an equal share.
pub(crate) fn fair_share(want: &[u64], budget: u64) -> Vec<u64> {
    let total: u64 = want.iter().sum();
    if total <= budget {
        return want.to_vec();
    }
    let mut grant = vec![0u64; want.len()];
    let mut order: Vec<usize> = (0..want.len()).collect();
    order.sort_by_key(|&d| want[d]);
    let mut left = budget;
    for (k, &d) in order.iter().enumerate() {
        let remaining_drives = (order.len() - k) as u64;
        let share = left / remaining_drives;
        grant[d] = want[d].min(share);
        left -= grant[d];
    }
    // Integer division leaves up to (drives - 1) IOCBs; hand them to drives still short.
    for &d in order.iter().rev() {
        if left == 0 {
            break;
        }
        let extra = (want[d] - grant[d]).min(left);
        grant[d] += extra;
        left -= extra;
    }
    grant
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fair_share_respects_budget_and_wants() {
        assert_eq!(fair_share(&[3, 4], 100), vec![3, 4]);
        assert_eq!(fair_share(&[10, 10], 10), vec![5, 5]);
        assert_eq!(fair_share(&[1, 10, 10], 11), vec![1, 5, 5]);
        let g = fair_share(&[7, 9, 8], 10);
        assert_eq!(g.iter().sum::<u64>(), 10);
        assert!(g.iter().max().unwrap() - g.iter().min().unwrap() <= 1);
        assert_eq!(fair_share(&[5, 5], 0), vec![0, 0]);
    }

    #[test]
    fn rates_time_and_fit_are_inverse() {
        let r = IoRates {
            read_bytes_per_sec: 1e9,
            write_bytes_per_sec: 5e8,
            command_latency_ns: 1000,
            iocb_bytes: 1000,
        };
        assert_eq!(r.time_ns(IoKind::Read, 0), 0.0);
        assert_eq!(r.time_ns(IoKind::Read, 10), 1000.0 + 10_000.0);
        assert_eq!(r.time_ns(IoKind::Write, 10), 1000.0 + 20_000.0);
        assert_eq!(r.fitting(IoKind::Write, 21_000.0), 10);
        assert_eq!(r.fitting(IoKind::Write, 20_999.0), 9);
        assert_eq!(r.fitting(IoKind::Read, 500.0), 0);
    }
}
