//! Queues: the ring mechanics ([`QueueCore`]), I/O queue pairs driven from
//! Rust ([`IoQueuePair`]), and raw queue pairs handed to an executor that
//! builds commands itself ([`RawQueuePair`]).

mod core;
mod pair;
mod raw;

pub use self::core::{backoff, Completion, QueueCore, Settled};
pub use pair::{slice_segments, IoQueuePair, QueueRecovery};
pub use raw::RawQueuePair;
