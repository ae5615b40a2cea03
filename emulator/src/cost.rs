//! The cost model's clock (see [`CostModel`] for the model itself).
//!
//! Pure bookkeeping over `Instant`s handed in by the caller, so the
//! modelled due times can be checked without timing the host.

use super::config::{CostModel, MixedModel};
use std::time::{Duration, Instant};

/// Which way a command moves data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    Read,
    Write,
    /// Flush, Write Zeroes, Dataset Management: latency only.
    Other,
}

/// What the model decided for one command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Admission {
    /// When the command may complete; `None` = at once.
    pub due: Option<Instant>,
    /// Its transfer was paced at the collapsed (mixed) rate.
    pub mixed: bool,
    /// Modelled time newly spent with reads and writes sharing the drive.
    pub mixed_nanos: u64,
}

/// When each paced channel is next free.
#[derive(Debug)]
pub(crate) struct CostClock {
    /// The one channel used when only `bytes_per_sec` is set.
    shared_until: Instant,
    read_until: Instant,
    write_until: Instant,
    /// End of the mixed time already counted.
    mixed_until: Instant,
}

fn transfer_time(bytes: u64, rate: u64) -> Duration {
    let nanos = (bytes as u128 * 1_000_000_000 / rate.max(1) as u128).min(u64::MAX as u128) as u64;
    Duration::from_nanos(nanos)
}

/// Bytes per second of `dir` while the other direction is in flight.
fn mixed_rate(cost: &CostModel, m: MixedModel, dir: Direction) -> Option<u64> {
    let read = cost.read_bytes_per_sec.or(cost.bytes_per_sec);
    let write = cost.write_bytes_per_sec.or(cost.bytes_per_sec);
    let fastest = read.unwrap_or(0).max(write.unwrap_or(0));
    let (share, alone) = match dir {
        Direction::Read => (m.read_share, read),
        _ => (1.0 - m.read_share, write),
    };
    let rate = ((fastest as f64 * m.efficiency * share) as u64).max(1);
    Some(alone.map_or(rate, |a| a.min(rate)))
}

impl CostClock {
    pub(crate) fn new(now: Instant) -> Self {
        CostClock { shared_until: now, read_until: now, write_until: now, mixed_until: now }
    }

