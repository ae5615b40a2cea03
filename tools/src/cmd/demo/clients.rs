//! `tutti demo --clients N`: the demo's request stored and retrieved by N engine processes at
//! once, each a client of one tuttid on the emulated drives, as N vLLM workers of a
//! tensor-parallel engine are. Each client process runs its own executor on the queue pairs
//! the daemon leased to it (with `--cuda`: its own I/O kernels in its own green context on
//! the GPU, and with `--kv-memory cuda` its own pinned staging slots), stores its own request
//! (its own seed), retrieves it and verifies every byte, then finds the other clients' requests
//! and verifies those too. The parent starts tuttid in its own process, starts the clients,
//! and starts each phase in every client at the same moment, so the pool's rate is the bytes
//! of all clients over the time from that moment until the last client finished.
//!
//! A client is this binary run again (`tutti demo --client-of SOCKET --client-index I` and
//! the parent's other flags); it says `ready`, then answers each line on its stdin (`store`,
//! `retrieve`, `cross`, `quit`) with one JSON line on its stdout.

use super::args::{backend, Args, KvMemoryFlag};
use super::kv::{for_blocks, Kv};
use super::phase::{rate, retrieve_seed, store_request, Phase};
use crate::report::{bytes, print_json};
use anyhow::{anyhow, bail, Context};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};
use tutti_daemon::{Daemon, DaemonConfig, DriveSource, SocketMode};
use tutti_objstore::{chain_hashes, BlockHash, Geometry, OpenMode, PoolOptions};

/// How long the parent waits for a client's answer to one command (beyond `--timeout` per
/// wait on the drives the client itself applies).
const ANSWER_SLACK: Duration = Duration::from_secs(120);

/// What one client did in one phase.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
struct Answer {
    client: u32,
    phase: String,
    #[serde(default)]
    result: Option<Phase>,
    /// `cross`: blocks of the other clients' requests found and verified.
    #[serde(default)]
    others_verified_blocks: u64,
    #[serde(default)]
    data_path: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(serde::Serialize)]
struct PhaseTotal {
    bytes: u64,
    /// From the first client's start of the phase's timed part to the last one's end.
    seconds: f64,
    gib_per_sec: f64,
}

#[derive(serde::Serialize)]
struct ClientReport {
    client: u32,
    pid: u32,
    store: Phase,
    retrieve: Phase,
    others_verified_blocks: u64,
    data_path: String,
}

#[derive(serde::Serialize)]
struct Report {
    clients: Vec<ClientReport>,
    executor: String,
    request_tokens: u32,
    request_blocks: u32,
    store: PhaseTotal,
    retrieve: PhaseTotal,
    /// Clients still listed by tuttid once every client exited (0: everything released).
    clients_left: usize,
}

/// The token ids of client `i`'s request.
fn tokens(args: &Args, i: u32) -> Vec<u32> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed(args, i));
    (0..args.tokens).map(|_| rng.gen_range(0..128_256)).collect()
}

fn seed(args: &Args, i: u32) -> u64 {
    args.seed.wrapping_add(i as u64)
}

fn hashes(args: &Args, g: &Geometry, i: u32) -> Vec<BlockHash> {
    chain_hashes(&tokens(args, i), g.tokens_per_block)
}

/// One client process: connects, registers its KV memory, fills it, says `ready`, then
/// answers the parent's commands.
pub fn client(args: &Args, socket: &Path) -> anyhow::Result<()> {
    let me = args.client_index.context("--client-of needs --client-index")?;
    let n = args.clients.unwrap_or(2);
    let g = args.geometry.geometry()?;
    let blocks = args.tokens / g.tokens_per_block;
    // The KV memory first, as in an engine (see `tutti demo`).
    let kv = Kv::for_args(args, g, blocks)?;
    let name = format!("demo-client-{me}");
    let store = tutti_daemon::remote::connect(socket, &name, &backend(args), Duration::from_secs(30))
        .with_context(|| format!("connecting to tuttid at {}", socket.display()))?;
    kv.register_with(&store, &args.model)?;
    let own = hashes(args, &g, me);
    let data_path = store.info().data_path.map(|d| d.mode.to_string()).unwrap_or_default();
    let say = |a: Answer| -> anyhow::Result<()> {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", serde_json::to_string(&a)?)?;
        Ok(out.flush()?)
    };
    let answer = |phase: &str| Answer {
        client: me,
        phase: phase.into(),
        result: None,
        others_verified_blocks: 0,
        data_path: Some(data_path.clone()),
        error: None,
    };
    for_blocks(blocks, |b| kv.fill(seed(args, me), b, b))?;
    say(answer("ready"))?;
    for line in std::io::stdin().lock().lines() {
        let cmd = line?;
        let got = match cmd.trim() {
            "store" => {
                store_request(&store, &kv, &own, args).map(|p| Answer { result: Some(p), ..answer("store") })
            }
            "retrieve" => kv.clear().and_then(|()| {
                let r = retrieve_seed(&store, &kv, &own, args, "retrieve", seed(args, me))?;
                if r.hits as u32 != blocks {
                    bail!("client {me} found {} of its {blocks} blocks", r.hits);
                }
                Ok(Answer { result: Some(r.phase), ..answer("retrieve") })
            }),
            "cross" => (0..n)
                .filter(|&j| j != me)
                .try_fold(0u64, |acc, j| {
                    kv.clear()?;
                    let r = retrieve_seed(&store, &kv, &hashes(args, &g, j), args, "cross", seed(args, j))?;
                    if r.hits as u32 != blocks {
                        bail!("client {me} found {} of client {j}'s {blocks} blocks", r.hits);
                    }
                    Ok(acc + r.hits as u64)
                })
                .map(|v| Answer { others_verified_blocks: v, ..answer("cross") }),
            "quit" => return Ok(()),
            other => Err(anyhow!("unknown command {other:?}")),
        };
        match got {
            Ok(a) => say(a)?,
            Err(e) => {
                say(Answer { error: Some(format!("{e:#}")), ..answer(cmd.trim()) })?;
                return Err(e);
            }
        }
    }
    Ok(())
}

