//! Building one Read's submission entry, by data pointer kind, next to a
//! baseline measured in the same run (copying an already built entry):
//! - SGL Data Block inline (one contiguous buffer);
//! - PRP1/PRP2 for two pages (no list);
//! - PRP list for a contiguous 32 KiB buffer (8 pages: 7 list entries written to DMA memory);
//! - SGL Last Segment list and PRP list for 8 scattered 4 KiB pieces.
//!
//! Ratios (build time / baseline) are printed at the end.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use std::time::{Duration, Instant};
use tutti_driver::command::prp::{self, Scratch};
use tutti_driver::command::{sgl, Command, DataPtr};
use tutti_driver::spec::{SglDescriptor, SglSupport, SubmissionEntry};
use tutti_driver::transport::{DmaBuffer, DmaSpace, IovaSegment};
use tutti_emulator::EmuIommu;

const PAGE: u64 = 4096;
const BASE: u64 = 0x10_0000_0000;

fn contiguous(len: u64) -> [IovaSegment; 1] {
    [IovaSegment { iova: BASE, len }]
}

/// Eight 4 KiB pieces at scattered pages, as in a paged KV cache.
fn scattered() -> Vec<IovaSegment> {
    (0..8u64).map(|i| IovaSegment { iova: BASE + ((i * 37) % 64) * PAGE, len: PAGE }).collect()
}

fn entry(ptr: DataPtr, cid: u16) -> SubmissionEntry {
    Command::read(1, 2048, 64).data(ptr).cid(cid).entry()
}

type Case<'a> = (&'static str, Box<dyn Fn(u16) -> SubmissionEntry + 'a>);

fn cases(lists: &DmaBuffer) -> Vec<Case<'_>> {
    let scratch = move || Scratch { buf: lists, offset: 0, len: lists.len() };
    let built = entry(DataPtr::Sgl(SglDescriptor::data_block(BASE, 32768)), 0);
    let pieces = scattered();
    let pieces2 = pieces.clone();
    vec![
        (
            "baseline: copy a built SQE",
            Box::new(move |cid| {
                let mut e = black_box(built);
                e.cdw0 |= (cid as u32) << 16;
                e
            }),
        ),
        (
            "SGL Data Block inline",
            Box::new(|cid| entry(DataPtr::Sgl(SglDescriptor::data_block(BASE, 32768)), cid)),
        ),
        (
            "PRP1/PRP2, two pages",
            Box::new(move |cid| {
                entry(prp::build(&contiguous(2 * PAGE), PAGE, scratch()).unwrap_or(DataPtr::None), cid)
            }),
        ),
        (
            "PRP list, 32K contiguous",
            Box::new(move |cid| {
                entry(prp::build(&contiguous(8 * PAGE), PAGE, scratch()).unwrap_or(DataPtr::None), cid)
            }),
        ),
        (
            "SGL list, 8 x 4K pieces",
            Box::new(move |cid| {
                entry(sgl::build(&pieces, SglSupport::Supported, scratch()).unwrap_or(DataPtr::None), cid)
            }),
        ),
        (
            "PRP list, 8 x 4K pieces",
            Box::new(move |cid| entry(prp::build(&pieces2, PAGE, scratch()).unwrap_or(DataPtr::None), cid)),
        ),
    ]
}

fn time(f: &dyn Fn(u16) -> SubmissionEntry, rounds: u32) -> Duration {
    let t = Instant::now();
    for i in 0..rounds {
        black_box(f(i as u16));
    }
    t.elapsed()
}

fn bench(c: &mut Criterion) {
    let Ok(lists) = EmuIommu::new("bench").alloc(PAGE as usize) else { return };
    let cases = cases(&lists);
    // Every case must describe its memory: a failed build would make the timing meaningless.
    for (name, f) in &cases {
        assert_ne!(f(1).dptr, [0, 0], "{name} built no data pointer");
    }
    let mut g = c.benchmark_group("command_build");
    g.throughput(Throughput::Elements(1));
    for (name, f) in &cases {
        g.bench_function(*name, |b| {
            let mut cid = 0u16;
            b.iter(|| {
                cid = cid.wrapping_add(1);
                f(cid)
            })
        });
    }
    g.finish();
    let base = time(&*cases[0].1, 200_000).as_secs_f64();
    for (name, f) in &cases[1..] {
        println!("ratio {name} / copy of a built SQE: {:.1}", time(&**f, 200_000).as_secs_f64() / base);
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(1)).warm_up_time(Duration::from_millis(300));
    targets = bench
}
criterion_main!(benches);
