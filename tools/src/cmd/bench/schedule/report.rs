//! What `tutti bench schedule` reports: JSON, the text table and the plot.

use crate::cmd::bench::common::Host;
use crate::plot::{line_chart, table, Series};
use tutti_scheduler::sim::PolicyKind;

#[derive(serde::Serialize)]
pub struct Setup {
    pub drives: u32,
    pub read_mbps_per_drive: f64,
    pub write_mbps_per_drive: f64,
    pub mixed_efficiency: f64,
    pub mixed_read_share: f64,
    pub latency_us: u32,
    pub layers: u32,
    pub context_tokens: u32,
    pub hit_rate: f64,
    pub input_tokens: u32,
    pub prefix_tokens: u32,
    pub requests: u32,
    pub decode_steps: u32,
    pub tflops: f64,
    pub hbm_gbps: f64,
    pub profile_optimism: f64,
    pub backlog_mib: u64,
}

#[derive(serde::Serialize)]
pub struct Report {
    pub host: Host,
    pub setup: Setup,
    pub rows: Vec<Row>,
    pub note: &'static str,
}

/// What one policy measured.
#[derive(serde::Serialize, Clone, Debug)]
pub struct Measured {
    pub bubble_ms: f64,
    pub ttft_ms: f64,
    pub prefill_compute_ms: f64,
    pub read_gbps: f64,
    pub write_gbps: f64,
    pub backlog_peak_mib: f64,
    pub bytes_dropped: u64,
    /// Units started on a drive with the other direction in flight.
    pub mixed_issues: u64,
    pub writes_held_for_slack: u64,
    pub writes_in_decode: u64,
    /// Times a read was held behind writes in flight on its drive (writes overrunning a window).
    pub reads_held_for_writes: u64,
    /// Process CPU (every thread: the engine's, the runtime's, the emulated drives') over the
    /// policy's run, per GB read and written. The replayed compute sleeps, so it is I/O's.
    pub process_cpu_s_per_gb: f64,
    /// Per request: (bubble ms, TTFT ms).
    pub per_request: Vec<(f64, f64)>,
}

/// The simulator's prediction for one policy.
#[derive(serde::Serialize, Clone, Debug)]
pub struct Predicted {
    pub bubble_ms: f64,
    pub ttft_ms: f64,
    pub read_gbps: f64,
    pub write_gbps: f64,
    pub backlog_peak_mib: f64,
}

#[derive(serde::Serialize, Clone, Debug)]
pub struct Row {
    pub policy: PolicyKind,
    pub label: &'static str,
    pub measured: Measured,
    pub predicted: Predicted,
}

const NOTE: &str = "measured: real I/O through libtutti on emulated drives with the bandwidth model and \
the mixed read/write collapse, the compute timeline replayed by sleeping; predicted: `tutti simulate`'s \
model of the same drives, model and workload. Times are per request (means). mixed issues: layers \
started on a drive with the other direction in flight; reads held: times a read waited for writes in \
flight on its drive; CPU s/GB: process CPU (every thread) per GB read and written.";

impl Report {
    pub fn new(host: Host, setup: Setup, rows: Vec<Row>) -> Report {
        Report { host, setup, rows, note: NOTE }
    }

    pub fn text(&self) -> String {
        let s = &self.setup;
        let mut out = format!(
            "bench schedule: {} emulated drives ({:.0}/{:.0} MB/s read/write each, mixed {:.0}% of the faster, \
             {} µs), {} layers, {} tokens at hit rate {:.2}, {} requests × {} decode steps, profile optimism {:+.0}%\n\
             host: {}\n\n",
            s.drives,
            s.read_mbps_per_drive,
            s.write_mbps_per_drive,
            s.mixed_efficiency * 100.0,
            s.latency_us,
            s.layers,
            s.context_tokens,
            s.hit_rate,
            s.requests,
            s.decode_steps,
            s.profile_optimism * 100.0,
            self.host.describe(),
        );
        let rows: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| {
                let m = &r.measured;
                let p = &r.predicted;
                vec![
                    r.label.to_string(),
                    format!("{:.1}", m.bubble_ms),
                    format!("{:.1}", p.bubble_ms),
                    format!("{:.1}", m.ttft_ms),
                    format!("{:.1}", p.ttft_ms),
                    format!("{:.2}", m.read_gbps),
                    format!("{:.2}", p.read_gbps),
                    format!("{:.2}", m.write_gbps),
                    format!("{:.2}", p.write_gbps),
                    format!("{:.1}", m.backlog_peak_mib),
                    m.bytes_dropped.to_string(),
                    m.mixed_issues.to_string(),
                    m.reads_held_for_writes.to_string(),
                    format!("{:.2}", m.process_cpu_s_per_gb),
                ]
            })
            .collect();
        out += &table(
            &[
                "policy",
                "bubble ms",
                "sim",
                "TTFT ms",
                "sim",
                "read GB/s",
                "sim",
                "write GB/s",
                "sim",
                "backlog MiB",
                "dropped B",
                "mixed issues",
                "reads held",
                "CPU s/GB",
            ],
            &rows,
        );
        out += &format!("\n{NOTE}\n");
        out
    }

    pub fn svg(&self) -> String {
        let mut series = Vec::new();
        for r in &self.rows {
            let pts: Vec<(f64, f64)> =
                r.measured.per_request.iter().enumerate().map(|(i, p)| ((i + 1) as f64, p.0)).collect();
            series.push(Series::new(format!("{} measured", r.label), pts.clone()));
            let mut sim = Series::new(
                format!("{} simulated", r.label),
                pts.iter().map(|&(x, _)| (x, r.predicted.bubble_ms)).collect(),
            );
            sim.dashed = true;
            series.push(sim);
        }
        line_chart(
            "GPU bubble per request: measured on emulated drives vs simulated",
            "request",
            "bubble (ms)",
            false,
            &series,
        )
    }
}
