//! `tutti bench schedule`: the simulator's four policies on real I/O through the runtime.
//!
//! A compute timeline from the compute model (a small model on a slow GPU, so that its layers
//! last milliseconds, as the emulated drives' transfers do) is replayed by sleeping through each
//! layer and decode step, while the runtime loads each request's cached prefix and stores its new
//! KV on emulated drives with the bandwidth model and the mixed read/write collapse. Per policy:
//! - **a: load-all**: the whole prefix is loaded before the first layer (scheduler in pass mode);
//! - **b: layer-wise**: layer `l` waits only for its own KV; stores go as soon as each layer is
//!   computed, beside the reads (pass mode: reads and writes share drives);
//! - **c: slack**: the runtime's scheduler with the slack table of the compute model, fed the
//!   layer and decode timings (`tutti_sched_layer_*`, `tutti_sched_decode_*`);
//! - **d: slack+online**: the same, the table corrected online from the observed windows.
//!
//! Measured per policy: GPU bubble (time a layer waited for its KV), time to first token, read
//! and write bandwidth achieved, the write backlog's peak, bytes dropped; the simulator's
//! prediction for the same model, drives and workload stands beside each row.

mod abi;
mod report;

use report::{Measured, Predicted, Report, Row, Setup};

use abi::{key, KvMem, Rt};
use anyhow::{bail, Context};
use std::time::{Duration, Instant};
use tutti_scheduler::sim::{simulate, PolicyKind, SimConfig, SsdConfig, Workload};
use tutti_scheduler::{
    ComputeModel, GpuModel, ModelGeometry, OnlineConfig, Profiler, RequestShape, TableGrid,
};

use super::common::{cpu_s_per_gb, process_cpu_ns, Host, Output};

const TIMEOUT: Duration = Duration::from_secs(120);

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Emulated drives.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub drives: u32,
    /// Read bandwidth of one drive with no writes, MB/s.
    #[arg(long, default_value_t = 400.0)]
    pub read_mbps: f64,
    /// Write bandwidth of one drive with no reads, MB/s.
    #[arg(long, default_value_t = 200.0)]
    pub write_mbps: f64,
    /// Fraction of its faster direction's bandwidth a drive keeps with reads and writes in
    /// flight together (0.4 = the paper's 60% collapse).
    #[arg(long, default_value_t = 0.4)]
    pub mixed_efficiency: f64,
    /// Share of the mixed bandwidth reads get.
    #[arg(long, default_value_t = 0.5)]
    pub mixed_read_share: f64,
    /// Latency of every command, µs.
    #[arg(long, default_value_t = 100)]
    pub latency_us: u32,
    /// Model layers.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(2..=128))]
    pub layers: u32,
    /// Tokens per request (cached prefix + new input).
    #[arg(long, default_value_t = 4096)]
    pub context_tokens: u32,
    /// Share of each request's tokens whose KV comes from the pool.
    #[arg(long, default_value_t = 0.75)]
    pub hit_rate: f64,
    /// Requests run back to back per policy.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub requests: u32,
    /// Decode steps after each prefill.
    #[arg(long, default_value_t = 16)]
    pub decode_steps: u32,
    /// Achieved TFLOP/s of the (slow, emulated) GPU the compute timeline comes from.
    #[arg(long, default_value_t = 10.0)]
    pub tflops: f64,
    /// Achieved HBM bandwidth of that GPU, GB/s (decode steps).
    #[arg(long, default_value_t = 100.0)]
    pub hbm_gbps: f64,
    /// The slack table given to c and d overstates every window by this fraction (0.3 = a
    /// profile 30% too optimistic).
    #[arg(long, default_value_t = 0.0)]
    pub profile_optimism: f64,
    /// Bound on engine memory held by stores not yet written, MiB.
    #[arg(long, default_value_t = 256)]
    pub backlog_mib: u64,
    #[command(flatten)]
    pub out: Output,
}

