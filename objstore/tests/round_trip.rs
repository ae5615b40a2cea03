//! Store a request's KV and read it back into other slots, byte for byte, on
//! 1–4 drives, both layouts, both LBA sizes, and with objects split at MDTS.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use tutti_driver::spec::SglSupport;
use tutti_emulator::MediaConfig;
use tutti_objstore::{chain_hashes, Backend, BlockHash, Geometry, KvStore, LayoutKind, OpenMode};

/// Stores `chunks` chunks from blocks `0..chunks`, reads them into blocks
/// `chunks..2·chunks` in reverse order, and checks every byte.
fn round_trip(store: &KvStore, kv: &Kv, chunks: u32, seed: u64) {
    let g = *store.geometry();
    let (hashes, rep) = store_seeded(store, kv, chunks, seed);
    let src: Vec<u32> = (0..chunks).collect();
    assert_eq!((rep.stored, rep.present, rep.failed.len()), (chunks, 0, 0), "{rep:?}");
    kv.clear();
    let hit = store.lookup(&hashes).expect("lookup");
    assert_eq!(hit.hits(), chunks as usize);
    let dst: Vec<u32> = (chunks..2 * chunks).rev().collect();
    // Layer by layer, as an engine would before each layer's attention.
    let job = store.submit_load(&hit.files, &dst, 0..g.layers).expect("load");
    for layer in 0..g.layers {
        let st = store.wait_layer(job, layer, WAIT).expect("wait layer");
        assert!(st.layer_is_done(layer));
        for (i, &b) in dst.iter().enumerate() {
            for kvi in 0..2 {
                assert!(
                    kv.layer_holds(b, layer, kvi, seed + i as u64),
                    "chunk {i} layer {layer} kv {kvi} in block {b}"
                );
            }
        }
    }
    let st = store.release(job).expect("release");
    assert!(st.done && st.failed == 0, "{st:?}");
    assert!(dst.iter().enumerate().all(|(i, &b)| kv.holds(b, seed + i as u64)));
    for &b in &src {
        assert!(!kv.holds(b, seed + b as u64), "source blocks were cleared and not written by the load");
    }
    store.unpin(hit.pin).expect("unpin");
    // A second store of the same chunks finds them present.
    let again = store.store_request(&hashes, &src, WAIT).expect("store again");
    assert_eq!((again.stored, again.present), (0, chunks));
}

#[derive(Clone, Copy, Debug)]
enum Path {
    /// gio_uring, layer IOCBs where the drives allow them.
    Gio,
    /// gio_uring with the host filling every IOCTX.
    Explicit,
    /// The CPU-driven baseline.
    Direct,
}

fn open_on(d: &Drives, g: Geometry, path: Path) -> KvStore {
    let mut o = match path {
        Path::Direct => direct_options(g, OpenMode::Create),
        _ => options(g, OpenMode::Create),
    };
    if let (Path::Explicit, Backend::Gio(c)) = (path, &mut o.backend) {
        c.force_explicit = true;
    }
    KvStore::open(d.specs(), o).expect("store opens")
}

#[test]
fn one_to_four_drives_both_layouts_both_lba_sizes() {
    let g = geometry(3, 128); // 8 KiB objects
    for drives in 1..=4usize {
        for lba in [512u32, 4096] {
            for kind in [LayoutKind::VllmPerLayer, LayoutKind::Contiguous] {
                for path in [Path::Gio, Path::Explicit, Path::Direct] {
                    let d = Drives::uniform(drives, lba, 8 << 20);
                    let store = open_on(&d, g, path);
                    let kv = Kv::new(g, kind, 12);
                    kv.register(&store, "model");
                    let mode = store.info().io_mode;
                    match path {
                        // Identical drives see the memory at identical IOVAs: one table, layer IOCBs.
                        Path::Gio => assert!(mode.contains("layer IOCBs"), "{mode}"),
                        Path::Explicit => assert!(mode.contains("explicit IOCBs"), "{mode}"),
                        Path::Direct => assert!(mode.contains("CPU-driven"), "{mode}"),
                    }
                    round_trip(&store, &kv, 6, drives as u64 * 100 + lba as u64);
                    let st = store.stats();
                    let ctx = format!("{drives} drives, {lba}, {kind:?}, {path:?}");
                    assert_eq!(st.bytes_stored, 6 * g.file_bytes(), "{ctx}");
                    assert_eq!(st.bytes_loaded, 6 * g.file_bytes(), "{ctx}");
                    // 6 chunks × 3 layers × K,V, each way, one command each.
                    assert_eq!(st.commands, 2 * 6 * 3 * 2, "{ctx}");
                    // Per layer: one call on the layer path; per command on the others.
                    match path {
                        Path::Gio => assert_eq!((st.host_calls, st.host_built), (2 * 3, 0), "{ctx}"),
                        Path::Explicit => assert_eq!(st.host_built, st.commands, "{ctx}"),
                        Path::Direct => assert!(st.host_calls >= st.commands, "{ctx}"),
                    }
                    // Every drive took part: objects of one layer spread over all of them.
                    for e in &d.emus {
                        assert!(e.stats().bytes_written >= 6 * g.file_bytes() / drives as u64 / 2, "{ctx}");
                    }
                }
            }
        }
    }
}

