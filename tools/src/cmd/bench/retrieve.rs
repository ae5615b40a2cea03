//! `tutti bench retrieve`: layers of a long request retrieved through tutti
//! (object store, gio_uring host executor, RAM-backed emulated drives) and, in
//! the same run on the same objects into the same scattered block slots,
//! through io_uring with registered buffers, one pread per object, and a
//! plain memory copy. Every method's bytes are checked after it runs.
//!
//! Two parts:
//! - **request**: the full geometry (Llama-3-8B: 32 layers, 32 KiB objects),
//!   a 16K-token request by default: bandwidth of each method and tutti's ratio to it;
//! - **sweep**: host CPU per layer as the request grows from 1K to 16K
//!   blocks (tutti: the per-layer submission, which stays flat because the
//!   request's pairs are registered once, plus the per-request setup that
//!   does the O(blocks) work once). 16K blocks of all 32 layers would be 32 GiB per copy of the data,
//!   so the sweep's pool keeps the same 32 KiB objects but only a few layers
//!   (`--sweep-layers`): a layer call's cost depends on the blocks in it, not
//!   on how many other layers the model has.

mod baselines;
mod data;
pub(super) mod measure;
mod report;
mod tutti;

use super::common::Output;
use crate::cmd::ExecFlag;
use crate::report::bytes;
use anyhow::{bail, Context};
use data::Dataset;
use measure::{Method, Run};
use report::{bandwidth_chart, cpu_chart, text, MethodInfo, Ratio, Report, Scenario, Sweep, NOTES};
use std::path::PathBuf;
use std::time::Instant;
use tutti_objstore::Geometry;

#[derive(clap::Args, Debug)]
#[command(after_help = "The block-count sweep stores --sweep-layers layers per block, not the model's 32: \
16K blocks × 32 layers × K and V × 32 KiB would be 32 GiB for each of the copies the benchmark keeps \
(reference, page-cached file, emulated drives, KV memory). The cost of one layer call depends on the \
blocks in it, so fewer layers measure the same thing.")]
pub struct Args {
    /// Blocks of the request retrieved with the full geometry (1024 blocks of 16 tokens = 16K tokens).
    #[arg(long, default_value_t = 1024)]
    pub request_blocks: u32,
    /// Block counts of the control-path sweep (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "1024,2048,4096,8192,16384")]
    pub blocks: Vec<u32>,
    /// Layers stored per block in the sweep (see below).
    #[arg(long, default_value_t = 2)]
    pub sweep_layers: u32,
    /// Skip the block-count sweep.
    #[arg(long)]
    pub no_sweep: bool,
    #[command(flatten)]
    pub geometry: crate::geometry_flags::GeometryArgs,
    /// Emulated drives the pool stripes over.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub emulated: u32,
    /// io_uring submission queue entries (reads in flight per batch).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub uring_depth: u32,
    /// Directory of the file the baselines read (default: the temporary directory). Use a disk
    /// file system (ext4, xfs): on tmpfs io_uring hands every buffered read to a worker thread.
    #[arg(long)]
    pub file_dir: Option<PathBuf>,
    /// How the host executor runs: persistent (a kernel polls the ring, as with SQPOLL), launch
    /// (each submission starts the lane threads; on the host that is thread creation, not a CUDA launch),
    /// or inline (one block whose lanes run on the calling thread; needs --exec-blocks 1).
    #[arg(long, value_enum, default_value_t = ExecFlag::Persistent)]
    pub executor: ExecFlag,
    /// OS threads of the host executor (one block of 32 lanes each); every layer IOCB is split over them.
    #[arg(long, visible_alias = "exec-threads", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub exec_blocks: u32,
    /// Runs of each method at each size; the run of median time is reported. Repeats stop once
    /// they have taken a second, so large sizes run fewer times.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub reps: u32,
    /// Seed of the contents and of the block-slot shuffle.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Also write a plot of GB/s against blocks to this path (--svg plots host CPU per layer call).
    #[arg(long, value_name = "PATH")]
    pub bandwidth_svg: Option<PathBuf>,
    #[command(flatten)]
    pub out: Output,
}

