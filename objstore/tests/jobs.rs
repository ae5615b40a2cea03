//! Jobs: per-layer completion, per-block failure bitmaps the engine can
//! recompute from, cancellation, and argument checks.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use tutti_driver::spec::Status;
use tutti_emulator::{FaultAction, FaultMatch};
use tutti_objstore::store::LAYERS_IN_FLIGHT;
use tutti_objstore::{chain_hashes, Backend, KvStore, LayoutKind, OpenMode};

const READ: u8 = 0x02;
const WRITE: u8 = 0x01;

fn stored(chunks: u32) -> (Drives, KvStore, Kv, Vec<u32>) {
    let g = geometry(4, 128);
    let d = Drives::uniform(2, 512, 8 << 20);
    let store = open(&d, g, OpenMode::Create);
    let kv = Kv::new(g, LayoutKind::Contiguous, 2 * chunks);
    kv.register(&store, "m");
    let hashes = chain_hashes(&tokens(3, chunks as usize, g.tokens_per_block), g.tokens_per_block);
    let blocks: Vec<u32> = (0..chunks).collect();
    for &b in &blocks {
        kv.fill(b, 500 + b as u64);
    }
    assert_eq!(store.store_request(&hashes, &blocks, WAIT).unwrap().stored, chunks);
    let hit = store.lookup(&hashes).unwrap();
    (d, store, kv, hit.files)
}

#[test]
fn a_failed_read_marks_exactly_its_block() {
    let (d, store, kv, files) = stored(6);
    let map = store.stripe_map().clone();
    // Fail the read of chunk 4's V object in layer 2 (object 5).
    let obj = map.locate(files[4], 5);
    d.emus[obj.drive as usize].faults().fail_next(
        FaultMatch { opcode: Some(READ), lba: Some(obj.lba..obj.lba + 1), ..Default::default() },
        Status::UNRECOVERED_READ_ERROR,
    );
    kv.clear();
    let dst: Vec<u32> = (6..12).collect();
    let st = store.load_request(&files, &dst, WAIT).unwrap();
    assert_eq!(st.failed, 1, "{st:?}");
    assert!(st.block_failed(4) && !st.block_failed(3) && !st.block_failed(5));
    let why = st.first_error.unwrap_or_default();
    assert!(why.contains("layer 2") && why.contains("Unrecovered Read Error"), "{why}");
    for (i, &b) in dst.iter().enumerate() {
        if i != 4 {
            assert!(kv.holds(b, 500 + i as u64), "block {b} should have loaded");
        }
    }
    assert!(!kv.layer_holds(dst[4], 2, 1, 504));
}

#[test]
fn a_failed_write_is_not_committed_and_the_rest_are() {
    let g = geometry(2, 128);
    let d = Drives::uniform(3, 4096, 8 << 20);
    let store = open(&d, g, OpenMode::Create);
    let kv = Kv::new(g, LayoutKind::VllmPerLayer, 8);
    kv.register(&store, "m");
    let hashes = chain_hashes(&tokens(8, 4, g.tokens_per_block), g.tokens_per_block);
    for b in 0..4 {
        kv.fill(b, 900 + b as u64);
    }
    // Any write to drive 1's first data slot fails: a file there cannot be stored.
    let first = store.stripe_map().drive(1).data_start_lba;
    d.emus[1].faults().inject(
        FaultMatch { opcode: Some(WRITE), lba: Some(first..first + 1), ..Default::default() },
        FaultAction::Fail(Status::INTERNAL_ERROR),
        None,
    );
    let s = store.begin_store(&hashes, &[0, 1, 2, 3]).unwrap();
    let mut failed_any = None;
    for layer in 0..g.layers {
        let st = store.store_layer(s, layer, WAIT).unwrap();
        if st.failed > 0 {
            failed_any = Some(st);
        }
    }
    let st = failed_any.expect("one write failed");
    let bad: Vec<u32> = (0..4).filter(|&i| st.block_failed(i)).collect();
    assert_eq!(bad.len(), 1, "{st:?}");
    let rep = store.commit_store(s).unwrap();
    assert_eq!(rep.stored, 3);
    assert_eq!(rep.failed.iter().map(|f| f.0).collect::<Vec<_>>(), bad);
    assert!(rep.files[bad[0] as usize].is_none());
    d.clear_faults();
    // The failed chunk is a miss; the prefix stops there.
    assert_eq!(store.contains(&hashes).unwrap(), bad[0] as usize);
}

