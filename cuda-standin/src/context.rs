//! Contexts (primary and green): the handle, the SMs its kernels may run on,
//! and its legacy default stream. Which context is current on which thread is
//! `current.rs`; the driver's table of contexts is `driver.rs` (`State`).

use crate::stream::{Stream, StreamKind};
use std::sync::Arc;

pub(crate) struct Context {
    pub handle: usize,
    /// The green context this is the context of.
    pub green: Option<usize>,
    /// SMs its kernels may run on; `None` for every SM of the device.
    pub sms: Option<Arc<Vec<u32>>>,
    /// Its legacy default stream (stream NULL).
    pub legacy: Arc<Stream>,
}

impl Context {
    /// Context `handle`, its legacy stream `legacy_handle` (see `State::new_context`).
    pub fn new(
        handle: usize,
        legacy_handle: usize,
        green: Option<usize>,
        sms: Option<Vec<u32>>,
    ) -> Arc<Context> {
        let legacy = Stream::new(legacy_handle, handle, StreamKind::Legacy);
        Arc::new(Context { handle, green, sms: sms.map(Arc::new), legacy })
    }
}
