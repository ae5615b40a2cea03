//! Submit→complete through the whole driver stack on the emulated controller
//! (RAM media): one 4 KiB read at queue depth 1, and batches of 32 reads
//! published with one doorbell and reaped with one CQ-head write.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use tutti_driver::command::{Command, DataMode};
use tutti_driver::controller::{Controller, ControllerOptions};
use tutti_driver::emulated::{EmulatedConfig, EmulatedController};
use tutti_driver::transport::IovaSegment;

fn bench(c: &mut Criterion) {
    let Ok(emu) = EmulatedController::start(EmulatedConfig::default()) else { return };
    let Ok(ctrl) = Controller::new(emu.registers(), emu.dma_space(), ControllerOptions::default()) else {
        return;
    };
    let Ok(mut qp) = ctrl.create_io_queue_pair(256) else { return };
    let Ok(buf) = ctrl.dma().alloc(32 * 4096) else { return };
    let mut group = c.benchmark_group("submit_complete");
    for (mode, name) in [(DataMode::Prp, "prp"), (DataMode::Sgl, "sgl")] {
        for batch in [1u32, 32] {
            group.throughput(Throughput::Elements(batch as u64));
            group.bench_with_input(BenchmarkId::new(name, batch), &batch, |b, &batch| {
                let mut done = Vec::with_capacity(batch as usize);
                b.iter(|| {
                    for i in 0..batch {
                        let seg = [IovaSegment { iova: buf.iova_at(i as usize * 4096), len: 4096 }];
                        let _ = qp.submit_data(Command::read(1, i as u64 * 8, 8), &seg, mode, i as u64);
                    }
                    qp.ring();
                    done.clear();
                    while done.len() < batch as usize {
                        if qp.reap(&mut done).is_err() {
                            break;
                        }
                    }
                    black_box(done.len())
                });
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(2)).warm_up_time(std::time::Duration::from_millis(500));
    targets = bench
}
criterion_main!(benches);
