//! Staged layer tables: KV memory the drives cannot reach, moved through
//! staging slots by the executor.
//!
//! The KV memory here is ordinary host memory never mapped into the emulated
//! controllers' IOMMUs, so the IOMMU itself proves the point: a table that
//! aims the drives at it directly fails with a DMA error and leaves it
//! untouched, while a staged table over the same memory moves every byte.
//! The two controllers have their own IOMMUs, so the staging slots sit at
//! different IOVAs per drive.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::time::Duration;
use tutti_driver::command::DataPtr;
use tutti_driver::spec::{SglDescriptor, SglSupport, Status};
use tutti_gio_uring::mem::{HostMapping, HostRange};
use tutti_gio_uring::{
    GioOptions, IoStatus, Kv, LayerGeometry, LayerTable, Op, PoolDrive, TableId, TableKind,
};

const LAYERS: u32 = 2;
const BLOCKS: u32 = 48;

/// Objects of 24 KiB split at 16 KiB: a 4-page chunk (a PRP list) and a 2-page one.
fn geometry() -> LayerGeometry {
    LayerGeometry {
        layers: LAYERS,
        files: BLOCKS,
        blocks: BLOCKS,
        object_bytes: 24 << 10,
        max_transfer: 16 << 10,
        drives: (0..2).map(|d| PoolDrive { drive: d, data_start_lba: 64, lba_size: 512 }).collect(),
    }
}

/// KV memory the drives were never given: plain host memory, in whole pages of
/// its own (registering it with a GPU driver pins whole pages, and a page shared
/// with another test's registration would be refused as already registered).
struct Kv8 {
    buf: Vec<u64>,
    start: usize,
    len: usize,
}

impl Kv8 {
    fn new(g: &LayerGeometry) -> Self {
        const PAGE_WORDS: usize = 4096 / 8;
        let len = (g.blocks as u64 * g.layers as u64 * 2 * g.object_bytes / 8) as usize;
        let len = len.div_ceil(PAGE_WORDS) * PAGE_WORDS;
        let buf = vec![0u64; len + PAGE_WORDS];
        let start = (buf.as_ptr() as usize).next_multiple_of(4096).wrapping_sub(buf.as_ptr() as usize) / 8;
        Kv8 { buf, start, len }
    }
    fn w(&self) -> &[u64] {
        &self.buf[self.start..self.start + self.len]
    }
    fn w_mut(&mut self) -> &mut [u64] {
        &mut self.buf[self.start..self.start + self.len]
    }
    fn addr(&self, g: &LayerGeometry, block: u32, layer: u32, kv: Kv) -> u64 {
        let obj = ((block * g.layers + layer) * 2 + kv as u32) as u64;
        self.w().as_ptr() as u64 + obj * g.object_bytes
    }
    fn fill(&mut self, seed: u64) {
        for (i, w) in self.w_mut().iter_mut().enumerate() {
            *w = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        }
    }
    fn bytes(&self) -> Vec<u8> {
        self.w().iter().flat_map(|w| w.to_le_bytes()).collect()
    }
}

/// A staged table over `mem`. The executor copies between the slots and the KV
/// memory, so the table holds executor addresses: `mem` is registered with the
/// executor first (on a GPU, page-locked and mapped with cuMemHostRegister; the
/// kernels cannot touch plain pageable host memory). The drives still never see it.
/// Keep the returned mapping while the table is in use.
fn staged_table(rig: &Rig, g: &LayerGeometry, mem: &Kv8) -> (LayerTable, Box<dyn HostMapping>) {
    let host = mem.w().as_ptr() as u64;
    // SAFETY: `mem` outlives the mapping in every test (both live to the test's end) and is
    // never reallocated: the tests only write through it.
    let map = unsafe {
        rig.ring.executor().map_host(mem.w().as_ptr() as *mut u8, mem.w().len() * 8, HostRange::Memory)
    }
    .unwrap();
    let mut t = LayerTable::new(g.clone(), TableKind::Staged).unwrap();
    for b in 0..g.blocks {
        for l in 0..g.layers {
            for kv in [Kv::K, Kv::V] {
                t.set_kv(b, l, kv, mem.addr(g, b, l, kv) - host + map.exec_addr()).unwrap();
            }
        }
    }
    (t, map)
}

