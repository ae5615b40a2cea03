//! The P2P data path on emulated controllers: KV memory marked as device
//! memory (the emulated IOMMU keeps it apart from host memory and counts
//! what the controller moved into and out of it) is mapped with
//! `DmaSpace::map_device`, probed at registration, and then moved by
//! commands issued straight at its IOVAs, with no staging slot. A platform
//! that faults or silently drops the peer DMA (as QEMU's NVMe model does when
//! its IOMMU blocks it) fails the probe, which names what it saw, and the KV
//! memory moves through staging instead, every byte checked. The emulated
//! IOMMU stands in for PCIe routing, which no machine here has; the real
//! kernel's path runs in the QEMU harness (tests/tests/qemu_vfio.rs).

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::sync::Arc;
use tutti_emulator::DeviceReach;
use tutti_objstore::{
    CpuMapped, DeviceKvMemory, Geometry, KvMemoryKind, KvStore, LayoutKind, OpenMode, P2pPolicy, StoreOptions,
};

fn device(kv: &Kv, policy: P2pPolicy) -> DeviceKvMemory {
    DeviceKvMemory {
        provider: "emulated device memory".into(),
        policy,
        access: Arc::new(CpuMapped { base: kv.mem.addr(), len: kv.mem.len() as u64 }),
        unreachable: false,
    }
}

fn register(store: &KvStore, kv: &Kv, policy: P2pPolicy) -> tutti_objstore::Result<()> {
    // SAFETY: `kv` outlives the store in every test (declared before it).
    unsafe { store.register_device(kv.layout.clone(), "model", b"", device(kv, policy)) }.map(|_| ())
}

/// Stores blocks 0..n, clears the memory, loads them into n..2n and checks every byte.
fn round_trip(store: &KvStore, kv: &Kv, n: u32, seed: u64) {
    let (hashes, rep) = store_seeded(store, kv, n, seed);
    assert_eq!((rep.stored, rep.failed.len()), (n, 0), "{rep:?}");
    kv.clear();
    let hit = store.lookup(&hashes).expect("lookup");
    assert_eq!(hit.hits(), n as usize);
    let dst: Vec<u32> = (n..2 * n).collect();
    store.load_request(&hit.files, &dst, WAIT).expect("load");
    for (i, &b) in dst.iter().enumerate() {
        assert!(kv.holds(b, seed + i as u64), "block {b}: every byte");
    }
    store.unpin(hit.pin).expect("unpin");
}

fn device_bytes(d: &Drives) -> (u64, u64) {
    d.emus.iter().map(|e| e.iommu().device_counts()).fold((0, 0), |a, c| (a.0 + c.written, a.1 + c.read))
}

