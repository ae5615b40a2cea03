//! What a finished layer's failures mean: which outcomes are known, which a
//! recovery of their drives makes known, and that recovery (layers held back
//! until it ran).

use super::{GioIo, Held};
use crate::error::{ObjError, Result};
use crate::io::{note_failure, settle_by_recovery, sorted_failures, FailureKind, LayerOutcome, PairFailure};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;
use tutti_gio_uring::{GioError, IoStatus};

/// Whether the drive may still act on an IOCTX that ended with `status`.
///
/// Only a completion the executor reaped is a known outcome: an NVMe status,
/// or a refusal before the command was built (translation, malformed). A
/// completion timeout means the executor expired the command and reused its
/// slot (`tt_slot_expire`; the CID generation keeps a late completion from
/// being taken for the new command's) while the controller may still execute
/// it. `SubmitTimeout` and `QueueDead` are counted unknown as well: the
/// executor's rules say such a command never passed the doorbell
/// (`gio_queue.cuh`: nothing at or after the dead queue's hole is
/// published), but a dead queue is never deleted or reset in this process,
/// so nothing bounds what its controller does; a file costs less than
/// wrong bytes served as a hit. `QueueRecovering` is definite: the executor
/// refused the command before it took a ticket on the queue; so is
/// `StagingTimeout` (no staging slot came free: the command was never built).
pub(crate) fn failure_kind(status: IoStatus) -> FailureKind {
    match status {
        IoStatus::Nvme(_)
        | IoStatus::Translation(_)
        | IoStatus::Invalid(_)
        | IoStatus::StagingTimeout
        | IoStatus::QueueRecovering { .. } => FailureKind::Definite,
        IoStatus::Success
        | IoStatus::Pending
        | IoStatus::CompletionTimeout
        | IoStatus::SubmitTimeout
        | IoStatus::QueueDead { .. }
        | IoStatus::Unknown(_) => FailureKind::Unknown,
    }
}

/// Whether recovering the drive makes the outcome of an IOCTX that ended
/// with `status` known: the command reached (or may have reached) one of the
/// drive's queues, whose deletion completes or aborts it. Statuses the
/// executor should never report for a finished IOCTX (`Pending`, an
/// unrecognised code) say nothing about where the command went.
fn recovery_resolves(status: IoStatus) -> bool {
    matches!(status, IoStatus::CompletionTimeout | IoStatus::SubmitTimeout | IoStatus::QueueDead { .. })
}

impl GioIo {
    /// Once all IOCBs of `token` are in, its outcome goes to `ready`, or to
    /// `held` when a drive recovery can make some of its failures known.
    pub(super) fn finish(&mut self, token: u64) -> Result<()> {
        let t = self.transfers.get(&token).ok_or(ObjError::Unknown { what: "layer transfer", id: token })?;
        if !t.iocbs.iter().all(|(id, _)| self.results.contains_key(id)) {
            return Ok(());
        }
        let Some(t) = self.transfers.remove(&token) else { return Ok(()) };
        let mut failed: HashMap<u32, PairFailure> = HashMap::new();
        // Drives of each pair's unknown-outcome commands, and the pairs one of
        // whose unknown outcomes no recovery can settle.
        let mut drives: BTreeMap<u32, BTreeSet<u16>> = BTreeMap::new();
        let mut unresolvable: BTreeSet<u32> = BTreeSet::new();
        for (k, (id, first)) in t.iocbs.iter().enumerate() {
            let Some(r) = self.results.remove(id) else { continue };
            for f in &r.failures {
                let pair = match &t.explicit {
                    Some(maps) => maps[k].get(f.index as usize).copied(),
                    None => Some(first + f.index / t.ioctx_per_pair),
                };
                if let Some(p) = pair.filter(|&p| (p as usize) < t.pairs) {
                    let kind = failure_kind(f.status);
                    if kind == FailureKind::Unknown {
                        if recovery_resolves(f.status) {
                            drives.entry(p).or_default().insert(f.drive);
                        } else {
                            unresolvable.insert(p);
                        }
                    }
                    note_failure(&mut failed, p, PairFailure { kind, why: f.to_string() });
                }
            }
            if r.completed != r.count {
                // Defensive: IOCTXs unaccounted for fail the whole IOCB's pairs.
                let n = r.count.div_ceil(t.ioctx_per_pair);
                let why = format!("{}: {} of {} IOCTXs completed", r.id, r.completed, r.count);
                for p in *first..(*first + n).min(t.pairs as u32) {
                    unresolvable.insert(p);
                    note_failure(&mut failed, p, PairFailure::unknown(why.clone()));
                }
            }
        }
        let outcome = LayerOutcome {
            failed: sorted_failures(failed),
            commands: t.commands,
            host_calls: t.host_calls,
            host_built: t.host_built,
            host_pairs: t.host_pairs,
            ..Default::default()
        };
        drives.retain(|p, _| !unresolvable.contains(p));
        if self.cfg.recover_drives && !drives.is_empty() {
            self.held.insert(token, Held { outcome, drives, since: Instant::now() });
        } else {
            self.ready.insert(token, outcome);
        }
        Ok(())
    }

