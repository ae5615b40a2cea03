//! The slack-aware policy (paper Algorithms 3 and 4) as a budget planner.
//!
//! Per prefill layer `l` ([`Scheduler::plan_prefill_layer`]):
//! 1. reads of `l` (or earlier) that are still queued are overdue — the GPU is about to block on them — and are
//!    issued at once, outside the window budget;
//! 2. reads of `l+1` go next, up to the window's IOCB cap (they are on the critical path);
//! 3. writes get only the time each drive has left in the window after its reads, and start on a
//!    drive only once its reads drained ("armed" until then); the rest stays deferred.
//!
//! Per decode step ([`Scheduler::plan_decode_step`]) deferred writes fill the step's slack.
//! A drive never has reads and writes in flight together: reads granted to a drive that still
//! has writes in flight (left from an earlier window) are held until those complete, and writes
//! are never started on a drive with reads in flight or held. Writes not yet completed are
//! bounded ([`Scheduler::enqueue_writes`] refuses with [`SchedError::Backpressure`]).

mod drive;

use std::collections::BTreeMap;

use drive::{fair_share, Drive};
pub use drive::{DriveSnapshot, IoRates};

use crate::online::{OnlineConfig, OnlineSlack};
use crate::table::{SlackEntry, SlackTable};
use crate::{Backpressure, IoKind, RequestShape, SchedError};

#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SchedulerConfig {
    pub drives: usize,
    /// Per-drive rates.
    pub rates: IoRates,
    /// Bound on write IOCBs not yet completed (queued, armed or in flight).
    pub backlog_capacity_iocbs: u64,
    /// Fraction of every window withheld from writes, absorbing interpolation bias and jitter.
    pub write_guard: f64,
}

impl SchedulerConfig {
    pub fn validate(&self) -> Result<(), SchedError> {
        if self.drives == 0 {
            return Err(SchedError::InvalidConfig("no drives".into()));
        }
        self.rates.validate()?;
        if self.backlog_capacity_iocbs == 0 {
            return Err(SchedError::InvalidConfig("backlog capacity is 0 IOCBs".into()));
        }
        if !(0.0..1.0).contains(&self.write_guard) {
            return Err(SchedError::InvalidConfig(format!(
                "write guard must be in [0, 1), got {}",
                self.write_guard
            )));
        }
        Ok(())
    }
}

/// IOCBs to submit now to one drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Issue {
    pub drive: usize,
    pub kind: IoKind,
    pub iocbs: u32,
    /// For reads: the layer whose KV they load.
    pub layer: Option<u32>,
}

/// The budget for one prefill layer.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerPlan {
    pub layer: u32,
    /// Slack used (the profiled entry, corrected online if enabled).
    pub slack: SlackEntry,
    /// Submit these now. Held reads and armed writes follow from [`Scheduler::complete`].
    pub issue: Vec<Issue>,
    /// Reads of `layer` itself still queued: the GPU will wait for them (outside the budget).
    pub overdue_reads: u64,
    /// Reads of `layer + 1` granted within the window (issued or held behind writes).
    pub reads: u64,
    /// Writes granted within the window (issued or armed).
    pub writes: u64,
    /// Writes left in the backlog for later windows and decode steps.
    pub deferred_writes: u64,
}

/// The budget for one decode step.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodePlan {
    pub slack: SlackEntry,
    pub issue: Vec<Issue>,
    pub writes: u64,
    pub deferred_writes: u64,
}

#[derive(Debug, Clone)]
pub struct Scheduler {
    table: SlackTable,
    config: SchedulerConfig,
    online: Option<OnlineSlack>,
    drives: Vec<Drive>,
    /// Layer → per-drive read IOCBs not yet granted.
    reads: BTreeMap<u32, Vec<u64>>,
}