#[test]
fn layers_complete_one_by_one() {
    let (_d, store, kv, files) = stored(3);
    let dst = [3, 4, 5];
    let job = store.submit_load(&files, &dst, 1..4).unwrap();
    for layer in 1..4 {
        let st = store.wait_layer(job, layer, WAIT).unwrap();
        assert!(st.layer_is_done(layer));
        assert_eq!((st.first_layer, st.layers), (1, 3));
        for (i, &b) in dst.iter().enumerate() {
            assert!(
                kv.layer_holds(b, layer, 0, 500 + i as u64) && kv.layer_holds(b, layer, 1, 500 + i as u64)
            );
        }
    }
    assert!(store.wait_layer(job, 0, WAIT).is_err(), "layer 0 is not in the job");
    let st = store.wait(job, WAIT).unwrap();
    assert!(st.done && st.failed == 0 && st.layers_done == 3);
    assert_eq!(st.commands, 3 * 3 * 2);
    store.release(job).unwrap();
    assert!(store.poll(job).is_err(), "released jobs are gone");
}

#[test]
fn cancel_stops_at_a_layer_boundary() {
    let g = geometry(LAYERS_IN_FLIGHT as u32 + 4, 128);
    let d = Drives::uniform(2, 4096, 16 << 20);
    let store = open(&d, g, OpenMode::Create);
    let kv = Kv::new(g, LayoutKind::VllmPerLayer, 4);
    kv.register(&store, "m");
    let hashes = chain_hashes(&tokens(4, 2, g.tokens_per_block), g.tokens_per_block);
    kv.fill(0, 1);
    kv.fill(1, 2);
    store.store_request(&hashes, &[0, 1], WAIT).unwrap();
    let hit = store.lookup(&hashes).unwrap();
    let job = store.submit_load(&hit.files, &[2, 3], 0..g.layers).unwrap();
    let st = store.cancel(job).unwrap();
    assert!(st.cancelled);
    let st = store.wait(job, WAIT).unwrap();
    assert!(st.done && st.layers_done == g.layers);
    // The layers that were never handed to the I/O path are reported failed.
    assert!(st.block_failed(0) && st.block_failed(1), "{st:?}");
    assert!(st.first_error.as_deref().unwrap_or("").contains("cancelled"));
    assert_eq!(st.commands, LAYERS_IN_FLIGHT as u64 * 2 * 2, "only the first layers were issued");
    for layer in 0..LAYERS_IN_FLIGHT as u32 {
        assert!(kv.layer_holds(2, layer, 0, 1), "layer {layer} was issued before the cancel and completed");
    }
    assert!(!kv.layer_holds(2, g.layers - 1, 0, 1));
    store.release(job).unwrap();
    store.unpin(hit.pin).unwrap();
}

#[test]
fn bad_arguments_are_named() {
    let (_d, store, _kv, files) = stored(2);
    let e = |r: Result<u64, tutti_objstore::ObjError>| r.unwrap_err().to_string();
    assert!(e(store.submit_load(&files, &[0], 0..1)).contains("blocks"));
    assert!(e(store.submit_load(&files, &[0, 99], 0..1)).contains("engine block 99"));
    assert!(e(store.submit_load(&files, &[1, 1], 0..1)).contains("twice"));
    assert!(e(store.submit_load(&files, &[0, 1], 2..9)).contains("layers"));
    assert!(e(store.submit_load(&files, &[0, 1], 1..1)).contains("layers"));
    assert!(e(store.submit_load(&[12345, 0], &[0, 1], 0..1)).contains("file"));
    assert!(e(store.begin_store(&[], &[0])).contains("blocks"));
    assert!(store.unpin(777).is_err());
    assert!(store.commit_store(4242).is_err());
}

