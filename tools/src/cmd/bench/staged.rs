//! `tutti bench staged`: the staged path's copy alone, slot -> KV and KV ->
//! slot, for the chunk sizes of a KV geometry, against the executor's own way
//! of moving the same bytes, measured in the same run (see
//! `tutti_gio_uring::executor` `copy_bench.rs`).
//!
//! On the host executor the kernel's host build runs against `memcpy`. With
//! `--cuda` the kernel runs on the GPU against `cuMemcpyAsync` (the copy
//! engine): slots in mapped pinned host memory, KV memory from `cuMemAlloc`,
//! both timed with CUDA events. Without a CUDA driver `--cuda` fails with the
//! reason. So far `--cuda` has run only on the stand-in driver
//! (`tools/tests/bench_staged_cli.rs`), whose figures are host threads'.

use super::common::{parse_size, size_label, Host, Output};
use crate::cmd::demo::CudaArgs;
use crate::plot::{line_chart, table, Series};
use anyhow::{bail, Context};
use std::sync::Arc;
use std::time::Duration;
use tutti_gio_uring::{
    CopyDirection, CopyReport, CopySpec, CudaExecutor, ExecMode, Executor, HostExecutor, HostExecutorConfig,
};

#[derive(clap::Args, Debug)]
#[command(after_help = "Each chunk size is timed both ways with as many chunks as fit in --bytes; each \
method's destination is checked byte for byte on the first repetition. The kernel copies chunk i of the \
slot region to or from a shuffled place in KV memory, as a request's blocks are; the baselines copy the \
same bytes as one piece (\"whole\") and chunk by chunk to the same places (\"per chunk\").")]
pub struct Args {
    #[command(flatten)]
    pub geometry: crate::geometry_flags::GeometryArgs,
    /// Largest transfer of one command (the drives' MDTS): objects are split into chunks of at
    /// most this many bytes, as the staged table splits them (the demo's emulated drives: 128K).
    #[arg(long, default_value = "128K", value_parser = parse_size)]
    pub max_transfer: u64,
    /// Chunk sizes to time instead of the geometry's (comma separated, multiples of 16: 4K,32K,128K).
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    pub chunk_sizes: Vec<u64>,
    /// Bytes each method copies per repetition.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    pub bytes: u64,
    /// Repetitions of each method (alternating); the median time is reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub reps: u32,
    /// OS threads of the host executor running the kernel (one block of 32 lanes each).
    #[arg(long, visible_alias = "exec-threads", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub exec_blocks: u32,
    #[command(flatten)]
    pub cuda: CudaArgs,
    /// Seed of the contents and of the shuffle of KV chunks.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    #[command(flatten)]
    pub out: Output,
}

/// One chunk size in one direction.
#[derive(serde::Serialize, Debug)]
pub struct Row {
    pub chunk_bytes: u64,
    pub direction: CopyDirection,
    pub chunks: u32,
    /// Bytes each method moved per repetition.
    pub bytes: u64,
    /// Median GB/s (10^9 bytes/s) of the kernel and the baselines.
    pub kernel_gbps: f64,
    pub baseline_gbps: f64,
    pub baseline_chunks_gbps: f64,
    /// Kernel ÷ baseline (whole) and kernel ÷ baseline (per chunk).
    pub ratio: f64,
    pub ratio_chunks: f64,
    pub verified_bytes: u64,
    /// Every repetition, as measured.
    pub run: CopyReport,
}

#[derive(serde::Serialize, Debug)]
pub struct Report {
    pub host: Host,
    pub executor: String,
    pub baseline: String,
    pub clock: String,
    pub object_bytes: u64,
    pub max_transfer: u64,
    pub rows: Vec<Row>,
}

