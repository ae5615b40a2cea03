//! The staged data path: KV memory the drives may not touch (host memory kept
//! out of every emulated IOMMU, standing in for GPU memory without P2P) moves
//! through staging slots the executor copies, byte for byte, on SGL-capable
//! and PRP-only drives, with fewer slots than a layer has chunks, and across
//! a reopen. The direct backend and the host executor refuse what they cannot
//! move, naming why.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use tutti_driver::spec::SglSupport;
use tutti_objstore::{
    chain_hashes, Backend, Geometry, KvMemoryKind, KvStore, LayoutKind, OpenMode, StoreOptions,
};

fn staged_options(g: Geometry, mode: OpenMode, slots: u32) -> StoreOptions {
    let mut o = options(g, mode);
    if let Backend::Gio(c) = &mut o.backend {
        c.staging_slots = slots;
    }
    o
}

fn register_staged(store: &KvStore, kv: &Kv) {
    store
        .register_host_as(kv.mem.clone(), kv.layout.clone(), "model", b"", KvMemoryKind::HostUnmapped)
        .expect("staged registration");
}

/// Stores blocks 0..n, clears the memory, loads them into blocks n..2n in
/// reverse order and checks every byte of every object.
fn round_trip(store: &KvStore, kv: &Kv, n: u32, seed: u64) {
    let (hashes, rep) = store_seeded(store, kv, n, seed);
    assert_eq!((rep.stored, rep.failed.len()), (n, 0), "{rep:?}");
    kv.clear();
    let hit = store.lookup(&hashes).expect("lookup");
    assert_eq!(hit.hits(), n as usize);
    let dst: Vec<u32> = (n..2 * n).rev().collect();
    store.load_request(&hit.files, &dst, WAIT).expect("load");
    for (i, &b) in dst.iter().enumerate() {
        assert!(kv.holds(b, seed + i as u64), "chunk {i} in block {b}: every byte");
    }
    for b in 0..n {
        assert!(!kv.holds(b, seed + b as u64), "the load wrote only its destination blocks");
    }
    store.unpin(hit.pin).expect("unpin");
}

#[test]
fn staged_round_trip_on_sgl_and_prp_only_drives() {
    // 32 KiB objects split at 16 KiB (MDTS 2): two commands per object.
    let g = geometry(2, 512);
    for sgl in [SglSupport::Supported, SglSupport::None] {
        for kind in [LayoutKind::VllmPerLayer, LayoutKind::Contiguous] {
            let ctx = format!("{sgl:?} {kind:?}");
            let cfg = DriveCfg { sgl, mdts: 2, ..DriveCfg::ram(512, 16 << 20) };
            let d = Drives::start(&[cfg.clone(), cfg.clone(), cfg]);
            let store = KvStore::open(d.specs(), staged_options(g, OpenMode::Create, 32)).unwrap();
            assert_eq!(store.stripe_map().chunks(), 2, "{ctx}");
            let kv = Kv::new(g, kind, 10);
            register_staged(&store, &kv);
            let info = store.info();
            assert!(
                info.io_mode.contains("staged") && info.io_mode.contains("layer IOCBs"),
                "{ctx}: {}",
                info.io_mode
            );
            let path = info.data_path.expect("a registration reports its data path");
            assert_eq!((path.mode, path.memory), ("staged", KvMemoryKind::HostUnmapped), "{ctx}");
            assert!(path.p2p_missing.unwrap().contains("not DMA-mappable"), "{ctx}");
            round_trip(&store, &kv, 5, 40);
            let st = store.stats();
            assert_eq!((st.bytes_stored, st.bytes_loaded), (5 * g.file_bytes(), 5 * g.file_bytes()), "{ctx}");
            assert_eq!(st.host_built, 0, "{ctx}: the executor built every command");
            let staging = store.info().data_path.unwrap().staging.expect("staging counters");
            assert_eq!(staging.staged_bytes, 2 * 5 * g.file_bytes(), "{ctx}: every byte went through a slot");
            assert_eq!((staging.slots, staging.withheld), (32, 0), "{ctx}");
        }
    }
}