impl Args {
    fn validate(&self) -> anyhow::Result<()> {
        let pos = |v: f64| v.is_finite() && v > 0.0;
        if !pos(self.read_mbps) || !pos(self.write_mbps) || !pos(self.tflops) || !pos(self.hbm_gbps) {
            bail!("--read-mbps, --write-mbps, --tflops and --hbm-gbps must be positive");
        }
        if !(self.mixed_efficiency > 0.0 && self.mixed_efficiency <= 1.0) {
            bail!("--mixed-efficiency must be in (0, 1], got {}", self.mixed_efficiency);
        }
        if !(self.mixed_read_share > 0.0 && self.mixed_read_share < 1.0) {
            bail!("--mixed-read-share must be in (0, 1), got {}", self.mixed_read_share);
        }
        if !(0.0..=1.0).contains(&self.hit_rate) {
            bail!("--hit-rate must be in [0, 1], got {}", self.hit_rate);
        }
        if !(self.profile_optimism.is_finite() && self.profile_optimism > -1.0) {
            bail!("--profile-optimism must be > -1, got {}", self.profile_optimism);
        }
        if self.context_tokens < 2 * BLOCK_TOKENS || self.context_tokens > 1 << 20 {
            bail!("--context-tokens must be in {}..=1048576", 2 * BLOCK_TOKENS);
        }
        Ok(())
    }
}

const BLOCK_TOKENS: u32 = 16;

/// The bench's model: small enough for emulated drives, with the compute model's shape.
fn compute_model(a: &Args) -> anyhow::Result<ComputeModel> {
    let geometry = ModelGeometry {
        name: "bench-schedule".into(),
        layers: a.layers,
        hidden: 1024,
        heads: 8,
        kv_heads: 2,
        head_dim: 128,
        ffn: 4096,
        vocab: 32_000,
        dtype_bytes: 2,
        block_tokens: BLOCK_TOKENS,
    };
    let gpu = GpuModel {
        name: "emulated-slow-gpu".into(),
        linear_tflops: a.tflops,
        attention_tflops: a.tflops,
        hbm_gbps: a.hbm_gbps,
        layer_overhead_ns: 50_000,
        io_sms: 4,
        iocbs_per_sm_per_us: 1.0,
    };
    Ok(ComputeModel::new(geometry, gpu)?)
}

/// The simulator's view of the same drives and workload.
fn sim_config(a: &Args, model: &ComputeModel) -> SimConfig {
    let d = f64::from(a.drives);
    let faster = a.read_mbps.max(a.write_mbps);
    SimConfig {
        model: model.clone(),
        ssd: SsdConfig {
            drives: a.drives as usize,
            read_gbps: a.read_mbps * d / 1000.0,
            write_gbps: a.write_mbps * d / 1000.0,
            mixed_gbps: faster * a.mixed_efficiency * d / 1000.0,
            mixed_read_share: a.mixed_read_share,
            command_latency_us: f64::from(a.latency_us),
        },
        workload: Workload {
            context_tokens: a.context_tokens,
            requests: a.requests,
            decode_steps: a.decode_steps,
        },
        backlog_mib: a.backlog_mib,
        profile_optimism: a.profile_optimism,
        online: OnlineConfig::default(),
        write_guard: 0.05,
        crossover_threshold_pct: 5.0,
    }
}

/// The shape of the workload in blocks.
struct Shape {
    prefix_blocks: u32,
    new_blocks: u32,
    object_bytes: u64,
}

impl Shape {
    fn of(a: &Args) -> Shape {
        let blocks = a.context_tokens / BLOCK_TOKENS;
        let prefix_blocks = ((f64::from(blocks) * a.hit_rate).round() as u32).min(blocks.saturating_sub(1));
        Shape {
            prefix_blocks,
            new_blocks: blocks - prefix_blocks,
            object_bytes: u64::from(BLOCK_TOKENS) * 2 * 128 * 2,
        }
    }
    /// Engine blocks: the prefix, and two sets for new KV (one request's stores may still be
    /// written while the next request computes into the other set).
    fn blocks(&self) -> u32 {
        self.prefix_blocks + 2 * self.new_blocks
    }
}

