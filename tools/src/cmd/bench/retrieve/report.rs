//! What `tutti bench retrieve` reports: the JSON shape, the text tables and the plots.

use super::measure::Run;
use super::tutti::PerLayer;
use crate::plot;
use crate::report::bytes;
use tutti_objstore::Geometry;

#[derive(serde::Serialize)]
pub struct MethodInfo {
    pub method: String,
    pub description: String,
}

/// tutti against one baseline.
#[derive(serde::Serialize)]
pub struct Ratio {
    pub baseline: String,
    /// tutti GB/s ÷ baseline GB/s.
    pub bandwidth: f64,
    /// Baseline host CPU per layer call ÷ tutti's (the calling thread only).
    pub host_cpu: f64,
    /// Baseline process CPU per layer ÷ tutti's (every thread: tutti's executor lanes and
    /// emulated controllers included).
    pub process_cpu: f64,
}

#[derive(serde::Serialize)]
pub struct Scenario {
    pub blocks: u32,
    pub tokens: u64,
    pub layers: u32,
    pub bytes_per_method: u64,
    pub runs: Vec<Run>,
    pub ratios: Vec<Ratio>,
    pub tutti_per_layer: PerLayer,
}

#[derive(serde::Serialize)]
pub struct Sweep {
    pub layers: u32,
    pub why_fewer_layers: String,
    pub points: Vec<Scenario>,
}

#[derive(serde::Serialize)]
pub struct Report {
    pub geometry: Geometry,
    pub object_bytes: u64,
    pub media: String,
    pub drives: u32,
    pub io_mode: String,
    pub baseline_file_dir: String,
    pub baseline_file_system: String,
    pub cpus: usize,
    pub methods: Vec<MethodInfo>,
    pub request: Scenario,
    pub sweep: Option<Sweep>,
    pub all_verified: bool,
    pub seconds: f64,
    pub notes: Vec<String>,
}

pub const NOTES: [&str; 4] = [
    "No GPU and no NVMe drive: tutti's drives are emulated controllers with RAM media, and its executor is \
     gio_uring's host executor (CPU threads standing in for GPU warps). Its bandwidth here is that of \
     emulator threads copying RAM, not of SSDs or PCIe.",
    "The emulated controllers, the executor lanes, and the benchmark thread share this machine's cores; \
     the process CPU columns (getrusage RUSAGE_SELF: user + system time of every thread) count all of them. \
     Against the baselines, whose calling thread does the whole copy, process CPU is the like-for-like \
     figure on this machine. On a GPU system the lanes are GPU threads and the copies are the drives' DMA, \
     so there only the host CPU column is host work.",
    "Host CPU per layer is the calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID) of the per-layer \
     control path: for tutti, the store's submission of one layer (IOCB headers naming the request's \
     registered (file, block) pairs; the data moves afterwards, off this thread); for the baselines, the \
     whole synchronous call (their CPU does the copying). tutti's one submit_load per request \
     (validation and registering the pairs, O(blocks) once) is the setup column; the rest of its \
     thread's CPU (polling in wait_layer) is the wait column.",
    "The baselines read a file whose pages are all in the page cache: their best case. A file tier reading \
     from an SSD would add the drive's latency and, for buffered reads, one more copy.",
];

