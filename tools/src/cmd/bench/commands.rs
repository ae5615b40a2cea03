//! `tutti bench commands`: what one small command costs from submission to
//! completion through tutti's stacks, next to io_uring NOPs (the kernel's
//! cheapest round trip) measured in the same run: the driver's Rust-driven
//! I/O queue pair, and gio_uring with the host executor in launch and
//! persistent modes, at several batch sizes.

use super::retrieve::measure::process_cpu_ns;
use super::rig::{DriveArgs, Rig};
use super::{parse_size, size_label, Output};
use crate::plot::table;
use crate::progress::count_bar;
use anyhow::{bail, Context};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_driver::command::{Command, DataMode};
use tutti_driver::controller::Controller;
use tutti_driver::queue::Completion;
use tutti_driver::spec::SglDescriptor;
use tutti_driver::transport::{DmaBuffer, IovaSegment};
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
    #[command(flatten)]
    pub drives: DriveArgs,
    #[command(flatten)]
    pub out: Output,
}

/// One path at one batch size.
#[derive(serde::Serialize, Clone)]
struct Measure {
    path: &'static str,
    batch: u32,
    /// Commands completed successfully (failures stop the run).
    commands: u64,
    seconds: f64,
    ns_per_command: f64,
    /// ns per command over the io_uring NOP's at the same batch size.
    ratio_vs_nop: Option<f64>,
    /// CPU of every thread of the process (executor lanes, emulated controller) per command.
    process_cpu_ns_per_command: f64,
    /// The same per decimal GB read (none for NOPs, which move nothing).
    process_cpu_s_per_gb: Option<f64>,
}

/// The persistent executor left idle for a second after its runs.
#[derive(serde::Serialize)]
struct Idle {
    seconds: f64,
    /// Process CPU seconds over the idle spell (the emulated controller's thread included).
    process_cpu_s: f64,
    /// CPU seconds of the executor's own threads over it.
    executor_cpu_s: f64,
    executor_threads: usize,
}

#[derive(serde::Serialize)]
struct Report {
    host: super::Host,
    media: String,
    drive: String,
    read_bytes: u64,
    data_pointer: &'static str,
    /// Why the io_uring baseline is missing, if it is.
    io_uring_unavailable: Option<String>,
    /// Bytes of the read buffer compared with what was written, after every path.
    bytes_verified: u64,
    results: Vec<Measure>,
    idle_persistent: Option<Idle>,
}

const NOP: &str = "io_uring NOP";
const QPAIR: &str = "IoQueuePair";
const GIO_LAUNCH: &str = "gio launch";
const GIO_PERSISTENT: &str = "gio persistent";

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
            .then(|| super::cpu_s_per_gb(cpu_ns / 1e9, commands * bytes_per_command)),
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

/// Reads the first `batch` blocks of `read_bytes` into `buf` through a queue pair the CPU drives.
fn queue_pair_batches(
    ctrl: &Arc<Controller>,
    buf: &DmaBuffer,
    args: &Args,
    lbas: u32,
    depth: u32,
) -> anyhow::Result<Vec<Measure>> {
    let mut qp = ctrl.create_io_queue_pair(depth)?;
    let mut done: Vec<Completion> = Vec::with_capacity(MAX_BATCH as usize);
    let rb = args.read_bytes as usize;
    args.batches
        .iter()
        .map(|&b| {
            measure(QPAIR, b, args.read_bytes, args.seconds, || {
                for i in 0..b {
                    let seg = [IovaSegment { iova: buf.iova_at(i as usize * rb), len: rb as u64 }];
                    qp.submit_data(
                        Command::read(1, i as u64 * lbas as u64, lbas),
                        &seg,
                        DataMode::Auto,
                        i as u64,
                    )?;
                }
                qp.ring();
                done.clear();
                let (t, mut idle) = (Instant::now(), 0u32);
                while done.len() < b as usize {
                    if qp.reap(&mut done)? > 0 {
                        idle = 0;
                        continue;
                    }
                    if t.elapsed() > WAIT {
                        bail!("{}: {} of {b} reads completed in {WAIT:?}", ctrl.name(), done.len());
                    }
                    // Spin briefly, then give the core away: on a small machine the emulated
                    // controller's thread needs it to make progress.
                    idle += 1;
                    if idle > 64 {
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                }
                if let Some(c) = done.iter().find(|c| !c.status.is_success()) {
                    bail!("{}: Read cid {} failed: {}", ctrl.name(), c.cid, c.status);
                }
                Ok(())
            })
        })
        .collect()
}

fn gio_batches(
    ctrl: &Arc<Controller>,
    buf: &DmaBuffer,
    args: &Args,
    lbas: u32,
    depth: u32,
    mode: ExecMode,
) -> anyhow::Result<(Vec<Measure>, Option<Idle>)> {
    let path = if mode == ExecMode::Persistent { GIO_PERSISTENT } else { GIO_LAUNCH };
    let drives = vec![DriveQueues::create(ctrl, 1, 1, depth)?];
    let exec = Arc::new(HostExecutor::new(HostExecutorConfig {
        mode,
        blocks: args.exec_blocks,
        ..Default::default()
    })?);
    let ring = GioUring::init_with(GioOptions { depth: 4, ..Default::default() }, drives, exec)?;
    let sgl = ctrl.info().sgl.available();
    let rb = args.read_bytes;
    let measures = args
        .batches
        .iter()
        .map(|&b| {
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
            measure(path, b, rb, args.seconds, || {
                let ids = ring.get_iocb(1)?;
                ring.set_ioctxs(ids[0], &ctxs)?;
                ring.issue(&ids, 1)?;
                for r in ring.wait_cqe(&ids, WAIT)? {
                    r.check()?;
                }
                Ok(())
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let idle = if mode == ExecMode::Persistent { Some(idle_cost()?) } else { None };
    Ok((measures, idle))
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
    let host = super::Host::now();
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

    let paths = 4u64;
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
    bar.set_message("IoQueuePair");
    results.extend(queue_pair_batches(ctrl, &buf, args, lbas, depth)?);
    check(QPAIR)?;
    bar.inc(args.batches.len() as u64);
    for mode in [ExecMode::Launch, ExecMode::Persistent] {
        bar.set_message(format!("gio {mode:?}"));
        let (measures, idle) = gio_batches(ctrl, &buf, args, lbas, depth, mode)?;
        results.extend(measures);
        if idle.is_some() {
            idle_persistent = idle;
        }
        check(if mode == ExecMode::Launch { GIO_LAUNCH } else { GIO_PERSISTENT })?;
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
    };
    args.out.emit(&report, &text(&report), String::new)
}

fn text(r: &Report) -> String {
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
    let paths = [NOP, QPAIR, GIO_LAUNCH, GIO_PERSISTENT];
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
         executor (the CUDA kernel source on CPU threads),\nlaunched per IOCB or persistent. The emulated \
         controller is a host thread too, so device time is CPU time here.\nThe host executor runs each \
         CUDA block on one OS thread, its 32 lanes as fibers; process CPU counts every thread.\n",
    );
    if let Some(why) = &r.io_uring_unavailable {
        out.push_str(&format!("note: no io_uring baseline: {why}\n"));
    }
    out
}
