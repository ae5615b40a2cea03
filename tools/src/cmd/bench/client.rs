//! `tutti bench client`: what an engine process pays for being a client of
//! tuttid instead of owning the pool, against an in-process runtime measured
//! in the same run on the same kind of drives: host CPU per layer of a
//! layer-by-layer load (and per job), and the round trip of a lookup.

use super::common::{cpu_s_per_gb, process_cpu_ns, Host, Output};
use crate::emu::EmulatedArgs;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_daemon::{Daemon, DaemonConfig, DriveSource, SocketMode};
use tutti_driver::controller::{Controller, ControllerOptions};
use tutti_emulator::{EmulatedController, MediaConfig};
use tutti_objstore::{
    chain_hashes, Backend, DriveSpec, Dtype, Geometry, GioConfig, HostKvMemory, KvLayout, KvStore,
    LayoutKind, OpenMode, PoolOptions, StoreOptions,
};

const WAIT: Duration = Duration::from_secs(60);

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Emulated drives under each of the two pools.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub emulated: u32,
    #[arg(long, default_value_t = 16)]
    pub layers: u32,
    #[arg(long, default_value_t = 4)]
    pub kv_heads: u32,
    #[arg(long, default_value_t = 64)]
    pub head_dim: u32,
    #[arg(long, default_value_t = 16)]
    pub block_tokens: u32,
    /// Blocks of the request loaded layer by layer.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub blocks: u32,
    /// Loads measured (each all layers, one layer at a time).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub loads: u32,
    /// Lookups measured.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub lookups: u32,
    #[command(flatten)]
    pub out: Output,
}

#[derive(serde::Serialize, Clone, Debug)]
pub struct Side {
    /// Host CPU inside per-layer submissions, per layer (ns).
    pub submit_ns_per_layer: f64,
    /// Host CPU of job setup, per job (ns).
    pub setup_ns_per_job: f64,
    /// Wall time of one whole layer-by-layer load (median, µs).
    pub load_us_median: f64,
    /// Wall time of one lookup + unpin of the request (median, µs).
    pub lookup_us_median: f64,
    /// Process CPU (every thread: executor lanes, emulated controllers and, for the
    /// client, the daemon serving it in this process) over the loads, per 10^9 bytes loaded.
    pub process_cpu_s_per_gb: f64,
}

#[derive(serde::Serialize, Clone, Debug)]
pub struct Report {
    pub host: Host,
    pub geometry: Geometry,
    pub blocks: u32,
    pub loads: u32,
    pub lookups: u32,
    pub in_process: Side,
    pub client: Side,
    /// client / in-process, per figure.
    pub ratio_submit_per_layer: f64,
    pub ratio_setup_per_job: f64,
    pub ratio_load: f64,
    pub ratio_lookup: f64,
    pub ratio_cpu_per_gb: f64,
}