    /// Whether a submitted layer still has IOCBs with the executor.
    pub(super) fn in_flight(&self) -> bool {
        self.transfers.values().any(|t| !t.iocbs.iter().all(|(id, _)| self.results.contains_key(id)))
    }

    /// Recovers the drives the held layers' unknown-outcome commands went to
    /// and releases those layers, with the failures a recovery settled made
    /// definite.
    ///
    /// Waits (across calls) until no other layer is in flight, so that no
    /// command of another layer is refused or caught in the recovery; no new
    /// layer is submitted meanwhile. Every command is bounded by the command
    /// and submit timeouts, so after that long the recovery runs anyway (and
    /// may find the drive busy).
    pub(super) fn recover_held(&mut self) -> Result<()> {
        if self.held.is_empty() {
            return Ok(());
        }
        // Layers that finished meanwhile join this recovery rather than wait for another.
        let done: Vec<u64> = self
            .transfers
            .iter()
            .filter(|(_, t)| t.iocbs.iter().all(|(id, _)| self.results.contains_key(id)))
            .map(|(&token, _)| token)
            .collect();
        for token in done {
            self.finish(token)?;
        }
        let Some(oldest) = self.held.values().map(|h| h.since).min() else { return Ok(()) };
        let patience = self.cfg.ring.submit_timeout + self.cfg.ring.command_timeout;
        let waited = oldest.elapsed();
        if self.in_flight() && waited < patience {
            return Ok(());
        }
        let wanted: BTreeSet<u16> =
            self.held.values().flat_map(|h| h.drives.values().flatten().copied()).collect();
        let mut lost: BTreeMap<u16, String> = BTreeMap::new();
        let (mut recoveries, mut failures) = (0u64, 0u64);
        for d in wanted {
            if self.recovered.contains(&d) {
                continue;
            }
            match self.ring.recover_drive(d, self.cfg.recovery_timeout) {
                Ok(rep) => {
                    tracing::info!(
                        drive = d,
                        expired_commands = rep.expired_commands,
                        dead_queues = rep.dead_queues,
                        elapsed_us = rep.elapsed.as_micros() as u64,
                        "drive recovered after commands of unknown outcome; their outcome is now known"
                    );
                    self.recovered.insert(d);
                    recoveries += 1;
                }
                Err(GioError::RecoveryBusy { .. }) if waited < patience => {
                    // A lane is still inside the queues: try again on a later poll.
                    tracing::debug!(drive = d, "drive recovery deferred: commands still in its queues");
                    self.pending_recoveries += recoveries;
                    return Ok(());
                }
                Err(e) => {
                    tracing::warn!(drive = d, error = %e,
                        "drive recovery failed; outcomes of commands sent to it stay unknown");
                    lost.insert(d, e.to_string());
                    failures += 1;
                }
            }
        }
        let recovered = std::mem::take(&mut self.recovered);
        let mut counts = Some((recoveries + self.pending_recoveries, failures));
        self.pending_recoveries = 0;
        for (token, h) in self.held.drain() {
            let mut outcome = h.outcome;
            for (p, f) in &mut outcome.failed {
                if let Some(ds) = h.drives.get(p) {
                    settle_by_recovery(f, ds, &recovered, &lost);
                }
            }
            if let Some((r, x)) = counts.take() {
                outcome.recoveries = r;
                outcome.recovery_failures = x;
            }
            self.ready.insert(token, outcome);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tutti_driver::spec::Status;
    use tutti_gio_uring::Translation;

    #[test]
    fn only_reaped_or_refused_commands_have_a_known_outcome() {
        for s in [
            IoStatus::Nvme(Status::WRITE_FAULT),
            IoStatus::Translation(Translation::File),
            IoStatus::Invalid(tutti_gio_uring::Invalid::Length),
        ] {
            assert_eq!(failure_kind(s), FailureKind::Definite, "{s}");
        }
        for s in [
            IoStatus::CompletionTimeout,
            IoStatus::SubmitTimeout,
            IoStatus::QueueDead { queue: 1 },
            IoStatus::Pending,
            IoStatus::Unknown(0x7700_0001),
        ] {
            assert_eq!(failure_kind(s), FailureKind::Unknown, "{s}");
        }
    }

    #[test]
    fn a_drive_recovery_settles_only_commands_that_reached_its_queues() {
        for s in [IoStatus::CompletionTimeout, IoStatus::SubmitTimeout, IoStatus::QueueDead { queue: 0 }] {
            assert!(recovery_resolves(s), "{s}");
        }
        for s in [IoStatus::Pending, IoStatus::Unknown(0x7700_0001), IoStatus::Nvme(Status::WRITE_FAULT)] {
            assert!(!recovery_resolves(s), "{s}");
        }
    }
}
