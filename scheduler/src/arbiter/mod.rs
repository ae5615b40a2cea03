//! The policy on real I/O: an arbiter that an I/O path asks, for every unit it is about to hand
//! to the drives (one layer of one load or store job), whether it may go now.
//!
//! It applies paper Algorithms 3 and 4 to units instead of simulated IOCBs:
//! - **Per-drive arbitration** ([`Mode::Arbitrate`] and up): a unit never starts on a drive that
//!   has a unit of the other direction in flight; a write does not start on a drive with a read
//!   in flight or waiting ("ready"), so a ready read never waits behind a write that started after
//!   it was ready. Reads start as soon as their drives carry no writes.
//! - **Slack** ([`Mode::Slack`], [`Mode::SlackOnline`]): a write starts only inside a compute
//!   window the engine announced (a prefill layer or a decode step), when each of its drives,
//!   after the reads already given to it, still finishes the write before the window's end (less
//!   a guard), and when the window's IOCB budget (the slack table's, after reads) covers it. The
//!   rest waits for later windows, decode steps above all (Algorithm 4). `SlackOnline` corrects the
//!   table's windows from the observed layer and step times ([`crate::OnlineSlack`], policy d).
//! - **No timings, no slack policy**: until the engine reports a compute window, and whenever it
//!   has reported none for [`ArbiterConfig::idle_after_ns`] (it is idle or gives no timings), the
//!   slack test is skipped and writes only obey the arbitration. [`Arbiter::policy`] says which
//!   is in force and why; a `tracing` event marks each change.
//! - **Bounded backlog**: stores are accepted with their bytes of engine memory
//!   ([`Arbiter::accept_store`]); the bytes are held until every unit of the store finished or
//!   the store is forgotten. Beyond [`ArbiterConfig::backlog_bytes`] a store is refused
//!   ([`BacklogFull::Backpressure`]: the engine keeps its pages and retries) or dropped
//!   ([`BacklogFull::Drop`]: its blocks are not stored and are later misses), and counted.
//! - **Urgent**: a unit the engine blocks on (it waits for the job) skips the slack test, never
//!   the arbitration, so every deferred write is eventually written.
//!
//! - **Across processes** ([`Arbiter::set_peers`]): with the arbiters of other engine processes
//!   on the same drives attached, a unit the local policy lets go starts only when no peer has
//!   the other direction in flight on its drives (nor, for a write, a read ready); otherwise it
//!   waits and counts in [`ArbiterStats::xproc_waits`]. `Mode::Pass` ignores the peers.
//!
//! The arbiter keeps no clock: every call carries `now_ns`. It can record every decision
//! ([`Arbiter::record`]) so tests check the invariants from the log, not from timings.

mod peers;
#[cfg(test)]
mod tests;
mod types;

pub use peers::{DriveCounts, PeerVerdict, Peers};
pub use types::{
    ArbiterConfig, ArbiterStats, BacklogFull, Decision, Event, Mode, PolicyOff, PolicyState, Unit,
};

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::online::OnlineSlack;
use crate::table::{SlackEntry, SlackTable};
use crate::{IoKind, RequestShape, SchedError};

/// Stop recording past this many events (a forgotten `record(true)` cannot grow without bound).
const MAX_EVENTS: usize = 1 << 20;

#[derive(Debug, Clone, Copy, Default)]
struct DriveState {
    reads_in_flight: u32,
    writes_in_flight: u32,
    /// Reads asked for and not yet started.
    reads_ready: u32,
    /// Estimated time this drive finishes what was given to it.
    busy_until_ns: u64,
}

#[derive(Debug, Clone, Copy)]
enum WindowKind {
    Prefill { shape: RequestShape, layer: u32 },
    Decode { context_tokens: u32 },
}

#[derive(Debug, Clone, Copy)]
struct Window {
    kind: WindowKind,
    start_ns: u64,
    /// Last moment a write may still be running.
    write_end_ns: u64,
    iocbs_left: u64,
}

#[derive(Debug, Clone)]
struct Store {
    bytes_left: u64,
}