fn backend() -> Backend {
    let mut gio = GioConfig::default();
    gio.host.blocks = 1;
    gio.sm_budget = 1;
    Backend::Gio(gio)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Stores the request once, then measures loads and lookups on `store`.
fn measure(store: &KvStore, args: &Args, bar: &indicatif::ProgressBar) -> anyhow::Result<Side> {
    let g = *store.geometry();
    let n = args.blocks;
    let bytes = KvLayout::bytes_needed(LayoutKind::Contiguous, &g, 2 * n);
    let mem = Arc::new(HostKvMemory::new(bytes as usize)?);
    let layout = KvLayout::contiguous(g, 2 * n, mem.addr())?;
    store.register_host(mem.clone(), layout, "bench-client", b"")?;
    mem.fill(0, mem.len(), 0x5a)?;
    let tokens: Vec<u32> = (0..n * g.tokens_per_block).collect();
    let hashes = chain_hashes(&tokens, g.tokens_per_block);
    let src: Vec<u32> = (0..n).collect();
    let rep = store.store_request(&hashes, &src, WAIT)?;
    anyhow::ensure!(rep.failed.is_empty(), "storing the request failed: {:?}", rep.failed);
    let dst: Vec<u32> = (n..2 * n).collect();
    let before = store.stats();
    let cpu0 = process_cpu_ns()?;
    let mut loads = Vec::with_capacity(args.loads as usize);
    for _ in 0..args.loads {
        let found = store.lookup(&hashes)?;
        anyhow::ensure!(found.hits() == n as usize, "{} of {n} blocks found", found.hits());
        let t = Instant::now();
        let job = store.submit_load(&found.files, &dst, 0..g.layers)?;
        for layer in 0..g.layers {
            store.wait_layer(job, layer, WAIT)?;
        }
        let st = store.release(job)?;
        loads.push(t.elapsed().as_secs_f64() * 1e6);
        anyhow::ensure!(st.failed == 0, "a load failed: {st:?}");
        store.unpin(found.pin)?;
        bar.inc(1);
    }
    let load_cpu_ns = process_cpu_ns()?.saturating_sub(cpu0);
    let loaded = args.loads as u64 * n as u64 * g.file_bytes();
    let after = store.stats();
    let layers = (after.layers - before.layers).max(1) as f64;
    let jobs = (after.jobs - before.jobs).max(1) as f64;
    let mut lookups = Vec::with_capacity(args.lookups as usize);
    for _ in 0..args.lookups {
        let t = Instant::now();
        let found = store.lookup(&hashes)?;
        store.unpin(found.pin)?;
        lookups.push(t.elapsed().as_secs_f64() * 1e6);
    }
    bar.inc(1);
    store.unregister()?;
    Ok(Side {
        submit_ns_per_layer: (after.submit_ns - before.submit_ns) as f64 / layers,
        setup_ns_per_job: (after.setup_ns - before.setup_ns) as f64 / jobs,
        load_us_median: median(loads),
        lookup_us_median: median(lookups),
        process_cpu_s_per_gb: cpu_s_per_gb(load_cpu_ns as f64 / 1e9, loaded),
    })
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let geometry = Geometry {
        layers: args.layers,
        kv_heads: args.kv_heads,
        head_dim: args.head_dim,
        tokens_per_block: args.block_tokens,
        dtype: Dtype::Bf16,
    };
    geometry.validate()?;
    let host = Host::now();
    // Room for the request's blocks (twice over) on every drive, and then some.
    let need = geometry.file_bytes() * args.blocks as u64 * 4 / args.emulated as u64 + (64 << 20);
    let emu = EmulatedArgs { capacity_mib: need.div_ceil(1 << 20), ..EmulatedArgs::default() };
    let configs = |prefix: &str| -> anyhow::Result<Vec<_>> {
        (0..args.emulated as usize)
            .map(|i| {
                let mut c = emu.config(i)?;
                c.name = format!("{prefix}{i}");
                c.media = MediaConfig::Ram;
                Ok(c)
            })
            .collect()
    };
    let bar = crate::progress::count_bar(2 * args.loads as u64 + 2, "loads", args.out.quiet);

    // In-process: this process owns its drives and pool.
    let emus = configs("own")?.into_iter().map(EmulatedController::start).collect::<Result<Vec<_>, _>>()?;
    let specs = emus
        .iter()
        .map(|e| {
            let c = Controller::new(e.registers(), e.dma_space(), ControllerOptions::default())?;
            Ok(DriveSpec::first_namespace(c)?)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let own = KvStore::open(
        specs,
        StoreOptions { pool: PoolOptions::new(geometry, OpenMode::Create), backend: backend() },
    )?;
    let in_process = measure(&own, args, &bar)?;
    drop(own);
    drop(emus);

    // Client: the same work through tuttid (in this process, over its socket and leased queues).
    let dir = std::env::temp_dir().join(format!("tutti-bench-client-{}", std::process::id()));
    let daemon = Daemon::start(DaemonConfig {
        socket: dir.join("tuttid.sock"),
        mode: SocketMode::Owner,
        drives: DriveSource::Emulated(configs("served")?),
        pool: PoolOptions::new(geometry, OpenMode::Create),
        io_timeout: Duration::from_secs(2),
    })?;
    let remote =
        tutti_daemon::remote::connect(daemon.socket(), "bench", &backend(), Duration::from_secs(10))?;
    let client = measure(&remote, args, &bar);
    drop(remote);
    daemon.stop()?;
    let _ = std::fs::remove_dir_all(&dir);
    let client = client?;
    bar.finish_and_clear();

    let ratio = |c: f64, i: f64| if i > 0.0 { c / i } else { 0.0 };
    let report = Report {
        host,
        geometry,
        blocks: args.blocks,
        loads: args.loads,
        lookups: args.lookups,
        ratio_submit_per_layer: ratio(client.submit_ns_per_layer, in_process.submit_ns_per_layer),
        ratio_setup_per_job: ratio(client.setup_ns_per_job, in_process.setup_ns_per_job),
        ratio_load: ratio(client.load_us_median, in_process.load_us_median),
        ratio_lookup: ratio(client.lookup_us_median, in_process.lookup_us_median),
        ratio_cpu_per_gb: ratio(client.process_cpu_s_per_gb, in_process.process_cpu_s_per_gb),
        in_process,
        client,
    };
    let r = &report;
    let text = format!(
        "tuttid client against in-process ({}; {} blocks x {} layers, {} loads, {} lookups)\n\
         {:<34} {:>12} {:>12} {:>8}\n\
         {:<34} {:>12.0} {:>12.0} {:>7.2}x\n\
         {:<34} {:>12.0} {:>12.0} {:>7.2}x\n\
         {:<34} {:>12.0} {:>12.0} {:>7.2}x\n\
         {:<34} {:>12.1} {:>12.1} {:>7.2}x\n\
         {:<34} {:>12.3} {:>12.3} {:>7.2}x\n\
         process CPU: every thread of this process (executor lanes, emulated controllers and, for the \
         client, the daemon it talks to) over the loads\n",
        r.host.describe(),
        r.blocks,
        r.geometry.layers,
        r.loads,
        r.lookups,
        "",
        "in-process",
        "client",
        "ratio",
        "host CPU per layer submission (ns)",
        r.in_process.submit_ns_per_layer,
        r.client.submit_ns_per_layer,
        r.ratio_submit_per_layer,
        "host CPU per load job setup (ns)",
        r.in_process.setup_ns_per_job,
        r.client.setup_ns_per_job,
        r.ratio_setup_per_job,
        "layer-by-layer load, median (us)",
        r.in_process.load_us_median,
        r.client.load_us_median,
        r.ratio_load,
        "lookup + unpin round trip, median (us)",
        r.in_process.lookup_us_median,
        r.client.lookup_us_median,
        r.ratio_lookup,
        "process CPU s per GB loaded",
        r.in_process.process_cpu_s_per_gb,
        r.client.process_cpu_s_per_gb,
        r.ratio_cpu_per_gb,
    );
    args.out.emit(&report, &text, String::new)
}
