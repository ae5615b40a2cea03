//! Store sessions register their (file, block) pairs with the I/O path once:
//! every per-layer job of the session submits by that list, and the list is
//! freed when the session is committed or aborted — never under a running job.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::time::Duration;
use tutti_emulator::{FaultAction, FaultMatch};
use tutti_objstore::{chain_hashes, Backend, KvStore, LayoutKind, OpenMode};

const WRITE: u8 = 0x01;

/// A gio_uring store whose executor has room for `lists` pair lists.
fn store_with_lists(d: &Drives, layers: u32, lists: u32) -> KvStore {
    let g = geometry(layers, 128);
    let mut opts = options(g, OpenMode::Create);
    if let Backend::Gio(gio) = &mut opts.backend {
        gio.ring.max_pair_lists = lists;
    }
    KvStore::open(d.specs(), opts).unwrap()
}

#[test]
fn a_session_of_per_layer_jobs_registers_its_pairs_once() {
    let layers = 4;
    let g = geometry(layers, 128);
    let d = Drives::uniform(2, 512, 8 << 20);
    let store = store_with_lists(&d, layers, 4);
    let kv = Kv::new(g, LayoutKind::Contiguous, 12);
    kv.register(&store, "m");
    assert!(store.info().io_mode.contains("layer IOCBs"));
    let hashes = chain_hashes(&tokens(11, 6, g.tokens_per_block), g.tokens_per_block);
    let src: Vec<u32> = (0..6).collect();
    for &b in &src {
        kv.fill(b, 300 + b as u64);
    }
    let before = store.stats();
    let session = store.begin_store(&hashes, &src).unwrap();
    // One job per layer, all submitted before any is waited for (vLLM's save_kv_layer).
    let jobs: Vec<u64> = (0..layers).map(|l| store.submit_store(session, l..l + 1).unwrap()).collect();
    for job in jobs {
        let st = store.wait(job, WAIT).unwrap();
        assert!(st.done && st.failed == 0, "{st:?}");
        assert!(st.pairs_registered, "a layer job did not use the session's list: {st:?}");
        assert_eq!(st.host_pairs, 0, "a layer job copied its pairs");
        store.release(job).unwrap();
    }
    let after = store.stats();
    assert_eq!(after.pair_registrations - before.pair_registrations, 1, "{after:?}");
    assert_eq!(after.pair_lists - before.pair_lists, layers as u64);
    assert_eq!(store.commit_store(session).unwrap().stored, 6);

    let hit = store.lookup(&hashes).unwrap();
    assert_eq!(hit.files.len(), 6);
    kv.clear();
    let dst: Vec<u32> = (6..12).collect();
    let st = store.load_request(&hit.files, &dst, WAIT).unwrap();
    assert_eq!(st.failed, 0, "{st:?}");
    for (i, &b) in dst.iter().enumerate() {
        assert!(kv.holds(b, 300 + i as u64), "block {b} did not round-trip");
    }
    store.unpin(hit.pin).unwrap();
}

#[test]
fn commit_and_abort_free_the_sessions_list_so_one_list_serves_many_sessions() {
    let layers = 3;
    let g = geometry(layers, 128);
    let d = Drives::uniform(2, 512, 8 << 20);
    // Room for exactly one list: a session that kept its list would starve the next.
    let store = store_with_lists(&d, layers, 1);
    let kv = Kv::new(g, LayoutKind::Contiguous, 4);
    kv.register(&store, "m");
    let rounds = 10u64;
    for round in 0..rounds {
        let hashes = chain_hashes(&tokens(40 + round, 4, g.tokens_per_block), g.tokens_per_block);
        let session = store.begin_store(&hashes, &[0, 1, 2, 3]).unwrap();
        for l in 0..layers {
            let job = store.submit_store(session, l..l + 1).unwrap();
            let st = store.wait(job, WAIT).unwrap();
            assert!(st.done && st.failed == 0, "round {round}: {st:?}");
            assert!(st.pairs_registered, "round {round} layer {l}: no free list (a session leaked its list)");
            store.release(job).unwrap();
        }
        if round % 2 == 0 {
            assert_eq!(store.commit_store(session).unwrap().stored, 4, "round {round}");
        } else {
            store.abort_store(session).unwrap();
            assert_eq!(store.contains(&hashes).unwrap(), 0, "round {round}: an aborted store is visible");
        }
    }
    let stats = store.stats();
    assert_eq!(stats.pair_registrations, rounds, "one registration per session: {stats:?}");
    assert_eq!(stats.host_pairs, 0);
    // The pool's one list is free again for a load.
    let hashes = chain_hashes(&tokens(40, 4, g.tokens_per_block), g.tokens_per_block);
    let hit = store.lookup(&hashes).unwrap();
    let job = store.submit_load(&hit.files, &[0, 1, 2, 3], 0..layers).unwrap();
    assert!(store.wait(job, WAIT).unwrap().pairs_registered);
    store.release(job).unwrap();
    store.unpin(hit.pin).unwrap();
}

#[test]
fn aborting_a_session_with_a_job_running_keeps_its_list_for_the_jobs() {
    let layers = 2;
    let g = geometry(layers, 128);
    let d = Drives::uniform(2, 512, 8 << 20);
    let store = store_with_lists(&d, layers, 1);
    let kv = Kv::new(g, LayoutKind::Contiguous, 8);
    kv.register(&store, "m");
    let hashes = chain_hashes(&tokens(77, 4, g.tokens_per_block), g.tokens_per_block);
    for b in 0..4 {
        kv.fill(b, 900 + b as u64);
    }
    // Layer 0's writes complete late (well within the command timeout), so its job is still running.
    for e in &d.emus {
        e.faults().inject(
            FaultMatch { opcode: Some(WRITE), ..Default::default() },
            FaultAction::Delay(Duration::from_millis(500)),
            Some(2),
        );
    }
    let session = store.begin_store(&hashes, &[0, 1, 2, 3]).unwrap();
    let first = store.submit_store(session, 0..1).unwrap();
    let refused = store.abort_store(session).unwrap_err().to_string();
    assert!(refused.contains("still running"), "{refused}");
    // The session, and its list, are still there: the next layer submits by that list.
    let second = store.submit_store(session, 1..2).unwrap();
    for job in [first, second] {
        let st = store.wait(job, WAIT).unwrap();
        assert!(st.done && st.failed == 0, "{st:?}");
        assert!(st.pairs_registered && st.host_pairs == 0, "{st:?}");
        store.release(job).unwrap();
    }
    assert_eq!(store.stats().pair_registrations, 1);
    assert_eq!(store.commit_store(session).unwrap().stored, 4);
    let hit = store.lookup(&hashes).unwrap();
    kv.clear();
    let st = store.load_request(&hit.files, &[4, 5, 6, 7], WAIT).unwrap();
    assert_eq!(st.failed, 0, "{st:?}");
    assert!(st.pairs_registered, "the committed session did not free its list");
    for i in 0..4u32 {
        assert!(kv.holds(4 + i, 900 + i as u64), "block {i} did not round-trip");
    }
    store.unpin(hit.pin).unwrap();
}
