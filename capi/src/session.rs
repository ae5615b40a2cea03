//! A store session's state, shared by the store calls (`store`) and the
//! jobs written for it (`jobs`), in a module of its own so neither of those
//! depends on the other for it.

use crate::runtime::Runtime;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use tutti_objstore::{JobId, KvStore, StoreId};

/// What a session has done so far.
pub(crate) struct State {
    pub(crate) committed: bool,
    /// The object store's jobs submitted for the session.
    pub(crate) jobs: Vec<JobId>,
}

/// A store session behind a `tutti_store_t`; its jobs hold it too.
pub(crate) struct StoreSession {
    pub(crate) rt: Arc<Runtime>,
    /// The store the reservation was made on (it stays there across a reconnect).
    pub(crate) store: Arc<KvStore>,
    pub(crate) id: StoreId,
    pub(crate) blocks: u32,
    pub(crate) state: Mutex<State>,
}

impl Drop for StoreSession {
    /// The last reference (the handle or one of its jobs) gives an
    /// uncommitted reservation up; its files go back to the pool.
    fn drop(&mut self) {
        let committed = self.state.get_mut().map(|s| s.committed).unwrap_or(false);
        if !committed {
            self.rt.stores_open.fetch_sub(1, Ordering::Relaxed);
            if let Err(e) = self.store.abort_store(self.id) {
                tracing::warn!(store = self.id, error = %e, "an abandoned store could not be aborted");
            }
        }
    }
}
