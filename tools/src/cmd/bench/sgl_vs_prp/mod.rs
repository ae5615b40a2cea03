//! `tutti bench sgl-vs-prp`: the same KV objects read from the drives into
//! scattered destination memory through gio_uring (the host executor drives
//! the NVMe queues), with the data pointers described three ways: SGL, PRP
//! with list pages, and PRP limited to PRP1/PRP2. Reports bandwidth, commands
//! and descriptor bytes per object, and the table each needs for a whole pool.
//! Every pass's bytes are compared with what was stored.

mod data;
mod report;
mod scatter;

use super::common::{cpu_s_per_gb, parse_size, process_cpu_ns, size_label, Host, Output};
use super::rig::{DriveArgs, Rig};
use crate::progress::byte_bar;
use anyhow::{bail, Context};
use data::DriveData;
use report::{plot, text, Report, Row};
use scatter::{Costs, Mode, Scatter, Shape};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_driver::command::MAX_NLB;
use tutti_gio_uring::{
    ioctx, DataRef, DriveQueues, GioOptions, GioUring, HostExecutor, HostExecutorConfig, Op,
};

const WAIT: Duration = Duration::from_secs(120);
const SWEEP: [u64; 10] =
    [4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20];

/// What the pass arithmetic needs of one drive.
struct DriveShape {
    lba: u32,
    capacity: u64,
    max_command: u64,
    page: u64,
}

/// A destination piece size, or whole objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Each object contiguous (objects at shuffled places).
    Object,
    /// Objects cut into pieces of this many bytes, each at a shuffled place.
    Bytes(u64),
}

/// The distinct piece sizes `pieces` give for objects of `size` (a piece of at least the
/// object is the whole object).
fn layouts(pieces: &[Piece], size: u64) -> Vec<u64> {
    let mut out = Vec::new();
    for p in pieces {
        let b = match p {
            Piece::Object => size,
            Piece::Bytes(b) => (*b).min(size),
        };
        if !out.contains(&b) {
            out.push(b);
        }
    }
    out
}

