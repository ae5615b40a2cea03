//! What `tutti bench commands` reports: each path's rate at each batch size, the idle cost of
//! the persistent executor, the `--breakdown` stage timings, and the text tables.

use crate::cmd::bench::common::{size_label, Host};
use crate::plot::table;
use tutti_gio_uring::ExecMode;

/// One path at one batch size.
#[derive(serde::Serialize, Clone)]
pub(super) struct Measure {
    pub(super) path: &'static str,
    pub(super) batch: u32,
    /// Commands completed successfully (failures stop the run).
    pub(super) commands: u64,
    pub(super) seconds: f64,
    pub(super) ns_per_command: f64,
    /// ns per command over the io_uring NOP's at the same batch size.
    pub(super) ratio_vs_nop: Option<f64>,
    /// CPU of every thread of the process (executor lanes, emulated controller) per command.
    pub(super) process_cpu_ns_per_command: f64,
    /// The same per decimal GB read (none for NOPs, which move nothing).
    pub(super) process_cpu_s_per_gb: Option<f64>,
}

/// The persistent executor left idle for a second after its runs.
#[derive(serde::Serialize)]
pub(super) struct Idle {
    pub(super) seconds: f64,
    /// Process CPU seconds over the idle spell (the emulated controller's thread included).
    pub(super) process_cpu_s: f64,
    /// CPU seconds of the executor's own threads over it.
    pub(super) executor_cpu_s: f64,
    pub(super) executor_threads: usize,
}

/// The median time of one stage of a batch (`--breakdown`).
#[derive(serde::Serialize, Clone)]
pub(super) struct Stage {
    pub(super) path: &'static str,
    pub(super) batch: u32,
    pub(super) stage: &'static str,
    /// Median over the traced batches, ns per batch (negative: the stages overlapped).
    pub(super) median_ns: i64,
    pub(super) batches: usize,
}

/// Stage timings of traced batches: each sample is one batch's milestones in order.
pub(super) struct Breakdown {
    pub(super) path: &'static str,
    pub(super) batch: u32,
    pub(super) names: &'static [&'static str],
    pub(super) samples: Vec<Vec<u64>>,
}

impl Breakdown {
    pub fn new(path: &'static str, batch: u32, names: &'static [&'static str]) -> Self {
        Breakdown { path, batch, names, samples: Vec::new() }
    }
    /// The median of each stage (milestone k+1 - milestone k).
    pub fn stages(&self) -> Vec<Stage> {
        (0..self.names.len())
            .map(|k| {
                let mut d: Vec<i64> = self.samples.iter().map(|m| m[k + 1] as i64 - m[k] as i64).collect();
                d.sort_unstable();
                Stage {
                    path: self.path,
                    batch: self.batch,
                    stage: self.names[k],
                    median_ns: d.get(d.len() / 2).copied().unwrap_or(0),
                    batches: d.len(),
                }
            })
            .collect()
    }
}

/// Batches traced per (path, batch size) with `--breakdown`.
pub(super) const TRACED_BATCHES: usize = 400;

pub(super) const QPAIR_STAGES: &[&str] = &[
    "host builds SQEs, rings doorbell",
    "controller notices doorbell",
    "controller runs the batch (fetch to last CQE)",
    "host reaps the last CQE",
];
pub(super) const GIO_STAGES: &[&str] = &[
    "host issue (ring push, futex wake)",
    "executor lane wakes, takes the IOCB",
    "lanes build + submit, controller fetches first",
    "controller runs the batch (fetch to last CQE)",
    "lanes see last CQE, IOCB posted",
    "host sees the IOCB (wait_cqe returns)",
];

#[derive(serde::Serialize)]
pub(super) struct Report {
    pub(super) host: Host,
    pub(super) media: String,
    pub(super) drive: String,
    pub(super) read_bytes: u64,
    pub(super) data_pointer: &'static str,
    /// Why the io_uring baseline is missing, if it is.
    pub(super) io_uring_unavailable: Option<String>,
    /// Bytes of the read buffer compared with what was written, after every path.
    pub(super) bytes_verified: u64,
    pub(super) results: Vec<Measure>,
    pub(super) idle_persistent: Option<Idle>,
    /// Stage medians (`--breakdown`), ns per batch.
    pub(super) breakdown: Vec<Stage>,
}

pub(super) const NOP: &str = "io_uring NOP";
pub(super) const MEMCPY: &str = "memcpy";
pub(super) const QPAIR: &str = "IoQueuePair";
pub(super) const QPAIR_NULL: &str = "IoQueuePair null media";
pub(super) const GIO_LAUNCH: &str = "gio launch";
pub(super) const GIO_PERSISTENT: &str = "gio persistent";
pub(super) const GIO_INLINE: &str = "gio inline";

pub(super) fn gio_path(mode: ExecMode) -> &'static str {
    match mode {
        ExecMode::Launch => GIO_LAUNCH,
        ExecMode::Persistent => GIO_PERSISTENT,
        ExecMode::Inline => GIO_INLINE,
    }
}

