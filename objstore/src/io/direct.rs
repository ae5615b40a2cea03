//! The CPU-driven baseline: the host builds, submits and reaps every command.
//!
//! One queue pair per drive; on a controller with no pair left (one that
//! grants a single I/O queue pair, say) a drive takes turns on the
//! controller's shared pair with the pool's metadata
//! (`Controller::shared_io_queue_pair`); a layer holds every pair it uses
//! from its first command to its last completion. A layer's commands are fed to all drives at
//! once, each queue kept full, completions reaped in batches. Every command's
//! data pointer is still the registered SGL descriptor (or, on a drive
//! without SGL support, PRP entries the driver builds from it), so the bytes
//! moved are exactly those of the gio_uring path; only who does the work differs.
//!
//! A command that times out may still be executed by the drive later. After
//! such a layer the queue pairs those commands went to are recovered
//! (`IoQueuePair::recover`: §5.6, Delete I/O Submission Queue completes only
//! after every command of the SQ was completed or aborted), which makes those
//! failures definite, as on the gio_uring path. When a recovery is turned off
//! or fails, they stay unknown.

use super::{
    layer_commands, note_failure, settle_by_recovery, sorted_failures, Cmd, Direction, FailureKind, LayerIo,
    LayerOutcome, LayerRequest, PairFailure,
};
use crate::error::{ObjError, Result};
use crate::registration::{KvMemoryKind, Registration};
use crate::stripe::StripeMap;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::MutexGuard;
use std::time::Instant;
use tutti_driver::command::{Command, DataMode};
use tutti_driver::controller::Controller;
use tutti_driver::queue::SharedQueuePair;
use tutti_driver::queue::{backoff, Completion, IoQueuePair};
use tutti_driver::transport::IovaSegment;
use tutti_driver::DriverError;

struct Lane {
    /// Index of its queue pair in `DirectIo::pairs`.
    slot: usize,
    nsid: u32,
    /// Commands of the current layer for this drive, in order.
    todo: Vec<u32>,
    next: usize,
    /// CID → command index of everything in flight.
    inflight: HashMap<u16, u32>,
}

pub struct DirectIo {
    lanes: Vec<Lane>,
    /// The queue pairs, each once: a drive's own, or its controller's shared one.
    pairs: Vec<Arc<SharedQueuePair>>,
    attached: Option<(Arc<Registration>, StripeMap)>,
    done: HashMap<u64, LayerOutcome>,
    next_token: u64,
    recover: bool,
}

impl DirectIo {
    /// One queue pair of `depth` entries on each drive (pool order), or the
    /// controller's shared pair where the controller has none left.
    pub fn new(drives: &[(Arc<Controller>, u32)], depth: u32, recover: bool) -> Result<Self> {
        let mut pairs: Vec<Arc<SharedQueuePair>> = Vec::new();
        let mut lanes = Vec::new();
        for (ctrl, nsid) in drives {
            let depth = depth.clamp(2, ctrl.info().max_queue_entries);
            let pair = if ctrl.free_io_queue_pairs() > 0 {
                Arc::new(std::sync::Mutex::new(ctrl.create_io_queue_pair(depth)?))
            } else {
                tracing::info!(device = %ctrl.name(), nsid, granted = ctrl.info().io_queue_pairs,
                    "no I/O queue pair left for the data path; sharing the controller's pair with metadata");
                ctrl.shared_io_queue_pair(depth)?
            };
            let slot = match pairs.iter().position(|p| Arc::ptr_eq(p, &pair)) {
                Some(i) => i,
                None => {
                    pairs.push(pair);
                    pairs.len() - 1
                }
            };
            lanes.push(Lane { slot, nsid: *nsid, todo: Vec::new(), next: 0, inflight: HashMap::new() });
        }
        Ok(DirectIo { lanes, pairs, attached: None, done: HashMap::new(), next_token: 1, recover })
    }

