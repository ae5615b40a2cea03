//! What the doorbell relay costs: the same small-read workload through the
//! host executor with direct doorbells (the baseline, measured in the same
//! run) and with every doorbell forwarded by a `DoorbellRelay` thread.
//!
//! Workload: one IOCB of 64 reads of 4 KiB over one emulated controller with
//! two queue pairs, issued and waited for; launch mode and persistent mode.
//! The ratio (relay time / direct time) of each mode is printed at the end
//! and written to `docs/perf/doorbell-relay.json` when that directory exists.
//!
//! Caveat: here the executor's lanes, the emulated controller and the relay
//! are all host threads on the same cores, so this measures the relay
//! thread's CPU cost and its added hop (mailbox -> poll -> register), not a
//! GPU's PCIe writes to host memory and a host's MMIO write to a BAR.

// A benchmark is a test harness: a broken setup aborts it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::sync::Arc;
use std::time::Duration;
use tutti_driver::controller::{Controller, ControllerOptions};
use tutti_driver::spec::SglDescriptor;
use tutti_driver::transport::DmaBuffer;
use tutti_emulator::{EmulatedConfig, EmulatedController, NamespaceConfig};
use tutti_gio_uring::executor::{DoorbellMode, RelayConfig};
use tutti_gio_uring::{
    ioctx, DataRef, DriveQueues, ExecMode, GioOptions, GioUring, HostExecutor, HostExecutorConfig, Op,
};

const READS: usize = 64;
const CMD: usize = 4096;

struct Setup {
    ring: GioUring,
    exec: Arc<HostExecutor>,
    buf: DmaBuffer,
    _ctrl: Arc<Controller>,
    _emu: EmulatedController,
}

fn setup(mode: ExecMode, doorbells: DoorbellMode) -> Setup {
    let emu = EmulatedController::start(EmulatedConfig {
        name: "bench".into(),
        namespaces: vec![NamespaceConfig::with_bytes(8 << 20, 512)],
        ..EmulatedConfig::default()
    })
    .unwrap();
    let ctrl = Controller::new(emu.registers(), emu.dma_space(), ControllerOptions::default()).unwrap();
    let drives = vec![DriveQueues::create(&ctrl, 1, 2, 64).unwrap()];
    let exec = Arc::new(
        HostExecutor::new(HostExecutorConfig { mode, blocks: 2, doorbells, ..Default::default() }).unwrap(),
    );
    let ring =
        GioUring::init_with(GioOptions { depth: 4, ..Default::default() }, drives, exec.clone()).unwrap();
    let buf = ctrl.dma().alloc(READS * CMD).unwrap();
    Setup { ring, exec, buf, _ctrl: ctrl, _emu: emu }
}

fn one_batch(s: &Setup) {
    let ctxs: Vec<_> = (0..READS)
        .map(|m| {
            let sgl = SglDescriptor::data_block(s.buf.iova_at(m * CMD), CMD as u32);
            ioctx(Op::Read, 0, m as u64 * 8, 8, DataRef::Sgl(sgl))
        })
        .collect();
    let ids = s.ring.get_iocb(1).unwrap();
    s.ring.set_ioctxs(ids[0], &ctxs).unwrap();
    s.ring.issue(&ids, 2).unwrap();
    let r = s.ring.wait_cqe(&ids, Duration::from_secs(30)).unwrap();
    assert!(r[0].is_ok(), "{:?}", r[0].failures.first());
}

/// One mode's result: seconds per batch with direct and relayed doorbells.
struct Row {
    mode: &'static str,
    direct: f64,
    relay: f64,
    relayed: u64,
    wakeups: u64,
}

/// The 1-minute load average, which says how much the other threads of the
/// machine disturbed the run.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "unknown".into())
}

fn bench(c: &mut Criterion) {
    let load_at_start = load_average();
    let mut rows = Vec::new();
    for (mode, label) in [(ExecMode::Launch, "launch"), (ExecMode::Persistent, "persistent")] {
        let mut g = c.benchmark_group(format!("doorbell_relay/{label}"));
        g.throughput(Throughput::Elements(READS as u64));
        g.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(3));
        let mut per_batch = [0.0f64; 2];
        for (i, doorbells) in
            [DoorbellMode::Direct, DoorbellMode::Relay(RelayConfig::default())].into_iter().enumerate()
        {
            let name = if i == 0 { "direct" } else { "relay" };
            let s = setup(mode, doorbells);
            let mut total = Duration::ZERO;
            let mut batches = 0u64;
            g.bench_function(name, |b| {
                b.iter_custom(|iters| {
                    let t = std::time::Instant::now();
                    for _ in 0..iters {
                        one_batch(&s);
                    }
                    let e = t.elapsed();
                    total += e;
                    batches += iters;
                    e
                })
            });
            per_batch[i] = total.as_secs_f64() / batches.max(1) as f64;
            if let Some(r) = s.exec.relay() {
                let st = r.stats();
                rows.push(Row {
                    mode: label,
                    direct: per_batch[0],
                    relay: per_batch[1],
                    relayed: st.relayed,
                    wakeups: st.wakeups,
                });
            }
        }
        g.finish();
    }
    report(&rows, &load_at_start);
}

fn report(rows: &[Row], load_at_start: &str) {
    let load_at_end = load_average();
    let mut modes = Vec::new();
    println!(
        "\ndoorbell relay: time per batch of {READS} x 4 KiB reads (relay / direct); load average {load_at_start} -> {load_at_end}"
    );
    for Row { mode, direct, relay, relayed, wakeups } in rows {
        let ratio = relay / direct;
        println!(
            "  {mode:<10} direct {:>8.1} us  relay {:>8.1} us  ratio {ratio:.2}  (doorbells relayed {relayed}, relay wakeups {wakeups})",
            direct * 1e6,
            relay * 1e6
        );
        modes.push(format!(
            "    {{\"mode\": \"{mode}\", \"direct_us_per_batch\": {:.1}, \"relay_us_per_batch\": {:.1}, \"ratio\": {ratio:.3}, \"doorbells_relayed\": {relayed}, \"relay_wakeups\": {wakeups}}}",
            direct * 1e6,
            relay * 1e6
        ));
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/perf");
    if dir.is_dir() {
        let json = format!(
            "{{\n  \"bench\": \"gio_uring/benches/doorbell_relay.rs\",\n  \"workload\": \"one IOCB of {READS} reads of 4 KiB, one emulated controller, two queue pairs, host executor 2 x 32 lanes\",\n  \"method\": \"mean wall time per batch (issue to completion) over every batch criterion ran, warm-up included; direct, then relay, in one process\",\n  \"caveat\": \"executor lanes, emulated controller and relay are host threads sharing the cores: the relay thread's CPU cost and extra hop, not PCIe\",\n  \"cores\": {},\n  \"load_average_start\": \"{load_at_start}\",\n  \"load_average_end\": \"{load_at_end}\",\n  \"results\": [\n{}\n  ]\n}}\n",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            modes.join(",\n")
        );
        let path = dir.join("doorbell-relay.json");
        match std::fs::write(&path, json) {
            Ok(()) => println!("  written to {}", path.display()),
            Err(e) => println!("  could not write {}: {e}", path.display()),
        }
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