/// The distinct chunk sizes of objects of `object` bytes split at `max_transfer`.
pub fn chunk_sizes(object: u64, max_transfer: u64) -> Vec<u64> {
    let full = object.min(max_transfer);
    let mut sizes = vec![full];
    let tail = object % max_transfer;
    if object > max_transfer && tail != 0 {
        sizes.push(tail);
    }
    sizes
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn gbps(bytes: u64, t: Duration) -> f64 {
    if t.is_zero() {
        0.0
    } else {
        bytes as f64 / t.as_secs_f64() / 1e9
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let g = args.geometry.geometry()?;
    if args.max_transfer == 0 {
        bail!("--max-transfer must be at least 1 byte");
    }
    let sizes = if args.chunk_sizes.is_empty() {
        chunk_sizes(g.object_bytes(), args.max_transfer)
    } else {
        args.chunk_sizes.clone()
    };
    if let Some(s) = sizes.iter().find(|&&s| s == 0 || !s.is_multiple_of(16)) {
        bail!("a chunk of {s} bytes: chunk sizes must be non-zero multiples of 16");
    }
    if args.bytes == 0 || args.bytes > tutti_gio_uring::executor::COPY_MAX_BYTES {
        bail!("--bytes {}: 1 ..= {} per copy", args.bytes, tutti_gio_uring::executor::COPY_MAX_BYTES);
    }
    let exec: Arc<dyn Executor> = if args.cuda.cuda {
        // The bench launches on the I/O stream itself: launch mode, on --cuda-sms SMs if given.
        Arc::new(
            CudaExecutor::new(args.cuda.config(ExecMode::Launch))
                .context("the CUDA executor (--cuda) for the copy bench")?,
        )
    } else {
        Arc::new(HostExecutor::new(HostExecutorConfig {
            mode: ExecMode::Launch,
            blocks: args.exec_blocks,
            ..Default::default()
        })?)
    };
    let host = Host::now();
    let quiet = args.out.quiet || args.out.json;
    let bar = crate::progress::count_bar((sizes.len() * 2) as u64, "copies", quiet);
    let mut rows = Vec::new();
    for &chunk in &sizes {
        let chunks =
            u32::try_from((args.bytes / chunk).max(1)).context("too many chunks; use fewer --bytes")?;
        for direction in [CopyDirection::SlotToKv, CopyDirection::KvToSlot] {
            let spec = CopySpec { chunk_bytes: chunk, chunks, direction, reps: args.reps, seed: args.seed };
            let run = exec.copy_bench(&spec).with_context(|| {
                format!("copy bench, {} chunks of {} {}", chunks, size_label(chunk), direction.name())
            })?;
            let bytes = chunk * chunks as u64;
            let (k, b, c) = (
                gbps(bytes, median(run.runs.iter().map(|r| r.kernel).collect())),
                gbps(bytes, median(run.runs.iter().map(|r| r.baseline).collect())),
                gbps(bytes, median(run.runs.iter().map(|r| r.baseline_chunks).collect())),
            );
            rows.push(Row {
                chunk_bytes: chunk,
                direction,
                chunks,
                bytes,
                kernel_gbps: k,
                baseline_gbps: b,
                baseline_chunks_gbps: c,
                ratio: ratio(k, b),
                ratio_chunks: ratio(k, c),
                verified_bytes: run.verified_bytes,
                run,
            });
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    let (baseline, clock) =
        rows.first().map(|r| (r.run.baseline.clone(), r.run.clock.clone())).unwrap_or_default();
    let report = Report {
        host,
        executor: exec.name().to_string(),
        baseline,
        clock,
        object_bytes: g.object_bytes(),
        max_transfer: args.max_transfer,
        rows,
    };
    args.out.emit(&report, &text(&report), || svg(&report))
}

fn text(r: &Report) -> String {
    let mut out = format!(
        "bench staged: the staged copy (tt_gio_copy) against {} on the same bytes, {}\n\
         executor: {}\nhost: {}\nobjects of {} split at {}; every method's bytes verified\n\n",
        r.baseline,
        r.clock,
        r.executor,
        r.host.describe(),
        crate::report::bytes(r.object_bytes),
        crate::report::bytes(r.max_transfer),
    );
    let rows: Vec<Vec<String>> = r
        .rows
        .iter()
        .map(|row| {
            vec![
                size_label(row.chunk_bytes),
                row.direction.name().to_string(),
                format!("{} x {}", row.run.grid, row.run.block),
                format!("{:.2}", row.kernel_gbps),
                format!("{:.2}", row.baseline_gbps),
                format!("{:.2}x", row.ratio),
                format!("{:.2}", row.baseline_chunks_gbps),
                format!("{:.2}x", row.ratio_chunks),
            ]
        })
        .collect();
    out += &table(
        &[
            "chunk",
            "direction",
            "grid",
            "kernel GB/s",
            "baseline GB/s",
            "kernel / baseline",
            "per-chunk baseline GB/s",
            "kernel / per chunk",
        ],
        &rows,
    );
    out
}

fn svg(r: &Report) -> String {
    let series: Vec<Series> = [CopyDirection::SlotToKv, CopyDirection::KvToSlot]
        .into_iter()
        .flat_map(|d| {
            let pick = |f: fn(&Row) -> f64| -> Vec<(f64, f64)> {
                r.rows
                    .iter()
                    .filter(|row| row.direction == d)
                    .map(|row| (row.chunk_bytes as f64, f(row)))
                    .collect()
            };
            [
                Series::new(format!("tt_gio_copy {}", d.name()), pick(|row| row.kernel_gbps)),
                Series {
                    dashed: true,
                    ..Series::new(format!("baseline {}", d.name()), pick(|row| row.baseline_gbps))
                },
            ]
        })
        .collect();
    line_chart(&format!("staged copy vs {}", r.baseline), "chunk bytes", "GB/s", true, &series)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_split_at_the_max_transfer() {
        assert_eq!(chunk_sizes(32 << 10, 128 << 10), vec![32 << 10]);
        assert_eq!(chunk_sizes(256 << 10, 128 << 10), vec![128 << 10]);
        assert_eq!(chunk_sizes(24 << 10, 16 << 10), vec![16 << 10, 8 << 10]);
    }
}