#[test]
fn objects_split_at_mdts_and_mixed_lba_sizes() {
    // 32 KiB objects; drive 1's 8 KiB transfer limit splits each into 4 commands.
    let g = geometry(2, 512);
    let cfgs = [
        DriveCfg { mdts: 3, ..DriveCfg::ram(512, 16 << 20) },
        DriveCfg { mdts: 1, ..DriveCfg::ram(4096, 16 << 20) },
        DriveCfg { mdts: 0, ..DriveCfg::ram(512, 16 << 20) },
    ];
    let d = Drives::start(&cfgs);
    let store = open(&d, g, OpenMode::Create);
    assert_eq!((store.stripe_map().chunk_bytes(), store.stripe_map().chunks()), (8 << 10, 4));
    let kv = Kv::new(g, LayoutKind::Contiguous, 10);
    kv.register(&store, "model");
    // These controllers map the KV memory at different IOVAs, so each drive needs
    // its own descriptors: the host fills explicit IOCBs.
    let mode = store.info().io_mode;
    assert!(mode.contains("explicit IOCBs") && mode.contains("IOMMU views"), "{mode}");
    round_trip(&store, &kv, 5, 7);
    assert_eq!(store.stats().commands, 2 * 5 * 2 * 2 * 4, "5 chunks × 2 layers × K,V × 4 commands, each way");
}

#[test]
fn mixed_lba_sizes_take_the_executor_path() {
    // 32 KiB objects on 512-, 4096- and 512-byte drives that see the KV memory at
    // the same IOVAs: one layer table, objects placed in each drive's own LBAs.
    let g = geometry(2, 512);
    let cfgs = [DriveCfg::ram(512, 16 << 20), DriveCfg::ram(4096, 16 << 20), DriveCfg::ram(512, 16 << 20)];
    let d = Drives::start(&cfgs);
    let store = open(&d, g, OpenMode::Create);
    let kv = Kv::new(g, LayoutKind::VllmPerLayer, 12);
    kv.register(&store, "model");
    let mode = store.info().io_mode;
    assert!(mode.contains("layer IOCBs"), "{mode}");
    round_trip(&store, &kv, 6, 11);
    let st = store.stats();
    assert_eq!(st.host_built, 0, "the executor built every command: {mode}");
    assert_eq!(st.commands, 2 * 6 * 2 * 2 * store.stripe_map().chunks() as u64);
    // The 4096-byte drive took its share of every layer.
    assert!(d.emus[1].stats().bytes_written >= 6 * g.file_bytes() / 3 / 2);
}

#[test]
fn file_media_round_trip() {
    let dir = std::env::temp_dir().join(format!("tutti-objstore-rt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfgs: Vec<DriveCfg> = (0..2)
        .map(|i| DriveCfg {
            media: MediaConfig::File(dir.join(format!("d{i}.img"))),
            ..DriveCfg::ram(4096, 8 << 20)
        })
        .collect();
    let g = geometry(2, 128);
    {
        let d = Drives::start(&cfgs);
        let store = open(&d, g, OpenMode::Create);
        let kv = Kv::new(g, LayoutKind::VllmPerLayer, 8);
        kv.register(&store, "model");
        round_trip(&store, &kv, 4, 3);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn partial_prefix_hits_and_unstored_tails_miss() {
    let g = geometry(2, 128);
    let d = Drives::uniform(2, 512, 8 << 20);
    let store = open(&d, g, OpenMode::Create);
    let kv = Kv::new(g, LayoutKind::Contiguous, 8);
    kv.register(&store, "model");
    let t = tokens(5, 4, g.tokens_per_block);
    let hashes = chain_hashes(&t, g.tokens_per_block);
    for b in 0..2 {
        kv.fill(b, 50 + b as u64);
    }
    store.store_request(&hashes[..2], &[0, 1], WAIT).unwrap();
    let hit = store.lookup(&hashes).unwrap();
    assert_eq!(hit.hits(), 2, "the first two chunks of four");
    store.unpin(hit.pin).unwrap();
    // A request that shares only chunk 0 (chunk 1 differs) hits one block.
    let mut t2 = t.clone();
    t2[g.tokens_per_block as usize + 3] ^= 1;
    let h2 = chain_hashes(&t2, g.tokens_per_block);
    assert_eq!(store.contains(&h2).unwrap(), 1);
    assert_eq!(store.contains(&[BlockHash(12345)]).unwrap(), 0);
}

#[test]
fn drives_without_sgl_use_the_direct_path() {
    let g = geometry(2, 128);
    let cfgs =
        [DriveCfg { sgl: SglSupport::None, ..DriveCfg::ram(512, 8 << 20) }, DriveCfg::ram(512, 8 << 20)];
    let d = Drives::start(&cfgs);
    let kv = Kv::new(g, LayoutKind::Contiguous, 8);
    {
        let store = open(&d, g, OpenMode::Create);
        let e = store.register_host(kv.mem.clone(), kv.layout.clone(), "m", b"").unwrap_err().to_string();
        assert!(e.contains("SGL") && e.contains("direct"), "{e}");
    }
    // The CPU path describes the same chunks with PRP entries the driver builds.
    let store = KvStore::open(d.specs(), direct_options(g, OpenMode::Create)).unwrap();
    kv.register(&store, "m");
    round_trip(&store, &kv, 4, 11);
}