#[derive(Debug, Clone)]
pub struct Arbiter {
    config: ArbiterConfig,
    table: Option<SlackTable>,
    online: Option<OnlineSlack>,
    drives: Vec<DriveState>,
    /// Reads asked for, not yet started: (job, layer) → drives.
    ready: BTreeMap<(u64, u32), Vec<usize>>,
    /// Units started, not yet completed.
    running: HashMap<(u64, u32), Unit>,
    stores: HashMap<u64, Store>,
    /// Stores accepted and not yet bound to a job: key → bytes.
    accepted: HashMap<u64, u64>,
    next_store: u64,
    window: Option<Window>,
    last_window_ns: Option<u64>,
    slack_was_active: bool,
    stats: ArbiterStats,
    seq: u64,
    log: Option<Vec<Event>>,
    /// Arbiters of other processes on the same drives.
    peers: Option<Arc<dyn Peers>>,
}

fn touched(drive_bytes: &[u64]) -> Vec<usize> {
    drive_bytes.iter().enumerate().filter(|(_, &b)| b > 0).map(|(d, _)| d).collect()
}

impl Arbiter {
    /// `table` is required by the slack modes and must be for `layers` layers.
    pub fn new(config: ArbiterConfig, table: Option<SlackTable>) -> Result<Self, SchedError> {
        config.validate()?;
        let slack = matches!(config.mode, Mode::Slack | Mode::SlackOnline);
        if slack && table.is_none() {
            return Err(SchedError::InvalidConfig(format!(
                "mode {} needs a slack table (`tutti profile`)",
                config.mode
            )));
        }
        let online =
            if config.mode == Mode::SlackOnline { Some(OnlineSlack::new(config.online)?) } else { None };
        Ok(Arbiter {
            drives: vec![DriveState::default(); config.drives],
            config,
            table,
            online,
            ready: BTreeMap::new(),
            running: HashMap::new(),
            stores: HashMap::new(),
            accepted: HashMap::new(),
            next_store: 1,
            window: None,
            last_window_ns: None,
            slack_was_active: false,
            stats: ArbiterStats::default(),
            seq: 0,
            log: None,
            peers: None,
        })
    }

    /// Attaches (or with `None` detaches) the arbiters of other processes on the same drives;
    /// this arbiter's counts on every drive are announced at once.
    pub fn set_peers(&mut self, peers: Option<Arc<dyn Peers>>) {
        self.peers = peers;
        self.publish(0..self.drives.len());
    }

    /// The peers attached with [`Arbiter::set_peers`].
    pub fn peers(&self) -> Option<&Arc<dyn Peers>> {
        self.peers.as_ref()
    }

    fn counts(&self, d: usize) -> DriveCounts {
        let s = &self.drives[d];
        DriveCounts {
            reads_in_flight: s.reads_in_flight,
            writes_in_flight: s.writes_in_flight,
            reads_ready: s.reads_ready,
        }
    }

    /// Announces this arbiter's counts on `drives` to the peers.
    fn publish(&self, drives: impl IntoIterator<Item = usize>) {
        if let Some(p) = &self.peers {
            for d in drives {
                p.publish(d, self.counts(d));
            }
        }
    }

    /// Whether the peers let `unit` start on `drives`: the unit is announced in flight first,
    /// then the peers are read (announce-then-check, see [`Peers`]); when they forbid it, the
    /// announcement is taken back.
    fn peers_allow(&self, unit: &Unit, drives: &[usize], now_ns: u64) -> bool {
        let Some(p) = &self.peers else {
            return true;
        };
        if self.config.mode == Mode::Pass {
            return true;
        }
        for &d in drives {
            let mut c = self.counts(d);
            match unit.kind {
                IoKind::Read => c.reads_in_flight = c.reads_in_flight.saturating_add(1),
                IoKind::Write => c.writes_in_flight = c.writes_in_flight.saturating_add(1),
            }
            p.publish(d, c);
        }
        if p.check(unit.kind, drives, now_ns) == PeerVerdict::Clear {
            return true;
        }
        self.publish(drives.iter().copied());
        false
    }

    pub fn config(&self) -> &ArbiterConfig {
        &self.config
    }

    pub fn stats(&self) -> ArbiterStats {
        self.stats.clone()
    }

    /// Starts (or stops) recording every decision; returns what was recorded so far.
    pub fn record(&mut self, on: bool) -> Vec<Event> {
        let was = if on { self.log.replace(Vec::new()) } else { self.log.take() };
        was.unwrap_or_default()
    }

    fn log(&mut self, e: impl FnOnce(u64) -> Event) {
        self.seq += 1;
        let seq = self.seq;
        if let Some(log) = &mut self.log {
            if log.len() < MAX_EVENTS {
                log.push(e(seq));
            }
        }
    }

