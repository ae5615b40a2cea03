//! The hook through which a scheduler decides when each layer of a job goes to the drives.
//!
//! The store knows nothing of slack or policies (`tutti-scheduler` is a peer crate): with a gate
//! installed ([`crate::KvStore::set_gate`]) it asks before handing every layer of every load or
//! store to the I/O path, reports each layer's end, and offers every store job's bytes first,
//! so a gate can bound the engine memory that unwritten stores hold. Without a gate, layers go
//! as soon as a job is advanced (the behaviour before gates existed).

use crate::io::Direction;
use crate::store::job_state::JobId;

/// One layer of one job, about to be handed to the drives.
#[derive(Debug, Clone, Copy)]
pub struct GateUnit<'a> {
    pub job: JobId,
    pub layer: u32,
    pub dir: Direction,
    /// Bytes the layer moves on each drive of the pool, in pool order.
    pub drive_bytes: &'a [u64],
}

/// The gate's answer for one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Hand it over now; [`IoGate::finished`] follows when it is done (or was not handed over).
    Go,
    /// Not yet: the job keeps it (and its later layers) queued and asks again on its next advance.
    Wait,
}

/// The gate's answer for a new store job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreAdmission {
    Accepted,
    /// Not written at all: every block of the job fails with this reason (later a miss).
    Dropped(String),
}

pub trait IoGate: Send + Sync {
    /// A store job of `bytes` (every layer) is starting. `Err(why)` refuses it: nothing was
    /// done, the engine keeps its memory and may submit again (back-pressure).
    fn accept_store(&self, job: JobId, bytes: u64) -> Result<StoreAdmission, String>;
    /// May `unit` go now? `urgent`: the engine is blocked waiting for this job.
    fn admit(&self, unit: &GateUnit<'_>, urgent: bool) -> Admit;
    /// A unit answered `Go` finished, failed, or was not handed over after all.
    fn finished(&self, job: JobId, layer: u32);
    /// The job is done or gone: whatever the gate keeps for it goes.
    fn forget(&self, job: JobId);
    /// Times it held units back, by reason, since it was made (for reports).
    fn waits(&self) -> crate::report::GateWaits {
        crate::report::GateWaits::default()
    }
}