fn pairs() -> Vec<(u32, u32)> {
    // File f into engine block (f * 7) % BLOCKS: not the identity.
    (0..BLOCKS).map(|f| (f, (f * 7) % BLOCKS)).collect()
}

fn run(rig: &Rig, table: TableId, op: Op) -> Vec<IoStatus> {
    let mut failures = Vec::new();
    for layer in 0..LAYERS {
        let ids = rig.ring.submit_layer(table, layer, &pairs(), op, 3).unwrap();
        for r in rig.ring.wait_cqe(&ids, Duration::from_secs(60)).unwrap() {
            assert_eq!(r.completed, r.count, "{op:?} layer {layer}: every IOCTX finishes");
            failures.extend(r.failures.iter().map(|f| f.status));
        }
    }
    failures
}

fn staged_rig(sgl: SglSupport) -> Rig {
    rig(RigSpec {
        sgl,
        ns_bytes: 16 << 20,
        opts: GioOptions { depth: 16, ..Default::default() },
        ..Default::default()
    })
}

/// Writes a pattern through staging, clears the KV memory, reads it back:
/// every byte of every (block, layer, K|V) comes back.
fn staged_round_trip(sgl: SglSupport, slots: u32) -> tutti_gio_uring::StagingStats {
    let rig = staged_rig(sgl);
    let g = geometry();
    let mut mem = Kv8::new(&g);
    mem.fill(0x5eed);
    let want = mem.bytes();
    let st = staged_table(&rig, &g, &mem);
    let table = rig.ring.register_staged_table(&st.0, slots).unwrap();
    assert_eq!(run(&rig, table, Op::Write), vec![], "staged writes");
    mem.w_mut().iter_mut().for_each(|w| *w = 0);
    assert_eq!(run(&rig, table, Op::Read), vec![], "staged reads");
    let got = mem.bytes();
    assert!(first_diff(&got, &want).is_none(), "first differing byte at {:?}", first_diff(&got, &want));
    let stats = rig.ring.staging_stats(table).unwrap();
    let moved = 2 * LAYERS as u64 * BLOCKS as u64 * 2 * g.object_bytes;
    assert_eq!(stats.staged_bytes, moved, "every byte went through a slot, once per direction");
    assert_eq!(stats.withheld, 0);
    rig.ring.unregister_table(table).unwrap();
    stats
}

#[test]
fn staged_layers_move_every_byte_on_sgl_drives() {
    let stats = staged_round_trip(SglSupport::Supported, 64);
    assert_eq!((stats.slots, stats.slot_bytes), (64, 16 << 10), "one 16 KiB chunk per slot");
}

#[test]
fn staged_layers_move_every_byte_on_prp_only_drives() {
    // 16 KiB slots: PRP1 + a list for full chunks, PRP1 + PRP2 for the 8 KiB tails.
    staged_round_trip(SglSupport::None, 64);
}

#[test]
fn staging_smaller_than_a_layer_applies_backpressure_and_completes() {
    // A layer is 48 pairs x 2 x 2 = 192 commands; 3 slots carry them all.
    let stats = staged_round_trip(SglSupport::Supported, 3);
    assert!(stats.waits > 0, "lanes waited for slots: {stats:?}");
}

