//! Pins block eviction, eviction frees files in LRU order, and KV stored
//! under one cache identity never answers another.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::time::Duration;
use tutti_emulator::CostModel;
use tutti_objstore::{chain_hashes, BlockHash, KvStore, LayoutKind, OpenMode};

/// A store whose pool holds exactly `files` files, with that many engine blocks (+4).
fn tiny(files: u32) -> (Drives, KvStore, Kv) {
    tiny_with(files, CostModel::default())
}

fn tiny_with(files: u32, cost: CostModel) -> (Drives, KvStore, Kv) {
    let g = geometry(2, 128);
    // One drive of exactly the superblock, two 2-page journal halves and `files` files.
    let bytes = 4096 * (1 + 2 * 2) + files as u64 * g.file_bytes();
    let d = Drives::start(&[DriveCfg { cost, ..DriveCfg::ram(512, bytes) }]);
    let mut o = options(g, OpenMode::Create);
    o.pool.journal_pages = Some(2);
    let store = KvStore::open(d.specs(), o).unwrap();
    assert_eq!(store.stripe_map().files(), files);
    let kv = Kv::new(g, LayoutKind::Contiguous, files + 4);
    kv.register(&store, "model");
    (d, store, kv)
}

/// Stores one chunk (a request of one block) seeded `seed` from block 0.
fn put(store: &KvStore, kv: &Kv, seed: u64) -> BlockHash {
    let h = BlockHash(seed as u128 * 7919);
    kv.fill(0, seed);
    let rep = store.store_request(&[h], &[0], WAIT).unwrap();
    assert_eq!(rep.stored + rep.present, 1, "{rep:?}");
    h
}

fn has(store: &KvStore, h: BlockHash) -> bool {
    store.contains(&[h]).unwrap() == 1
}

#[test]
fn eviction_frees_the_least_recently_used_first() {
    let (_d, store, kv) = tiny(4);
    let h: Vec<BlockHash> = (1..=4).map(|s| put(&store, &kv, s)).collect();
    // Use chunk 1 (index 0): chunk 2 becomes the least recently used.
    let used = store.lookup(&h[..1]).unwrap();
    store.unpin(used.pin).unwrap();
    let h5 = put(&store, &kv, 5);
    assert!(!has(&store, h[1]), "the LRU file was evicted");
    assert!(has(&store, h[0]) && has(&store, h[2]) && has(&store, h[3]) && has(&store, h5));
    let h6 = put(&store, &kv, 6);
    assert!(!has(&store, h[2]), "then the next least recently used");
    assert!(has(&store, h6));
    assert_eq!(store.stats().index.evictions, 2);
    // The newest data is intact after its file was reused.
    let l = store.lookup(&[h6]).unwrap();
    kv.clear();
    store.load_request(&l.files, &[3], WAIT).unwrap();
    assert!(kv.holds(3, 6));
    store.unpin(l.pin).unwrap();
}

#[test]
fn pins_block_eviction_until_unpinned() {
    let (_d, store, kv) = tiny(3);
    let h: Vec<BlockHash> = (1..=3).map(|s| put(&store, &kv, s)).collect();
    let pinned = store.lookup(&h).unwrap();
    assert_eq!(pinned.hits(), 3);
    // Every file pinned: a store cannot get a file and says so.
    kv.fill(0, 9);
    let rep = store.store_request(&[BlockHash(99)], &[0], WAIT).unwrap();
    assert_eq!(rep.stored, 0);
    assert!(rep.failed[0].1.contains("pool full"), "{rep:?}");
    // Pinned data is still loadable and intact.
    kv.clear();
    store.load_request(&pinned.files, &[4, 5, 6], WAIT).unwrap();
    assert!(kv.holds(4, 1) && kv.holds(5, 2) && kv.holds(6, 3));
    store.unpin(pinned.pin).unwrap();
    assert!(store.unpin(pinned.pin).is_err(), "a pin is released once");
    // Pin only the first chunk: the others go first.
    let one = store.lookup(&h[..1]).unwrap();
    put(&store, &kv, 10);
    put(&store, &kv, 11);
    assert!(has(&store, h[0]), "the pinned file survived two evictions");
    assert!(!has(&store, h[1]) && !has(&store, h[2]));
    store.unpin(one.pin).unwrap();
    put(&store, &kv, 12);
    assert!(!has(&store, h[0]), "unpinned, it is evictable again");
}

#[test]
fn another_identity_never_hits() {
    let g = geometry(2, 128);
    let d = Drives::uniform(2, 4096, 8 << 20);
    let store = open(&d, g, OpenMode::Create);
    let kv = Kv::new(g, LayoutKind::Contiguous, 4);
    kv.register(&store, "llama");
    let hashes = chain_hashes(&tokens(1, 2, g.tokens_per_block), g.tokens_per_block);
    kv.fill(0, 1);
    kv.fill(1, 2);
    store.store_request(&hashes, &[0, 1], WAIT).unwrap();
    assert_eq!(store.contains(&hashes).unwrap(), 2);
    // Another model name, another tenant, another layout: all miss.
    kv.register(&store, "mistral");
    assert_eq!(store.contains(&hashes).unwrap(), 0);
    store.register_host(kv.mem.clone(), kv.layout.clone(), "llama", b"tenant-b").unwrap();
    assert_eq!(store.contains(&hashes).unwrap(), 0);
    let per_layer = Kv::new(g, LayoutKind::VllmPerLayer, 4);
    per_layer.register(&store, "llama");
    assert_eq!(store.lookup(&hashes).unwrap().hits(), 0);
    // Files stored under another identity cannot be loaded by id either.
    let err = store.submit_load(&[0], &[0], 0..1).unwrap_err().to_string();
    assert!(err.contains("identity") || err.contains("no entry"), "{err}");
    // Back under the original identity, the entries answer again.
    kv.register(&store, "llama");
    assert_eq!(store.contains(&hashes).unwrap(), 2);
}

#[test]
fn a_load_in_flight_holds_its_files_even_if_unpinned() {
    // Slow commands keep the load in flight while the rest of the test runs.
    let cost = CostModel { per_command: Duration::from_millis(30), ..Default::default() };
    let (_d, store, kv) = tiny_with(2, cost);
    let h1 = put(&store, &kv, 1);
    let h2 = put(&store, &kv, 2);
    let keep = store.lookup(&[h2]).unwrap(); // h2 pinned: h1 is the only candidate
    let l = store.lookup(&[h1]).unwrap();
    let job = store.submit_load(&l.files, &[3], 0..2).unwrap();
    store.unpin(l.pin).unwrap();
    assert!(!store.poll(job).unwrap().done, "the load is still in flight");
    kv.fill(0, 9);
    let rep = store.store_request(&[BlockHash(99)], &[0], WAIT).unwrap();
    assert!(rep.failed.first().is_some_and(|f| f.1.contains("pool full")), "{rep:?}");
    let st = store.wait(job, WAIT).unwrap();
    assert!(st.done && st.failed == 0);
    assert!(kv.holds(3, 1), "the load read what h1 held");
    store.release(job).unwrap();
    // Now h1 is idle and unpinned: it goes.
    let rep = store.store_request(&[BlockHash(99)], &[0], WAIT).unwrap();
    assert_eq!(rep.stored, 1);
    assert!(!has(&store, h1) && has(&store, h2));
    store.unpin(keep.pin).unwrap();
}
