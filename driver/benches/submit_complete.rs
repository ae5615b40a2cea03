//! Submit→complete through the whole driver stack on the emulated controller
//! (RAM media): one 4 KiB read at queue depth 1, and batches of 32 reads
//! published with one doorbell and reaped with one CQ-head write; next to the
//! baseline measured in the same run, io_uring NOPs at the same batch size
//! (the kernel's floor for a submit→complete, no data moved).
//!
//! A failed submission, a failed completion or a batch that does not complete
//! within `BATCH_DEADLINE` stops the bench with the reason. Ratios (driver time
//! / io_uring NOP time) are printed at the end.

mod common;

use common::{read_batch, NopRing, BATCH_DEADLINE};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use std::time::{Duration, Instant};
use tutti_driver::command::DataMode;
use tutti_driver::controller::{Controller, ControllerOptions};
use tutti_emulator::{EmulatedConfig, EmulatedController};

const BATCHES: [u32; 2] = [1, 32];

/// A bench cannot return an error: say what failed and stop.
fn or_die<T, E: std::fmt::Display>(what: &str, r: Result<T, E>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("submit_complete bench: {what}: {e}"),
    }
}

fn per_command(total: Duration, rounds: u32, batch: u32) -> f64 {
    total.as_secs_f64() * 1e9 / f64::from(rounds * batch)
}

fn bench(c: &mut Criterion) {
    let emu =
        or_die("starting the emulated controller", EmulatedController::start(EmulatedConfig::default()));
    let ctrl = or_die(
        "bringing the controller up",
        Controller::new(emu.registers(), emu.dma_space(), ControllerOptions::default()),
    );
    let mut qp = or_die("creating an I/O queue pair", ctrl.create_io_queue_pair(256));
    let buf = or_die("allocating DMA memory", ctrl.dma().alloc(32 * 4096));
    let mut nop = match NopRing::new(64) {
        Ok(r) => Some(r),
        Err(e) => {
            eprintln!("submit_complete: io_uring unavailable ({e}): the NOP baseline is not measured");
            None
        }
    };

    let mut group = c.benchmark_group("submit_complete");
    let mut done = Vec::with_capacity(32);
    for batch in BATCHES {
        group.throughput(Throughput::Elements(u64::from(batch)));
        for (mode, name) in [(DataMode::Prp, "prp"), (DataMode::Sgl, "sgl")] {
            group.bench_with_input(BenchmarkId::new(name, batch), &batch, |b, &batch| {
                b.iter(|| {
                    let deadline = Instant::now() + BATCH_DEADLINE;
                    let n = or_die(name, read_batch(&mut qp, &buf, batch, mode, &mut done, deadline));
                    black_box(n)
                });
            });
        }
        if let Some(ring) = nop.as_mut() {
            group.bench_with_input(BenchmarkId::new("baseline io_uring NOP", batch), &batch, |b, &batch| {
                b.iter(|| or_die("io_uring NOP", ring.round(batch)));
            });
        }
    }
    group.finish();

    // Ratios from one more timed loop of each, in this run.
    if let Some(ring) = nop.as_mut() {
        const ROUNDS: u32 = 2000;
        for batch in BATCHES {
            let t = Instant::now();
            for _ in 0..ROUNDS {
                let deadline = Instant::now() + BATCH_DEADLINE;
                or_die("sgl", read_batch(&mut qp, &buf, batch, DataMode::Sgl, &mut done, deadline));
            }
            let driver = per_command(t.elapsed(), ROUNDS, batch);
            let t = Instant::now();
            for _ in 0..ROUNDS {
                or_die("io_uring NOP", ring.round(batch));
            }
            let base = per_command(t.elapsed(), ROUNDS, batch);
            println!(
                "ratio submit→complete batch {batch}, driver SGL read / io_uring NOP: {:.1} ({driver:.0} ns / {base:.0} ns per command)",
                driver / base
            );
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(2)).warm_up_time(Duration::from_millis(500));
    targets = bench
}
criterion_main!(benches);
