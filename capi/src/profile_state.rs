//! The profiler's state, held by the runtime and driven by the calls in
//! `profiler` (a module of its own so the runtime does not depend on the
//! C calls that depend on it).

use crate::error::Result;
use std::collections::HashMap;
use tutti_scheduler::Profiler;

/// The profiler and the bookkeeping of the calls that feed it.
pub(crate) struct ProfileState {
    pub(crate) profiler: Profiler,
    /// Layer starts waiting for their end: (request, layer) → start ns.
    pub(crate) open: HashMap<(u64, u32), u64>,
    pub(crate) layers: u32,
    pub(crate) requests: u64,
    pub(crate) decode_steps: u64,
}

impl ProfileState {
    pub(crate) fn new(layers: u32) -> Result<Self> {
        Ok(ProfileState {
            profiler: Profiler::new(layers)?,
            open: HashMap::new(),
            layers,
            requests: 0,
            decode_steps: 0,
        })
    }
}