#[test]
fn the_iommu_refuses_kv_memory_it_was_never_given_and_staging_moves_it() {
    let rig = staged_rig(SglSupport::Supported);
    let g = geometry();
    // Put known data on the drives through staging first.
    let mut mem = Kv8::new(&g);
    mem.fill(0xfeed);
    let want = mem.bytes();
    let st = staged_table(&rig, &g, &mem);
    let staged = rig.ring.register_staged_table(&st.0, 16).unwrap();
    assert_eq!(run(&rig, staged, Op::Write), vec![]);

    // A direct table aims the drives at the same memory by its host address.
    let sentinel = 0xA5A5_A5A5_A5A5_A5A5u64;
    mem.w_mut().iter_mut().for_each(|w| *w = sentinel);
    let mut direct = LayerTable::new(g.clone(), TableKind::Sgl).unwrap();
    for b in 0..g.blocks {
        for l in 0..g.layers {
            for kv in [Kv::K, Kv::V] {
                for c in 0..g.chunks() {
                    let (off, len) = g.chunk(c);
                    let d = SglDescriptor::data_block(mem.addr(&g, b, l, kv) + off, len as u32);
                    direct.set_entry(b, l, kv, c, DataPtr::Sgl(d)).unwrap();
                }
            }
        }
    }
    let direct = rig.ring.register_table(&direct).unwrap();
    let failures = run(&rig, direct, Op::Read);
    let commands = (LAYERS * BLOCKS * 2 * g.chunks()) as usize;
    assert_eq!(failures.len(), commands, "every direct command fails");
    assert!(
        failures.iter().all(|s| *s == IoStatus::Nvme(Status::DATA_TRANSFER_ERROR)),
        "the emulated IOMMU faults the DMA: {:?}",
        failures.first()
    );
    assert!(mem.w().iter().all(|&w| w == sentinel), "no byte of the KV memory was touched");

    // The staged table over the same memory reads every byte.
    assert_eq!(run(&rig, staged, Op::Read), vec![]);
    assert!(first_diff(&mem.bytes(), &want).is_none());
}

#[test]
fn staged_tables_are_registered_only_with_staging() {
    let rig = staged_rig(SglSupport::Supported);
    let g = geometry();
    let mem = Kv8::new(&g);
    let (t, _map) = staged_table(&rig, &g, &mem);
    assert!(rig.ring.register_table(&t).unwrap_err().to_string().contains("register_staged_table"));
    assert!(rig.ring.register_staged_table(&t, 0).unwrap_err().to_string().contains("staging slots"));
    let direct = LayerTable::new(g, TableKind::Sgl).unwrap();
    assert!(rig.ring.register_staged_table(&direct, 4).unwrap_err().to_string().contains("register_table"));
}

#[test]
fn a_failed_read_leaves_kv_untouched_and_a_lost_one_withholds_its_slot() {
    use tutti_driver::emulated::FaultMatch;
    let opts = GioOptions {
        depth: 16,
        command_timeout: Duration::from_millis(300),
        submit_timeout: Duration::from_secs(3),
        ..Default::default()
    };
    let rig = rig(RigSpec { ns_bytes: 16 << 20, opts, ..Default::default() });
    let g = geometry();
    let mut mem = Kv8::new(&g);
    mem.fill(0xabc);
    let want = mem.bytes();
    let st = staged_table(&rig, &g, &mem);
    let table = rig.ring.register_staged_table(&st.0, 4).unwrap();
    assert_eq!(run(&rig, table, Op::Write), vec![]);

    let sentinel = 0x5A5A_5A5A_5A5A_5A5Au64;
    mem.w_mut().iter_mut().for_each(|w| *w = sentinel);
    // Drive 0 fails its first read; drive 1 executes its first read (into the slot) and never
    // completes it.
    let read = FaultMatch { opcode: Some(0x02), ..Default::default() };
    rig.emus[0].faults().fail_next(read.clone(), Status::UNRECOVERED_READ_ERROR);
    rig.emus[1].faults().drop_next(read);
    let ids = rig.ring.submit_layer(table, 0, &pairs(), Op::Read, 3).unwrap();
    let results = rig.ring.wait_cqe(&ids, Duration::from_secs(60)).unwrap();
    assert_eq!(results.len(), 1, "one IOCB of 48 pairs");
    let mut statuses: Vec<IoStatus> = results[0].failures.iter().map(|f| f.status).collect();
    statuses.sort_by_key(|s| format!("{s:?}"));
    assert_eq!(statuses, vec![IoStatus::CompletionTimeout, IoStatus::Nvme(Status::UNRECOVERED_READ_ERROR)]);

    // Every chunk of layer 0 holds its bytes, except the two that failed: untouched.
    let chunks = g.chunks();
    let failed: Vec<(u32, u32, u32)> = results[0]
        .failures
        .iter()
        .map(|f| (pairs()[(f.index / (2 * chunks)) as usize].1, (f.index / chunks) % 2, f.index % chunks))
        .collect();
    let got = mem.bytes();
    let base = mem.w().as_ptr() as u64;
    for (_, block) in pairs() {
        for kv in [Kv::K, Kv::V] {
            for c in 0..chunks {
                let (off, len) = g.chunk(c);
                let at = (mem.addr(&g, block, 0, kv) - base + off) as usize;
                let region = &got[at..at + len as usize];
                if failed.contains(&(block, kv as u32, c)) {
                    assert!(
                        region.iter().all(|&b| b == 0x5A),
                        "failed chunk (block {block}, {kv:?}, {c}) untouched"
                    );
                } else {
                    assert_eq!(region, &want[at..at + len as usize], "chunk (block {block}, {kv:?}, {c})");
                }
            }
        }
    }
    let stats = rig.ring.staging_stats(table).unwrap();
    assert_eq!(stats.withheld, 1, "the slot of the command of unknown outcome is never handed out again");
    // The three slots left carry a whole layer again.
    rig.emus.iter().for_each(|e| e.faults().clear());
    assert_eq!(run(&rig, table, Op::Read), vec![]);
    assert!(first_diff(&mem.bytes(), &want).is_none());
}