struct Proc {
    index: u32,
    child: Child,
    stdin: ChildStdin,
    answers: std::sync::mpsc::Receiver<String>,
}

impl Proc {
    fn start(args: &Args, socket: &Path, index: u32) -> anyhow::Result<Proc> {
        let exe = std::env::current_exe().context("finding the tutti binary")?;
        let mut cmd = Command::new(exe);
        cmd.args(client_args(args, socket, index))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().context("starting a client process")?;
        let stdin = child.stdin.take().context("client stdin")?;
        let stdout: ChildStdout = child.stdout.take().context("client stdout")?;
        let (tx, answers) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Proc { index, child, stdin, answers })
    }

    fn tell(&mut self, cmd: &str) -> anyhow::Result<()> {
        writeln!(self.stdin, "{cmd}").with_context(|| format!("client {} stopped listening", self.index))?;
        Ok(self.stdin.flush()?)
    }

    /// The client's answer to `phase`, within `within`.
    fn answer(&mut self, phase: &str, within: Duration) -> anyhow::Result<Answer> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.answers.recv_timeout(left).map_err(|_| match self.child.try_wait() {
                Ok(Some(st)) => anyhow!("client {} exited ({st}) before answering {phase}", self.index),
                _ => anyhow!("client {} did not answer {phase} within {} s", self.index, within.as_secs()),
            })?;
            // Anything that is not an answer (a progress line) is passed through.
            let Ok(a) = serde_json::from_str::<Answer>(&line) else {
                eprintln!("client {}: {line}", self.index);
                continue;
            };
            if let Some(e) = a.error {
                bail!("client {} failed at {}: {e}", self.index, a.phase);
            }
            if a.phase != phase {
                bail!("client {} answered {} to {phase}", self.index, a.phase);
            }
            return Ok(a);
        }
    }
}

/// The parent's command line for client `index`: its own flags, less `--clients`, plus the
/// client's role.
fn client_args(args: &Args, socket: &Path, index: u32) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        if a == "--clients" {
            it.next();
            continue;
        }
        if a.starts_with("--clients=") || a == "--json" {
            continue;
        }
        out.push(a);
    }
    out.extend([
        "--json".into(),
        "--clients".into(),
        args.clients.unwrap_or(2).to_string(),
        "--client-of".into(),
        socket.display().to_string(),
        "--client-index".into(),
        index.to_string(),
    ]);
    out
}

/// Starts one phase in every client at once and collects their answers.
fn phase(procs: &mut [Proc], name: &str, within: Duration) -> anyhow::Result<Vec<Answer>> {
    for p in procs.iter_mut() {
        p.tell(name)?;
    }
    procs.iter_mut().map(|p| p.answer(name, within)).collect()
}

/// Every client's bytes over the span from the first start to the last end (their
/// CLOCK_MONOTONIC stamps: one clock for every process).
fn total(answers: &[Answer]) -> PhaseTotal {
    let phases: Vec<&Phase> = answers.iter().filter_map(|a| a.result.as_ref()).collect();
    let bytes: u64 = phases.iter().map(|p| p.bytes).sum();
    let start = phases.iter().map(|p| p.start_mono_ns).min().unwrap_or(0);
    let end = phases.iter().map(|p| p.end_mono_ns).max().unwrap_or(0);
    let seconds = end.saturating_sub(start) as f64 / 1e9;
    PhaseTotal { bytes, seconds, gib_per_sec: bytes as f64 / seconds.max(1e-9) / (1u64 << 30) as f64 }
}

/// A private directory for the daemon's socket, removed when dropped.
struct SocketDir(std::path::PathBuf);

