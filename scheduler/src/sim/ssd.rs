//! Fluid model of an SSD array.
//!
//! Each drive serves reads and writes from two FIFO queues of batches (one batch = the IOCBs of
//! one submission to that drive). A batch moves no bytes until its command latency has passed
//! after issue; after that the head batch of each class transfers at the class's bandwidth:
//! read-only or write-only bandwidth when one class is active, and the collapsed mixed
//! bandwidth (split by `mixed_read_share`) while both are — the paper's measurement of ~29 GB/s
//! read alone, ~12 GB/s write alone, ~12 GB/s combined.

use std::collections::VecDeque;

use crate::IoKind;

/// Array-wide figures; every drive gets `1/drives` of each bandwidth.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SsdConfig {
    pub drives: usize,
    /// Read bandwidth of the array with no writes in flight, GB/s.
    pub read_gbps: f64,
    /// Write bandwidth of the array with no reads in flight, GB/s.
    pub write_gbps: f64,
    /// Combined bandwidth of the array while reads and writes are both in flight, GB/s.
    pub mixed_gbps: f64,
    /// Share of the mixed bandwidth that goes to reads ("write bandwidth effectively drops to zero").
    pub mixed_read_share: f64,
    /// Time from issue to first data of a batch, microseconds.
    pub command_latency_us: f64,
}

impl Default for SsdConfig {
    /// The paper's array: two drives, 29 / 12 / 12 GB/s.
    fn default() -> Self {
        SsdConfig {
            drives: 2,
            read_gbps: 29.0,
            write_gbps: 12.0,
            mixed_gbps: 12.0,
            mixed_read_share: 0.9,
            command_latency_us: 100.0,
        }
    }
}

impl SsdConfig {
    pub fn validate(&self) -> Result<(), String> {
        let pos = |v: f64| v.is_finite() && v > 0.0;
        if self.drives == 0 {
            return Err("the SSD array needs at least one drive".into());
        }
        if !pos(self.read_gbps) || !pos(self.write_gbps) || !pos(self.mixed_gbps) {
            return Err(format!(
                "SSD bandwidths must be > 0 (read {}, write {}, mixed {})",
                self.read_gbps, self.write_gbps, self.mixed_gbps
            ));
        }
        if !(self.mixed_read_share > 0.0 && self.mixed_read_share < 1.0) {
            return Err(format!("mixed read share must be in (0, 1), got {}", self.mixed_read_share));
        }
        if !(self.command_latency_us.is_finite() && self.command_latency_us >= 0.0) {
            return Err(format!("command latency must be >= 0, got {}", self.command_latency_us));
        }
        Ok(())
    }

    fn per_drive(&self, gbps: f64) -> f64 {
        gbps / self.drives as f64
    }
}

/// What a batch is for, reported back on completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tag {
    Read { layer: u32 },
    Write,
}

#[derive(Debug, Clone)]
struct Batch {
    tag: Tag,
    iocbs: u32,
    remaining: f64,
    ready_at: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Completion {
    pub drive: usize,
    pub kind: IoKind,
    pub iocbs: u32,
    pub tag: Tag,
}

#[derive(Debug, Clone, Default)]
struct Drive {
    reads: VecDeque<Batch>,
    writes: VecDeque<Batch>,
}

/// Totals the array accumulates as time passes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct ArrayStats {
    pub read_bytes: f64,
    pub write_bytes: f64,
    /// Time any drive had a read batch in flight (latency included).
    pub read_busy_ns: f64,
    pub write_busy_ns: f64,
    /// Time any drive moved reads and writes at once.
    pub mixed_ns: f64,
}

/// Bytes below this count as done (float residue of rate × time).
const EPS_BYTES: f64 = 1e-3;

pub(crate) struct SsdArray {
    cfg: SsdConfig,
    /// Bytes per nanosecond, per drive.
    read_rate: f64,
    write_rate: f64,
    mixed_rate: f64,
    latency_ns: f64,
    drives: Vec<Drive>,
    pub stats: ArrayStats,
}