fn to_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Scheduler {
    pub fn new(table: SlackTable, config: SchedulerConfig) -> Result<Self, SchedError> {
        config.validate()?;
        let drives = vec![Drive::default(); config.drives];
        Ok(Scheduler { table, config, online: None, drives, reads: BTreeMap::new() })
    }

    /// Correct the profiled slack from observed compute times ([`Scheduler::observe_layer`]).
    pub fn with_online_slack(mut self, config: OnlineConfig) -> Result<Self, SchedError> {
        self.online = Some(OnlineSlack::new(config)?);
        Ok(self)
    }

    pub fn table(&self) -> &SlackTable {
        &self.table
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    pub fn online(&self) -> Option<&OnlineSlack> {
        self.online.as_ref()
    }

    pub fn drive(&self, drive: usize) -> Option<DriveSnapshot> {
        self.drives.get(drive).map(Drive::snapshot)
    }

    /// Write IOCBs not yet completed, over all drives.
    pub fn outstanding_writes(&self) -> u64 {
        self.drives.iter().map(Drive::outstanding_writes).sum()
    }

    /// Write IOCBs deferred and not yet granted.
    pub fn queued_writes(&self) -> u64 {
        self.drives.iter().map(|d| d.queued_writes).sum()
    }

    /// Read IOCBs queued and not yet granted.
    pub fn queued_reads(&self) -> u64 {
        self.reads.values().flatten().sum()
    }

    /// Read IOCBs of `layer` queued and not yet granted.
    pub fn queued_reads_for(&self, layer: u32) -> u64 {
        self.reads.get(&layer).map_or(0, |q| q.iter().sum())
    }

    fn check_counts(&self, per_drive: &[u32]) -> Result<(), SchedError> {
        if per_drive.len() != self.drives.len() {
            return Err(SchedError::DriveCount { expected: self.drives.len(), got: per_drive.len() });
        }
        Ok(())
    }

    fn check_layer(&self, layer: u32) -> Result<(), SchedError> {
        let layers = self.table.layers();
        if layer >= layers {
            return Err(SchedError::LayerOutOfRange { layer, layers });
        }
        Ok(())
    }

    /// The engine needs these reads (per drive) before it computes `layer`.
    pub fn enqueue_reads(&mut self, layer: u32, per_drive: &[u32]) -> Result<(), SchedError> {
        self.check_layer(layer)?;
        self.check_counts(per_drive)?;
        let q = self.reads.entry(layer).or_insert_with(|| vec![0; per_drive.len()]);
        for (slot, &n) in q.iter_mut().zip(per_drive) {
            *slot += u64::from(n);
        }
        Ok(())
    }

    /// Drop reads never granted (the request was aborted).
    pub fn cancel_reads(&mut self) {
        self.reads.clear();
    }

    /// Hand over writes (per drive). All or nothing: if they would exceed the backlog bound,
    /// nothing is taken and [`SchedError::Backpressure`] tells the engine to stall.
    pub fn enqueue_writes(&mut self, per_drive: &[u32]) -> Result<(), SchedError> {
        self.check_counts(per_drive)?;
        let requested: u64 = per_drive.iter().map(|&n| u64::from(n)).sum();
        let capacity = self.config.backlog_capacity_iocbs;
        if requested > capacity {
            return Err(SchedError::InvalidConfig(format!(
                "{requested} write IOCBs in one call can never fit a backlog of {capacity}"
            )));
        }
        let outstanding = self.outstanding_writes();
        if outstanding + requested > capacity {
            tracing::debug!(outstanding, requested, capacity, "write back-pressure");
            return Err(SchedError::Backpressure(Backpressure { outstanding, requested, capacity }));
        }
        for (d, &n) in self.drives.iter_mut().zip(per_drive) {
            d.queued_writes += u64::from(n);
        }
        Ok(())
    }

    fn prefill_slack(&self, shape: RequestShape, layer: u32) -> Result<SlackEntry, SchedError> {
        let entry = self.table.lookup(shape, layer)?;
        Ok(match &self.online {
            Some(o) => OnlineSlack::correct(entry, o.prefill_ratio(self.table.cell_of(shape))),
            None => entry,
        })
    }

    fn decode_slack(&self, context_tokens: u32) -> SlackEntry {
        let entry = self.table.decode_lookup(context_tokens);
        match &self.online {
            Some(o) => OnlineSlack::correct(entry, o.decode_ratio()),
            None => entry,
        }
    }

    /// Armed writes of an earlier window go back to the backlog: their deadline has passed.
    fn disarm_all(&mut self) {
        for d in &mut self.drives {
            d.queued_writes += d.armed_writes;
            d.armed_writes = 0;
        }
    }

    fn start_reads(&mut self, drive: usize, layer: u32, n: u64, issue: &mut Vec<Issue>) {
        let mut n = n;
        while n > 0 {
            let chunk = to_u32(n);
            n -= u64::from(chunk);
            let d = &mut self.drives[drive];
            if d.writes_in_flight > 0 {
                d.gated_reads.push_back((layer, chunk));
            } else {
                d.reads_in_flight = d.reads_in_flight.saturating_add(chunk);
                issue.push(Issue { drive, kind: IoKind::Read, iocbs: chunk, layer: Some(layer) });
            }
        }
    }

    fn start_writes(&mut self, drive: usize, n: u64, issue: &mut Vec<Issue>) {
        let d = &mut self.drives[drive];
        let n = n.min(u64::from(u32::MAX - d.writes_in_flight));
        if n == 0 {
            return;
        }
        d.queued_writes -= n;
        d.writes_in_flight += n as u32;
        issue.push(Issue { drive, kind: IoKind::Write, iocbs: n as u32, layer: None });
    }

    /// Grant deferred writes into a window of `usable_ns` starting now, within `budget` IOCBs.
    fn grant_writes(&mut self, now_ns: u64, usable_ns: f64, budget: u64, issue: &mut Vec<Issue>) -> u64 {
        let rates = self.config.rates;
        let want: Vec<u64> = self
            .drives
            .iter()
            .map(|d| d.queued_writes.min(rates.fitting(IoKind::Write, usable_ns - d.busy_ns(&rates))))
            .collect();
        let grants = fair_share(&want, budget);
        let deadline = now_ns.saturating_add(usable_ns.max(0.0) as u64);
        for (drive, &g) in grants.iter().enumerate() {
            if g == 0 {
                continue;
            }
            if self.drives[drive].has_reads() {
                let d = &mut self.drives[drive];
                d.queued_writes -= g;
                d.armed_writes += g;
                d.armed_deadline_ns = deadline;
            } else {
                self.start_writes(drive, g, issue);
            }
        }
        grants.iter().sum()
    }

    /// Algorithm 3, one layer: call when the engine is about to compute `layer` at `now_ns`.
    pub fn plan_prefill_layer(
        &mut self,
        shape: RequestShape,
        layer: u32,
        now_ns: u64,
    ) -> Result<LayerPlan, SchedError> {
        self.check_layer(layer)?;
        let slack = self.prefill_slack(shape, layer)?;
        self.disarm_all();
        let mut issue = Vec::new();

        // Reads of this layer (or, if the engine skipped ahead, of earlier ones) are overdue.
        let mut overdue_reads = 0;
        let later = self.reads.split_off(&(layer + 1));
        let overdue = std::mem::replace(&mut self.reads, later);
        for (l, q) in overdue {
            for (drive, n) in q.into_iter().enumerate() {
                overdue_reads += n;
                self.start_reads(drive, l, n, &mut issue);
            }
        }

        let mut reads = 0;
        let next = layer + 1;
        if let Some(q) = self.reads.remove(&next) {
            let grants = fair_share(&q, u64::from(slack.max_iocbs));
            for (drive, &g) in grants.iter().enumerate() {
                self.start_reads(drive, next, g, &mut issue);
            }
            reads = grants.iter().sum();
            let left: Vec<u64> = q.iter().zip(&grants).map(|(w, g)| w - g).collect();
            if left.iter().any(|&n| n > 0) {
                self.reads.insert(next, left);
            }
        }

        let usable = slack.window_ns as f64 * (1.0 - self.config.write_guard);
        let budget = u64::from(slack.max_iocbs).saturating_sub(reads);
        let writes = self.grant_writes(now_ns, usable, budget, &mut issue);
        let deferred_writes = self.queued_writes();
        tracing::debug!(
            layer,
            window_ns = slack.window_ns,
            overdue_reads,
            reads,
            writes,
            deferred_writes,
            "prefill plan"
        );
        Ok(LayerPlan { layer, slack, issue, overdue_reads, reads, writes, deferred_writes })
    }

    /// Algorithm 4, one step: deferred writes into the decode step's slack.
    pub fn plan_decode_step(&mut self, context_tokens: u32, now_ns: u64) -> DecodePlan {
        let slack = self.decode_slack(context_tokens);
        self.disarm_all();
        let mut issue = Vec::new();
        let usable = slack.window_ns as f64 * (1.0 - self.config.write_guard);
        let writes = self.grant_writes(now_ns, usable, u64::from(slack.max_iocbs), &mut issue);
        let deferred_writes = self.queued_writes();
        tracing::trace!(context_tokens, window_ns = slack.window_ns, writes, deferred_writes, "decode plan");
        DecodePlan { slack, issue, writes, deferred_writes }
    }

    /// The engine is stalled (back-pressure, or idle): issue up to `needed` deferred writes on
    /// drives without reads, regardless of slack. `u64::MAX` flushes everything possible.
    pub fn relieve(&mut self, needed: u64) -> Vec<Issue> {
        self.disarm_all();
        let want: Vec<u64> =
            self.drives.iter().map(|d| if d.has_reads() { 0 } else { d.queued_writes }).collect();
        let grants = fair_share(&want, needed);
        let mut issue = Vec::new();
        for (drive, &g) in grants.iter().enumerate() {
            self.start_writes(drive, g, &mut issue);
        }
        issue
    }

    /// `n` IOCBs of `kind` completed on `drive` at `now_ns`. Returns what may start now: reads
    /// held behind the drive's writes, or writes armed behind its reads (trimmed to what still
    /// fits before the window's deadline; the rest goes back to the backlog).
    pub fn complete(
        &mut self,
        drive: usize,
        kind: IoKind,
        n: u32,
        now_ns: u64,
    ) -> Result<Vec<Issue>, SchedError> {
        let rates = self.config.rates;
        let drives = self.drives.len();
        let d = self.drives.get_mut(drive).ok_or(SchedError::NoSuchDrive { drive, drives })?;
        let in_flight = match kind {
            IoKind::Read => &mut d.reads_in_flight,
            IoKind::Write => &mut d.writes_in_flight,
        };
        if n > *in_flight {
            return Err(SchedError::CompletionMismatch { drive, kind, completed: n, in_flight: *in_flight });
        }
        *in_flight -= n;
        let mut issue = Vec::new();
        if d.writes_in_flight == 0 {
            while let Some((layer, n)) = d.gated_reads.pop_front() {
                d.reads_in_flight = d.reads_in_flight.saturating_add(n);
                issue.push(Issue { drive, kind: IoKind::Read, iocbs: n, layer: Some(layer) });
            }
        }
        if !d.has_reads() && d.armed_writes > 0 {
            let left_ns = d.armed_deadline_ns.saturating_sub(now_ns) as f64;
            let fit = d.armed_writes.min(rates.fitting(IoKind::Write, left_ns));
            d.queued_writes += d.armed_writes;
            d.armed_writes = 0;
            self.start_writes(drive, fit, &mut issue);
        }
        Ok(issue)
    }

    /// Online slack: `layer` of a prefill with `shape` computed for `compute_ns`.
    pub fn observe_layer(
        &mut self,
        shape: RequestShape,
        layer: u32,
        compute_ns: u64,
    ) -> Result<(), SchedError> {
        let profiled = self.table.lookup(shape, layer)?.window_ns;
        let cell = self.table.cell_of(shape);
        if let Some(o) = &mut self.online {
            o.observe_prefill(cell, profiled, compute_ns);
        }
        Ok(())
    }

    /// Online slack: a decode step with `context_tokens` computed for `step_ns`.
    pub fn observe_decode(&mut self, context_tokens: u32, step_ns: u64) {
        let profiled = self.table.decode_lookup(context_tokens).window_ns;
        if let Some(o) = &mut self.online {
            o.observe_decode(profiled, step_ns);
        }
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