pub fn text(r: &Report) -> String {
    use std::fmt::Write;
    let g = &r.geometry;
    let q = &r.request;
    let mut out = String::new();
    let _ = writeln!(out, "KV: {g}: {} objects", bytes(r.object_bytes));
    let _ = writeln!(out, "tutti: {} on {} drives, {}", r.io_mode, r.drives, r.media);
    let _ = writeln!(
        out,
        "baselines read a page-cached file in {} ({}); {} CPUs shared by every thread",
        r.baseline_file_dir, r.baseline_file_system, r.cpus
    );
    let _ = writeln!(
        out,
        "\nrequest: {} blocks ({} tokens), {} per method, one call per layer into shuffled block slots",
        q.blocks,
        q.tokens,
        bytes(q.bytes_per_method)
    );
    let rows: Vec<Vec<String>> = q
        .runs
        .iter()
        .map(|run| {
            let ratio = q.ratios.iter().find(|x| x.baseline == run.method);
            vec![
                run.method.clone(),
                format!("{:.2}", run.gb_per_s),
                ratio.map_or("-".into(), |x| format!("{:.2}", x.bandwidth)),
                format!("{:.1}", run.host_cpu_us_per_layer_call),
                format!("{:.1}", run.host_cpu_ns_per_block),
                format!("{:.1}", run.setup_cpu_us_per_request),
                ratio.map_or("-".into(), |x| format!("{:.0}", x.host_cpu)),
                format!("{:.0}", run.wait_cpu_us_per_layer),
                format!("{:.1}", run.process_cpu_us_per_layer),
                ratio.map_or("-".into(), |x| format!("{:.2}", x.process_cpu)),
                format!("{:.2}", run.process_cpu_s),
                format!("{:.3}", run.process_cpu_s_per_gb),
                if run.verified { "yes".into() } else { "NO".into() },
            ]
        })
        .collect();
    out.push_str(&plot::table(
        &[
            "method",
            "GB/s",
            "tutti÷this",
            "host CPU µs/layer",
            "ns/block",
            "setup µs/request",
            "this÷tutti CPU",
            "wait µs/layer",
            "process CPU µs/layer",
            "this÷tutti process CPU",
            "process CPU s",
            "CPU s/GB",
            "verified",
        ],
        &rows,
    ));
    let t = &q.tutti_per_layer;
    let _ = writeln!(
        out,
        "host CPU: the calling thread's CPU in the per-layer call (tutti: the store's submission of the \
         layer); setup: tutti's one submit_load per request; wait: its CPU while polling for the layer afterwards; \
         process CPU: every thread (getrusage), executor lanes and emulated controllers included"
    );
    let _ = writeln!(
        out,
        "tutti per layer: {:.0} NVMe commands, {:.0} host call(s), {:.0} commands built and {:.0} pairs \
         copied by the host ({})",
        t.nvme_commands,
        t.host_calls,
        t.host_built,
        t.host_pairs,
        if t.pairs_registered { "pairs registered once per request" } else { "pairs copied per layer" }
    );
    if let Some(run) = q.runs.first() {
        let _ = writeln!(
            out,
            "tutti per request: {:.1} µs setup = {:.1} µs per layer over {} layers; {:.1} µs per layer with it",
            run.setup_cpu_us_per_request,
            run.setup_cpu_us_per_request / q.layers.max(1) as f64,
            q.layers,
            run.host_cpu_us_per_layer_with_setup
        );
    }
    if let Some(s) = &r.sweep {
        let _ = writeln!(
            out,
            "\nhost CPU µs per layer as the request grows (tutti: per-layer submission, plus its setup once per \
             request; process: every thread's CPU per layer; {} layers per block, same objects: {})",
            s.layers, s.why_fewer_layers
        );
        let names: Vec<String> = s.points[0].runs.iter().map(|x| x.method.clone()).collect();
        let mut headers: Vec<String> = vec!["blocks".into()];
        headers.extend(names.iter().map(|n| format!("{n} µs")));
        headers.push(format!("{} setup µs", names.first().map_or("", String::as_str)));
        headers.extend(names.iter().map(|n| format!("{n} process µs")));
        headers.extend(names.iter().map(|n| format!("{n} GB/s")));
        let rows: Vec<Vec<String>> = s
            .points
            .iter()
            .map(|p| {
                let mut row = vec![p.blocks.to_string()];
                row.extend(p.runs.iter().map(|x| format!("{:.1}", x.host_cpu_us_per_layer_call)));
                row.push(p.runs.first().map_or("-".into(), |x| format!("{:.1}", x.setup_cpu_us_per_request)));
                row.extend(p.runs.iter().map(|x| format!("{:.0}", x.process_cpu_us_per_layer)));
                row.extend(p.runs.iter().map(|x| format!("{:.2}", x.gb_per_s)));
                row
            })
            .collect();
        let h: Vec<&str> = headers.iter().map(String::as_str).collect();
        out.push_str(&plot::table(&h, &rows));
    }
    let _ = writeln!(
        out,
        "\n{} in {:.1} s",
        if r.all_verified { "every byte verified" } else { "VERIFICATION FAILED" },
        r.seconds
    );
    for n in &r.notes {
        let _ = writeln!(out, "note: {n}");
    }
    out
}

/// One curve per method over the sweep's block counts (the request's point
/// when there is no sweep), of `y` of each run.
fn chart(r: &Report, title: &str, y_label: &str, y: impl Fn(&Run) -> f64) -> String {
    let points: Vec<&Scenario> = match &r.sweep {
        Some(s) => s.points.iter().collect(),
        None => vec![&r.request],
    };
    let series: Vec<plot::Series> = r
        .methods
        .iter()
        .enumerate()
        .map(|(i, m)| {
            plot::Series::new(
                m.method.clone(),
                points.iter().filter_map(|p| p.runs.get(i).map(|x| (p.blocks as f64, y(x)))).collect(),
            )
        })
        .collect();
    plot::line_chart(title, "blocks in the request", y_label, false, &series)
}

pub fn cpu_chart(r: &Report) -> String {
    chart(r, "host CPU per layer call (retrieve)", "host CPU ms per layer call", |x| {
        x.host_cpu_us_per_layer_call / 1e3
    })
}

pub fn bandwidth_chart(r: &Report) -> String {
    chart(r, "retrieve bandwidth", "GB/s", |x| x.gb_per_s)
}
