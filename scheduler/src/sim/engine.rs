//! The simulated GPU: runs requests layer by layer and lets the SSD model move in between.

use crate::sim::io::{Io, RequestIo};
use crate::sim::policies::{self, SimPolicy};
use crate::sim::ssd::SsdArray;
use crate::sim::{PolicyKind, RunMetrics, SimConfig};
use crate::table::SlackTable;
use crate::{RequestShape, SchedError};

const MIB: f64 = 1024.0 * 1024.0;

/// Split `total` IOCBs over drives; the remainder rotates with `rotate` (round-robin placement).
fn split(total: u64, drives: usize, rotate: usize) -> Vec<u32> {
    let base = total / drives as u64;
    let rem = (total % drives as u64) as usize;
    (0..drives)
        .map(|d| {
            let extra = u64::from((d + drives - rotate % drives) % drives < rem);
            u32::try_from(base + extra).unwrap_or(u32::MAX)
        })
        .collect()
}

#[derive(Default)]
struct Totals {
    ttft_ns: f64,
    compute_ns: f64,
    read_wait_ns: f64,
    stall_ns: f64,
    decode_stall_ns: f64,
    deferred_iocbs: u64,
    peak_backlog_iocbs: u64,
}

struct Engine<'a> {
    cfg: &'a SimConfig,
    io: Io,
    policy: Box<dyn SimPolicy>,
    totals: Totals,
}

impl Engine<'_> {
    fn advance_to(&mut self, t: f64) -> Result<(), SchedError> {
        let done = self.io.array.advance(self.io.now, t);
        self.io.now = t.max(self.io.now);
        for c in &done {
            self.io.account(c);
            self.policy.on_complete(&mut self.io, c)?;
        }
        Ok(())
    }

    /// Let I/O run until `cond` holds; returns the time waited.
    fn wait_until(&mut self, what: &str, cond: impl Fn(&Io) -> bool) -> Result<f64, SchedError> {
        let start = self.io.now;
        while !cond(&self.io) {
            let t = self.io.array.next_event(self.io.now).ok_or_else(|| {
                SchedError::Sim(format!(
                    "waiting for {what} at {:.3} ms with no I/O in flight",
                    self.io.now / 1e6
                ))
            })?;
            self.advance_to(t)?;
        }
        Ok(self.io.now - start)
    }

    /// The GPU computes for `dur` ns while I/O proceeds.
    fn compute(&mut self, dur: f64) -> Result<(), SchedError> {
        let until = self.io.now + dur;
        while let Some(t) = self.io.array.next_event(self.io.now).filter(|&t| t < until) {
            self.advance_to(t)?;
        }
        self.advance_to(until)
    }

    /// Hand writes to the policy, stalling (GPU idle) while the backlog is full.
    fn write(&mut self, per_drive: &[u32]) -> Result<f64, SchedError> {
        let start = self.io.now;
        let needed: u64 = per_drive.iter().map(|&n| u64::from(n)).sum();
        while !self.policy.offer_writes(&mut self.io, per_drive)? {
            self.policy.relieve(&mut self.io, needed)?;
            let t = self.io.array.next_event(self.io.now).ok_or_else(|| {
                SchedError::Sim("write backlog full with no write in flight to free it".into())
            })?;
            self.advance_to(t)?;
        }
        let outstanding = self.policy.outstanding_writes(&self.io);
        self.totals.peak_backlog_iocbs = self.totals.peak_backlog_iocbs.max(outstanding);
        Ok(self.io.now - start)
    }

    fn request(&mut self, req: &RequestIo) -> Result<(), SchedError> {
        let cfg = self.cfg;
        let model = &cfg.model;
        let layers = req.reads.len();
        self.io.reads_left = req.reads.iter().map(|d| d.iter().map(|&n| u64::from(n)).sum()).collect();
        let start = self.io.now;
        self.policy.request_start(&mut self.io, req)?;
        let layer_ns = model.prefill_layer_ns(req.shape.input_tokens, req.shape.prefix_tokens);
        let wait_all = self.policy.waits_for_all_reads();
        for layer in 0..layers {
            self.policy.layer_begin(&mut self.io, req, layer as u32)?;
            self.totals.read_wait_ns += self.wait_until("reads", |io| {
                if wait_all {
                    io.reads_left.iter().all(|&n| n == 0)
                } else {
                    io.reads_left[layer] == 0
                }
            })?;
            self.compute(layer_ns)?;
            self.totals.compute_ns += layer_ns;
            self.policy.layer_end(&mut self.io, req, layer as u32, layer_ns)?;
            self.totals.stall_ns += self.write(&req.writes[layer])?;
        }
        self.totals.ttft_ns += self.io.now - start;
        self.totals.deferred_iocbs += self.policy.outstanding_writes(&self.io);

        let geometry = &model.geometry;
        let block_writes = 2 * u64::from(geometry.layers);
        let first = req.shape.input_tokens + req.shape.prefix_tokens;
        for step in 0..cfg.workload.decode_steps {
            let context = first + step;
            self.policy.decode_begin(&mut self.io, context)?;
            let step_ns = model.decode_step_ns(context);
            self.compute(step_ns)?;
            self.policy.decode_end(&mut self.io, context, step_ns);
            // A filled KV block of generated tokens is written out like any other.
            if (step + 1) % geometry.block_tokens == 0 {
                let per_drive = split(block_writes, self.io.array.drives(), step as usize);
                self.totals.decode_stall_ns += self.write(&per_drive)?;
            }
        }
        Ok(())
    }
}