    fn run(
        &mut self,
        cmds: &[Cmd],
        dir: Direction,
        qps: &mut [MutexGuard<'_, IoQueuePair>],
    ) -> Result<LayerOutcome> {
        let mut out =
            LayerOutcome { commands: cmds.len() as u64, host_built: cmds.len() as u64, ..Default::default() };
        for l in &mut self.lanes {
            l.todo.clear();
            l.next = 0;
            l.inflight.clear();
        }
        for (i, c) in cmds.iter().enumerate() {
            let lane = self
                .lanes
                .get_mut(c.drive as usize)
                .ok_or(ObjError::Unknown { what: "pool drive", id: c.drive as u64 })?;
            lane.todo.push(i as u32);
        }
        let mut failed: HashMap<u32, PairFailure> = HashMap::new();
        // Pair → lanes its unknown-outcome commands went to.
        let mut unsettled: HashMap<u32, BTreeSet<usize>> = HashMap::new();
        let mut outstanding = 0usize;
        let mut reaped: Vec<Completion> = Vec::new();
        let mut spins = 0u32;
        let mut last_progress = Instant::now();
        loop {
            let mut progressed = false;
            for lane in &mut self.lanes {
                let qp = &mut qps[lane.slot];
                let mut submitted = false;
                while lane.next < lane.todo.len() && qp.free_slots() > 0 {
                    let idx = lane.todo[lane.next];
                    let c = &cmds[idx as usize];
                    lane.next += 1;
                    let cmd = match dir {
                        Direction::Load => Command::read(lane.nsid, c.lba, c.nlb),
                        Direction::Store => Command::write(lane.nsid, c.lba, c.nlb),
                    };
                    let seg = [IovaSegment { iova: c.desc.addr, len: c.desc.len as u64 }];
                    match qp.submit_data(cmd, &seg, DataMode::Auto, idx as u64) {
                        Ok(cid) => {
                            lane.inflight.insert(cid, idx);
                            outstanding += 1;
                            out.host_calls += 1;
                            submitted = true;
                        }
                        // Refused before reaching the submission queue.
                        Err(e) => note_failure(&mut failed, c.pair, PairFailure::definite(e.to_string())),
                    }
                }
                if submitted {
                    qp.ring();
                    out.host_calls += 1;
                }
            }
            for qp in qps.iter_mut() {
                reaped.clear();
                // Its submissions fail (definitely, never reaching the SQ); nothing is in flight.
                if qp.is_unusable() {
                    continue;
                }
                qp.reap(&mut reaped)?;
                for comp in &reaped {
                    // The token is the command's index; its drive is its lane.
                    let c = &cmds[comp.token as usize];
                    if let Some(lane) = self.lanes.get_mut(c.drive as usize) {
                        lane.inflight.remove(&comp.cid);
                    }
                    outstanding -= 1;
                    progressed = true;
                    if !comp.status.is_success() {
                        let why = format!(
                            "{} LBA {} on {}: {}",
                            if dir == Direction::Load { "Read" } else { "Write" },
                            c.lba,
                            qp.controller().name(),
                            comp.status
                        );
                        note_failure(&mut failed, c.pair, PairFailure::definite(why));
                    }
                }
            }
            let pending = self.lanes.iter().any(|l| l.next < l.todo.len());
            if outstanding == 0 && !pending {
                break;
            }
            if progressed {
                last_progress = Instant::now();
                spins = 0;
                continue;
            }
            let timeout = qps
                .first()
                .map_or(std::time::Duration::from_secs(10), |q| q.controller().options().io_timeout);
            if last_progress.elapsed() >= timeout {
                outstanding -= self.expire(cmds, &mut failed, &mut unsettled, qps)?;
                last_progress = Instant::now();
                continue;
            }
            backoff(&mut spins);
        }
        if self.recover && !unsettled.is_empty() {
            self.recover_lanes(&mut failed, &unsettled, &mut out, qps);
        }
        out.failed = sorted_failures(failed);
        Ok(out)
    }

    /// Recovers the queue pairs that unknown-outcome commands went to, and
    /// makes a pair's failure definite when every such lane recovered.
    fn recover_lanes(
        &mut self,
        failed: &mut HashMap<u32, PairFailure>,
        unsettled: &HashMap<u32, BTreeSet<usize>>,
        out: &mut LayerOutcome,
        qps: &mut [MutexGuard<'_, IoQueuePair>],
    ) {
        let lanes: BTreeSet<usize> = unsettled.values().flatten().copied().collect();
        let mut recovered = BTreeSet::new();
        let mut lost = BTreeMap::new();
        // A pair two lanes share is recovered once, for both.
        let mut done_slots: HashMap<usize, std::result::Result<(), String>> = HashMap::new();
        for &i in &lanes {
            let Some(lane) = self.lanes.get_mut(i) else { continue };
            if let Some(r) = done_slots.get(&lane.slot) {
                match r {
                    Ok(()) => {
                        lane.inflight.clear();
                        recovered.insert(i);
                    }
                    Err(e) => {
                        lost.insert(i, e.clone());
                    }
                }
                continue;
            }
            let result = qps[lane.slot].recover();
            done_slots.insert(lane.slot, result.as_ref().map(|_| ()).map_err(|e| e.to_string()));
            match result {
                Ok(r) => {
                    tracing::info!(
                        drive = i,
                        abandoned = r.abandoned,
                        outstanding = r.outstanding,
                        "queue pair recovered after commands of unknown outcome; their outcome is now known"
                    );
                    lane.inflight.clear();
                    recovered.insert(i);
                    out.recoveries += 1;
                }
                Err(e) => {
                    tracing::error!(drive = i, error = %e,
                        "queue pair recovery failed; outcomes of commands sent to it stay unknown");
                    lost.insert(i, e.to_string());
                    out.recovery_failures += 1;
                }
            }
        }
        for (p, ls) in unsettled {
            if let Some(f) = failed.get_mut(p) {
                settle_by_recovery(f, ls, &recovered, &lost);
            }
        }
    }

    /// Gives up on commands that stopped completing: each one in flight is
    /// waited for once more (bounded by the I/O timeout) and its pair failed
    /// if it still does not complete. Returns how many commands were settled.
    fn expire(
        &mut self,
        cmds: &[Cmd],
        failed: &mut HashMap<u32, PairFailure>,
        unsettled: &mut HashMap<u32, BTreeSet<usize>>,
        qps: &mut [MutexGuard<'_, IoQueuePair>],
    ) -> Result<usize> {
        let mut settled = 0;
        for (i, lane) in self.lanes.iter_mut().enumerate() {
            let stuck: Vec<(u16, u32)> = lane.inflight.drain().collect();
            for (cid, idx) in stuck {
                settled += 1;
                let pair = cmds[idx as usize].pair;
                match qps[lane.slot].wait(cid) {
                    Ok(comp) if comp.status.is_success() => {}
                    Ok(comp) => note_failure(failed, pair, PairFailure::definite(comp.status.to_string())),
                    Err(e) => {
                        tracing::warn!(error = %e, "command timed out");
                        let f = wait_failure(&e);
                        if f.kind == FailureKind::Unknown {
                            unsettled.entry(pair).or_default().insert(i);
                        }
                        note_failure(failed, pair, f);
                    }
                }
            }
        }
        Ok(settled)
    }
}

impl LayerIo for DirectIo {
    fn name(&self) -> &'static str {
        "direct"
    }

    fn mode(&self) -> String {
        format!(
            "CPU-driven: the host builds, submits and reaps every command ({} queue pairs)",
            self.pairs.len()
        )
    }

    fn owner_gone(&mut self, why: &str) {
        if self.recover {
            tracing::warn!(reason = why, "the pool's owner is gone: no queue pair is recovered from here on");
        }
        self.recover = false;
    }

    fn progress(&mut self) -> Result<()> {
        Ok(())
    }

    fn accepts(&self, kind: KvMemoryKind) -> Result<()> {
        match kind.p2p_obstacle() {
            None => Ok(()),
            Some(why) => Err(ObjError::invalid(
                "memory",
                format!(
                    "{} KV memory needs the staged data path, which the direct backend cannot run: the host \
                     CPU would have to copy every chunk (and cannot copy CUDA memory); use the gio backend ({why})",
                    kind.name()
                ),
            )),
        }
    }

    fn attach(&mut self, reg: &Arc<Registration>, map: &StripeMap) -> Result<()> {
        self.accepts(reg.memory_kind)?;
        if reg.staged() {
            return Err(ObjError::invalid(
                "memory",
                format!(
                    "{} KV memory is on the staged data path ({}), which the direct backend cannot run: the \
                     host CPU would have to copy every chunk; use the gio backend",
                    reg.memory_kind.name(),
                    reg.p2p_missing.as_deref().unwrap_or("")
                ),
            ));
        }
        self.attached = Some((reg.clone(), map.clone()));
        Ok(())
    }

    fn detach(&mut self) -> Result<()> {
        self.attached = None;
        Ok(())
    }

    fn submit(&mut self, req: LayerRequest<'_>) -> Result<Option<u64>> {
        let LayerRequest { layer, pairs, dir, .. } = req;
        let (reg, map) = self.attached.clone().ok_or(ObjError::NotRegistered)?;
        let cmds = layer_commands(&map, &reg, layer, pairs);
        // Every pair the layer uses is held until its last command settled:
        // a shared pair's other user (metadata) finds nothing of ours in flight.
        let held = self.pairs.clone();
        let mut qps = held
            .iter()
            .map(|p| p.lock().map_err(|_| ObjError::Poisoned("queue pair")))
            .collect::<Result<Vec<_>>>()?;
        let mut outcome = match self.run(&cmds, dir, &mut qps) {
            Ok(o) => o,
            // Commands may be in flight on a queue that stopped making sense
            // (e.g. a malformed completion): none of them has a known outcome.
            Err(e) => {
                tracing::warn!(error = %e, layer, "layer transfer broke off with commands in flight");
                let why = format!("{e} (the commands' outcome is unknown)");
                LayerOutcome {
                    failed: (0..pairs.len() as u32).map(|p| (p, PairFailure::unknown(why.clone()))).collect(),
                    commands: cmds.len() as u64,
                    host_built: cmds.len() as u64,
                    ..Default::default()
                }
            }
        };
        outcome.host_pairs = pairs.len() as u64;
        let token = self.next_token;
        self.next_token += 1;
        self.done.insert(token, outcome);
        Ok(Some(token))
    }

    fn poll(&mut self, token: u64) -> Result<Option<LayerOutcome>> {
        self.done.remove(&token).map(Some).ok_or(ObjError::Unknown { what: "layer transfer", id: token })
    }
}

/// What waiting for a submitted command ended with, when it ended without a
/// completion: the command reached the submission queue, so unless the error
/// says the controller refused it, the device may still execute it.
fn wait_failure(e: &DriverError) -> PairFailure {
    match e {
        DriverError::CommandFailed { .. } => PairFailure::definite(e.to_string()),
        // CommandTimeout (completion lost or late), ControllerFatal (the
        // controller stopped; what it did with the command is unknown until a
        // reset), BadDeviceResponse, transport errors, a CID the queue no
        // longer tracks...
        _ => PairFailure::unknown(e.to_string()),
    }
}
