//! The four policies as the simulated engine sees them.

use crate::policy::{Issue, Scheduler};
use crate::sim::io::{Io, RequestIo};
use crate::sim::ssd::Completion;
use crate::sim::{PolicyKind, SimConfig};
use crate::table::SlackTable;
use crate::{IoKind, SchedError};

/// Hooks the engine calls; a policy decides what to submit at each.
pub(crate) trait SimPolicy {
    /// Layer `l` may compute only when every layer's reads completed (policy (a)).
    fn waits_for_all_reads(&self) -> bool {
        false
    }
    fn request_start(&mut self, io: &mut Io, req: &RequestIo) -> Result<(), SchedError>;
    fn layer_begin(&mut self, io: &mut Io, req: &RequestIo, layer: u32) -> Result<(), SchedError>;
    fn layer_end(
        &mut self,
        io: &mut Io,
        req: &RequestIo,
        layer: u32,
        compute_ns: f64,
    ) -> Result<(), SchedError>;
    /// Take these writes (per drive); `Ok(false)` is back-pressure: stall and retry.
    fn offer_writes(&mut self, io: &mut Io, per_drive: &[u32]) -> Result<bool, SchedError>;
    fn decode_begin(&mut self, io: &mut Io, context_tokens: u32) -> Result<(), SchedError>;
    fn decode_end(&mut self, io: &mut Io, context_tokens: u32, step_ns: f64);
    fn on_complete(&mut self, io: &mut Io, c: &Completion) -> Result<(), SchedError>;
    /// The GPU is stalled or idle: submit up to `needed` held-back writes.
    fn relieve(&mut self, io: &mut Io, needed: u64) -> Result<(), SchedError>;
    /// Writes accepted and not yet completed.
    fn outstanding_writes(&self, io: &Io) -> u64;
}

pub(crate) fn make(
    kind: PolicyKind,
    cfg: &SimConfig,
    table: &SlackTable,
) -> Result<Box<dyn SimPolicy>, SchedError> {
    let capacity = cfg.scheduler_config().backlog_capacity_iocbs;
    Ok(match kind {
        PolicyKind::LoadAll => Box::new(Eager { capacity, load_all: true }),
        PolicyKind::Interleaved => Box::new(Eager { capacity, load_all: false }),
        PolicyKind::SlackAware | PolicyKind::SlackOnline => {
            let mut s = Scheduler::new(table.clone(), cfg.scheduler_config())?;
            if kind == PolicyKind::SlackOnline {
                s = s.with_online_slack(cfg.online)?;
            }
            Box::new(SlackPolicy { scheduler: s })
        }
    })
}

fn issue_reads(io: &mut Io, per_drive: &[u32], layer: u32) -> Result<(), SchedError> {
    for (drive, &n) in per_drive.iter().enumerate() {
        io.issue(Issue { drive, kind: IoKind::Read, iocbs: n, layer: Some(layer) })?;
    }
    Ok(())
}

/// (a) and (b): everything goes to the drives as soon as it exists; no budgets.
struct Eager {
    capacity: u64,
    load_all: bool,
}

impl SimPolicy for Eager {
    fn waits_for_all_reads(&self) -> bool {
        self.load_all
    }

    fn request_start(&mut self, io: &mut Io, req: &RequestIo) -> Result<(), SchedError> {
        let upto = if self.load_all { req.reads.len() } else { 1.min(req.reads.len()) };
        for (layer, per_drive) in req.reads.iter().enumerate().take(upto) {
            issue_reads(io, per_drive, layer as u32)?;
        }
        Ok(())
    }

    fn layer_begin(&mut self, io: &mut Io, req: &RequestIo, layer: u32) -> Result<(), SchedError> {
        if !self.load_all {
            if let Some(next) = req.reads.get(layer as usize + 1) {
                issue_reads(io, next, layer + 1)?;
            }
        }
        Ok(())
    }

    fn layer_end(&mut self, _: &mut Io, _: &RequestIo, _: u32, _: f64) -> Result<(), SchedError> {
        Ok(())
    }

    fn offer_writes(&mut self, io: &mut Io, per_drive: &[u32]) -> Result<bool, SchedError> {
        let n: u64 = per_drive.iter().map(|&n| u64::from(n)).sum();
        if io.writes_in_device() + n > self.capacity {
            return Ok(false);
        }
        for (drive, &iocbs) in per_drive.iter().enumerate() {
            io.issue(Issue { drive, kind: IoKind::Write, iocbs, layer: None })?;
        }
        Ok(true)
    }

    fn decode_begin(&mut self, _: &mut Io, _: u32) -> Result<(), SchedError> {
        Ok(())
    }

    fn decode_end(&mut self, _: &mut Io, _: u32, _: f64) {}

    fn on_complete(&mut self, _: &mut Io, _: &Completion) -> Result<(), SchedError> {
        Ok(())
    }

    fn relieve(&mut self, _: &mut Io, _: u64) -> Result<(), SchedError> {
        Ok(())
    }

    fn outstanding_writes(&self, io: &Io) -> u64 {
        io.writes_in_device()
    }
}

/// (c) and (d): the crate's [`Scheduler`], exactly as an engine would drive it.
struct SlackPolicy {
    scheduler: Scheduler,
}

impl SimPolicy for SlackPolicy {
    fn request_start(&mut self, _: &mut Io, req: &RequestIo) -> Result<(), SchedError> {
        for (layer, per_drive) in req.reads.iter().enumerate() {
            self.scheduler.enqueue_reads(layer as u32, per_drive)?;
        }
        Ok(())
    }

    fn layer_begin(&mut self, io: &mut Io, req: &RequestIo, layer: u32) -> Result<(), SchedError> {
        let plan = self.scheduler.plan_prefill_layer(req.shape, layer, io.now_ns())?;
        io.issue_all(&plan.issue)
    }

    fn layer_end(
        &mut self,
        _: &mut Io,
        req: &RequestIo,
        layer: u32,
        compute_ns: f64,
    ) -> Result<(), SchedError> {
        self.scheduler.observe_layer(req.shape, layer, compute_ns.round() as u64)
    }

    fn offer_writes(&mut self, _: &mut Io, per_drive: &[u32]) -> Result<bool, SchedError> {
        match self.scheduler.enqueue_writes(per_drive) {
            Ok(()) => Ok(true),
            Err(SchedError::Backpressure(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn decode_begin(&mut self, io: &mut Io, context_tokens: u32) -> Result<(), SchedError> {
        let plan = self.scheduler.plan_decode_step(context_tokens, io.now_ns());
        io.issue_all(&plan.issue)
    }

    fn decode_end(&mut self, _: &mut Io, context_tokens: u32, step_ns: f64) {
        self.scheduler.observe_decode(context_tokens, step_ns.round() as u64);
    }

    fn on_complete(&mut self, io: &mut Io, c: &Completion) -> Result<(), SchedError> {
        let released = self.scheduler.complete(c.drive, c.kind, c.iocbs, io.now_ns())?;
        io.issue_all(&released)
    }

    fn relieve(&mut self, io: &mut Io, needed: u64) -> Result<(), SchedError> {
        let issued = self.scheduler.relieve(needed);
        io.issue_all(&issued)
    }

    fn outstanding_writes(&self, _: &Io) -> u64 {
        self.scheduler.outstanding_writes()
    }
}
