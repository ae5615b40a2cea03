//! The tunables of a [`GioUring`](super::GioUring).

use std::time::Duration;

/// Tunables of a [`GioUring`](super::GioUring).
#[derive(Clone, Debug)]
pub struct GioOptions {
    /// IOCBs in the pool (1..=4096).
    pub depth: u32,
    /// A submitted command with no completion after this long fails with
    /// `IoStatus::CompletionTimeout` (and its slot is reused).
    pub command_timeout: Duration,
    /// A command that cannot get a submission slot for this long fails with
    /// `IoStatus::SubmitTimeout` and the queue is declared dead. Must exceed
    /// `command_timeout`: slots held by lost commands free up after that.
    pub submit_timeout: Duration,
    /// Longest sleep of an executor poll loop.
    pub max_backoff: Duration,
    /// Sleep of an idle persistent kernel.
    pub idle_sleep: Duration,
    /// Layer tables that can be registered at once (1..=255).
    pub max_tables: u32,
    /// Pair lists that can be registered at once (1..=65536); each costs
    /// 16 bytes of executor memory while unused.
    pub max_pair_lists: u32,
}

impl Default for GioOptions {
    fn default() -> Self {
        GioOptions {
            depth: 64,
            command_timeout: Duration::from_secs(10),
            submit_timeout: Duration::from_secs(25),
            max_backoff: Duration::from_micros(50),
            idle_sleep: Duration::from_micros(200),
            max_tables: 8,
            max_pair_lists: 64,
        }
    }
}