/// Time after which a method stops repeating a size.
const REP_BUDGET: std::time::Duration = std::time::Duration::from_secs(1);

fn geometry(a: &Args, layers: u32) -> anyhow::Result<Geometry> {
    let g = a.geometry.with_layers(layers)?;
    if !g.object_bytes().is_multiple_of(512) {
        bail!(
            "objects of {} bytes: the emulated drives need multiples of their 512-byte blocks",
            g.object_bytes()
        );
    }
    Ok(g)
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let g = geometry(args, args.geometry.layers)?;
    let gs = geometry(args, args.sweep_layers).context("--sweep-layers")?;
    if args.request_blocks == 0 {
        bail!("--request-blocks must be at least 1");
    }
    if !args.no_sweep && (args.blocks.is_empty() || args.blocks.contains(&0)) {
        bail!("--blocks needs block counts of at least 1 (or --no-sweep)");
    }
    let dir = args.file_dir.clone().unwrap_or_else(std::env::temp_dir);
    let largest = (args.request_blocks as u64 * g.file_bytes()).max(if args.no_sweep {
        0
    } else {
        args.blocks.iter().max().map_or(0, |&n| n as u64 * gs.file_bytes())
    });
    check_memory(largest)?;
    let quiet = args.out.quiet || args.out.json;
    let start = Instant::now();
    let mut sweep_blocks = args.blocks.clone();
    sweep_blocks.sort_unstable();
    sweep_blocks.dedup();
    let sweep_bytes: u64 =
        if args.no_sweep { 0 } else { sweep_blocks.iter().map(|&n| n as u64 * gs.file_bytes()).sum() };
    let total = 4 * (args.request_blocks as u64 * g.file_bytes() + sweep_bytes);
    let bar = crate::progress::byte_bar(total, "retrieve", quiet);

    let (mut request, methods, io_mode) = {
        let ds = Dataset::create(g, args.request_blocks, args.seed, &dir)?;
        measure_points(&ds, &[ds.blocks], args, quiet, &bar)?
    };
    let request = request.pop().ok_or_else(|| anyhow::anyhow!("the request measured nothing"))?;
    let sweep = if args.no_sweep {
        None
    } else {
        let max = *sweep_blocks.last().unwrap_or(&1);
        let ds = Dataset::create(gs, max, args.seed, &dir)?;
        let (points, _, _) = measure_points(&ds, &sweep_blocks, args, quiet, &bar)?;
        Some(Sweep {
            layers: gs.layers,
            why_fewer_layers: format!(
                "{} blocks × {} layers × 2 × {} would be {} per copy of the data; {} layers keep the same \
                 objects and layer calls at {}",
                max,
                g.layers,
                bytes(g.object_bytes()),
                bytes(max as u64 * g.file_bytes()),
                gs.layers,
                bytes(max as u64 * gs.file_bytes())
            ),
            points,
        })
    };
    bar.finish_and_clear();

    let fs = data::file_system(&dir);
    let mut notes: Vec<String> =
        NOTES.iter().map(|s| s.split_whitespace().collect::<Vec<_>>().join(" ")).collect();
    if fs == "tmpfs" {
        notes.push(format!(
            "The baseline file is on tmpfs ({}): io_uring hands its reads to kernel worker threads, \
             so its host CPU column misses the copies; use --file-dir on ext4 or xfs.",
            dir.display()
        ));
    }
    let all_verified = request.runs.iter().all(|r| r.verified)
        && sweep.iter().flat_map(|s| &s.points).flat_map(|p| &p.runs).all(|r| r.verified);
    let report = Report {
        geometry: g,
        object_bytes: g.object_bytes(),
        media: "emulated (RAM media)".into(),
        drives: args.emulated,
        io_mode,
        baseline_file_dir: dir.display().to_string(),
        baseline_file_system: fs.clone(),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        methods,
        request,
        sweep,
        all_verified,
        seconds: start.elapsed().as_secs_f64(),
        notes,
    };
    if let Some(path) = &args.bandwidth_svg {
        std::fs::write(path, bandwidth_chart(&report))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    args.out.emit(&report, &text(&report), || cpu_chart(&report))
}

/// Refuses a run whose copies of the data would not fit in memory: the
/// reference, the page-cached file, the emulated drives (plus metadata) and
/// the KV memory each hold the whole data set.
fn check_memory(data: u64) -> anyhow::Result<()> {
    let need = data * 4 + data / 8;
    let available = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib << 10)
    });
    if let Some(avail) = available {
        if need > avail {
            bail!(
                "the largest data set is {} and the benchmark keeps four copies of it ({}), more than the \
                 {} of memory available: lower --request-blocks, --blocks or --sweep-layers",
                bytes(data),
                bytes(need),
                bytes(avail)
            );
        }
    }
    Ok(())
}

