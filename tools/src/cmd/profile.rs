//! `tutti profile`: build a slack table from an engine's timing trace or from the compute model.
//!
//! Trace format (JSON lines; `#` comments and blank lines are skipped):
//! ```text
//! {"kind":"request","request":7,"input_tokens":2048,"prefix_tokens":30720}
//! {"kind":"layer","request":7,"layer":0,"start_ns":1000,"end_ns":51000}
//! {"kind":"decode","request":7,"context_tokens":32769,"start_ns":1700000,"end_ns":1707000}
//! ```
//! `--example-trace PATH` writes such a trace for the compute model.

use std::io::{BufReader, Write};
use std::path::PathBuf;

use anyhow::Context;
use tutti_scheduler::profiler::synthetic_trace;
use tutti_scheduler::{FitReport, Profiler, RequestShape, SlackTable, TableGrid};

use super::simulate::ModelArgs;

/// Write a slack table (slack window, SM budget, max IOCBs per input/prefix bucket and layer).
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model and GPU identity the table is for; without --trace, also the compute model profiled.
    #[command(flatten)]
    pub model: ModelArgs,
    /// JSON-lines timing trace recorded by an engine [default: profile the compute model].
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Where to write the slack table.
    #[arg(long, short, required_unless_present = "example_trace")]
    pub out: Option<PathBuf>,
    /// Instead of profiling, write the trace an engine would record on the compute model.
    #[arg(long, conflicts_with_all = ["trace", "out"])]
    pub example_trace: Option<PathBuf>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(serde::Serialize)]
struct SampleSlack {
    input_tokens: u32,
    prefix_tokens: u32,
    layer: u32,
    window_ms: f64,
    sm_budget: u32,
    max_iocbs: u32,
}

#[derive(serde::Serialize)]
struct Summary {
    table: String,
    model: String,
    gpu: String,
    layers: u32,
    source: String,
    input_buckets: usize,
    prefix_buckets: usize,
    decode_buckets: usize,
    trace_records: Option<usize>,
    fit: Option<FitReport>,
    samples: Vec<SampleSlack>,
    decode_window_ms_at_64k: f64,
}

const EXAMPLE_SHAPES: [(u32, u32); 8] = [
    (512, 0),
    (4096, 0),
    (32_768, 0),
    (2048, 16_384),
    (8192, 32_768),
    (1024, 65_536),
    (16_384, 8192),
    (256, 120_000),
];

pub fn run(args: &Args) -> anyhow::Result<()> {
    let model = args.model.compute_model()?;
    if let Some(path) = &args.example_trace {
        let shapes: Vec<RequestShape> =
            EXAMPLE_SHAPES.iter().map(|&(n, p)| RequestShape::new(n, p)).collect();
        let records = synthetic_trace(&model, &shapes, 16);
        let mut out = std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        );
        for r in &records {
            serde_json::to_writer(&mut out, r)?;
            out.write_all(b"\n")?;
        }
        out.flush().with_context(|| format!("writing {}", path.display()))?;
        if args.json {
            return crate::report::print_json(&serde_json::json!({
                "trace": path.display().to_string(),
                "records": records.len(),
            }));
        }
        println!("wrote an example trace of {} records to {}", records.len(), path.display());
        return Ok(());
    }
    let Some(out) = &args.out else { anyhow::bail!("--out is required") };
    let grid = TableGrid::standard()?;
    let (table, fit, records) = match &args.trace {
        Some(path) => {
            let file =
                std::fs::File::open(path).with_context(|| format!("opening trace {}", path.display()))?;
            let len = file.metadata().map(|m| m.len()).unwrap_or(0);
            let bar = crate::progress::byte_bar(len, "trace", args.json);
            let mut profiler = Profiler::new(model.geometry.layers)?;
            let records = profiler
                .ingest_jsonl(BufReader::new(bar.wrap_read(file)))
                .with_context(|| format!("reading trace {}", path.display()))?;
            bar.finish_and_clear();
            let source = format!("trace:{}", path.display());
            let (table, fit) = profiler.build(model.identity(), grid, model.gpu.io_partition(), &source)?;
            (table, Some(fit), Some(records))
        }
        None => (Profiler::from_model(&model, grid)?, None, None),
    };
    table.save(out)?;
    let summary = summarize(&table, out, fit, records)?;
    if args.json {
        return crate::report::print_json(&summary);
    }
    print_summary(&summary);
    Ok(())
}

fn summarize(
    table: &SlackTable,
    out: &std::path::Path,
    fit: Option<FitReport>,
    records: Option<usize>,
) -> anyhow::Result<Summary> {
    let id = table.identity();
    let mut samples = Vec::new();
    for &(n, p) in &[(4096, 0), (4096, 61_440), (1024, 64_512), (32_768, 32_768)] {
        for layer in [0, id.layers - 1] {
            let e = table.lookup(RequestShape::new(n, p), layer)?;
            samples.push(SampleSlack {
                input_tokens: n,
                prefix_tokens: p,
                layer,
                window_ms: e.window_ns as f64 / 1e6,
                sm_budget: e.sm_budget,
                max_iocbs: e.max_iocbs,
            });
        }
    }
    Ok(Summary {
        table: out.display().to_string(),
        model: id.model.clone(),
        gpu: id.gpu.clone(),
        layers: id.layers,
        source: table.source().to_string(),
        input_buckets: table.grid().input.len(),
        prefix_buckets: table.grid().prefix.len(),
        decode_buckets: table.grid().decode_context.len(),
        trace_records: records,
        fit,
        samples,
        decode_window_ms_at_64k: table.decode_lookup(65_536).window_ns as f64 / 1e6,
    })
}

fn print_summary(s: &Summary) {
    println!(
        "wrote slack table {} for {} on {} ({} layers), from {}",
        s.table, s.model, s.gpu, s.layers, s.source
    );
    println!(
        "  grid: {} input x {} prefix buckets x {} layers; {} decode buckets",
        s.input_buckets, s.prefix_buckets, s.layers, s.decode_buckets
    );
    if let (Some(fit), Some(records)) = (&s.fit, s.trace_records) {
        println!(
            "  fit: {records} records, {} requests, {} layer timings, {} decode steps; worst relative error {:.2}%",
            fit.requests,
            fit.layer_samples,
            fit.decode_samples,
            fit.max_rel_error * 100.0
        );
    }
    println!(
        "  {:>7} {:>7} {:>5} {:>10} {:>4} {:>9}",
        "input", "prefix", "layer", "window ms", "SMs", "max IOCBs"
    );
    for x in &s.samples {
        println!(
            "  {:>7} {:>7} {:>5} {:>10.3} {:>4} {:>9}",
            x.input_tokens, x.prefix_tokens, x.layer, x.window_ms, x.sm_budget, x.max_iocbs
        );
    }
    println!("  decode step slack at 64K context: {:.3} ms", s.decode_window_ms_at_64k);
}