fn parse_piece(s: &str) -> Result<Piece, String> {
    if s.eq_ignore_ascii_case("object") {
        return Ok(Piece::Object);
    }
    parse_size(s).map(Piece::Bytes)
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Object sizes (binary units, multiples of 4K), comma separated.
    #[arg(long, value_delimiter = ',', default_value = "32K", value_parser = parse_size)]
    pub sizes: Vec<u64>,
    /// Sweep object sizes 4K, 8K, ..., 2M instead of --sizes.
    #[arg(long)]
    pub sweep: bool,
    /// Destination layouts: "object" (objects contiguous, placed at shuffled slots, like
    /// the pages of a paged KV cache) and/or a piece size (e.g. 4K: every page of an object elsewhere).
    #[arg(long, value_delimiter = ',', default_value = "object,4K", value_parser = parse_piece)]
    pub pieces: Vec<Piece>,
    /// Data pointer modes to compare.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "sgl,prp,prp-inline")]
    pub modes: Vec<Mode>,
    /// Bytes of objects read per pass, for each object size.
    /// [default: 128M, 32M with --sweep]
    #[arg(long, value_parser = parse_size)]
    pub bytes: Option<u64>,
    /// Timed passes per configuration; the median is reported.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub passes: u32,
    /// Untimed (but verified) passes before the timed ones, per configuration.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=10))]
    pub warmup: u32,
    /// Pool size the table sizes are computed for.
    #[arg(long, default_value = "60G", value_parser = parse_size)]
    pub pool_bytes: u64,
    /// Raw queue pairs the executor drives on each drive.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub queue_pairs: u32,
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(2..=4096))]
    pub queue_depth: u32,
    /// OS threads of the gio_uring host executor (one block of 32 lanes each).
    #[arg(long, visible_alias = "exec-threads", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub exec_blocks: u32,
    /// Seed of the object contents and of the destination placement.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub drives: DriveArgs,
    #[command(flatten)]
    pub out: Output,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let sizes: Vec<u64> = if args.sweep { SWEEP.to_vec() } else { args.sizes.clone() };
    if sizes.is_empty() || args.pieces.is_empty() || args.modes.is_empty() {
        bail!("need at least one size, one piece layout and one mode");
    }
    if let Some(s) = sizes.iter().find(|s| **s == 0 || !s.is_multiple_of(4096)) {
        bail!("object size {s} is not a positive multiple of 4K");
    }
    let host = Host::now();
    let bytes = args.bytes.unwrap_or(if args.sweep { 32 << 20 } else { 128 << 20 });
    let largest = sizes.iter().copied().max().unwrap_or(0);
    if bytes < largest {
        bail!("--bytes {} is less than one object of {}", size_label(bytes), size_label(largest));
    }
    let nd = if args.drives.drives.is_empty() {
        args.drives.emulated as u64
    } else {
        args.drives.drives.len() as u64
    };
    // Each drive holds its share of one size's objects (rounded up to whole objects).
    let rig = Rig::start(&args.drives, (bytes / nd + largest).next_multiple_of(1 << 20))?;
    let shapes = rig
        .ctrls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let (lba, blocks) = rig.namespace(i)?;
            let info = c.info();
            let max_cmd = (info.max_transfer / lba as u64).min(MAX_NLB as u64) * lba as u64;
            Ok(DriveShape {
                lba,
                capacity: blocks * lba as u64,
                max_command: max_cmd,
                page: info.page_size as u64,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let page = shapes[0].page;
    if shapes.iter().any(|s| s.page != page) {
        bail!("the drives use different memory page sizes");
    }
    let max_command = shapes.iter().map(|s| s.max_command).min().unwrap_or(page) / page * page;
    let sgl_support =
        rig.ctrls.iter().map(|c| c.info().sgl).find(|s| !s.available()).unwrap_or(rig.ctrls[0].info().sgl);
    let mut notes = Vec::new();
    let mut modes = args.modes.clone();
    modes.dedup();
    if !sgl_support.available() && modes.contains(&Mode::Sgl) {
        notes.push("SGL rows left out: a drive reports no SGL support (Identify SGLS = 0)".to_string());
        modes.retain(|m| *m != Mode::Sgl);
        if modes.is_empty() {
            bail!("only SGL was asked for and a drive does not support SGLs");
        }
    }

    let drives = rig
        .ctrls
        .iter()
        .map(|c| Ok(DriveQueues::create(c, 1, args.queue_pairs, args.queue_depth)?))
        .collect::<anyhow::Result<Vec<_>>>()?;
    // Enough IOCBs (2048 commands each) for a pass of page-sized commands.
    let depth = ((bytes + nd * largest) / page).div_ceil(2048) + nd + 1;
    let exec =
        Arc::new(HostExecutor::new(HostExecutorConfig { blocks: args.exec_blocks, ..Default::default() })?);
    let ring = GioUring::init_with(
        GioOptions { depth: depth.clamp(16, 4096) as u32, ..Default::default() },
        drives,
        exec,
    )?;

    let per_size: u64 =
        sizes.iter().map(|&s| (bytes / s).max(nd) * s * layouts(&args.pieces, s).len() as u64).sum();
    let repeat = modes.len() as u64 * (args.warmup + args.passes) as u64;
    let bar = byte_bar(per_size * repeat, "sgl-vs-prp", args.out.quiet);
    let mut rows = Vec::new();
    for &size in &sizes {
        let objects = (bytes / size).max(nd);
        let per_drive: Vec<usize> = (0..nd).map(|d| (objects - d).div_ceil(nd) as usize).collect();
        let mut sources = Vec::new();
        for (d, c) in rig.ctrls.iter().enumerate() {
            let len = per_drive[d] as u64 * size;
            if len > shapes[d].capacity {
                bail!(
                    "{}: {} of objects do not fit its {} namespace",
                    c.name(),
                    size_label(len),
                    size_label(shapes[d].capacity)
                );
            }
            if size % shapes[d].lba as u64 != 0 {
                bail!(
                    "{}: object size {} is not a whole number of {}-byte LBAs",
                    c.name(),
                    size_label(size),
                    shapes[d].lba
                );
            }
            let src = crate::pattern::drive_words(args.seed ^ size, d, 0, len as usize);
            data::write_objects(c, &src)?;
            sources.push(src);
        }
        let source_sum = data::source_checksum(&sources, size).hex();
        let dsts = rig
            .ctrls
            .iter()
            .zip(&per_drive)
            .map(|(c, &n)| Ok(c.dma().alloc(n * size as usize)?))
            .collect::<anyhow::Result<Vec<_>>>()?;
        for piece_bytes in layouts(&args.pieces, size) {
            let shape = Shape::new(size, piece_bytes, page, max_command)?;
            let scatters = per_drive
                .iter()
                .enumerate()
                .map(|(d, &n)| Scatter::new(shape, n, args.seed ^ (d as u64) << 32 ^ size))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let mut group = Vec::new();
            for &mode in &modes {
                bar.set_message(format!("{} {}", size_label(size), mode.label()));
                let cfg = Config {
                    ring: &ring,
                    ctrls: &rig.ctrls,
                    shapes: &shapes,
                    sources: &sources,
                    scatters: &scatters,
                    dsts: &dsts,
                };
                let mut row = cfg.measure(mode, shape, args, &bar).with_context(|| {
                    format!(
                        "{} objects, {} pieces, {}",
                        size_label(size),
                        size_label(piece_bytes),
                        mode.label()
                    )
                })?;
                row.source_checksum = source_sum.clone();
                if row.read_checksum != source_sum {
                    bail!(
                        "{}: the bytes read hash to {}, the stored ones to {source_sum}",
                        mode.label(),
                        row.read_checksum
                    );
                }
                row.pool_objects = args.pool_bytes / size;
                group.push(row);
            }
            let base = group.iter().find(|r| r.mode == Mode::Prp).map(|r| r.gb_per_sec);
            for r in &mut group {
                r.ratio_vs_prp = base.filter(|b| *b > 0.0).map(|b| r.gb_per_sec / b);
            }
            rows.extend(group);
        }
    }
    bar.finish_and_clear();
    let report = Report {
        host,
        media: rig.media(),
        drives: rig.names(),
        executor: ring.executor().name().to_string(),
        max_transfer: max_command,
        page,
        sgl_supported: sgl_support.available(),
        bytes_per_pass: bytes,
        passes: args.passes,
        pool_bytes: args.pool_bytes,
        rows,
        notes,
    };
    args.out.emit(&report, &text(&report), || plot(&report))
}

/// What one configuration's passes share.
struct Config<'a> {
    ring: &'a GioUring,
    ctrls: &'a [Arc<tutti_driver::controller::Controller>],
    shapes: &'a [DriveShape],
    sources: &'a [Vec<u8>],
    scatters: &'a [Scatter],
    dsts: &'a [tutti_driver::transport::DmaBuffer],
}

