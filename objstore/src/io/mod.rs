//! Moving one layer of many blocks between the drives and the KV memory.
//!
//! [`LayerIo`] is what the store needs from an I/O path: start one layer's
//! transfer for a list of (file, engine block) pairs, and later learn which
//! pairs failed. Four implementations:
//!
//! - [`gio::GioIo`]: gio_uring. The host submits one IOCB per layer (split
//!   when it exceeds an IOCB) and the executor expands it into NVMe commands
//!   from the registered tables — the main path. A job's (file, block) pairs
//!   are registered with the executor once ([`LayerIo::register_pairs`]), so
//!   each layer costs the host O(IOCBs), not O(blocks).
//! - [`direct::DirectIo`]: the host builds and submits every command itself
//!   on ordinary queue pairs — the CPU-driven baseline benchmarks compare with.
//! - [`proxy::ProxyIo`]: a tuttid client on a controller with no queue pair left
//!   to lease; the daemon moves the layer on its own pair into the client's memory.
//! - `NoIo` (crate-private): a control-only client, which moves no data; it refuses every call.
//!
//! The two that move bytes themselves address data through the same P2P SGL tables and place objects by
//! the same stripe arithmetic, so they move identical bytes.

pub mod direct;
pub mod gio;
pub(crate) mod none;
pub mod proxy;

use crate::error::Result;
use crate::index::FileId;
use crate::registration::Registration;
use crate::stripe::StripeMap;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use tutti_driver::spec::SglDescriptor;

/// Which way a transfer goes.
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Drives → KV memory (retrieve).
    Load,
    /// KV memory → drives (store).
    Store,
}

/// One (file, engine block) pair of a layer transfer.
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
pub struct Pair {
    pub file: FileId,
    pub block: u32,
}

/// Whether the device may still act on a command that failed.
///
/// A command the host gave up on is not a command the device gave up on: a
/// controller may execute a timed-out command later and move its data then
/// ("late DMA"). Such a failure must be kept apart from one whose outcome is
/// known, because the store may reuse a file only if no write into it can
/// still land (see [`Index::quarantine`](crate::index::Index::quarantine)).
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailureKind {
    /// The command did not and will not move its data: the controller
    /// completed it with an error status, or it was refused before being
    /// handed to the controller (bad translation, malformed, queue full).
    Definite,
    /// The host stopped waiting without learning the outcome (no completion
    /// within the command timeout, completion lost, queue or controller
    /// dead): the device may still execute it until the drive is reset.
    Unknown,
}

/// One layer to move: layer `layer` of every pair of `pairs`, in direction `dir`.
/// `registered` is the handle [`LayerIo::register_pairs`] returned for these very
/// pairs, if any.
#[derive(Clone, Copy, Debug)]
pub struct LayerRequest<'a> {
    pub layer: u32,
    pub pairs: &'a [Pair],
    pub dir: Direction,
    pub registered: Option<u64>,
}

/// Why one pair of a layer transfer failed.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PairFailure {
    pub kind: FailureKind,
    pub why: String,
}

impl PairFailure {
    pub fn definite(why: impl Into<String>) -> Self {
        PairFailure { kind: FailureKind::Definite, why: why.into() }
    }
    pub fn unknown(why: impl Into<String>) -> Self {
        PairFailure { kind: FailureKind::Unknown, why: why.into() }
    }
}

/// Records a failed command of `pair`: the first reason is kept, except that
/// a command of unknown outcome makes the whole pair's outcome unknown (and
/// its reason is the one reported), whatever failed before.
pub(crate) fn note_failure(failed: &mut HashMap<u32, PairFailure>, pair: u32, f: PairFailure) {
    match failed.entry(pair) {
        Entry::Vacant(v) => {
            v.insert(f);
        }
        Entry::Occupied(mut o) => {
            if f.kind == FailureKind::Unknown && o.get().kind == FailureKind::Definite {
                o.insert(f);
            }
        }
    }
}