impl SocketDir {
    fn new() -> anyhow::Result<SocketDir> {
        let d = std::env::temp_dir().join(format!("tutti-demo-clients-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        Ok(SocketDir(d))
    }
}

impl Drop for SocketDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn run(args: &Args, n: u32) -> anyhow::Result<()> {
    let g = args.geometry.geometry()?;
    if args.tokens < g.tokens_per_block {
        bail!("--tokens {} is less than one block of {} tokens", args.tokens, g.tokens_per_block);
    }
    if matches!(args.kv_memory, KvMemoryFlag::Cuda | KvMemoryFlag::CudaGdr) && !args.cuda.cuda {
        bail!("--kv-memory cuda needs --cuda (the CUDA executor copies between staging and CUDA memory)");
    }
    let blocks = args.tokens / g.tokens_per_block;
    let pool_bytes = n as u64 * blocks as u64 * g.file_bytes();
    let namespaces = args.pool_drives.emulated as u64 * args.pool_drives.emu.emu_namespaces as u64;
    let per_drive = pool_bytes.div_ceil(namespaces) + pool_bytes / 8 + (64 << 20);
    let mut emu = args.pool_drives.emu.clone();
    emu.capacity_mib = emu.capacity_mib.max(per_drive.div_ceil(1 << 20));
    let drives =
        (0..args.pool_drives.emulated as usize).map(|i| emu.config(i)).collect::<Result<Vec<_>, _>>()?;
    let dir = SocketDir::new()?;
    let daemon = Daemon::start(DaemonConfig {
        socket: dir.0.join("tuttid.sock"),
        mode: SocketMode::Owner,
        drives: DriveSource::Emulated(drives),
        pool: PoolOptions::new(g, OpenMode::Create),
        io_timeout: Duration::from_secs(2),
    })
    .context("starting tuttid")?;
    let files = daemon.status().stats.index.files;
    if (files as u64) < n as u64 * blocks as u64 {
        bail!("the pool holds {files} blocks; {n} requests of {blocks} need more: raise --capacity-mib or --emulated");
    }
    let socket = daemon.socket().to_path_buf();
    let mut procs = (0..n).map(|i| Proc::start(args, &socket, i)).collect::<anyhow::Result<Vec<_>>>()?;
    let within = args.wait() + ANSWER_SLACK;
    let result = (|| -> anyhow::Result<Report> {
        let ready =
            procs.iter_mut().map(|p| p.answer("ready", within)).collect::<anyhow::Result<Vec<_>>>()?;
        let stored = phase(&mut procs, "store", within)?;
        let loaded = phase(&mut procs, "retrieve", within)?;
        let cross = phase(&mut procs, "cross", within)?;
        let clients = procs
            .iter()
            .enumerate()
            .map(|(i, p)| ClientReport {
                client: p.index,
                pid: p.child.id(),
                store: stored[i].result.clone().unwrap_or_default(),
                retrieve: loaded[i].result.clone().unwrap_or_default(),
                others_verified_blocks: cross[i].others_verified_blocks,
                data_path: ready[i].data_path.clone().unwrap_or_default(),
            })
            .collect();
        Ok(Report {
            clients,
            executor: if args.cuda.cuda { "cuda".into() } else { "host".into() },
            request_tokens: args.tokens,
            request_blocks: blocks,
            store: total(&stored),
            retrieve: total(&loaded),
            clients_left: 0,
        })
    })();
    for p in procs.iter_mut() {
        let _ = p.tell("quit");
    }
    for p in procs.iter_mut() {
        let deadline = Instant::now() + Duration::from_secs(30);
        while p.child.try_wait()?.is_none() {
            if Instant::now() >= deadline {
                let _ = p.child.kill();
                let _ = p.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let mut report = result?;
    // A departed client is released by the daemon; wait (bounded) until none is listed.
    let deadline = Instant::now() + Duration::from_secs(30);
    report.clients_left = loop {
        let left = daemon.status().clients.len();
        if left == 0 || Instant::now() >= deadline {
            break left;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if report.clients_left != 0 {
        bail!("tuttid still lists {} clients after they all exited", report.clients_left);
    }
    if args.json {
        return print_json(&report);
    }
    for c in &report.clients {
        println!(
            "client {} (pid {}, {} data path): store {} in {:.2} s = {}, retrieve {:.2} s = {}; {} verified, and {} blocks of the others'",
            c.client,
            c.pid,
            c.data_path,
            bytes(c.store.bytes),
            c.store.seconds,
            rate(c.store.gib_per_sec),
            c.retrieve.seconds,
            rate(c.retrieve.gib_per_sec),
            bytes(c.retrieve.verified_bytes),
            c.others_verified_blocks
        );
    }
    println!(
        "{n} clients ({} executor) at once: store {} in {:.2} s = {}, retrieve {} in {:.2} s = {}",
        report.executor,
        bytes(report.store.bytes),
        report.store.seconds,
        rate(report.store.gib_per_sec),
        bytes(report.retrieve.bytes),
        report.retrieve.seconds,
        rate(report.retrieve.gib_per_sec)
    );
    println!("every byte verified; tuttid released every client");
    Ok(())
}
