//! The I/O queue pair users of one controller share and take turns on.

use super::IoQueuePair;
use crate::controller::{poisoned, Controller};
use crate::error::Result;
use std::any::Any;
use std::sync::{Arc, Mutex};

/// An I/O queue pair several users of one controller take turns on: each
/// holds the lock for a whole operation (every command it submitted has
/// completed, or was abandoned, when it lets go).
pub type SharedQueuePair = Mutex<IoQueuePair>;

impl Controller {
    /// The controller's shared I/O queue pair: created with `depth` entries
    /// (clamped to 2..=CAP.MQES+1) by the first caller, and the same pair for
    /// every caller while any of them holds it. Users that need few commands
    /// (metadata), or that cannot get a pair of their own on a controller
    /// that grants few, take turns on it.
    pub fn shared_io_queue_pair(self: &Arc<Self>, depth: u32) -> Result<Arc<SharedQueuePair>> {
        let mut slot = self.shared_slot().lock().map_err(|_| poisoned(self.name()))?;
        // Only this function fills the slot, always with a SharedQueuePair.
        if let Some(pair) = slot.upgrade().and_then(|p| p.downcast::<SharedQueuePair>().ok()) {
            return Ok(pair);
        }
        let depth = depth.clamp(2, self.info().max_queue_entries.max(2));
        let pair = Arc::new(Mutex::new(IoQueuePair::create(self, depth, "the shared queue pair")?));
        let erased: Arc<dyn Any + Send + Sync> = pair.clone();
        *slot = Arc::downgrade(&erased);
        Ok(pair)
    }
}