    fn slack_mode(&self) -> bool {
        matches!(self.config.mode, Mode::Slack | Mode::SlackOnline)
    }

    fn idle(&self, now_ns: u64) -> bool {
        self.last_window_ns.is_none_or(|t| now_ns.saturating_sub(t) >= self.config.idle_after_ns)
    }

    /// The policy in force at `now_ns`.
    pub fn policy(&self, now_ns: u64) -> PolicyState {
        let mode = self.config.mode;
        let off = if !self.slack_mode() {
            Some(PolicyOff::Mode)
        } else if self.last_window_ns.is_none() {
            Some(PolicyOff::NoTimings)
        } else if self.idle(now_ns) {
            Some(PolicyOff::Idle)
        } else {
            None
        };
        let off_reason = off.map(|o| match o {
            PolicyOff::Mode => format!("mode {mode}: writes are not held for slack"),
            PolicyOff::NoTimings => "the engine gave no layer or decode timings".to_string(),
            PolicyOff::Idle => {
                format!("the engine gave no timings for {} ms (idle)", self.config.idle_after_ns / 1_000_000)
            }
        });
        PolicyState { mode, slack_active: off.is_none(), off, off_reason }
    }

    fn note_policy(&mut self, now_ns: u64) {
        let p = self.policy(now_ns);
        if p.slack_active != self.slack_was_active {
            self.slack_was_active = p.slack_active;
            match &p.off_reason {
                None => tracing::info!(mode = %p.mode, "slack policy on: the engine gives timings"),
                Some(why) => tracing::info!(mode = %p.mode, reason = %why, "slack policy off"),
            }
        }
    }

    fn slack_entry(&self, kind: WindowKind) -> Result<Option<SlackEntry>, SchedError> {
        let Some(table) = &self.table else {
            return Ok(None);
        };
        Ok(Some(match kind {
            WindowKind::Prefill { shape, layer } => {
                let e = table.lookup(shape, layer)?;
                match &self.online {
                    Some(o) => OnlineSlack::correct(e, o.prefill_ratio(table.cell_of(shape))),
                    None => e,
                }
            }
            WindowKind::Decode { context_tokens } => {
                let e = table.decode_lookup(context_tokens);
                match &self.online {
                    Some(o) => OnlineSlack::correct(e, o.decode_ratio()),
                    None => e,
                }
            }
        }))
    }

    fn open_window(&mut self, kind: WindowKind, now_ns: u64) -> Result<(), SchedError> {
        let entry = self.slack_entry(kind)?;
        let (usable, iocbs) = match entry {
            Some(e) => (e.window_ns as f64 * (1.0 - self.config.write_guard), u64::from(e.max_iocbs)),
            None => (0.0, 0),
        };
        self.window = Some(Window {
            kind,
            start_ns: now_ns,
            write_end_ns: now_ns.saturating_add(usable as u64),
            iocbs_left: iocbs,
        });
        self.last_window_ns = Some(now_ns);
        self.note_policy(now_ns);
        Ok(())
    }

    fn close_window(&mut self, now_ns: u64) {
        self.window = None;
        self.last_window_ns = Some(now_ns);
    }

    /// The engine starts computing `layer` of a prefill of `shape`: a window for writes.
    pub fn layer_start(&mut self, shape: RequestShape, layer: u32, now_ns: u64) -> Result<(), SchedError> {
        if let Some(t) = &self.table {
            if layer >= t.layers() {
                return Err(SchedError::LayerOutOfRange { layer, layers: t.layers() });
            }
        }
        self.stats.prefill_windows += 1;
        self.open_window(WindowKind::Prefill { shape, layer }, now_ns)
    }

    /// The engine finished computing `layer`: the window closes; its length corrects the slack.
    pub fn layer_end(&mut self, layer: u32, now_ns: u64) -> Result<(), SchedError> {
        if let Some(Window { kind: WindowKind::Prefill { shape, layer: open }, start_ns, .. }) = self.window {
            if open == layer {
                if let (Some(o), Some(t)) = (&mut self.online, &self.table) {
                    let profiled = t.lookup(shape, layer)?.window_ns;
                    o.observe_prefill(t.cell_of(shape), profiled, now_ns.saturating_sub(start_ns));
                }
            }
        }
        self.close_window(now_ns);
        Ok(())
    }

