//! `tutti bench commands`: what one small command costs from submission to
//! completion through tutti's stacks, next to io_uring NOPs (the kernel's
//! cheapest round trip) measured in the same run: the driver's Rust-driven
//! I/O queue pair, and gio_uring with the host executor in launch and
//! persistent modes, at several batch sizes.

mod report;

use super::common::{cpu_s_per_gb, parse_size, process_cpu_ns, size_label, Host, Output};
use super::rig::{DriveArgs, Rig};
use crate::progress::count_bar;
use anyhow::{bail, Context};
use report::{
    gio_path, text, Breakdown, Idle, Measure, Report, Stage, GIO_STAGES, MEMCPY, NOP, QPAIR, QPAIR_NULL,
    QPAIR_STAGES, TRACED_BATCHES,
};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_driver::command::{Command, DataMode};
use tutti_driver::controller::Controller;
use tutti_driver::queue::Completion;
use tutti_driver::spec::SglDescriptor;
use tutti_driver::transport::{DmaBuffer, IovaSegment};
use tutti_emulator::{monotonic_ns, EmulatedController};
use tutti_gio_uring::{
    ioctx, DataRef, DriveQueues, ExecMode, GioOptions, GioUring, HostExecutor, HostExecutorConfig, Op,
};

const WAIT: Duration = Duration::from_secs(30);
/// Largest batch (the controller's queue size may lower it).
const MAX_BATCH: u32 = 1024;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Commands submitted together and waited for together, comma separated (1..=1024).
    #[arg(long, value_delimiter = ',', default_value = "1,32,256",
          value_parser = clap::value_parser!(u32).range(1..=MAX_BATCH as i64))]
    pub batches: Vec<u32>,
    /// Bytes per Read (a multiple of the LBA size, at most 8K).
    #[arg(long, default_value = "4K", value_parser = parse_size)]
    pub read_bytes: u64,
    /// OS threads of the gio_uring host executor (one block of 32 lanes each).
    #[arg(long, visible_alias = "exec-threads", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub exec_blocks: u32,
    /// Seconds each (path, batch) measurement runs.
    #[arg(long, default_value_t = 0.5)]
    pub seconds: f64,
    /// Also time the stages of a batch (submit, controller pick-up, execution,
    /// completion seen) for the queue pair and gio persistent, from timestamps
    /// the emulated controller and the executor take (medians over extra batches
    /// after each measurement; emulated drives only).
    #[arg(long)]
    pub breakdown: bool,
    #[command(flatten)]
    pub drives: DriveArgs,
    #[command(flatten)]
    pub out: Output,
}