fn backends(g: Geometry) -> [(&'static str, StoreOptions); 2] {
    [("gio", options(g, OpenMode::Create)), ("direct", direct_options(g, OpenMode::Create))]
}

#[test]
fn device_memory_moves_peer_to_peer_with_no_staging() {
    let g = geometry(2, 512);
    for (name, opts) in backends(g) {
        let kv = Kv::new(g, LayoutKind::Contiguous, 8);
        let d = Drives::uniform(2, 512, 16 << 20);
        let store = KvStore::open(d.specs(), opts).unwrap();
        register(&store, &kv, P2pPolicy::Auto).unwrap();
        let path = store.info().data_path.expect("data path");
        assert_eq!(
            (path.mode, path.memory, path.p2p_missing.as_deref(), path.provider.as_deref(), path.staging),
            ("p2p", KvMemoryKind::DeviceP2p, None, Some("emulated device memory"), None),
            "{name}"
        );
        let (w0, r0) = device_bytes(&d);
        assert!(w0 >= 512 && r0 >= 512, "{name}: the probe moved bytes both ways: {w0} {r0}");
        round_trip(&store, &kv, 4, 11);
        let (w, r) = device_bytes(&d);
        let moved = 4 * g.file_bytes();
        assert_eq!((w - w0, r - r0), (moved, moved), "{name}: every KV byte went to and from device memory");
        if name == "gio" {
            let st = store.stats();
            assert_eq!(st.host_built, 0, "the executor issued the commands");
        }
    }
}

#[test]
fn a_silently_dropped_probe_falls_back_to_staging_with_the_reason() {
    let g = geometry(2, 512);
    let kv = Kv::new(g, LayoutKind::Contiguous, 8);
    let d = Drives::uniform(2, 512, 16 << 20);
    // Only the second drive's platform drops the peer DMA: the probe checks every drive.
    d.emus[1].iommu().set_device_reach(DeviceReach::SilentDrop);
    let store = KvStore::open(d.specs(), options(g, OpenMode::Create)).unwrap();
    register(&store, &kv, P2pPolicy::Auto).unwrap();
    let path = store.info().data_path.unwrap();
    assert_eq!((path.mode, path.memory), ("staged", KvMemoryKind::DeviceP2p));
    let why = path.p2p_missing.unwrap();
    assert!(why.contains("P2P probe of emulated device memory on emu1"), "{why}");
    assert!(
        why.contains("completed with success status") && why.contains("512 of 512 bytes differ"),
        "{why}"
    );
    let before = device_bytes(&d);
    round_trip(&store, &kv, 4, 21);
    assert_eq!(device_bytes(&d), before, "staged: the drives never touched device memory");
    let staging = store.info().data_path.unwrap().staging.expect("staging counters");
    assert_eq!(staging.staged_bytes, 2 * 4 * g.file_bytes());
    drop(store);
    // The probe left the pool's LBA 0 as it was: the pool reopens.
    let store = KvStore::open(d.specs(), options(g, OpenMode::OpenOrCreate)).unwrap();
    assert!(!store.info().formatted_now, "reopened, not reformatted");
}

#[test]
fn a_faulting_probe_falls_back_and_the_direct_backend_refuses_staging() {
    let g = geometry(2, 512);
    let kv = Kv::new(g, LayoutKind::Contiguous, 8);
    let d = Drives::uniform(1, 512, 16 << 20);
    d.emus[0].iommu().set_device_reach(DeviceReach::Fault);
    let store = KvStore::open(d.specs(), options(g, OpenMode::Create)).unwrap();
    register(&store, &kv, P2pPolicy::Auto).unwrap();
    let why = store.info().data_path.unwrap().p2p_missing.unwrap();
    assert!(why.contains("the drive's Read into the target failed"), "{why}");
    round_trip(&store, &kv, 3, 31);
    // A target whose IOMMU entries were revoked after mapping (a range the IOMMU never mapped).
    d.emus[0].iommu().set_device_reach(DeviceReach::Reachable);
    let unreachable = DeviceKvMemory { unreachable: true, ..device(&kv, P2pPolicy::Auto) };
    // SAFETY: as in `register`.
    unsafe { store.register_device(kv.layout.clone(), "model", b"", unreachable) }.unwrap();
    let path = store.info().data_path.unwrap();
    assert_eq!(path.mode, "staged");
    assert!(path.p2p_missing.unwrap().contains("the drive's Read into the target failed"));
    round_trip(&store, &kv, 3, 35);
    drop(store);
    d.emus[0].iommu().set_device_reach(DeviceReach::Fault);
    let direct = KvStore::open(d.specs(), direct_options(g, OpenMode::OpenOrCreate)).unwrap();
    let e = register(&direct, &kv, P2pPolicy::Auto).unwrap_err().to_string();
    assert!(e.contains("staged data path") && e.contains("P2P probe"), "{e}");
}

#[test]
fn the_setting_requires_or_forbids_p2p() {
    let g = geometry(2, 512);
    let kv = Kv::new(g, LayoutKind::Contiguous, 8);
    let d = Drives::uniform(1, 512, 16 << 20);
    let store = KvStore::open(d.specs(), options(g, OpenMode::Create)).unwrap();
    register(&store, &kv, P2pPolicy::Off).unwrap();
    let path = store.info().data_path.unwrap();
    assert_eq!(path.mode, "staged");
    assert!(path.p2p_missing.unwrap().contains("P2P is off"));
    assert_eq!(device_bytes(&d), (0, 0), "off: not even a probe");
    round_trip(&store, &kv, 2, 41);
    d.emus[0].iommu().set_device_reach(DeviceReach::SilentDrop);
    let e = register(&store, &kv, P2pPolicy::Require).unwrap_err().to_string();
    assert!(e.contains("requires P2P") && e.contains("bytes differ"), "{e}");
    d.emus[0].iommu().set_device_reach(DeviceReach::Reachable);
    register(&store, &kv, P2pPolicy::Require).unwrap();
    assert_eq!(store.info().data_path.unwrap().mode, "p2p");
    round_trip(&store, &kv, 2, 51);
    assert_eq!(P2pPolicy::parse("on").unwrap(), P2pPolicy::Require);
    assert!(P2pPolicy::parse("sometimes").unwrap_err().to_string().contains("auto, require or off"));
}