    /// Accounts for a command fetched at `now` that moved `bytes` in `dir`.
    pub(crate) fn admit(&mut self, cost: &CostModel, now: Instant, dir: Direction, bytes: u64) -> Admission {
        let latency = cost.per_command
            + match dir {
                Direction::Read => cost.read_latency,
                Direction::Write => cost.write_latency,
                Direction::Other => Duration::ZERO,
            };
        let mut out = Admission { due: (!latency.is_zero()).then(|| now + latency), ..Default::default() };
        if bytes == 0 {
            return out;
        }
        let split = cost.read_bytes_per_sec.is_some() || cost.write_bytes_per_sec.is_some();
        let end = if !split || dir == Direction::Other {
            let Some(rate) = cost.bytes_per_sec else {
                return out;
            };
            // Transfers share one paced channel: each starts when the previous one ends.
            self.shared_until = self.shared_until.max(now) + transfer_time(bytes, rate);
            self.shared_until
        } else {
            let (own, other, alone) = match dir {
                Direction::Read => (self.read_until, self.write_until, cost.read_bytes_per_sec),
                _ => (self.write_until, self.read_until, cost.write_bytes_per_sec),
            };
            let alone = alone.or(cost.bytes_per_sec);
            let rate = match cost.mixed {
                Some(m) if other > now => {
                    out.mixed = true;
                    mixed_rate(cost, m, dir)
                }
                _ => alone,
            };
            let Some(rate) = rate else {
                return out;
            };
            let start = own.max(now);
            let end = start + transfer_time(bytes, rate);
            match dir {
                Direction::Read => self.read_until = end,
                _ => self.write_until = end,
            }
            if out.mixed {
                let from = start.max(self.mixed_until);
                if end > from {
                    out.mixed_nanos = (end - from).as_nanos().min(u64::MAX as u128) as u64;
                    self.mixed_until = end;
                }
            }
            end
        };
        out.due = Some(out.due.map_or(end, |d| d.max(end)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1_000_000;

    fn model() -> CostModel {
        CostModel {
            read_bytes_per_sec: Some(6000 * MB),
            write_bytes_per_sec: Some(2000 * MB),
            mixed: Some(MixedModel { efficiency: 0.4, read_share: 0.75 }),
            ..Default::default()
        }
    }

    fn secs(from: Instant, to: Option<Instant>) -> f64 {
        (to.expect("a due time") - from).as_secs_f64()
    }

    #[test]
    fn reads_alone_get_the_read_rate() {
        let t0 = Instant::now();
        let mut clock = CostClock::new(t0);
        let cost = model();
        let mut last = None;
        for _ in 0..100 {
            let a = clock.admit(&cost, t0, Direction::Read, 6 * MB);
            assert!(!a.mixed);
            last = a.due;
        }
        // 600 MB at 6000 MB/s, back to back on the read channel.
        assert!((secs(t0, last) - 0.1).abs() < 1e-6, "{}", secs(t0, last));
    }

    #[test]
    fn writes_alone_get_the_write_rate() {
        let t0 = Instant::now();
        let mut clock = CostClock::new(t0);
        let cost = model();
        let mut last = None;
        for _ in 0..10 {
            last = clock.admit(&cost, t0, Direction::Write, 20 * MB).due;
        }
        assert!((secs(t0, last) - 0.1).abs() < 1e-6, "{}", secs(t0, last));
    }

    #[test]
    fn mixed_reads_and_writes_share_the_collapsed_total() {
        let t0 = Instant::now();
        let mut clock = CostClock::new(t0);
        let cost = model();
        // A write holds the write channel for 1 s (2000 MB at 2000 MB/s).
        let w = clock.admit(&cost, t0, Direction::Write, 2000 * MB);
        assert!(!w.mixed);
        // Reads fetched meanwhile get 0.75 × 0.4 × 6000 MB/s = 1800 MB/s.
        let r = clock.admit(&cost, t0, Direction::Read, 180 * MB);
        assert!(r.mixed);
        assert!((secs(t0, r.due) - 0.1).abs() < 1e-6, "{}", secs(t0, r.due));
        assert!(r.mixed_nanos.abs_diff(100_000_000) < 1000, "{}", r.mixed_nanos);
        // A write fetched while reads are in flight gets 0.25 × 2400 = 600 MB/s,
        // after the first write's transfer.
        let t1 = t0 + Duration::from_millis(50);
        let w2 = clock.admit(&cost, t1, Direction::Write, 60 * MB);
        assert!(w2.mixed);
        assert!((secs(t0, w2.due) - 1.1).abs() < 1e-6, "{}", secs(t0, w2.due));
        // Its 0.1 s transfer (1.0 s to 1.1 s) is mixed time not yet counted.
        assert!(w2.mixed_nanos.abs_diff(100_000_000) < 1000, "{}", w2.mixed_nanos);
        // Reads fetched after every transfer ended are alone again.
        let r2 = clock.admit(&cost, t0 + Duration::from_secs(2), Direction::Read, 60 * MB);
        assert!(!r2.mixed);
        assert!((secs(t0, r2.due) - 2.01).abs() < 1e-6, "{}", secs(t0, r2.due));
    }

    #[test]
    fn without_a_mixed_model_directions_do_not_slow_each_other() {
        let t0 = Instant::now();
        let mut clock = CostClock::new(t0);
        let cost = CostModel { mixed: None, ..model() };
        clock.admit(&cost, t0, Direction::Write, 2000 * MB);
        let r = clock.admit(&cost, t0, Direction::Read, 600 * MB);
        assert!(!r.mixed);
        assert!((secs(t0, r.due) - 0.1).abs() < 1e-6);
    }

    #[test]
    fn a_direction_never_gets_more_than_its_rate_alone() {
        let t0 = Instant::now();
        let mut clock = CostClock::new(t0);
        // Writes at 100 MB/s, collapse 0.9 of 6000 split evenly would be 2700 MB/s.
        let cost = CostModel {
            write_bytes_per_sec: Some(100 * MB),
            mixed: Some(MixedModel { efficiency: 0.9, read_share: 0.5 }),
            ..model()
        };
        clock.admit(&cost, t0, Direction::Read, 6000 * MB);
        let w = clock.admit(&cost, t0, Direction::Write, 10 * MB);
        assert!(w.mixed);
        assert!((secs(t0, w.due) - 0.1).abs() < 1e-6);
    }

    #[test]
    fn latency_is_applied_per_command_and_per_direction() {
        let t0 = Instant::now();
        let mut clock = CostClock::new(t0);
        let cost = CostModel {
            per_command: Duration::from_micros(10),
            read_latency: Duration::from_micros(80),
            write_latency: Duration::from_micros(20),
            ..Default::default()
        };
        for _ in 0..3 {
            let r = clock.admit(&cost, t0, Direction::Read, 4096);
            assert_eq!(r.due, Some(t0 + Duration::from_micros(90)));
            let w = clock.admit(&cost, t0, Direction::Write, 4096);
            assert_eq!(w.due, Some(t0 + Duration::from_micros(30)));
            let f = clock.admit(&cost, t0, Direction::Other, 0);
            assert_eq!(f.due, Some(t0 + Duration::from_micros(10)));
        }
        // Latency and transfer overlap: a command ends at the later of the two.
        let cost = CostModel { read_bytes_per_sec: Some(1000 * MB), ..cost };
        let r = clock.admit(&cost, t0, Direction::Read, 1000 * MB);
        assert_eq!(r.due, Some(t0 + Duration::from_secs(1)));
        let r = clock.admit(&cost, t0 + Duration::from_secs(5), Direction::Read, 4000);
        assert_eq!(r.due, Some(t0 + Duration::from_secs(5) + Duration::from_micros(90)));
    }

    #[test]
    fn default_adds_no_cost() {
        let t0 = Instant::now();
        let mut clock = CostClock::new(t0);
        for dir in [Direction::Read, Direction::Write, Direction::Other] {
            assert_eq!(clock.admit(&CostModel::default(), t0, dir, 1 << 20), Admission::default());
        }
    }

    #[test]
    fn only_bytes_per_sec_keeps_one_shared_channel() {
        let t0 = Instant::now();
        let mut clock = CostClock::new(t0);
        let cost = CostModel { bytes_per_sec: Some(1000 * MB), ..Default::default() };
        clock.admit(&cost, t0, Direction::Read, 500 * MB);
        let w = clock.admit(&cost, t0, Direction::Write, 500 * MB);
        assert_eq!(w.due, Some(t0 + Duration::from_secs(1)));
    }

    #[test]
    fn validation_names_the_bad_field() {
        let bad = |c: CostModel| c.validate().expect_err("should be refused");
        assert!(bad(CostModel { read_bytes_per_sec: Some(0), ..model() }).contains("read_bytes_per_sec"));
        let m = |efficiency, read_share| CostModel {
            mixed: Some(MixedModel { efficiency, read_share }),
            ..model()
        };
        assert!(bad(m(0.0, 0.5)).contains("efficiency"));
        assert!(bad(m(1.5, 0.5)).contains("efficiency"));
        assert!(bad(m(f64::NAN, 0.5)).contains("efficiency"));
        assert!(bad(m(0.4, 1.0)).contains("read share"));
        assert!(bad(m(0.4, 0.0)).contains("read share"));
        let no_rate =
            CostModel { mixed: Some(MixedModel { efficiency: 0.4, read_share: 0.5 }), ..Default::default() };
        assert!(bad(no_rate).contains("rate"));
        model().validate().expect("valid");
        CostModel::default().validate().expect("valid");
    }
}
