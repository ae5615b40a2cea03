//! Persistence: the index survives a reopen; wrong drive order, a missing or
//! foreign drive, a corrupt superblock or another geometry are clear errors.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use tutti_objstore::{chain_hashes, KvStore, LayoutKind, OpenMode};

fn err(drives: &Drives, order: &[usize], g: tutti_objstore::Geometry, mode: OpenMode) -> String {
    match KvStore::open(drives.specs_in(order), options(g, mode)) {
        Ok(_) => panic!("opening {order:?} should fail"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn stored_prefix_survives_reopen() {
    let g = geometry(3, 128);
    let d = Drives::uniform(3, 512, 8 << 20);
    let hashes = chain_hashes(&tokens(9, 5, g.tokens_per_block), g.tokens_per_block);
    let pool = {
        let store = open(&d, g, OpenMode::Create);
        let kv = Kv::new(g, LayoutKind::VllmPerLayer, 5);
        kv.register(&store, "m");
        for b in 0..5 {
            kv.fill(b, 70 + b as u64);
        }
        assert_eq!(store.store_request(&hashes, &[0, 1, 2, 3, 4], WAIT).unwrap().stored, 5);
        assert!(store.info().formatted_now);
        store.pool_id()
    };
    // OpenOrCreate finds the pool and does not format it.
    let store = open(&d, g, OpenMode::OpenOrCreate);
    assert_eq!(store.pool_id(), pool);
    assert!(!store.info().formatted_now);
    assert_eq!(store.info().replay.iter().map(|r| r.records).sum::<u64>(), 5);
    let kv = Kv::new(g, LayoutKind::VllmPerLayer, 5);
    kv.register(&store, "m");
    let hit = store.lookup(&hashes).unwrap();
    assert_eq!(hit.hits(), 5);
    store.load_request(&hit.files, &[4, 3, 2, 1, 0], WAIT).unwrap();
    for i in 0..5u32 {
        assert!(kv.holds(4 - i, 70 + i as u64));
    }
    store.unpin(hit.pin).unwrap();
    drop(store);
    // Create formats: the pool is new and empty.
    let store = open(&d, g, OpenMode::Create);
    assert_ne!(store.pool_id(), pool);
    let kv = Kv::new(g, LayoutKind::VllmPerLayer, 5);
    kv.register(&store, "m");
    assert_eq!(store.contains(&hashes).unwrap(), 0);
}

#[test]
fn wrong_order_missing_foreign_and_blank_drives_are_named() {
    let g = geometry(2, 128);
    let d = Drives::uniform(4, 512, 4 << 20);
    drop(KvStore::open(d.specs_in(&[0, 1, 2]), options(g, OpenMode::Create)).unwrap());
    let e = err(&d, &[1, 0, 2], g, OpenMode::Open);
    assert!(e.contains("wrong drive order") && e.contains("emu1") && e.contains("SN-0, SN-1, SN-2"), "{e}");
    let e = err(&d, &[0, 1], g, OpenMode::Open);
    assert!(e.contains("3 drives, 2 given") && e.contains("SN-2"), "{e}");
    let e = err(&d, &[0, 1, 3], g, OpenMode::Open);
    assert!(e.contains("emu3") && e.contains("no tutti superblock"), "{e}");
    let e = err(&d, &[0, 1, 3], g, OpenMode::OpenOrCreate);
    assert!(e.contains("no tutti superblock"), "OpenOrCreate formats only all-blank drives: {e}");
    let e = err(&d, &[3], g, OpenMode::Open);
    assert!(e.contains("none of the drives holds a tutti pool"), "{e}");
    // Drive 3 joins another pool; mixing it in is refused.
    drop(KvStore::open(d.specs_in(&[3]), options(g, OpenMode::Create)).unwrap());
    let e = err(&d, &[0, 1, 3], g, OpenMode::Open);
    assert!(e.contains("belongs to another pool"), "{e}");
    // Another geometry is refused.
    let e = err(&d, &[0, 1, 2], geometry(3, 128), OpenMode::Open);
    assert!(e.contains("formatted for 2 layers"), "{e}");
    // The right order still opens.
    KvStore::open(d.specs_in(&[0, 1, 2]), options(g, OpenMode::Open)).unwrap();
}

#[test]
fn a_corrupt_superblock_is_reported() {
    let g = geometry(2, 128);
    let d = Drives::uniform(2, 4096, 4 << 20);
    drop(open(&d, g, OpenMode::Create));
    // Flip a byte of drive 1's superblock through a raw write.
    let specs = d.specs();
    let ctrl = &specs[1].ctrl;
    let buf = ctrl.dma().alloc(4096).unwrap();
    let mut qp = ctrl.create_io_queue_pair(4).unwrap();
    qp.read_buf(1, 0, &buf, 0, 4096, Default::default()).unwrap();
    let mut b = [0u8; 1];
    buf.copy_out(40, &mut b).unwrap();
    buf.copy_in(40, &[b[0] ^ 0x55]).unwrap();
    qp.write_buf(1, 0, &buf, 0, 4096, Default::default()).unwrap();
    drop((qp, buf, specs));
    let e = err(&d, &[0, 1], g, OpenMode::Open);
    assert!(e.contains("emu1") && e.contains("checksum"), "{e}");
}

/// Rewrites drive `i`'s superblock after `edit` (with a valid checksum).
fn rewrite_superblock(d: &Drives, i: usize, edit: impl Fn(&mut tutti_objstore::superblock::Superblock)) {
    use tutti_objstore::superblock::{Found, Superblock};
    let specs = d.specs();
    let ctrl = &specs[i].ctrl;
    let buf = ctrl.dma().alloc(4096).unwrap();
    let mut qp = ctrl.create_io_queue_pair(4).unwrap();
    qp.read_buf(1, 0, &buf, 0, 4096, Default::default()).unwrap();
    let mut raw = vec![0u8; 4096];
    buf.copy_out(0, &mut raw).unwrap();
    let Found::Valid(mut sb) = Superblock::decode(&raw) else { panic!("no superblock") };
    edit(&mut sb);
    buf.copy_in(0, &sb.encode()).unwrap();
    qp.write_buf(1, 0, &buf, 0, 4096, Default::default()).unwrap();
}

#[test]
fn absurd_counts_in_a_superblock_are_errors() {
    let g = geometry(2, 128);
    type Edit = fn(&mut tutti_objstore::superblock::Superblock);
    let cases: [(Edit, &str); 4] = [
        (|sb| sb.files = u32::MAX - 1, "formatted for 4294967294 files"),
        (|sb| sb.journal_pages = u32::MAX, "no room"),
        (|sb| sb.lba_size = 1 << 31, "LBA"),
        (|sb| sb.data_start_lba = u64::MAX, "data at LBA"),
    ];
    for (edit, needle) in cases {
        let d = Drives::uniform(1, 4096, 4 << 20);
        drop(open(&d, g, OpenMode::Create));
        rewrite_superblock(&d, 0, edit);
        let e = err(&d, &[0], g, OpenMode::Open);
        assert!(e.contains(needle), "wanted {needle:?}: {e}");
    }
}