/// Every method over chunks `0..n` of the data set for each `n` in `points`,
/// one method at a time: tutti's executor and emulated controllers are
/// stopped before the baselines run, so they do not compete for the cores.
fn measure_points(
    ds: &Dataset,
    points: &[u32],
    args: &Args,
    quiet: bool,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<(Vec<Scenario>, Vec<MethodInfo>, String)> {
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); points.len()];
    let mut infos = Vec::new();
    let mut per_layer = vec![tutti::PerLayer::default(); points.len()];
    let io_mode;
    {
        let mut t = tutti::Tutti::setup(ds, args.emulated, args.executor.mode(), args.exec_blocks, quiet)?;
        io_mode = t.io_mode.clone();
        for (k, &n) in points.iter().enumerate() {
            runs[k].push(measure_one(&mut t, ds, n, args.reps, bar)?);
            per_layer[k] = t.last;
        }
        infos.push(MethodInfo { method: t.name().into(), description: t.describe() });
    }
    let mut uring = baselines::UringFixed::new(ds, args.uring_depth)?;
    let baselines: [&mut dyn Method; 3] = [&mut uring, &mut baselines::Pread, &mut baselines::Memcpy];
    for m in baselines {
        for (k, &n) in points.iter().enumerate() {
            runs[k].push(measure_one(m, ds, n, args.reps, bar)?);
        }
        infos.push(MethodInfo { method: m.name().into(), description: m.describe() });
    }
    let scenarios = points
        .iter()
        .zip(runs)
        .zip(per_layer)
        .map(|((&n, runs), tutti_per_layer)| {
            let t = &runs[0];
            let ratios = runs[1..]
                .iter()
                .map(|b| Ratio {
                    baseline: b.method.clone(),
                    bandwidth: t.gb_per_s / b.gb_per_s.max(1e-12),
                    host_cpu: b.host_cpu_us_per_layer_call / t.host_cpu_us_per_layer_call.max(1e-9),
                    process_cpu: b.process_cpu_us_per_layer / t.process_cpu_us_per_layer.max(1e-9),
                })
                .collect();
            Scenario {
                blocks: n,
                tokens: n as u64 * ds.g.tokens_per_block as u64,
                layers: ds.g.layers,
                bytes_per_method: n as u64 * ds.g.file_bytes(),
                runs,
                ratios,
                tutti_per_layer,
            }
        })
        .collect();
    Ok((scenarios, infos, io_mode))
}

/// All layers of chunks `0..n`, after a small warm-up: up to `reps` runs
/// (fewer once they have taken [`REP_BUDGET`]), the one of median time reported.
fn measure_one(
    m: &mut dyn Method,
    ds: &Dataset,
    n: u32,
    reps: u32,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<Run> {
    bar.set_message(format!("{} {n}", m.name()));
    measure::run(m, ds, n.min(32), 0..1)?;
    let start = Instant::now();
    let mut runs = Vec::new();
    while runs.is_empty() || (runs.len() < reps as usize && start.elapsed() < REP_BUDGET) {
        runs.push(measure::run(m, ds, n, 0..ds.g.layers)?);
    }
    bar.inc(runs[0].bytes);
    runs.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    let count = runs.len() as u32;
    let mut r = runs.swap_remove(runs.len() / 2);
    r.reps = count;
    Ok(r)
}