fn ready(b: Option<&Batch>, now: f64) -> bool {
    b.is_some_and(|b| b.ready_at <= now + 1e-6)
}

impl SsdArray {
    pub fn new(cfg: SsdConfig) -> Self {
        SsdArray {
            read_rate: cfg.per_drive(cfg.read_gbps),
            write_rate: cfg.per_drive(cfg.write_gbps),
            mixed_rate: cfg.per_drive(cfg.mixed_gbps),
            latency_ns: cfg.command_latency_us * 1e3,
            drives: vec![Drive::default(); cfg.drives],
            cfg,
            stats: ArrayStats::default(),
        }
    }

    pub fn drives(&self) -> usize {
        self.cfg.drives
    }

    pub fn submit(&mut self, now: f64, drive: usize, tag: Tag, iocbs: u32, bytes: f64) {
        let batch = Batch { tag, iocbs, remaining: bytes.max(0.0), ready_at: now + self.latency_ns };
        let d = &mut self.drives[drive];
        match tag {
            Tag::Read { .. } => d.reads.push_back(batch),
            Tag::Write => d.writes.push_back(batch),
        }
    }

    pub fn idle(&self) -> bool {
        self.drives.iter().all(|d| d.reads.is_empty() && d.writes.is_empty())
    }

    /// (read, write) bytes/ns the head batches of `d` move at `now`.
    fn rates(&self, d: &Drive, now: f64) -> (f64, f64) {
        match (ready(d.reads.front(), now), ready(d.writes.front(), now)) {
            (true, true) => {
                let s = self.cfg.mixed_read_share;
                (self.mixed_rate * s, self.mixed_rate * (1.0 - s))
            }
            (true, false) => (self.read_rate, 0.0),
            (false, true) => (0.0, self.write_rate),
            (false, false) => (0.0, 0.0),
        }
    }

    /// When the next batch starts moving or finishes, if anything is queued.
    pub fn next_event(&self, now: f64) -> Option<f64> {
        let mut next: Option<f64> = None;
        let mut consider = |t: f64| next = Some(next.map_or(t, |n: f64| n.min(t)));
        for d in &self.drives {
            let (r, w) = self.rates(d, now);
            for (queue, rate) in [(&d.reads, r), (&d.writes, w)] {
                let Some(head) = queue.front() else { continue };
                if rate > 0.0 {
                    consider(now + (head.remaining / rate).max(0.0));
                } else {
                    consider(head.ready_at.max(now));
                }
                // A later batch may still be in its latency phase; it becomes "ready" on its own.
                if let Some(second) = queue.get(1) {
                    if second.ready_at > now {
                        consider(second.ready_at);
                    }
                }
            }
        }
        next
    }