pub(super) fn text(r: &Report) -> String {
    let mut out = format!(
        "commands: {} Reads ({} data pointer) on {} ({}), submit to complete, against io_uring NOPs; host: {}\n\n",
        size_label(r.read_bytes),
        r.data_pointer,
        r.drive,
        r.media,
        r.host.describe()
    );
    let mut batches: Vec<u32> = Vec::new();
    for m in &r.results {
        if !batches.contains(&m.batch) {
            batches.push(m.batch);
        }
    }
    let paths = [NOP, MEMCPY, QPAIR, QPAIR_NULL, GIO_LAUNCH, GIO_PERSISTENT, GIO_INLINE];
    let mut headers = vec!["batch".to_string()];
    for p in paths.iter().filter(|p| r.results.iter().any(|m| m.path == **p)) {
        headers.push(format!("{p} ns"));
        if *p != NOP {
            headers.push("x NOP".into());
        }
    }
    let rows: Vec<Vec<String>> = batches
        .iter()
        .map(|&b| {
            let mut row = vec![b.to_string()];
            for p in paths.iter().filter(|p| r.results.iter().any(|m| m.path == **p)) {
                let m = r.results.iter().find(|m| m.path == *p && m.batch == b);
                row.push(m.map_or("-".into(), |m| format!("{:.0}", m.ns_per_command)));
                if *p != NOP {
                    row.push(m.and_then(|m| m.ratio_vs_nop).map_or("-".into(), |v| format!("{v:.1}x")));
                }
            }
            row
        })
        .collect();
    let h: Vec<&str> = headers.iter().map(String::as_str).collect();
    out.push_str(&table(&h, &rows));
    let cpu_rows: Vec<Vec<String>> = paths
        .iter()
        .filter(|p| r.results.iter().any(|m| m.path == **p))
        .map(|p| {
            let mut row = vec![p.to_string()];
            for &b in &batches {
                let m = r.results.iter().find(|m| m.path == *p && m.batch == b);
                row.push(m.map_or("-".into(), |m| match m.process_cpu_s_per_gb {
                    Some(g) => format!("{:.0} ({g:.2})", m.process_cpu_ns_per_command),
                    None => format!("{:.0}", m.process_cpu_ns_per_command),
                }));
            }
            row
        })
        .collect();
    let cpu_headers: Vec<String> = std::iter::once("process CPU ns/command (s/GB)".to_string())
        .chain(batches.iter().map(|b| format!("batch {b}")))
        .collect();
    let ch: Vec<&str> = cpu_headers.iter().map(String::as_str).collect();
    out.push('\n');
    out.push_str(&table(&ch, &cpu_rows));
    if let Some(i) = &r.idle_persistent {
        out.push_str(&format!(
            "\nidle persistent executor, {:.1} s with nothing submitted: its {} thread(s) used {:.3} s of CPU, \
             the whole process {:.3} s\n",
            i.seconds, i.executor_threads, i.executor_cpu_s, i.process_cpu_s
        ));
    }
    out.push_str(
        "\nns per command: wall time of a batch (submit, doorbell, device, completion) over its commands.\n\
         IoQueuePair: the driver's queue pair, driven by this thread; gio: gio_uring IOCBs run by the host \
         executor (the CUDA kernel source on CPU threads),\nlaunched per IOCB, persistent, or inline (its lanes run \
         on the thread that issues and waits, like io_uring without SQPOLL). The emulated \
         controller is a host thread too, so device time is CPU time here.\nThe host executor runs each \
         CUDA block on one OS thread, its 32 lanes as fibers; process CPU counts every thread.\n\
         memcpy: the data copy of each Read alone (RAM to the read buffer); IoQueuePair null media: the same \
         queue pair on an emulated drive with no media\n(like null_blk: commands checked and completed, no \
         data moved, nothing verified).\n",
    );
    if !r.breakdown.is_empty() {
        out.push_str(&breakdown_text(r, &batches));
    }
    if let Some(why) = &r.io_uring_unavailable {
        out.push_str(&format!("note: no io_uring baseline: {why}\n"));
    }
    out
}

/// The `--breakdown` tables: one per path, a row per stage, a column per batch size.
pub(super) fn breakdown_text(r: &Report, batches: &[u32]) -> String {
    let mut out = String::new();
    for (path, names) in [(QPAIR, QPAIR_STAGES), (GIO_PERSISTENT, GIO_STAGES)] {
        if !r.breakdown.iter().any(|s| s.path == path) {
            continue;
        }
        let rows: Vec<Vec<String>> = names
            .iter()
            .map(|name| {
                let mut row = vec![name.to_string()];
                for &b in batches {
                    let s = r.breakdown.iter().find(|s| s.path == path && s.batch == b && s.stage == *name);
                    row.push(s.map_or("-".into(), |s| format!("{:.2}", s.median_ns as f64 / 1e3)));
                }
                row
            })
            .collect();
        let headers: Vec<String> = std::iter::once(format!("{path}: median us per batch"))
            .chain(batches.iter().map(|b| format!("batch {b}")))
            .collect();
        let h: Vec<&str> = headers.iter().map(String::as_str).collect();
        out.push('\n');
        out.push_str(&table(&h, &rows));
    }
    out.push_str(&format!(
        "stages from timestamps of the host, the executor and the emulated controller (CLOCK_MONOTONIC), \
         medians of {TRACED_BATCHES} traced batches after each measurement; stages may overlap (negative)\n"
    ));
    out
}