/// Applies drive recoveries to the failure of a pair whose unknown-outcome
/// commands went to `drives`: once every one of them was recovered (its
/// queues deleted, which completes or aborts every earlier command), the
/// outcome is known and the failure definite; otherwise the reason names a
/// recovery that failed, if one did, and the outcome stays unknown.
pub(crate) fn settle_by_recovery<D: Copy + Ord + std::fmt::Display>(
    f: &mut PairFailure,
    drives: &BTreeSet<D>,
    recovered: &BTreeSet<D>,
    lost: &BTreeMap<D, String>,
) {
    if f.kind != FailureKind::Unknown {
        return;
    }
    if drives.iter().all(|d| recovered.contains(d)) {
        f.kind = FailureKind::Definite;
        f.why = format!(
            "{}; drive {} recovered: the command was completed or aborted before its queue was deleted",
            f.why,
            drives.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
        );
    } else if let Some((d, e)) = drives.iter().find_map(|d| lost.get(d).map(|e| (d, e))) {
        f.why = format!("{}; recovery of drive {d} failed: {e}", f.why);
    }
}

/// The failures by pair, in pair order.
pub(crate) fn sorted_failures(failed: HashMap<u32, PairFailure>) -> Vec<(u32, PairFailure)> {
    let mut failed: Vec<(u32, PairFailure)> = failed.into_iter().collect();
    failed.sort_unstable_by_key(|f| f.0);
    failed
}

/// How one layer transfer ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LayerOutcome {
    /// Indices (into the submitted pairs) that failed, with the first reason
    /// for each and whether the device may still act on it.
    pub failed: Vec<(u32, PairFailure)>,
    /// NVMe commands the layer took.
    pub commands: u64,
    /// Calls the host made into the I/O path to move the layer: one per
    /// command submitted and doorbell rung on the direct path; one per
    /// `submit_layer` or per filled IOCB and `issue` on gio_uring.
    pub host_calls: u64,
    /// Commands (NVMe entries or IOCTXs) whose fields the host wrote itself;
    /// 0 when the executor expands them from the tables.
    pub host_built: u64,
    /// (file, block) pairs the host read or copied to submit the layer; 0
    /// when the executor reads them from a list registered for the job.
    pub host_pairs: u64,
    /// Drives recovered (queue pairs deleted and created again) before this
    /// outcome was reported, so that failures of unknown outcome became
    /// definite. Counted in one outcome when one recovery serves several.
    pub recoveries: u64,
    /// Drive recoveries that failed or could not run; the failures they were
    /// for stay unknown.
    pub recovery_failures: u64,
}

/// An I/O path for layer transfers. Implementations are used under the
/// store's I/O lock, one call at a time.
pub(crate) trait LayerIo: Send {
    fn name(&self) -> &'static str;
    /// How layers are moved, for reports.
    fn mode(&self) -> String;
    /// The pool's owner is gone (see [`crate::PoolControl::gone`]): commands already on the
    /// drives may still complete and are reaped as usual, but no drive is recovered for
    /// their failures (recovery needs the owner, and the drives did nothing wrong), and the
    /// outcome of a command that ends without a completion stays unknown.
    fn owner_gone(&mut self, _why: &str) {}
    /// Makes a registration's tables available to the executor.
    fn attach(&mut self, reg: &Arc<Registration>, map: &StripeMap) -> Result<()>;
    /// Forgets the registration (its memory is about to be unmapped).
    fn detach(&mut self) -> Result<()>;
    /// Whether this path can move KV memory of `kind`; checked before a
    /// registration touches anything.
    fn accepts(&self, _kind: crate::registration::KvMemoryKind) -> Result<()> {
        Ok(())
    }
    /// The staging slots of a staged registration and their counters.
    fn staging(&self) -> Option<tutti_gio_uring::StagingStats> {
        None
    }
    /// Per pool drive: NVMe commands completed, error completions and timeouts on this
    /// path's queue pairs (`DriveIo`'s byte counts are the store's). Empty for a path that
    /// keeps no per-queue counters.
    fn drive_io(&self) -> Vec<crate::report::DriveIo> {
        Vec::new()
    }
    /// A job (or every job of a store session) is about to move `pairs` for
    /// each of its layers. A path whose executor can keep them does so now,
    /// once per job or session, and returns a handle
    /// for [`submit`](Self::submit); `None` (the default) when it has nothing
    /// to keep or no room: every `submit` then gets the pairs as usual.
    fn register_pairs(&mut self, _pairs: &[Pair]) -> Result<Option<u64>> {
        Ok(None)
    }
    /// The job or session that registered `handle` is over. Refused while a
    /// transfer that references it may still be in flight.
    fn unregister_pairs(&mut self, _handle: u64) -> Result<()> {
        Ok(())
    }
    /// Starts the layer `req` names for every pair; returns a token for
    /// [`poll`](Self::poll), or `None` when the path is full for now (retry
    /// after earlier transfers finish).
    fn submit(&mut self, req: LayerRequest<'_>) -> Result<Option<u64>>;
    /// Collects whatever has finished, so capacity frees up.
    fn progress(&mut self) -> Result<()>;
    /// The outcome once the transfer has finished, `None` while it runs.
    fn poll(&mut self, token: u64) -> Result<Option<LayerOutcome>>;
}

/// One NVMe command of a layer transfer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cmd {
    pub pair: u32,
    pub drive: u32,
    pub lba: u64,
    pub nlb: u32,
    pub desc: SglDescriptor,
}

