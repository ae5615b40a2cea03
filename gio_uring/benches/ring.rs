//! Host/executor ring costs, each next to a baseline measured in the same run:
//! - enqueue + dequeue from one producer (baseline: a Mutex<VecDeque>);
//! - enqueue from two producers into one consumer (baseline: std's sync_channel);
//! - completion reaping: the executor's push (the code `tt_gio_issue` runs,
//!   compiled for the host) then the host draining the completion ring
//!   (baseline: the same through std's `sync_channel`, send then `try_recv`).
//!
//! Ratios (ring time / baseline time) are printed at the end.

// A benchmark is a test harness: a broken setup aborts it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tutti_gio_uring::shared_ring::OwnedRing;
use tutti_kernels::host::executor_ring_push;

const BATCH: u64 = 512;
const MP_ITEMS: u64 = 20_000;

fn spsc_ring(r: &OwnedRing) {
    for i in 0..BATCH {
        assert!(r.push(i));
    }
    for _ in 0..BATCH {
        std::hint::black_box(r.pop());
    }
}

fn spsc_mutex(q: &Mutex<VecDeque<u64>>) {
    for i in 0..BATCH {
        q.lock().unwrap().push_back(i);
    }
    for _ in 0..BATCH {
        std::hint::black_box(q.lock().unwrap().pop_front());
    }
}

fn mpsc_ring(r: &Arc<OwnedRing>) -> Duration {
    let t = Instant::now();
    let producers: Vec<_> = (0..2)
        .map(|_| {
            let r = r.clone();
            std::thread::spawn(move || {
                for i in 0..MP_ITEMS {
                    // Non-blocking ring, more threads than cores: give the core away when full.
                    while !r.push(i) {
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    let mut got = 0;
    while got < 2 * MP_ITEMS {
        match r.pop() {
            Some(_) => got += 1,
            None => std::thread::yield_now(),
        }
    }
    for p in producers {
        p.join().unwrap();
    }
    t.elapsed()
}

fn mpsc_channel() -> Duration {
    let t = Instant::now();
    let (tx, rx) = std::sync::mpsc::sync_channel::<u64>(1024);
    let producers: Vec<_> = (0..2)
        .map(|_| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for i in 0..MP_ITEMS {
                    tx.send(i).unwrap();
                }
            })
        })
        .collect();
    drop(tx);
    let mut got = 0;
    while rx.recv().is_ok() {
        got += 1;
    }
    assert_eq!(got, 2 * MP_ITEMS);
    for p in producers {
        p.join().unwrap();
    }
    t.elapsed()
}

fn reap(r: &OwnedRing) {
    for i in 0..BATCH {
        // SAFETY: `r` is a live, initialised ring.
        assert!(unsafe { executor_ring_push(r.as_raw(), i) });
    }
    let mut n = 0;
    while r.pop().is_some() {
        n += 1;
    }
    assert_eq!(n, BATCH);
}

fn reap_channel(tx: &std::sync::mpsc::SyncSender<u64>, rx: &std::sync::mpsc::Receiver<u64>) {
    for i in 0..BATCH {
        tx.send(i).unwrap();
    }
    let mut n = 0;
    while rx.try_recv().is_ok() {
        n += 1;
    }
    assert_eq!(n, BATCH);
}

fn time(f: impl Fn(), rounds: u32) -> Duration {
    let t = Instant::now();
    for _ in 0..rounds {
        f();
    }
    t.elapsed()
}

fn benches(c: &mut Criterion) {
    let ring = OwnedRing::new(1024).unwrap();
    let mutex = Mutex::new(VecDeque::with_capacity(1024));
    let mut g = c.benchmark_group("single_producer");
    g.throughput(Throughput::Elements(BATCH));
    g.bench_function("gio_ring push+pop", |b| b.iter(|| spsc_ring(&ring)));
    g.bench_function("baseline Mutex<VecDeque>", |b| b.iter(|| spsc_mutex(&mutex)));
    g.finish();

    let shared = Arc::new(OwnedRing::new(1024).unwrap());
    let mut g = c.benchmark_group("two_producers");
    g.throughput(Throughput::Elements(2 * MP_ITEMS));
    g.bench_function("gio_ring", |b| b.iter_custom(|n| (0..n).map(|_| mpsc_ring(&shared)).sum()));
    g.bench_function("baseline std sync_channel", |b| {
        b.iter_custom(|n| (0..n).map(|_| mpsc_channel()).sum())
    });
    g.finish();

    let mut g = c.benchmark_group("completion_reaping");
    g.throughput(Throughput::Elements(BATCH));
    g.bench_function("executor push + host drain", |b| b.iter(|| reap(&ring)));
    let (tx, rx) = std::sync::mpsc::sync_channel::<u64>(1024);
    g.bench_function("baseline std sync_channel send + try_recv", |b| b.iter(|| reap_channel(&tx, &rx)));
    g.finish();

    let sp = time(|| spsc_ring(&ring), 2000).as_secs_f64() / time(|| spsc_mutex(&mutex), 2000).as_secs_f64();
    let mp = (0..5).map(|_| mpsc_ring(&shared)).sum::<Duration>().as_secs_f64()
        / (0..5).map(|_| mpsc_channel()).sum::<Duration>().as_secs_f64();
    let rp = time(|| reap(&ring), 2000).as_secs_f64() / time(|| reap_channel(&tx, &rx), 2000).as_secs_f64();
    println!("ratio single producer, gio_ring / Mutex<VecDeque>: {sp:.2}");
    println!("ratio two producers, gio_ring / sync_channel: {mp:.2}");
    println!("ratio completion reaping, gio_ring / sync_channel: {rp:.2}");
}

criterion_group! {
    name = ring;
    config = Criterion::default().sample_size(10).measurement_time(Duration::from_secs(1)).warm_up_time(Duration::from_millis(300));
    targets = benches
}
criterion_main!(ring);
