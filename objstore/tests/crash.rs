//! Crash tests: a store is stopped at a random command (every later write or
//! flush fails, as if power went), the process state is dropped and the
//! media kept, the pool reopened. Every lookup hit must return exactly the
//! bytes stored; blocks whose store did not complete must be misses.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use rand::{Rng, SeedableRng};
use tutti_driver::spec::Status;
use tutti_emulator::{FaultAction, FaultMatch, MediaConfig};
use tutti_objstore::{chain_hashes, BlockHash, Geometry, KvStore, LayoutKind, OpenMode};

const WRITE: u8 = 0x01;
const FLUSH: u8 = 0x00;

struct Request {
    hashes: Vec<BlockHash>,
    seeds: Vec<u64>,
}

fn request(g: &Geometry, seed: u64, chunks: usize) -> Request {
    let hashes = chain_hashes(&tokens(seed, chunks, g.tokens_per_block), g.tokens_per_block);
    Request { hashes, seeds: (0..chunks as u64).map(|i| seed * 1000 + i).collect() }
}

fn store_all(
    store: &KvStore,
    kv: &Kv,
    r: &Request,
) -> Result<tutti_objstore::StoreReport, tutti_objstore::ObjError> {
    let blocks: Vec<u32> = (0..r.hashes.len() as u32).collect();
    for (&b, &s) in blocks.iter().zip(&r.seeds) {
        kv.fill(b, s);
    }
    store.store_request(&r.hashes, &blocks, WAIT)
}

/// Loads every chunk of `r` that is stored (looked up one by one, so a chunk
/// after a miss is checked too) and checks its bytes; returns which hit.
fn verify_each(store: &KvStore, kv: &Kv, r: &Request) -> Vec<bool> {
    kv.clear();
    let mut hit = Vec::new();
    for (i, h) in r.hashes.iter().enumerate() {
        let l = store.lookup(std::slice::from_ref(h)).expect("lookup");
        hit.push(l.hits() == 1);
        if l.hits() == 1 {
            let st = store.load_request(&l.files, &[0], WAIT).expect("load");
            assert_eq!(st.failed, 0, "{st:?}");
            assert!(kv.holds(0, r.seeds[i]), "chunk {i} is a hit but its bytes are wrong");
            kv.clear();
        }
        store.unpin(l.pin).expect("unpin");
    }
    hit
}

/// On one drive, every write after the first `w` and every flush after the
/// first `f` fails, `w` drawn over the whole store (data and journal writes)
/// and `f` over its flushes; the other drives keep working, so a crash can
/// cut a commit between two drives' journals.
fn arm(drives: &Drives, rng: &mut impl Rng, writes: u32) {
    let e = &drives.emus[rng.gen_range(0..drives.emus.len())];
    let w = rng.gen_range(0..=writes);
    let f = rng.gen_range(0..=4);
    let fail = FaultAction::Fail(Status::INTERNAL_ERROR);
    e.faults().inject(FaultMatch { opcode: Some(WRITE), skip: w, ..Default::default() }, fail.clone(), None);
    e.faults().inject(FaultMatch { opcode: Some(FLUSH), skip: f, ..Default::default() }, fail, None);
}

fn small_pool(drives: &Drives, g: Geometry, mode: OpenMode) -> KvStore {
    let mut o = options(g, mode);
    o.pool.journal_pages = Some(4);
    KvStore::open(drives.specs(), o).expect("store opens")
}

/// Outcome counts over all rounds, to show the crash points cover every stage.
#[derive(Default, Debug)]
struct Tally {
    rounds: u32,
    nothing_committed: u32,
    some_committed: u32,
    all_committed: u32,
    a_survivors: usize,
}