/// A rig whose commands expire after 300 ms, for the tests of commands the host gives up on.
fn expiring_rig() -> Rig {
    let opts = GioOptions {
        depth: 16,
        command_timeout: Duration::from_millis(300),
        submit_timeout: Duration::from_secs(3),
        ..Default::default()
    };
    rig(RigSpec { ns_bytes: 16 << 20, opts, ..Default::default() })
}

/// Slots are reused many times per layer (3 slots for 192 commands) and reads execute late
/// (every read's data lands 2 ms after the controller took it). Whatever a slot held before
/// a read is never that read's chunk: within a read pass each chunk is read once, and the
/// pass over layer 0 follows a write pass whose last chunks were layer 1's (layer 1's read
/// follows layer 0's). Every word of the pattern differs, and every round writes new data.
/// So a copy out of a slot that ran before its read's data landed, or that read a line
/// cached from the slot's previous use, puts another chunk's bytes into KV memory, and the
/// check of every byte catches it. (On the host no cache can be stale; what this catches
/// here is a copy that does not wait for the completion. The load flavour that keeps a GPU
/// from reading a stale line is checked in the SASS: kernels/tests/sass.rs.)
#[test]
fn a_reused_slot_is_never_read_stale() {
    use tutti_driver::emulated::{FaultAction, FaultMatch};
    let rig = staged_rig(SglSupport::Supported);
    let g = geometry();
    let mut mem = Kv8::new(&g);
    let st = staged_table(&rig, &g, &mem);
    let table = rig.ring.register_staged_table(&st.0, 3).unwrap();
    let read = FaultMatch { opcode: Some(0x02), ..Default::default() };
    for e in &rig.emus {
        e.faults().inject(read.clone(), FaultAction::DelayExecution(Duration::from_millis(2)), None);
    }
    for round in 0..3u64 {
        mem.fill(0x57a1e ^ (round << 32));
        let want = mem.bytes();
        assert_eq!(run(&rig, table, Op::Write), vec![], "round {round}: staged writes");
        // A sentinel no chunk holds: a chunk never copied out shows as it.
        mem.w_mut().iter_mut().for_each(|w| *w = 0xDEAD_BEEF_DEAD_BEEF);
        assert_eq!(run(&rig, table, Op::Read), vec![], "round {round}: staged reads");
        let got = mem.bytes();
        assert!(
            first_diff(&got, &want).is_none(),
            "round {round}: first differing byte at {:?} (a stale or early copy out of a slot)",
            first_diff(&got, &want)
        );
    }
    let stats = rig.ring.staging_stats(table).unwrap();
    assert!(stats.waits > 0, "the three slots were contended: {stats:?}");
    assert_eq!(stats.withheld, 0);
}

/// Reads layer 0 with drive 1's next read made to vanish (`drop_next`) or to run late
/// (`late`: it moves its data and completes only after that long): either way the command
/// expires, its slot is withheld, and the rest of the layer is unharmed.
fn lose_one_read(rig: &Rig, table: TableId, late: Option<Duration>) {
    use tutti_driver::emulated::FaultMatch;
    let read = FaultMatch { opcode: Some(0x02), ..Default::default() };
    match late {
        Some(by) => rig.emus[1].faults().delay_execution_next(read, by),
        None => rig.emus[1].faults().drop_next(read),
    }
    let ids = rig.ring.submit_layer(table, 0, &pairs(), Op::Read, 3).unwrap();
    let results = rig.ring.wait_cqe(&ids, Duration::from_secs(60)).unwrap();
    let statuses: Vec<IoStatus> = results.iter().flat_map(|r| r.failures.iter().map(|f| f.status)).collect();
    assert_eq!(statuses, vec![IoStatus::CompletionTimeout]);
    let stats = rig.ring.staging_stats(table).unwrap();
    assert_eq!((stats.withheld, stats.withheld_now), (1, 1), "{stats:?}");
}