impl Config<'_> {
    fn measure(
        &self,
        mode: Mode,
        shape: Shape,
        args: &Args,
        bar: &indicatif::ProgressBar,
    ) -> anyhow::Result<Row> {
        // Descriptors are built once, before timing: the table a store registers up front.
        let mut costs = Costs::default();
        let mut ctxs = Vec::new();
        let mut keep = Vec::new();
        for (d, sc) in self.scatters.iter().enumerate() {
            let ctrl = &self.ctrls[d];
            let built = scatter::build(mode, sc, self.dsts[d].iova(), ctrl.dma().as_ref(), ctrl.info().sgl)?;
            let lba = self.shapes[d].lba as u64;
            for c in &built.commands {
                let slba = (c.object as u64 * shape.object_bytes + c.offset) / lba;
                ctxs.push(ioctx(Op::Read, d as u16, slba, (c.bytes / lba) as u32, DataRef::try_from(c.ptr)?));
            }
            costs.add(built.costs);
            keep.push(built);
        }
        let objects: u64 = self.scatters.iter().map(|s| s.objects as u64).sum();
        let bytes_read = objects * shape.object_bytes;
        let mut pass_seconds = Vec::new();
        let mut timed_cpu_ns = 0u64;
        let mut verified = 0;
        let mut read_sum = String::new();
        for pass in 0..args.warmup + args.passes {
            for dst in self.dsts {
                dst.fill(0xa5);
            }
            let cpu0 = process_cpu_ns()?;
            let t = Instant::now();
            let ids = self.ring.get_iocb(ctxs.len().div_ceil(2048))?;
            for (id, chunk) in ids.iter().zip(ctxs.chunks(2048)) {
                self.ring.set_ioctxs(*id, chunk)?;
            }
            self.ring.issue(&ids, 3)?;
            for r in self.ring.wait_cqe(&ids, WAIT)? {
                r.check()?;
            }
            let elapsed = t.elapsed().as_secs_f64();
            let pass_cpu_ns = process_cpu_ns()?.saturating_sub(cpu0);
            bar.inc(bytes_read);
            let drives: Vec<DriveData<'_>> = (0..self.scatters.len())
                .map(|d| DriveData {
                    source: &self.sources[d],
                    scatter: &self.scatters[d],
                    dst: &self.dsts[d],
                })
                .collect();
            let (n, sum) = data::verify(&drives)?;
            if n != bytes_read {
                bail!("verified {n} bytes of the {bytes_read} read");
            }
            if pass >= args.warmup {
                pass_seconds.push(elapsed);
                timed_cpu_ns += pass_cpu_ns;
                verified += n;
                read_sum = sum.hex();
            }
        }
        drop(keep);
        let mut sorted = pass_seconds.clone();
        sorted.sort_by(f64::total_cmp);
        let seconds = sorted[sorted.len() / 2];
        let per = |v: u64| v as f64 / objects as f64;
        Ok(Row {
            object_bytes: shape.object_bytes,
            piece_bytes: shape.piece_bytes,
            pieces_per_object: shape.pieces(),
            mode,
            label: mode.label(),
            objects,
            bytes_read,
            bytes_verified: verified,
            source_checksum: String::new(),
            read_checksum: read_sum,
            pass_seconds,
            seconds,
            gb_per_sec: bytes_read as f64 / seconds / 1e9,
            ratio_vs_prp: None,
            ns_per_command: seconds * 1e9 / costs.commands.max(1) as f64,
            process_cpu_s_per_gb: cpu_s_per_gb(timed_cpu_ns as f64 / 1e9, bytes_read * args.passes as u64),
            commands_per_object: per(costs.commands),
            descriptors_per_object: per(costs.descriptors),
            desc_bytes_per_object: per(costs.desc_bytes),
            list_bytes_per_object: per(costs.list_bytes),
            pool_objects: 0,
            pool_table_bytes: ((args.pool_bytes / shape.object_bytes) as u128 * costs.table_bytes() as u128
                / objects.max(1) as u128) as u64,
        })
    }
}