/// Runs `batch_fn` (one batch of `batch` commands) for about `seconds`, after a warm-up.
fn measure(
    path: &'static str,
    batch: u32,
    bytes_per_command: u64,
    seconds: f64,
    mut batch_fn: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Measure> {
    for _ in 0..3 {
        batch_fn()?;
    }
    let cpu0 = process_cpu_ns()?;
    let t = Instant::now();
    let mut batches = 0u64;
    while batches < 3 || t.elapsed().as_secs_f64() < seconds {
        batch_fn()?;
        batches += 1;
    }
    let s = t.elapsed().as_secs_f64();
    let cpu_ns = process_cpu_ns()?.saturating_sub(cpu0) as f64;
    let commands = batches * batch as u64;
    Ok(Measure {
        path,
        batch,
        commands,
        seconds: s,
        ns_per_command: s * 1e9 / commands as f64,
        ratio_vs_nop: None,
        process_cpu_ns_per_command: cpu_ns / commands as f64,
        process_cpu_s_per_gb: (bytes_per_command > 0)
            .then(|| cpu_s_per_gb(cpu_ns / 1e9, commands * bytes_per_command)),
    })
}

fn nop_batches(args: &Args) -> anyhow::Result<Vec<Measure>> {
    let mut ring = io_uring::IoUring::new(MAX_BATCH.next_power_of_two())?;
    let nop = io_uring::opcode::Nop::new().build();
    args.batches
        .iter()
        .map(|&b| {
            measure(NOP, b, 0, args.seconds, || {
                for i in 0..b {
                    let e = nop.clone().user_data(i as u64);
                    // SAFETY: a NOP references no memory.
                    unsafe { ring.submission().push(&e) }.map_err(|_| anyhow::anyhow!("io_uring SQ full"))?;
                }
                ring.submit_and_wait(b as usize)?;
                let mut got = 0;
                for c in ring.completion() {
                    if c.result() < 0 {
                        bail!("io_uring NOP failed: {}", std::io::Error::from_raw_os_error(-c.result()));
                    }
                    got += 1;
                }
                if got != b {
                    bail!("io_uring returned {got} of {b} NOP completions");
                }
                Ok(())
            })
        })
        .collect()
}

/// The data copy a Read of `read_bytes` makes in the emulated controller, alone:
/// `batch` copies from a RAM block store (as big as what the reads span) into the
/// read buffer, at the same offsets.
fn memcpy_batches(buf: &DmaBuffer, args: &Args) -> anyhow::Result<Vec<Measure>> {
    let rb = args.read_bytes as usize;
    let span = args.batches.iter().copied().max().unwrap_or(1) as usize * rb;
    let media: Vec<u8> = (0..span).map(|i| i as u8).collect();
    args.batches
        .iter()
        .map(|&b| {
            measure(MEMCPY, b, args.read_bytes, args.seconds, || {
                for i in 0..b as usize {
                    buf.copy_in(i * rb, &media[i * rb..(i + 1) * rb])?;
                }
                Ok(())
            })
        })
        .collect()
}

/// Reads the first `batch` blocks of `read_bytes` into `buf` through a queue pair the CPU drives.
/// With `emu` (`--breakdown`), each measurement is followed by traced batches.
fn queue_pair_batches(
    ctrl: &Arc<Controller>,
    buf: &DmaBuffer,
    args: &Args,
    lbas: u32,
    depth: u32,
    emu: Option<&EmulatedController>,
) -> anyhow::Result<(Vec<Measure>, Vec<Stage>)> {
    let mut qp = ctrl.create_io_queue_pair(depth)?;
    let mut done: Vec<Completion> = Vec::with_capacity(MAX_BATCH as usize);
    let rb = args.read_bytes as usize;
    // One batch; `marks` gets the times it was submitted and rung (when tracing).
    let mut batch = |b: u32, marks: Option<&mut [u64; 2]>| -> anyhow::Result<()> {
        let t0 = marks.is_some().then(monotonic_ns);
        for i in 0..b {
            let seg = [IovaSegment { iova: buf.iova_at(i as usize * rb), len: rb as u64 }];
            qp.submit_data(Command::read(1, i as u64 * lbas as u64, lbas), &seg, DataMode::Auto, i as u64)?;
        }
        qp.ring();
        if let (Some(m), Some(t0)) = (marks, t0) {
            *m = [t0, monotonic_ns()];
        }
        done.clear();
        let (t, mut idle) = (Instant::now(), 0u32);
        while done.len() < b as usize {
            if qp.reap(&mut done)? > 0 {
                idle = 0;
                continue;
            }
            // Spin briefly, then give the core away: on a small machine the emulated
            // controller's thread needs it to make progress. The clock is read only
            // once spinning is over (on the host it costs more than a poll).
            idle += 1;
            if idle > 64 {
                if t.elapsed() > WAIT {
                    bail!("{}: {} of {b} reads completed in {WAIT:?}", ctrl.name(), done.len());
                }
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        if let Some(c) = done.iter().find(|c| !c.status.is_success()) {
            bail!("{}: Read cid {} failed: {}", ctrl.name(), c.cid, c.status);
        }
        Ok(())
    };
    let mut measures = Vec::new();
    let mut stages = Vec::new();
    for &b in &args.batches {
        measures.push(measure(QPAIR, b, args.read_bytes, args.seconds, || batch(b, None))?);
        let Some(emu) = emu else { continue };
        let mut bd = Breakdown::new(QPAIR, b, QPAIR_STAGES);
        for _ in 0..TRACED_BATCHES {
            let mut m = [0u64; 2];
            emu.trace_start();
            batch(b, Some(&mut m))?;
            let end = monotonic_ns();
            if let Some(span) = emu.trace_take() {
                bd.samples.push(vec![m[0], m[1], span.first_fetch_ns, span.last_post_ns, end]);
            }
        }
        stages.extend(bd.stages());
    }
    Ok((measures, stages))
}

fn gio_batches(
    ctrl: &Arc<Controller>,
    buf: &DmaBuffer,
    args: &Args,
    lbas: u32,
    depth: u32,
    mode: ExecMode,
    emu: Option<&EmulatedController>,
) -> anyhow::Result<(Vec<Measure>, Option<Idle>, Vec<Stage>)> {
    let path = gio_path(mode);
    let drives = vec![DriveQueues::create(ctrl, 1, 1, depth)?];
    let exec = Arc::new(HostExecutor::new(HostExecutorConfig {
        mode,
        blocks: args.exec_blocks,
        ..Default::default()
    })?);
    let ring = GioUring::init_with(GioOptions { depth: 4, ..Default::default() }, drives, exec)?;
    let sgl = ctrl.info().sgl.available();
    let rb = args.read_bytes;
    let mut measures = Vec::new();
    let mut stages = Vec::new();
    for &b in &args.batches {
        let ctxs: Vec<_> = (0..b as u64)
            .map(|i| {
                let iova = buf.iova_at((i * rb) as usize);
                let data = if sgl {
                    DataRef::Sgl(SglDescriptor::data_block(iova, rb as u32))
                } else {
                    // §4.3: a page-aligned buffer of up to two pages needs no list.
                    DataRef::Prp { prp1: iova, prp2: if rb > 4096 { iova + 4096 } else { 0 } }
                };
                ioctx(Op::Read, 0, i * lbas as u64, lbas, data)
            })
            .collect();
        // One IOCB; returns (issued, issue returned, executor started, posted, host saw it).
        let one = || -> anyhow::Result<[u64; 5]> {
            let ids = ring.get_iocb(1)?;
            ring.set_ioctxs(ids[0], &ctxs)?;
            let t0 = monotonic_ns();
            ring.issue(&ids, 1)?;
            let t1 = monotonic_ns();
            let mut marks = [t0, t1, 0, 0, 0];
            for r in ring.wait_cqe(&ids, WAIT)? {
                let r = r.check()?;
                marks[2] = r.started_ns;
                marks[3] = r.done_ns;
            }
            marks[4] = monotonic_ns();
            Ok(marks)
        };
        measures.push(measure(path, b, rb, args.seconds, || one().map(|_| ()))?);
        let Some(emu) = emu.filter(|_| mode == ExecMode::Persistent) else { continue };
        let mut bd = Breakdown::new(path, b, GIO_STAGES);
        for _ in 0..TRACED_BATCHES {
            emu.trace_start();
            let m = one()?;
            if let Some(span) = emu.trace_take() {
                bd.samples.push(vec![m[0], m[1], m[2], span.first_fetch_ns, span.last_post_ns, m[3], m[4]]);
            }
        }
        stages.extend(bd.stages());
    }
    let idle = if mode == ExecMode::Persistent { Some(idle_cost()?) } else { None };
    Ok((measures, idle, stages))
}

/// CPU of the whole process and of the executor's threads (named "tutti-block" by the
/// host runtime) over one second in which nothing is submitted.
fn idle_cost() -> anyhow::Result<Idle> {
    let idle = Duration::from_secs(1);
    std::thread::sleep(Duration::from_millis(100));
    let (p0, e0) = (process_cpu_ns()?, executor_cpu_ticks());
    let t = Instant::now();
    std::thread::sleep(idle);
    let seconds = t.elapsed().as_secs_f64();
    let (p1, (e1, threads)) = (process_cpu_ns()?, executor_cpu_ticks());
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(Idle {
        seconds,
        process_cpu_s: p1.saturating_sub(p0) as f64 / 1e9,
        executor_cpu_s: e1.saturating_sub(e0.0) as f64 / hz,
        executor_threads: threads,
    })
}

/// User + system clock ticks of the executor's threads so far, and how many there are.
fn executor_cpu_ticks() -> (u64, usize) {
    let (mut ticks, mut threads) = (0, 0);
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return (0, 0) };
    for t in tasks.flatten() {
        let dir = t.path();
        if std::fs::read_to_string(dir.join("comm")).map_or(true, |c| c.trim() != "tutti-block") {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else { continue };
        // Fields after the parenthesised name: state is field 3, utime 14 and stime 15.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        ticks += f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
            + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        threads += 1;
    }
    (ticks, threads)
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    if args.batches.is_empty() {
        bail!("--batches needs at least one batch size");
    }
    if !(args.seconds > 0.0 && args.seconds <= 600.0) {
        bail!("--seconds {} is not in (0, 600]", args.seconds);
    }
    if args.read_bytes == 0 || args.read_bytes > 8192 || !args.read_bytes.is_multiple_of(512) {
        bail!("--read-bytes {} is not a multiple of 512 in 512..=8K", args.read_bytes);
    }
    let host = Host::now();
    let max_batch = args.batches.iter().copied().max().unwrap_or(1) as u64;
    let span = max_batch * args.read_bytes;
    let rig = Rig::start(&args.drives, span.next_multiple_of(1 << 20))?;
    let ctrl = &rig.ctrls[0];
    let (lba, blocks) = rig.namespace(0)?;
    if !args.read_bytes.is_multiple_of(lba as u64) || span > blocks * lba as u64 {
        bail!(
            "{}: {} reads of {} do not fit namespace 1 ({} blocks of {lba} bytes)",
            ctrl.name(),
            max_batch,
            size_label(args.read_bytes),
            blocks
        );
    }
    let lbas = (args.read_bytes / lba as u64) as u32;
    // A queue of n entries holds n - 1 commands (§4.1: full when tail + 1 = head).
    let depth = max_batch as u32 + 1;
    if depth > ctrl.info().max_queue_entries {
        bail!(
            "{}: a batch of {max_batch} needs queues of {depth} entries; the controller allows {}",
            ctrl.name(),
            ctrl.info().max_queue_entries
        );
    }
    let sgl = ctrl.info().sgl.available();
    // The blocks every batch reads hold a pattern, so each path's reads can be checked.
    let pattern: Vec<u8> =
        (0..span).map(|i| (i.wrapping_mul(0x9e37_79b9) >> 11) as u8 ^ (i >> 9) as u8).collect();
    let buf = ctrl.dma().alloc(span as usize)?;
    buf.copy_in(0, &pattern)?;
    ctrl.create_io_queue_pair(64)?
        .write(1, 0, &[IovaSegment { iova: buf.iova(), len: span }], DataMode::Auto)
        .context("writing the blocks the reads target")?;
    let mut verified = 0u64;
    let mut check = |what: &str| -> anyhow::Result<()> {
        let mut got = vec![0u8; span as usize];
        buf.copy_out(0, &mut got)?;
        if let Some(i) = got.iter().zip(&pattern).position(|(a, b)| a != b) {
            bail!(
                "{what}: byte {i} of the read buffer is {:#04x}, the drive holds {:#04x}",
                got[i],
                pattern[i]
            );
        }
        verified += span;
        buf.fill(0);
        Ok(())
    };
    buf.fill(0);

    let paths = if rig.emulator(0).is_some() { 7u64 } else { 5 };
    let bar = count_bar(paths * args.batches.len() as u64, "commands", args.out.quiet);
    let mut results = Vec::new();
    let mut io_uring_unavailable = None;
    let mut idle_persistent = None;
    bar.set_message("io_uring");
    match nop_batches(args) {
        Ok(m) => results.extend(m),
        Err(e) => io_uring_unavailable = Some(format!("{e:#}")),
    }
    bar.inc(args.batches.len() as u64);
    let emu = if args.breakdown {
        Some(
            rig.emulator(0)
                .context("--breakdown needs an emulated drive (its controller takes the timestamps)")?,
        )
    } else {
        None
    };
    let mut breakdown = Vec::new();
    bar.set_message("IoQueuePair");
    let (measures, stages) = queue_pair_batches(ctrl, &buf, args, lbas, depth, emu)?;
    results.extend(measures);
    breakdown.extend(stages);
    check(QPAIR)?;
    // The same queue pair on a drive with no media (nothing copied), and the copy alone.
    if let Some(emu) = rig.emulator(0) {
        bar.set_message("null media");
        let mut cfg = emu.config().clone();
        cfg.name = format!("{}-null", cfg.name);
        cfg.media = tutti_emulator::MediaConfig::Null;
        let null = EmulatedController::start(cfg)?;
        let null_ctrl = crate::cmd::identify::bring_up(&null)?;
        let null_buf = null_ctrl.dma().alloc(span as usize)?;
        let (m, _) = queue_pair_batches(&null_ctrl, &null_buf, args, lbas, depth, None)?;
        results.extend(m.into_iter().map(|m| Measure { path: QPAIR_NULL, ..m }));
        drop(null_buf);
        drop(null_ctrl);
        drop(null);
        results.extend(memcpy_batches(&buf, args)?);
        buf.fill(0);
    }
    bar.inc(args.batches.len() as u64);
    for mode in [ExecMode::Launch, ExecMode::Persistent, ExecMode::Inline] {
        bar.set_message(format!("gio {mode:?}"));
        let (measures, idle, stages) = gio_batches(ctrl, &buf, args, lbas, depth, mode, emu)?;
        results.extend(measures);
        breakdown.extend(stages);
        if idle.is_some() {
            idle_persistent = idle;
        }
        check(gio_path(mode))?;
        bar.inc(args.batches.len() as u64);
    }
    bar.finish_and_clear();
    let nops: Vec<(u32, f64)> =
        results.iter().filter(|m| m.path == NOP).map(|m| (m.batch, m.ns_per_command)).collect();
    for m in &mut results {
        m.ratio_vs_nop = nops.iter().find(|(b, _)| *b == m.batch).map(|(_, ns)| m.ns_per_command / ns);
    }
    let report = Report {
        host,
        media: rig.media(),
        drive: ctrl.name().to_string(),
        read_bytes: args.read_bytes,
        data_pointer: if sgl { "SGL" } else { "PRP" },
        io_uring_unavailable,
        bytes_verified: verified,
        results,
        idle_persistent,
        breakdown,
    };
    args.out.emit(&report, &text(&report), String::new)
}