/// The commands of one layer, in IOCB order: pair, then K|V, then chunk.
pub(crate) fn layer_commands(map: &StripeMap, reg: &Registration, layer: u32, pairs: &[Pair]) -> Vec<Cmd> {
    let chunks = map.chunks();
    let mut out = Vec::with_capacity(pairs.len() * 2 * chunks as usize);
    for (i, p) in pairs.iter().enumerate() {
        for kv in 0..2 {
            for c in 0..chunks {
                let (at, _len) = map.locate_chunk(p.file, 2 * layer + kv, c);
                out.push(Cmd {
                    pair: i as u32,
                    drive: at.drive,
                    lba: at.lba,
                    nlb: at.lbas as u32,
                    desc: reg.descriptor(at.drive, p.block, layer, kv, c),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_settled_only_when_every_drive_it_went_to_was_recovered() {
        let recovered = BTreeSet::from([0u16, 1]);
        let lost = BTreeMap::from([(2u16, "Delete I/O SQ timed out".to_string())]);
        let mut both = PairFailure::unknown("timed out");
        settle_by_recovery(&mut both, &BTreeSet::from([0, 1]), &recovered, &lost);
        assert_eq!(both.kind, FailureKind::Definite);
        assert!(both.why.contains("drive 0, 1 recovered"), "{}", both.why);
        let mut one_lost = PairFailure::unknown("timed out");
        settle_by_recovery(&mut one_lost, &BTreeSet::from([1, 2]), &recovered, &lost);
        assert_eq!(one_lost.kind, FailureKind::Unknown);
        assert!(
            one_lost.why.contains("recovery of drive 2 failed: Delete I/O SQ timed out"),
            "{}",
            one_lost.why
        );
        // A drive neither recovered nor reported lost settles nothing.
        let mut unseen = PairFailure::unknown("timed out");
        settle_by_recovery(&mut unseen, &BTreeSet::from([0, 3]), &recovered, &lost);
        assert_eq!(unseen, PairFailure::unknown("timed out"));
        let mut definite = PairFailure::definite("write fault");
        settle_by_recovery(&mut definite, &BTreeSet::from([0]), &recovered, &lost);
        assert_eq!(definite, PairFailure::definite("write fault"));
    }

    #[test]
    fn an_unknown_outcome_wins_over_a_definite_failure_of_the_same_pair() {
        let mut failed = HashMap::new();
        note_failure(&mut failed, 3, PairFailure::definite("LBA out of range"));
        note_failure(&mut failed, 3, PairFailure::unknown("timed out"));
        note_failure(&mut failed, 3, PairFailure::definite("write fault"));
        note_failure(&mut failed, 1, PairFailure::unknown("queue dead"));
        note_failure(&mut failed, 1, PairFailure::unknown("timed out again"));
        let v = sorted_failures(failed);
        assert_eq!(v, vec![(1, PairFailure::unknown("queue dead")), (3, PairFailure::unknown("timed out"))]);
    }
}