#[test]
fn fewer_staging_slots_than_a_layer_has_chunks_still_completes() {
    // A layer of 8 blocks is 8 x 2 x 2 = 32 commands; 2 slots carry them.
    let g = geometry(2, 512);
    let cfg = DriveCfg { mdts: 2, ..DriveCfg::ram(512, 16 << 20) };
    let d = Drives::start(&[cfg.clone(), cfg]);
    let store = KvStore::open(d.specs(), staged_options(g, OpenMode::Create, 2)).unwrap();
    let kv = Kv::new(g, LayoutKind::Contiguous, 16);
    register_staged(&store, &kv);
    round_trip(&store, &kv, 8, 77);
    let staging = store.info().data_path.unwrap().staging.unwrap();
    assert_eq!(staging.slots, 2);
    assert!(staging.waits > 0, "lanes waited for a free slot: {staging:?}");
}

#[test]
fn staged_writes_are_read_back_after_reopen() {
    let g = geometry(3, 128);
    let d = Drives::uniform(2, 512, 8 << 20);
    let hashes = chain_hashes(&tokens(3, 4, g.tokens_per_block), g.tokens_per_block);
    {
        let store = KvStore::open(d.specs(), staged_options(g, OpenMode::Create, 8)).unwrap();
        let kv = Kv::new(g, LayoutKind::VllmPerLayer, 4);
        register_staged(&store, &kv);
        for b in 0..4 {
            kv.fill(b, 900 + b as u64);
        }
        assert_eq!(store.store_request(&hashes, &[0, 1, 2, 3], WAIT).unwrap().stored, 4);
    }
    let store = KvStore::open(d.specs(), staged_options(g, OpenMode::OpenOrCreate, 8)).unwrap();
    let kv = Kv::new(g, LayoutKind::VllmPerLayer, 4);
    register_staged(&store, &kv);
    let hit = store.lookup(&hashes).unwrap();
    assert_eq!(hit.hits(), 4);
    store.load_request(&hit.files, &[3, 2, 1, 0], WAIT).unwrap();
    for i in 0..4u32 {
        assert!(kv.holds(3 - i, 900 + i as u64), "chunk {i}");
    }
    store.unpin(hit.pin).unwrap();
}

#[test]
fn direct_registrations_report_the_direct_path() {
    let g = geometry(2, 128);
    let d = Drives::uniform(2, 512, 8 << 20);
    let store = open(&d, g, OpenMode::Create);
    assert!(store.info().data_path.is_none(), "nothing registered yet");
    let kv = Kv::new(g, LayoutKind::Contiguous, 4);
    kv.register(&store, "model");
    let path = store.info().data_path.unwrap();
    assert_eq!(
        (path.mode, path.memory, path.p2p_missing, path.staging),
        ("direct", KvMemoryKind::Host, None, None)
    );
}

#[test]
fn backends_that_cannot_stage_refuse_with_the_reason() {
    let g = geometry(2, 128);
    let d = Drives::uniform(2, 512, 8 << 20);
    let kv = Kv::new(g, LayoutKind::Contiguous, 4);
    {
        let direct = KvStore::open(d.specs(), direct_options(g, OpenMode::Create)).unwrap();
        let e = direct
            .register_host_as(kv.mem.clone(), kv.layout.clone(), "m", b"", KvMemoryKind::HostUnmapped)
            .unwrap_err()
            .to_string();
        assert!(e.contains("staged data path") && e.contains("direct backend"), "{e}");
        // SAFETY: refused before anything reads the memory (it is host memory, registered as CUDA).
        let e = unsafe { direct.register_as(kv.layout.clone(), "m", b"", KvMemoryKind::Cuda) }
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot copy CUDA memory") && e.contains("vfio type1 cannot map it"), "{e}");
        assert!(direct.info().data_path.is_none(), "nothing was registered");
    }
    // The host executor cannot address CUDA memory (host executor even when the suite runs on CUDA).
    let mut o = options(g, OpenMode::Create);
    if let Backend::Gio(c) = &mut o.backend {
        c.executor = tutti_objstore::GioExecutor::Host;
    }
    let store = KvStore::open(d.specs(), o).unwrap();
    // SAFETY: as above.
    let e = unsafe { store.register_as(kv.layout.clone(), "m", b"", KvMemoryKind::Cuda) }
        .unwrap_err()
        .to_string();
    assert!(e.contains("CUDA executor") && e.contains("host"), "{e}");
    let e = store
        .register_host_as(kv.mem.clone(), kv.layout.clone(), "m", b"", KvMemoryKind::Cuda)
        .unwrap_err()
        .to_string();
    assert!(e.contains("host memory registered as CUDA memory"), "{e}");
}