#[test]
fn loads_and_stores_from_several_threads() {
    let g = geometry(3, 128);
    let d = Drives::uniform(3, 512, 16 << 20);
    let store = open(&d, g, OpenMode::Create);
    let kv = Kv::new(g, LayoutKind::VllmPerLayer, 24);
    kv.register(&store, "m");
    let x = chain_hashes(&tokens(1, 8, g.tokens_per_block), g.tokens_per_block);
    for b in 0..8 {
        kv.fill(b, 10 + b as u64);
    }
    assert_eq!(store.store_request(&x, &(0..8).collect::<Vec<_>>(), WAIT).unwrap().stored, 8);
    std::thread::scope(|s| {
        // Reader: loads X into blocks 8..16 again and again, checking every byte.
        s.spawn(|| {
            for round in 0..6 {
                let hit = store.lookup(&x).unwrap();
                assert_eq!(hit.hits(), 8, "round {round}");
                let dst: Vec<u32> = (8..16).collect();
                let st = store.load_request(&hit.files, &dst, WAIT).unwrap();
                assert_eq!(st.failed, 0);
                for i in 0..8u32 {
                    assert!(kv.holds(8 + i, 10 + i as u64), "round {round} chunk {i}");
                }
                store.unpin(hit.pin).unwrap();
            }
        });
        // Writer: stores other requests from blocks 16..24 meanwhile.
        s.spawn(|| {
            for r in 0..6u64 {
                let h = chain_hashes(&tokens(100 + r, 8, g.tokens_per_block), g.tokens_per_block);
                for b in 16..24 {
                    kv.fill(b, 1000 * r + b as u64);
                }
                let rep = store.store_request(&h, &(16..24).collect::<Vec<_>>(), WAIT).unwrap();
                assert_eq!(rep.stored, 8, "{rep:?}");
            }
        });
    });
    assert_eq!(store.stats().index.valid, 8 + 6 * 8);
}

#[test]
fn jobs_register_their_pairs_once_and_a_pool_of_two_lists_never_runs_out() {
    let g = geometry(3, 128);
    let d = Drives::uniform(2, 512, 8 << 20);
    let mut opts = options(g, OpenMode::Create);
    if let Backend::Gio(gio) = &mut opts.backend {
        gio.ring.max_pair_lists = 2;
    }
    let store = KvStore::open(d.specs(), opts).unwrap();
    let kv = Kv::new(g, LayoutKind::Contiguous, 16);
    kv.register(&store, "m");
    assert!(store.info().io_mode.contains("layer IOCBs"));
    let hashes = chain_hashes(&tokens(5, 4, g.tokens_per_block), g.tokens_per_block);
    for b in 0..4 {
        kv.fill(b, 700 + b as u64);
    }
    assert_eq!(store.store_request(&hashes, &[0, 1, 2, 3], WAIT).unwrap().stored, 4);
    let hit = store.lookup(&hashes).unwrap();
    let holds = |dst: &[u32]| dst.iter().enumerate().all(|(i, &b)| kv.holds(b, 700 + i as u64));

    // Many jobs one after another: each registers its pairs, and frees them when done.
    for round in 0..12u32 {
        let dst: Vec<u32> = (0..4).map(|i| 4 + (i + round) % 4).collect();
        kv.clear();
        let job = store.submit_load(&hit.files, &dst, 0..3).unwrap();
        let st = store.wait(job, WAIT).unwrap();
        assert!(st.done && st.failed == 0, "round {round}: {st:?}");
        assert!(st.pairs_registered, "round {round}: the pool of lists ran out");
        assert_eq!(st.host_pairs, 0, "layers copied pairs although they were registered");
        assert_eq!(st.layer_submit_ns.len(), 3);
        assert_eq!(st.submit_ns, st.layer_submit_ns.iter().sum::<u64>());
        store.release(job).unwrap();
        assert!(holds(&dst), "round {round}: wrong bytes");
    }

    // Three jobs at once on two lists: the third carries its pairs in every layer and loads all the same.
    kv.clear();
    let dsts = [[4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]];
    let jobs: Vec<u64> = dsts.iter().map(|dst| store.submit_load(&hit.files, dst, 0..3).unwrap()).collect();
    let sts: Vec<_> = jobs.iter().map(|&j| store.wait(j, WAIT).unwrap()).collect();
    for (st, dst) in sts.iter().zip(&dsts) {
        assert!(st.done && st.failed == 0, "{st:?}");
        assert!(holds(dst));
    }
    let registered: Vec<bool> = sts.iter().map(|s| s.pairs_registered).collect();
    assert_eq!(registered, [true, true, false]);
    assert_eq!(sts[2].host_pairs, 4 * 3, "the fallback copies 4 pairs in each of 3 layers");
    for j in jobs {
        store.release(j).unwrap();
    }
    // Released: the next job gets a list again.
    let job = store.submit_load(&hit.files, &[4, 5, 6, 7], 0..3).unwrap();
    assert!(store.wait(job, WAIT).unwrap().pairs_registered);
    store.release(job).unwrap();
    let stats = store.stats();
    assert_eq!(stats.host_pairs, 12);
    assert!(stats.pair_lists > 12 + 2, "{stats:?}");
    store.unpin(hit.pin).unwrap();
}