/// Run one policy at one hit rate. `table` is the profile (c) and (d) use, as given.
pub fn simulate(
    cfg: &SimConfig,
    policy: PolicyKind,
    hit_rate: f64,
    table: &SlackTable,
) -> Result<RunMetrics, SchedError> {
    cfg.validate()?;
    if !(0.0..=1.0).contains(&hit_rate) {
        return Err(SchedError::Sim(format!("hit rate must be in [0, 1], got {hit_rate}")));
    }
    if let Some(mismatch) = table.identity().mismatch(&cfg.model.identity()) {
        return Err(SchedError::Sim(format!("slack table made for another setup: {mismatch}")));
    }
    run(cfg, policy, hit_rate, table)
}

pub(crate) fn run(
    cfg: &SimConfig,
    kind: PolicyKind,
    hit_rate: f64,
    table: &SlackTable,
) -> Result<RunMetrics, SchedError> {
    let geometry = &cfg.model.geometry;
    let block = geometry.block_tokens;
    let ctx = cfg.workload.context_tokens;
    // At least one block is always computed: a request at "100%" still produces a token.
    let max_prefix_blocks = ctx.saturating_sub(1) / block;
    let prefix_blocks =
        ((hit_rate * f64::from(ctx) / f64::from(block)).floor() as u32).min(max_prefix_blocks);
    let prefix = prefix_blocks * block;
    let input = ctx - prefix;
    let drives = cfg.ssd.drives;
    let layers = geometry.layers as usize;
    let req = RequestIo {
        shape: RequestShape::new(input, prefix),
        reads: (0..layers).map(|l| split(2 * u64::from(prefix_blocks), drives, l)).collect(),
        writes: (0..layers).map(|l| split(2 * u64::from(input.div_ceil(block)), drives, l)).collect(),
    };
    let iocb_bytes = geometry.iocb_bytes() as f64;
    let mut engine = Engine {
        cfg,
        io: Io::new(SsdArray::new(cfg.ssd), iocb_bytes),
        policy: policies::make(kind, cfg, table)?,
        totals: Totals::default(),
    };
    for _ in 0..cfg.workload.requests {
        engine.request(&req)?;
    }
    let last_token = engine.io.now;
    engine.policy.relieve(&mut engine.io, u64::MAX)?;
    engine.wait_until("the write backlog to drain", |io| io.array.idle())?;
    if engine.policy.outstanding_writes(&engine.io) != 0 {
        return Err(SchedError::Sim(format!("{} policy left writes never issued", kind.label())));
    }
    let drain_ns = engine.io.now - last_token;

    let n = f64::from(cfg.workload.requests);
    let t = &engine.totals;
    let stats = engine.io.array.stats;
    let bubble_ns = t.read_wait_ns + t.stall_ns;
    let gbps = |bytes: f64, ns: f64| if ns > 0.0 { bytes / ns } else { 0.0 };
    let mib = |iocbs: u64| iocbs as f64 * iocb_bytes / MIB;
    Ok(RunMetrics {
        policy: kind,
        hit_rate,
        prefix_tokens: prefix,
        input_tokens: input,
        ttft_ms: t.ttft_ns / n / 1e6,
        prefill_compute_ms: t.compute_ns / n / 1e6,
        bubble_ms: bubble_ns / n / 1e6,
        stall_ms: t.stall_ns / n / 1e6,
        bubble_pct: if t.compute_ns > 0.0 { 100.0 * bubble_ns / t.compute_ns } else { 0.0 },
        decode_stall_ms: t.decode_stall_ns / n / 1e6,
        read_gbps: gbps(stats.read_bytes, stats.read_busy_ns),
        write_gbps: gbps(stats.write_bytes, stats.write_busy_ns),
        mixed_ms: stats.mixed_ns / n / 1e6,
        backlog_peak_mib: mib(t.peak_backlog_iocbs),
        deferred_mib: mib(t.deferred_iocbs) / n,
        drain_ms: drain_ns / 1e6,
        read_mib: stats.read_bytes / MIB,
        written_mib: stats.write_bytes / MIB,
    })
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn split_is_even_and_rotates_the_remainder() {
        assert_eq!(split(10, 2, 0), vec![5, 5]);
        assert_eq!(split(7, 3, 0), vec![3, 2, 2]);
        assert_eq!(split(7, 3, 1), vec![2, 3, 2]);
        assert_eq!(split(7, 3, 2).iter().sum::<u32>(), 7);
        assert_eq!(split(0, 2, 5), vec![0, 0]);
    }
}