fn crash_round(seed: u64, drives: &Drives, g: Geometry, tally: &mut Tally) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let kind = if seed.is_multiple_of(2) { LayoutKind::Contiguous } else { LayoutKind::VllmPerLayer };
    let a = request(&g, seed * 2 + 1, 4);
    let (files, b, committed) = {
        let store = small_pool(drives, g, OpenMode::Create);
        let files = store.stripe_map().files() as usize;
        let kv = Kv::new(g, kind, files as u32);
        kv.register(&store, "model");
        let rep = store_all(&store, &kv, &a).expect("clean store");
        assert_eq!(rep.stored, 4);
        // Enough new chunks to evict two of A's files.
        let b = request(&g, seed * 2 + 2, files - 2);
        let per_drive = (b.hashes.len() * g.objects_per_file() as usize).div_ceil(drives.emus.len()) as u32;
        arm(drives, &mut rng, per_drive + 3);
        let committed: Vec<usize> = match store_all(&store, &kv, &b) {
            Ok(rep) => rep.files.iter().enumerate().filter(|(_, f)| f.is_some()).map(|(i, _)| i).collect(),
            Err(_) => Vec::new(),
        };
        (files, b, committed)
        // The store and its memory are dropped here: the crash.
    };
    drives.clear_faults();
    let store = small_pool(drives, g, OpenMode::Open);
    let kv = Kv::new(g, kind, files as u32);
    kv.register(&store, "model");
    let hits_a = verify_each(&store, &kv, &a);
    let hits_b = verify_each(&store, &kv, &b);
    for &i in &committed {
        assert!(hits_b[i], "seed {seed}: chunk {i} was reported stored but is not a hit after reopen");
    }
    let n_a = hits_a.iter().filter(|h| **h).count();
    let n_b = hits_b.iter().filter(|h| **h).count();
    assert!(n_a >= 2, "only two of A's files were evicted");
    assert!(n_a + n_b <= files, "more hits than files");
    tally.rounds += 1;
    tally.a_survivors += n_a;
    match committed.len() {
        0 => tally.nothing_committed += 1,
        n if n == b.hashes.len() => tally.all_committed += 1,
        _ => tally.some_committed += 1,
    }
    // The pool still works after the crash: store B again, completely.
    let rep = store_all(&store, &kv, &b).expect("store after reopen");
    assert!(rep.failed.is_empty(), "{rep:?}");
    assert!(verify_each(&store, &kv, &b).iter().all(|h| *h));
}

#[test]
fn crash_at_random_points_with_kept_alive_controllers() {
    let g = geometry(2, 128);
    let mut tally = Tally::default();
    for seed in 0..48u64 {
        let n = 1 + (seed % 3) as usize;
        let lba = if seed % 4 < 2 { 512 } else { 4096 };
        let drives = Drives::uniform(n, lba, 512 << 10);
        crash_round(seed, &drives, g, &mut tally);
    }
    eprintln!("{tally:?}");
    assert!(tally.nothing_committed > 0 && tally.all_committed + tally.some_committed > 0, "{tally:?}");
}

#[test]
fn crash_with_file_media_and_restarted_controllers() {
    let dir = std::env::temp_dir().join(format!("tutti-objstore-crash-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let g = geometry(2, 128);
    for seed in 100..104u64 {
        let cfgs: Vec<DriveCfg> = (0..2)
            .map(|i| DriveCfg {
                media: MediaConfig::File(dir.join(format!("s{seed}-d{i}.img"))),
                ..DriveCfg::ram(4096, 2 << 20)
            })
            .collect();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let a = request(&g, seed, 4);
        let mut committed = Vec::new();
        let files;
        {
            let drives = Drives::start(&cfgs);
            let store = small_pool(&drives, g, OpenMode::Create);
            files = store.stripe_map().files();
            let kv = Kv::new(g, LayoutKind::Contiguous, files);
            kv.register(&store, "model");
            store_all(&store, &kv, &a).unwrap();
            let b = request(&g, seed + 50, files as usize - 1);
            let per_drive = (b.hashes.len() * g.objects_per_file() as usize).div_ceil(2) as u32;
            arm(&drives, &mut rng, per_drive + 3);
            if let Ok(rep) = store_all(&store, &kv, &b) {
                committed =
                    rep.files.iter().enumerate().filter(|(_, f)| f.is_some()).map(|(i, _)| i).collect();
            }
            // Controllers, store and memory all go away: only the files remain.
        }
        let drives = Drives::start(&cfgs);
        let store = small_pool(&drives, g, OpenMode::Open);
        let kv = Kv::new(g, LayoutKind::Contiguous, files);
        kv.register(&store, "model");
        verify_each(&store, &kv, &a);
        let b = request(&g, seed + 50, files as usize - 1);
        let hits = verify_each(&store, &kv, &b);
        for &i in &committed {
            assert!(hits[i], "chunk {i} was reported stored but is not a hit after restart");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
