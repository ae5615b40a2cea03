//! Discrete-event model of layer-wise prefill and decode over an SSD array, to compare policies.
//!
//! The GPU runs requests back to back: per request a prefill of `layers` layers (layer `l` may
//! start only once its KV reads completed; any wait is *bubble*), then `decode_steps` decode
//! steps. Compute times come from [`ComputeModel`], KV sizes from the model geometry, I/O times
//! from the fluid [`SsdConfig`] array model. A request of `context_tokens` at hit rate `h` reads
//! `h·context` cached tokens (whole blocks) and computes and writes the rest.
//!
//! Policies: (a) load everything before compute; (b) layer-wise, reads of `l+1` and writes of
//! `l` issued as soon as they exist, interleaved; (c) the slack-aware [`crate::Scheduler`] with
//! a profiled table; (d) the same with online slack correction. Unwritten KV holds HBM, so all
//! policies share one bound on writes not yet completed; hitting it stalls the GPU.
//!
//! Not modelled: SM interference of the I/O kernel (the SM budget is only passed through),
//! batching of several requests, PCIe limits other than the drives, HBM traffic of the DMA.

mod engine;
mod io;
mod policies;
pub mod ssd;
mod sweep;

pub use engine::simulate;
pub use ssd::SsdConfig;
pub use sweep::{default_hit_rates, sweep, Crossover, SweepReport};

use crate::online::OnlineConfig;
use crate::policy::{IoRates, SchedulerConfig};
use crate::{ComputeModel, SchedError};

/// The four policies compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// (a) read every layer's KV, then compute.
    LoadAll,
    /// (b) layer-wise pipeline; reads and writes issued as soon as they exist.
    Interleaved,
    /// (c) slack-aware scheduler with the profiled table.
    SlackAware,
    /// (d) slack-aware scheduler with online slack correction.
    SlackOnline,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 4] =
        [PolicyKind::LoadAll, PolicyKind::Interleaved, PolicyKind::SlackAware, PolicyKind::SlackOnline];

    /// Short label used in tables and plots.
    pub fn label(self) -> &'static str {
        match self {
            PolicyKind::LoadAll => "a:load-all",
            PolicyKind::Interleaved => "b:layerwise",
            PolicyKind::SlackAware => "c:slack",
            PolicyKind::SlackOnline => "d:slack+online",
        }
    }

    pub fn letter(self) -> char {
        match self {
            PolicyKind::LoadAll => 'a',
            PolicyKind::Interleaved => 'b',
            PolicyKind::SlackAware => 'c',
            PolicyKind::SlackOnline => 'd',
        }
    }
}

/// The requests run at each hit rate.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Workload {
    /// Tokens per request (cached prefix + new input).
    pub context_tokens: u32,
    /// Requests run back to back per simulation.
    pub requests: u32,
    /// Decode steps after each prefill.
    pub decode_steps: u32,
}

impl Default for Workload {
    fn default() -> Self {
        Workload { context_tokens: 65_536, requests: 4, decode_steps: 64 }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SimConfig {
    pub model: ComputeModel,
    pub ssd: SsdConfig,
    pub workload: Workload,
    /// HBM that may hold KV not yet written, MiB (bound on outstanding writes, all policies).
    pub backlog_mib: u64,
    /// The profile given to (c) and (d) overstates every slack window by this fraction.
    pub profile_optimism: f64,
    pub online: OnlineConfig,
    /// Fraction of each window the scheduler withholds from writes.
    pub write_guard: f64,
    /// Bubble, in percent of prefill compute, below which a hit rate counts as hidden.
    pub crossover_threshold_pct: f64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            model: ComputeModel::llama3_8b_h100(),
            ssd: SsdConfig::default(),
            workload: Workload::default(),
            backlog_mib: 8192,
            profile_optimism: 0.0,
            online: OnlineConfig::default(),
            write_guard: 0.05,
            crossover_threshold_pct: 5.0,
        }
    }
}

impl SimConfig {
    pub fn validate(&self) -> Result<(), SchedError> {
        self.model.geometry.validate()?;
        self.model.gpu.validate()?;
        self.ssd.validate().map_err(SchedError::Sim)?;
        self.online.validate()?;
        let w = &self.workload;
        if w.context_tokens == 0 || w.requests == 0 {
            return Err(SchedError::Sim("workload needs > 0 context tokens and > 0 requests".into()));
        }
        if !(self.profile_optimism.is_finite() && self.profile_optimism > -1.0) {
            return Err(SchedError::Sim(format!(
                "profile optimism must be > -1, got {}",
                self.profile_optimism
            )));
        }
        if !(self.crossover_threshold_pct.is_finite() && self.crossover_threshold_pct > 0.0) {
            return Err(SchedError::Sim("crossover threshold must be > 0%".into()));
        }
        let layer_write = u64::from(w.context_tokens) * self.model.geometry.kv_bytes_per_token_layer();
        if self.backlog_mib * (1 << 20) < layer_write {
            return Err(SchedError::Sim(format!(
                "backlog of {} MiB cannot hold one layer's writes ({} MiB)",
                self.backlog_mib,
                layer_write.div_ceil(1 << 20)
            )));
        }
        self.scheduler_config().validate()
    }

    /// The scheduler configuration (c) and (d) run with: this array's per-drive rates.
    pub fn scheduler_config(&self) -> SchedulerConfig {
        let drives = self.ssd.drives.max(1);
        let iocb_bytes = self.model.geometry.iocb_bytes();
        SchedulerConfig {
            drives,
            rates: IoRates {
                read_bytes_per_sec: self.ssd.read_gbps * 1e9 / drives as f64,
                write_bytes_per_sec: self.ssd.write_gbps * 1e9 / drives as f64,
                command_latency_ns: (self.ssd.command_latency_us * 1e3) as u64,
                iocb_bytes,
            },
            backlog_capacity_iocbs: self.backlog_mib * (1 << 20) / iocb_bytes.max(1),
            write_guard: self.write_guard,
        }
    }
}

/// Outcome of one policy at one hit rate (per-request figures are means over the requests).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunMetrics {
    pub policy: PolicyKind,
    pub hit_rate: f64,
    pub prefix_tokens: u32,
    pub input_tokens: u32,
    pub ttft_ms: f64,
    pub prefill_compute_ms: f64,
    /// GPU idle during prefill: waiting for reads plus write back-pressure stalls.
    pub bubble_ms: f64,
    /// The back-pressure part of `bubble_ms`.
    pub stall_ms: f64,
    pub bubble_pct: f64,
    pub decode_stall_ms: f64,
    /// Bytes read / time any drive had reads in flight.
    pub read_gbps: f64,
    pub write_gbps: f64,
    /// Time any drive moved reads and writes at once, per request.
    pub mixed_ms: f64,
    /// Most write data not yet completed at any time.
    pub backlog_peak_mib: f64,
    /// Write data not yet completed when a prefill ends (pushed into decode), per request.
    pub deferred_mib: f64,
    /// Time after the last decode step until every write completed.
    pub drain_ms: f64,
    pub read_mib: f64,
    pub written_mib: f64,
}