    /// Move time from `now` to `t` (no event strictly between) and return finished batches.
    pub fn advance(&mut self, now: f64, t: f64) -> Vec<Completion> {
        let dt = (t - now).max(0.0);
        let mut any_read = false;
        let mut any_write = false;
        let mut any_mixed = false;
        let mut done = Vec::new();
        for drive in 0..self.drives.len() {
            let (r, w) = self.rates(&self.drives[drive], now);
            let d = &mut self.drives[drive];
            any_read |= !d.reads.is_empty();
            any_write |= !d.writes.is_empty();
            any_mixed |= r > 0.0 && w > 0.0;
            for (queue, rate, kind) in [(&mut d.reads, r, IoKind::Read), (&mut d.writes, w, IoKind::Write)] {
                let Some(head) = queue.front_mut() else { continue };
                // Finish a batch whose end falls within float error of `t`, or time could stall.
                let finishes = rate > 0.0 && head.remaining / rate <= dt + t.abs() * 1e-12 + 1e-9;
                let moved = if finishes { head.remaining } else { (rate * dt).min(head.remaining) };
                head.remaining -= moved;
                match kind {
                    IoKind::Read => self.stats.read_bytes += moved,
                    IoKind::Write => self.stats.write_bytes += moved,
                }
                // Zero-byte batches finish once their latency has passed.
                while queue.front().is_some_and(|h| h.remaining <= EPS_BYTES && h.ready_at <= t + 1e-6) {
                    let Some(b) = queue.pop_front() else { break };
                    done.push(Completion { drive, kind, iocbs: b.iocbs, tag: b.tag });
                }
            }
        }
        if any_read {
            self.stats.read_busy_ns += dt;
        }
        if any_write {
            self.stats.write_busy_ns += dt;
        }
        if any_mixed {
            self.stats.mixed_ns += dt;
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn array(latency_us: f64) -> SsdArray {
        SsdArray::new(SsdConfig { command_latency_us: latency_us, ..SsdConfig::default() })
    }

    /// Run until idle; returns (completion time, completion) pairs.
    fn drain(a: &mut SsdArray, mut now: f64) -> Vec<(f64, Completion)> {
        let mut out = Vec::new();
        while let Some(t) = a.next_event(now) {
            for c in a.advance(now, t) {
                out.push((t, c));
            }
            now = t;
        }
        out
    }

    #[test]
    fn reads_alone_run_at_read_bandwidth_after_latency() {
        let mut a = array(100.0);
        // 14.5 GB/s per drive = 14.5 B/ns: 14.5 MB takes 1 ms after 0.1 ms latency.
        a.submit(0.0, 0, Tag::Read { layer: 3 }, 10, 14.5e6);
        let done = drain(&mut a, 0.0);
        assert_eq!(done.len(), 1);
        assert!((done[0].0 - 1.1e6).abs() < 1.0, "{}", done[0].0);
        assert_eq!(done[0].1.tag, Tag::Read { layer: 3 });
        assert!((a.stats.read_bytes - 14.5e6).abs() < 1.0);
    }

    #[test]
    fn mixed_traffic_collapses_to_the_mixed_bandwidth() {
        let mut a = array(0.0);
        a.submit(0.0, 0, Tag::Read { layer: 0 }, 1, 5.4e6);
        a.submit(0.0, 0, Tag::Write, 1, 6e6);
        let done = drain(&mut a, 0.0);
        // Mixed: 6 B/ns per drive, reads get 5.4 → the read finishes at 1 ms instead of 0.37 ms.
        let read_t = done.iter().find(|(_, c)| c.kind == IoKind::Read).unwrap().0;
        assert!((read_t - 1e6).abs() < 1.0, "{read_t}");
        // The write moved 0.6 MB meanwhile, then 5.4 MB alone at 6 B/ns.
        let write_t = done.iter().find(|(_, c)| c.kind == IoKind::Write).unwrap().0;
        assert!((write_t - 1.9e6).abs() < 1.0, "{write_t}");
        assert!((a.stats.mixed_ns - 1e6).abs() < 1.0);
        assert!(a.idle());
    }

    #[test]
    fn batches_of_a_class_are_served_in_order_and_drives_are_independent() {
        let mut a = array(0.0);
        a.submit(0.0, 0, Tag::Read { layer: 0 }, 1, 14.5e6);
        a.submit(0.0, 0, Tag::Read { layer: 1 }, 1, 14.5e6);
        a.submit(0.0, 1, Tag::Write, 1, 6e6);
        let done = drain(&mut a, 0.0);
        let t = |pred: &dyn Fn(&Completion) -> bool| done.iter().find(|(_, c)| pred(c)).unwrap().0;
        assert!((t(&|c| c.tag == Tag::Read { layer: 0 }) - 1e6).abs() < 1.0);
        assert!((t(&|c| c.tag == Tag::Read { layer: 1 }) - 2e6).abs() < 1.0);
        assert!((t(&|c| c.kind == IoKind::Write) - 1e6).abs() < 1.0, "other drive is not slowed");
        assert_eq!(a.stats.mixed_ns, 0.0);
    }

    #[test]
    fn config_validation_names_the_bad_value() {
        let bad = SsdConfig { mixed_read_share: 1.5, ..SsdConfig::default() };
        assert!(bad.validate().unwrap_err().contains("1.5"));
        assert!(SsdConfig { drives: 0, ..SsdConfig::default() }.validate().is_err());
        assert!(SsdConfig::default().validate().is_ok());
    }
}