    /// A decode step over `context_tokens` of KV starts: a window for deferred writes.
    pub fn decode_start(&mut self, context_tokens: u32, now_ns: u64) -> Result<(), SchedError> {
        self.stats.decode_windows += 1;
        self.open_window(WindowKind::Decode { context_tokens }, now_ns)
    }

    /// The decode step ended.
    pub fn decode_end(&mut self, now_ns: u64) {
        if let Some(Window { kind: WindowKind::Decode { context_tokens }, start_ns, .. }) = self.window {
            if let (Some(o), Some(t)) = (&mut self.online, &self.table) {
                let profiled = t.decode_lookup(context_tokens).window_ns;
                o.observe_decode(profiled, now_ns.saturating_sub(start_ns));
            }
        }
        self.close_window(now_ns);
    }

    /// Bytes of engine memory held by stores not yet written.
    pub fn backlog_bytes(&self) -> u64 {
        self.stats.backlog_bytes
    }

    /// A store of `bytes` (all its layers) is about to be submitted. Returns its key for
    /// [`Arbiter::bind_store`], `Ok(None)` if it was dropped (backlog full, `BacklogFull::Drop`),
    /// or [`SchedError::BacklogFull`] (`BacklogFull::Backpressure`). Nothing is held on an error.
    pub fn accept_store(&mut self, bytes: u64) -> Result<Option<u64>, SchedError> {
        let held = self.stats.backlog_bytes;
        let capacity = self.config.backlog_bytes;
        let fits = self.config.mode == Mode::Pass || held.saturating_add(bytes) <= capacity;
        let key = self.next_store;
        self.next_store += 1;
        if !fits {
            match self.config.on_full {
                BacklogFull::Backpressure => {
                    self.stats.stores_refused += 1;
                    tracing::debug!(held, bytes, capacity, "store refused: write backlog full");
                    return Err(SchedError::BacklogFull { held, requested: bytes, capacity });
                }
                BacklogFull::Drop => {
                    self.stats.stores_dropped += 1;
                    self.stats.bytes_dropped += bytes;
                    tracing::info!(held, bytes, capacity, "store dropped: write backlog full");
                    return Ok(None);
                }
            }
        }
        self.accepted.insert(key, bytes);
        self.stats.backlog_bytes += bytes;
        self.stats.backlog_peak_bytes = self.stats.backlog_peak_bytes.max(self.stats.backlog_bytes);
        let held = self.stats.backlog_bytes;
        self.log(|seq| Event::Accept { seq, job: key, bytes, held });
        Ok(Some(key))
    }

    /// The store accepted as `key` became job `job` of the I/O path.
    pub fn bind_store(&mut self, key: u64, job: u64) -> Result<(), SchedError> {
        let bytes = self.accepted.remove(&key).ok_or(SchedError::UnknownUnit { what: "store", id: key })?;
        self.stores.insert(job, Store { bytes_left: bytes });
        Ok(())
    }

    /// The store accepted as `key` was not submitted after all: its bytes are released.
    pub fn withdraw_store(&mut self, key: u64) {
        if let Some(bytes) = self.accepted.remove(&key) {
            self.stats.backlog_bytes = self.stats.backlog_bytes.saturating_sub(bytes);
            let held = self.stats.backlog_bytes;
            self.log(|seq| Event::Release { seq, job: key, bytes, held });
        }
    }

    fn release(&mut self, job: u64, bytes: u64) {
        let Some(s) = self.stores.get_mut(&job) else {
            return;
        };
        let bytes = bytes.min(s.bytes_left);
        s.bytes_left -= bytes;
        if s.bytes_left == 0 {
            self.stores.remove(&job);
        }
        self.stats.backlog_bytes = self.stats.backlog_bytes.saturating_sub(bytes);
        let held = self.stats.backlog_bytes;
        if bytes > 0 {
            self.log(|seq| Event::Release { seq, job, bytes, held });
        }
    }

