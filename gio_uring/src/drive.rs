//! Drives as gio_uring sees them: a namespace and the raw queue pairs the
//! executor drives directly.

use crate::error::{GioError, Result};
use std::sync::Arc;
use tutti_driver::controller::Controller;
use tutti_driver::queue::RawQueuePair;
use tutti_driver::spec::SglSupport;

/// One namespace and its queue pairs, handed to `GioUring::init`.
pub struct DriveQueues {
    pub name: String,
    pub nsid: u32,
    pub lba_size: u32,
    /// Namespace size in logical blocks.
    pub blocks: u64,
    /// Largest transfer of one command, bytes.
    pub max_transfer: u64,
    pub sgl: SglSupport,
    pub queues: Vec<RawQueuePair>,
}

impl DriveQueues {
    /// Creates `pairs` raw queue pairs of `depth` entries on `ctrl` for namespace `nsid`.
    pub fn create(ctrl: &Arc<Controller>, nsid: u32, pairs: u32, depth: u32) -> Result<Self> {
        let info = ctrl.info();
        // Refuses namespaces with metadata, protection information or another command set.
        let ns = ctrl.data_namespace(nsid)?;
        if pairs == 0 {
            return Err(GioError::invalid(format!("{}: at least one queue pair is needed", ctrl.name())));
        }
        let queues = (0..pairs).map(|_| ctrl.create_raw_queue_pair(depth)).collect::<Result<Vec<_>, _>>()?;
        Ok(DriveQueues {
            name: format!("{} ns {nsid}", ctrl.name()),
            nsid,
            lba_size: ns.lba_size,
            blocks: ns.blocks,
            max_transfer: info.max_transfer,
            sgl: info.sgl,
            queues,
        })
    }

    /// Blocks one command may carry (MDTS, and NLB's 16 bits).
    pub fn max_lbas(&self) -> u32 {
        (self.max_transfer / self.lba_size as u64).clamp(1, tutti_driver::command::MAX_NLB as u64) as u32
    }
}

/// What `GioUring::drive` reports about a drive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriveInfo {
    pub name: String,
    pub nsid: u32,
    pub lba_size: u32,
    pub blocks: u64,
    pub max_lbas: u32,
    pub sgl: SglSupport,
    /// Executor queue indices of its queue pairs.
    pub queues: std::ops::Range<u32>,
}