#[test]
fn withheld_slots_come_back_after_their_queue_is_recreated() {
    let rig = expiring_rig();
    let g = geometry();
    let mut mem = Kv8::new(&g);
    mem.fill(0x7e5e7);
    let want = mem.bytes();
    let st = staged_table(&rig, &g, &mem);
    let table = rig.ring.register_staged_table(&st.0, 4).unwrap();
    assert_eq!(run(&rig, table, Op::Write), vec![]);
    lose_one_read(&rig, table, None);

    // The drive may still write the slot: it stays out through more work on the same queues.
    assert_eq!(run(&rig, table, Op::Read), vec![]);
    let stats = rig.ring.staging_stats(table).unwrap();
    assert_eq!(
        (stats.withheld_now, stats.reclaimed_after_reset, stats.reclaimed_late),
        (1, 0, 0),
        "{stats:?}"
    );

    // Deleting and recreating drive 1's queue pairs ends every command of the old ones.
    rig.ring.recover_drive(1, Duration::from_secs(10)).unwrap();
    mem.w_mut().iter_mut().for_each(|w| *w = 0);
    assert_eq!(run(&rig, table, Op::Read), vec![]);
    assert!(first_diff(&mem.bytes(), &want).is_none(), "every byte after the recovery");
    let stats = rig.ring.staging_stats(table).unwrap();
    assert_eq!(
        (stats.withheld, stats.withheld_now, stats.reclaimed_after_reset, stats.reclaimed_late),
        (1, 0, 1, 0),
        "the withheld slot came back once its queue was recreated: {stats:?}"
    );
}

#[test]
fn a_slot_withheld_for_a_late_command_comes_back_when_it_completes() {
    let rig = expiring_rig();
    let g = geometry();
    let mut mem = Kv8::new(&g);
    mem.fill(0x1a7e);
    let want = mem.bytes();
    let st = staged_table(&rig, &g, &mem);
    let table = rig.ring.register_staged_table(&st.0, 4).unwrap();
    assert_eq!(run(&rig, table, Op::Write), vec![]);
    let late = Duration::from_millis(1200);
    let lost_at = std::time::Instant::now();
    lose_one_read(&rig, table, Some(late));

    // While the late read is pending, the other three slots carry the work, and its DMA
    // (into the withheld slot) lands in nothing anyone reads.
    mem.w_mut().iter_mut().for_each(|w| *w = 0);
    assert_eq!(run(&rig, table, Op::Read), vec![]);
    assert!(first_diff(&mem.bytes(), &want).is_none(), "every byte while the late read was pending");

    // Once it has completed, the next lanes on its queue reap the late completion, and the
    // slot comes back without any recovery (a pass or two: whoever scans last must see it).
    std::thread::sleep(
        (lost_at + late + Duration::from_millis(200)).saturating_duration_since(std::time::Instant::now()),
    );
    let mut stats = rig.ring.staging_stats(table).unwrap();
    for _ in 0..3 {
        mem.w_mut().iter_mut().for_each(|w| *w = 0);
        assert_eq!(run(&rig, table, Op::Read), vec![]);
        assert!(first_diff(&mem.bytes(), &want).is_none(), "every byte after the late completion");
        stats = rig.ring.staging_stats(table).unwrap();
        if stats.withheld_now == 0 {
            break;
        }
    }
    assert_eq!(
        (stats.withheld, stats.withheld_now, stats.reclaimed_after_reset, stats.reclaimed_late),
        (1, 0, 0, 1),
        "the withheld slot came back after its command's late completion: {stats:?}"
    );
    let stale: u64 = rig.ring.queue_stats().unwrap().iter().map(|q| q.stale).sum();
    assert!(stale >= 1, "the late completion arrived as a stale one");
}