    /// May `unit` start now? `urgent`: the engine blocks on it (skips the slack test only).
    pub fn request(&mut self, unit: &Unit, urgent: bool, now_ns: u64) -> Result<Decision, SchedError> {
        if unit.drive_bytes.len() != self.drives.len() {
            return Err(SchedError::DriveCount { expected: self.drives.len(), got: unit.drive_bytes.len() });
        }
        let key = (unit.job, unit.layer);
        if self.running.contains_key(&key) {
            return Err(SchedError::InvalidConfig(format!(
                "job {} layer {} asked for while it runs",
                unit.job, unit.layer
            )));
        }
        let drives = touched(&unit.drive_bytes);
        let arbitrate = self.config.mode != Mode::Pass;
        let decision = match unit.kind {
            IoKind::Read => {
                if !self.ready.contains_key(&key) {
                    for &d in &drives {
                        self.drives[d].reads_ready += 1;
                    }
                    self.ready.insert(key, drives.clone());
                    // Peers' writes defer to this read from now on.
                    self.publish(drives.iter().copied());
                    let (job, layer, ds) = (unit.job, unit.layer, drives.clone());
                    self.log(|seq| Event::Ready { seq, job, layer, drives: ds });
                }
                if arbitrate && drives.iter().any(|&d| self.drives[d].writes_in_flight > 0) {
                    self.stats.read_waits += 1;
                    Decision::Wait
                } else {
                    Decision::Go
                }
            }
            IoKind::Write => {
                let reads = |d: &DriveState| d.reads_in_flight > 0 || d.reads_ready > 0;
                if arbitrate && drives.iter().any(|&d| reads(&self.drives[d])) {
                    self.stats.write_waits_for_reads += 1;
                    Decision::Wait
                } else if urgent || !self.policy(now_ns).slack_active {
                    if self.slack_mode() {
                        self.stats.writes_urgent_or_idle += 1;
                    }
                    Decision::Go
                } else if self.fits_window(unit, now_ns) {
                    Decision::Go
                } else {
                    self.stats.write_waits_for_slack += 1;
                    Decision::Wait
                }
            }
        };
        if decision == Decision::Go && !self.peers_allow(unit, &drives, now_ns) {
            self.stats.xproc_waits += 1;
            return Ok(Decision::Wait);
        }
        if decision == Decision::Go {
            self.start(unit, &drives, now_ns);
        }
        Ok(decision)
    }

    fn iocbs(&self, unit: &Unit) -> u64 {
        unit.drive_bytes.iter().sum::<u64>().div_ceil(self.config.rates.iocb_bytes)
    }

    /// Each drive of `unit`, after what it was given already, finishes the write before the
    /// window's end, and the window's IOCBs cover it.
    fn fits_window(&self, unit: &Unit, now_ns: u64) -> bool {
        let Some(w) = self.window else {
            return false;
        };
        if self.iocbs(unit) > w.iocbs_left {
            return false;
        }
        let rates = &self.config.rates;
        unit.drive_bytes.iter().zip(&self.drives).all(|(&b, d)| {
            if b == 0 {
                return true;
            }
            let t = rates.time_ns(IoKind::Write, b.div_ceil(rates.iocb_bytes));
            d.busy_until_ns.max(now_ns) as f64 + t <= w.write_end_ns as f64
        })
    }

    fn start(&mut self, unit: &Unit, drives: &[usize], now_ns: u64) {
        let key = (unit.job, unit.layer);
        let rates = self.config.rates;
        let iocbs = self.iocbs(unit);
        let mut mixed = false;
        if unit.kind == IoKind::Read && self.ready.remove(&key).is_some() {
            for &d in drives {
                self.drives[d].reads_ready = self.drives[d].reads_ready.saturating_sub(1);
            }
        }
        for &d in drives {
            let b = unit.drive_bytes[d];
            let st = &mut self.drives[d];
            let t = rates.time_ns(unit.kind, b.div_ceil(rates.iocb_bytes));
            st.busy_until_ns = (st.busy_until_ns.max(now_ns) as f64 + t) as u64;
            match unit.kind {
                IoKind::Read => {
                    mixed |= st.writes_in_flight > 0;
                    st.reads_in_flight += 1;
                }
                IoKind::Write => {
                    mixed |= st.reads_in_flight > 0;
                    st.writes_in_flight += 1;
                }
            }
        }
        if let Some(w) = &mut self.window {
            w.iocbs_left = w.iocbs_left.saturating_sub(iocbs);
        }
        let bytes: u64 = unit.drive_bytes.iter().sum();
        match unit.kind {
            IoKind::Read => {
                self.stats.reads_issued += 1;
                self.stats.read_bytes += bytes;
            }
            IoKind::Write => {
                self.stats.writes_issued += 1;
                self.stats.write_bytes += bytes;
                if matches!(self.window, Some(Window { kind: WindowKind::Decode { .. }, .. })) {
                    self.stats.writes_in_decode += 1;
                }
            }
        }
        self.stats.mixed_issues += u64::from(mixed);
        let in_flight: Vec<(u32, u32)> = drives
            .iter()
            .map(|&d| (self.drives[d].reads_in_flight, self.drives[d].writes_in_flight))
            .collect();
        let (job, layer, kind, ds) = (unit.job, unit.layer, unit.kind, drives.to_vec());
        self.log(|seq| Event::Issue { seq, job, layer, kind, drives: ds, in_flight });
        self.running.insert(key, unit.clone());
        self.publish(drives.iter().copied());
    }

