//! Queues: the ring mechanics ([`QueueCore`]), I/O queue pairs driven from
//! Rust ([`IoQueuePair`]), and raw queue pairs handed to an executor that
//! builds commands itself ([`RawQueuePair`]), and the pair a controller's
//! users share ([`SharedQueuePair`]).

mod core;
mod pair;
mod raw;
mod rings;
mod shared;

pub use self::core::{backoff, Completion, QueueCore, Settled};
pub use pair::{slice_segments, IoQueuePair, QueueRecovery};
pub use raw::RawQueuePair;
pub use rings::QueueRings;
pub use shared::SharedQueuePair;