fn runtime_config(a: &Args, shape: &Shape) -> capi::tutti_runtime_config_t {
    let file = 2 * u64::from(a.layers) * shape.object_bytes;
    // Every request's prefix and new blocks, twice over, spread over the drives, plus metadata.
    let files = u64::from(a.requests) * u64::from(shape.blocks()) + 64;
    let capacity = (2 * files * file).div_ceil(u64::from(a.drives)) + (32 << 20);
    capi::tutti_runtime_config_t {
        struct_size: std::mem::size_of::<capi::tutti_runtime_config_t>() as u32,
        drives: capi::TUTTI_DRIVES_EMULATED,
        emulated_count: a.drives,
        emulated_lba_size: 512,
        emulated_capacity_bytes: capacity,
        executor: capi::TUTTI_EXECUTOR_GIO_HOST,
        open_mode: capi::TUTTI_OPEN_CREATE,
        geometry: capi::tutti_geometry_t {
            layers: a.layers,
            kv_heads: 2,
            head_dim: 128,
            tokens_per_block: BLOCK_TOKENS,
            dtype: capi::TUTTI_DTYPE_BF16,
        },
        emulated_read_bytes_per_sec: (a.read_mbps * 1e6) as u64,
        emulated_write_bytes_per_sec: (a.write_mbps * 1e6) as u64,
        emulated_latency_us: a.latency_us,
        emulated_mixed_efficiency: a.mixed_efficiency,
        emulated_mixed_read_share: a.mixed_read_share,
        ..Default::default()
    }
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// One request's store session and its per-layer jobs.
struct Pending {
    store: abi::Store,
    jobs: Vec<abi::Job>,
    /// When its first layer was submitted, and when every layer was first seen written.
    start: Option<Instant>,
    done: Option<Instant>,
}

impl Pending {
    /// Polls the jobs (at a layer or step boundary) and notes when all are done.
    fn note_done(&mut self) -> anyhow::Result<()> {
        if self.done.is_none() && !self.jobs.is_empty() {
            for j in &self.jobs {
                if !j.done()? {
                    return Ok(());
                }
            }
            self.done = Some(Instant::now());
        }
        Ok(())
    }
}

#[derive(Default)]
struct Written {
    bytes: u64,
    seconds: f64,
}

impl Written {
    /// Waits for a request's stores, commits them and adds them up.
    fn finish(&mut self, mut p: Pending, shape: &Shape, layers: u32) -> anyhow::Result<()> {
        for j in &p.jobs {
            j.wait(TIMEOUT)?;
        }
        p.note_done()?;
        let stored = p.store.commit()?;
        if let (Some(s), Some(d)) = (p.start, p.done) {
            self.seconds += (d - s).as_secs_f64();
        }
        self.bytes += u64::from(stored) * 2 * shape.object_bytes * u64::from(layers);
        Ok(())
    }
}

/// Runs `policy` on a fresh runtime and measures it.
fn measure(
    a: &Args,
    model: &ComputeModel,
    policy: PolicyKind,
    table: Option<&std::ffi::CString>,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<Measured> {
    let shape = Shape::of(a);
    let rt = Rt::open(&runtime_config(a, &shape)).context("opening the runtime on emulated drives")?;
    let mem = KvMem::new((2 * u64::from(shape.blocks()) * shape.object_bytes * u64::from(a.layers)) as usize);
    rt.register(&mem, a.layers, shape.blocks(), shape.object_bytes)?;
    let prefix: Vec<u32> = (0..shape.prefix_blocks).collect();
    let half = shape.prefix_blocks + shape.new_blocks;
    let fresh: [Vec<u32>; 2] = [(shape.prefix_blocks..half).collect(), (half..shape.blocks()).collect()];
    // Warm the pool with every request's prefix, unscheduled and untimed.
    rt.configure(&capi::tutti_sched_config_t { mode: capi::TUTTI_SCHED_PASS, ..Default::default() })?;
    for r in 0..a.requests {
        let keys: Vec<_> = prefix.iter().map(|&b| key(r, b, 0)).collect();
        let st = rt.store_begin(&keys, &prefix)?;
        let jobs = (0..a.layers).map(|l| st.submit_layer(l)).collect::<anyhow::Result<Vec<_>>>()?;
        for j in &jobs {
            j.wait(TIMEOUT)?;
        }
        if st.commit()? != shape.prefix_blocks {
            bail!("warming the pool: not every prefix block of request {r} was stored");
        }
    }
    let mode = match policy {
        PolicyKind::LoadAll | PolicyKind::Interleaved => capi::TUTTI_SCHED_PASS,
        PolicyKind::SlackAware => capi::TUTTI_SCHED_SLACK,
        PolicyKind::SlackOnline => capi::TUTTI_SCHED_SLACK_ONLINE,
    };
    let geometry = &model.geometry;
    rt.configure(&capi::tutti_sched_config_t {
        mode,
        slack_table: table.map_or(std::ptr::null(), |t| t.as_ptr()),
        backlog_bytes: a.backlog_mib << 20,
        read_bytes_per_sec: (a.read_mbps * 1e6) as u64,
        write_bytes_per_sec: (a.write_mbps * 1e6) as u64,
        latency_ns: u64::from(a.latency_us) * 1000,
        iocb_bytes: geometry.iocb_bytes(),
        write_guard: 0.05,
        ..Default::default()
    })?;
    let slack = matches!(policy, PolicyKind::SlackAware | PolicyKind::SlackOnline);
    let input = shape.new_blocks * BLOCK_TOKENS;
    let prefix_tokens = shape.prefix_blocks * BLOCK_TOKENS;
    let layer_time = Duration::from_nanos(model.prefill_layer_ns(input, prefix_tokens) as u64);
    let mut per_request = Vec::new();
    let (mut read_bytes, mut read_time) = (0u64, 0f64);
    let mut written = Written::default();
    // The previous request's stores: still being written while the next request runs, as in
    // serving (its engine blocks are the other half of the fresh blocks, so nothing reuses them).
    let mut prev: Option<Pending> = None;
    let start_all = Instant::now();
    let cpu0 = process_cpu_ns()?;
    for r in 0..a.requests {
        let keys: Vec<_> = prefix.iter().map(|&b| key(r, b, 0)).collect();
        let fresh = &fresh[r as usize % 2];
        let new_keys: Vec<_> = fresh.iter().map(|&b| key(r, b, 1)).collect();
        let t0 = Instant::now();
        let load = rt.load(&keys, &prefix, a.layers)?;
        let mut bubble = Duration::ZERO;
        if policy == PolicyKind::LoadAll {
            let w = Instant::now();
            if load.wait(TIMEOUT)? > 0 {
                bail!("request {r}: prefix blocks failed to load");
            }
            bubble += w.elapsed();
        }
        let mut cur =
            Pending { store: rt.store_begin(&new_keys, fresh)?, jobs: Vec::new(), start: None, done: None };
        let mut load_done = t0;
        for l in 0..a.layers {
            if policy != PolicyKind::LoadAll {
                let w = Instant::now();
                if load.wait_layer(l, TIMEOUT)? > 0 {
                    bail!("request {r} layer {l}: prefix blocks failed to load");
                }
                bubble += w.elapsed();
            }
            load_done = Instant::now();
            let compute_start = Instant::now();
            if slack {
                rt.layer_start(input, prefix_tokens, l)?;
            }
            sleep_until(compute_start + layer_time);
            if slack {
                rt.layer_end(l)?;
            }
            cur.start.get_or_insert_with(Instant::now);
            cur.jobs.push(cur.store.submit_layer(l)?);
            if let Some(p) = &mut prev {
                p.note_done()?;
            }
        }
        let ttft = t0.elapsed();
        read_bytes += u64::from(shape.prefix_blocks) * 2 * shape.object_bytes * u64::from(a.layers);
        read_time += (load_done - t0).as_secs_f64();
        // The previous request's stores must be durable before its blocks are reused.
        if let Some(p) = prev.take() {
            written.finish(p, &shape, a.layers)?;
        }
        let context = input + prefix_tokens;
        for s in 0..a.decode_steps {
            let step = Duration::from_nanos(model.decode_step_ns(context + s) as u64);
            let t = Instant::now();
            if slack {
                rt.decode_start(context + s)?;
            }
            sleep_until(t + step);
            if slack {
                rt.decode_end()?;
            }
            cur.note_done()?;
        }
        prev = Some(cur);
        per_request.push((bubble.as_secs_f64() * 1e3, ttft.as_secs_f64() * 1e3));
        bar.inc(1);
    }
    if let Some(p) = prev.take() {
        written.finish(p, &shape, a.layers)?;
    }
    let (write_bytes, write_time) = (written.bytes, written.seconds);
    let cpu_s = process_cpu_ns()?.saturating_sub(cpu0) as f64 / 1e9;
    tracing::debug!(
        elapsed_s = start_all.elapsed().as_secs_f64(),
        policy = policy.label(),
        "policy measured"
    );
    let s = rt.sched_stats()?;
    let n = per_request.len().max(1) as f64;
    let mean = |f: fn(&(f64, f64)) -> f64| per_request.iter().map(f).sum::<f64>() / n;
    Ok(Measured {
        bubble_ms: mean(|p| p.0),
        ttft_ms: mean(|p| p.1),
        prefill_compute_ms: layer_time.as_secs_f64() * 1e3 * f64::from(a.layers),
        read_gbps: if read_time > 0.0 { read_bytes as f64 / read_time / 1e9 } else { 0.0 },
        write_gbps: if write_time > 0.0 { write_bytes as f64 / write_time / 1e9 } else { 0.0 },
        backlog_peak_mib: s.backlog_peak_bytes as f64 / f64::from(1 << 20),
        bytes_dropped: s.bytes_dropped,
        mixed_issues: s.mixed_issues,
        writes_held_for_slack: s.write_waits_for_slack,
        writes_in_decode: s.writes_in_decode,
        reads_held_for_writes: s.read_waits,
        process_cpu_s_per_gb: cpu_s_per_gb(cpu_s, read_bytes + write_bytes),
        per_request,
    })
}

pub fn run(a: &Args) -> anyhow::Result<()> {
    a.validate()?;
    let model = compute_model(a)?;
    let cfg = sim_config(a, &model);
    cfg.validate().context("the simulator's configuration for these flags")?;
    let table = Profiler::from_model(&model, TableGrid::standard()?)?;
    let given =
        if a.profile_optimism != 0.0 { table.with_window_scale(1.0 + a.profile_optimism)? } else { table };
    let dir = std::env::temp_dir().join(format!("tutti-bench-schedule-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("slack.json");
    given.save(&path)?;
    let cpath = std::ffi::CString::new(path.to_string_lossy().as_bytes())?;
    let host = Host::now();
    let bar = crate::progress::count_bar(u64::from(a.requests) * 4, "requests", a.out.quiet || a.out.json);
    let mut rows = Vec::new();
    let result = (|| -> anyhow::Result<()> {
        for policy in PolicyKind::ALL {
            bar.set_message(policy.label());
            let measured = measure(a, &model, policy, Some(&cpath), &bar)
                .with_context(|| format!("policy {}", policy.label()))?;
            let sim = simulate(&cfg, policy, a.hit_rate, &given)?;
            let predicted = Predicted {
                bubble_ms: sim.bubble_ms,
                ttft_ms: sim.ttft_ms,
                read_gbps: sim.read_gbps,
                write_gbps: sim.write_gbps,
                backlog_peak_mib: sim.backlog_peak_mib,
            };
            rows.push(Row { policy, label: policy.label(), measured, predicted });
        }
        Ok(())
    })();
    bar.finish_and_clear();
    let _ = std::fs::remove_dir_all(&dir);
    result?;
    let shape = RequestShape::new(
        a.context_tokens - (f64::from(a.context_tokens) * a.hit_rate) as u32,
        (f64::from(a.context_tokens) * a.hit_rate) as u32,
    );
    let rep = Report::new(host, setup(a, shape), rows);
    a.out.emit(&rep, &rep.text(), || rep.svg())
}

/// The setup the report names, from the flags and the request's shape.
fn setup(a: &Args, shape: RequestShape) -> Setup {
    Setup {
        drives: a.drives,
        read_mbps_per_drive: a.read_mbps,
        write_mbps_per_drive: a.write_mbps,
        mixed_efficiency: a.mixed_efficiency,
        mixed_read_share: a.mixed_read_share,
        latency_us: a.latency_us,
        layers: a.layers,
        context_tokens: a.context_tokens,
        hit_rate: a.hit_rate,
        input_tokens: shape.input_tokens,
        prefix_tokens: shape.prefix_tokens,
        requests: a.requests,
        decode_steps: a.decode_steps,
        tflops: a.tflops,
        hbm_gbps: a.hbm_gbps,
        profile_optimism: a.profile_optimism,
        backlog_mib: a.backlog_mib,
    }
}