    /// The unit `(job, layer)` finished (successfully or not).
    pub fn complete(&mut self, job: u64, layer: u32) -> Result<(), SchedError> {
        let unit = self
            .running
            .remove(&(job, layer))
            .ok_or(SchedError::UnknownUnit { what: "running unit of job", id: job })?;
        let drives = touched(&unit.drive_bytes);
        for &d in &drives {
            let st = &mut self.drives[d];
            match unit.kind {
                IoKind::Read => st.reads_in_flight = st.reads_in_flight.saturating_sub(1),
                IoKind::Write => st.writes_in_flight = st.writes_in_flight.saturating_sub(1),
            }
            if st.reads_in_flight == 0 && st.writes_in_flight == 0 {
                // Nothing left on the drive: the estimate of when it is free is moot.
                st.busy_until_ns = 0;
            }
        }
        self.publish(drives);
        if unit.kind == IoKind::Write {
            self.release(job, unit.drive_bytes.iter().sum());
        }
        let kind = unit.kind;
        self.log(|seq| Event::Complete { seq, job, layer, kind });
        Ok(())
    }

    /// The job is done or gone: its ready reads are withdrawn and its store bytes released
    /// (units still running stay until [`Arbiter::complete`]).
    pub fn forget(&mut self, job: u64) {
        let keys: Vec<(u64, u32)> = self.ready.range((job, 0)..=(job, u32::MAX)).map(|(k, _)| *k).collect();
        for k in keys {
            if let Some(drives) = self.ready.remove(&k) {
                for &d in &drives {
                    self.drives[d].reads_ready = self.drives[d].reads_ready.saturating_sub(1);
                }
                self.publish(drives);
            }
        }
        let running_bytes: u64 = self
            .running
            .iter()
            .filter(|((j, _), u)| *j == job && u.kind == IoKind::Write)
            .map(|(_, u)| u.drive_bytes.iter().sum::<u64>())
            .sum();
        if let Some(left) = self.stores.get(&job).map(|s| s.bytes_left) {
            self.release(job, left.saturating_sub(running_bytes));
        }
    }

    /// Drops every job whose id is below `bound`, as if it had never been asked for: its ready
    /// reads are withdrawn, its running units taken off their drives, its store bytes released.
    /// For jobs whose completions will never come (a client of tuttid that reconnected: the
    /// old connection's queue pairs, and the units in flight on them, are gone with the old
    /// daemon). A late [`Arbiter::complete`] of such a unit is an `UnknownUnit` error, nothing
    /// more. Returns how many units (ready or running) were dropped.
    pub fn abandon_before(&mut self, bound: u64) -> usize {
        let running: Vec<(u64, u32)> = self.running.keys().filter(|(j, _)| *j < bound).copied().collect();
        let ready = self.ready.range(..(bound, 0)).count();
        // As if each running unit had completed (a write's bytes released with it), then each
        // job were forgotten (its ready reads withdrawn, the rest of its store bytes released).
        for &(job, layer) in &running {
            let _ = self.complete(job, layer);
        }
        let mut jobs: Vec<u64> = self.ready.range(..(bound, 0)).map(|(k, _)| k.0).collect();
        jobs.extend(self.stores.keys().filter(|j| **j < bound));
        jobs.sort_unstable();
        jobs.dedup();
        for job in jobs {
            self.forget(job);
        }
        let dropped = running.len() + ready;
        if dropped > 0 {
            tracing::info!(bound, dropped, "scheduler dropped the units of jobs that will not complete");
        }
        dropped
    }

    /// Per drive: (reads in flight, writes in flight, reads ready).
    pub fn drive_state(&self) -> Vec<(u32, u32, u32)> {
        self.drives.iter().map(|d| (d.reads_in_flight, d.writes_in_flight, d.reads_ready)).collect()
    }
}
