//! Controllers with few I/O queue pairs or several namespaces: the pool's
//! metadata and its data path share what the controller grants.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use tutti_driver::controller::Controller;
use tutti_emulator::{EmulatedConfig, EmulatedController, NamespaceConfig};
use tutti_objstore::{chain_hashes, DriveSpec, KvStore, LayoutKind, OpenMode, StoreOptions};

fn controller(name: &str, pairs: u16, namespaces: usize) -> EmulatedController {
    EmulatedController::start(EmulatedConfig {
        name: name.into(),
        serial: format!("SN-{name}"),
        namespaces: vec![NamespaceConfig::with_bytes(8 << 20, 512); namespaces],
        max_io_queue_pairs: pairs,
        ..EmulatedConfig::default()
    })
    .expect("emulated controller starts")
}

/// Every namespace of `emu` as a pool drive.
fn all_namespaces(emu: &EmulatedController) -> Vec<DriveSpec> {
    let ctrl = Controller::new(emu.registers(), emu.dma_space(), Default::default()).expect("bring-up");
    ctrl.info().namespaces.iter().map(|n| DriveSpec::new(ctrl.clone(), n.nsid)).collect()
}

/// Stores four chunks, reads them back into other blocks, checks every byte,
/// then reopens the pool (journal replay through the same pair) and finds them.
fn store_load_reopen(emu: &EmulatedController, opts: impl Fn(OpenMode) -> StoreOptions) -> String {
    let g = geometry(2, 128);
    let hashes = chain_hashes(&tokens(9, 4, g.tokens_per_block), g.tokens_per_block);
    let mode;
    {
        let store = KvStore::open(all_namespaces(emu), opts(OpenMode::Create)).expect("store opens");
        let kv = Kv::new(g, LayoutKind::Contiguous, 8);
        kv.register(&store, "model");
        mode = store.info().io_mode;
        for b in 0..4 {
            kv.fill(b, 70 + b as u64);
        }
        let rep = store.store_request(&hashes, &[0, 1, 2, 3], WAIT).expect("store");
        assert_eq!((rep.stored, rep.failed.len()), (4, 0), "{rep:?}");
        kv.clear();
        let hit = store.lookup(&hashes).expect("lookup");
        assert_eq!(hit.hits(), 4);
        let st = store.load_request(&hit.files, &[4, 5, 6, 7], WAIT).expect("load");
        assert!(st.done && st.failed == 0, "{st:?}");
        for b in 0..4u32 {
            assert!(kv.holds(4 + b, 70 + b as u64), "block {b} came back");
        }
        store.unpin(hit.pin).expect("unpin");
    }
    let store = KvStore::open(all_namespaces(emu), opts(OpenMode::Open)).expect("store reopens");
    Kv::new(g, LayoutKind::Contiguous, 8).register(&store, "model");
    assert_eq!(store.contains(&hashes).expect("contains"), 4, "the journal was written and replayed");
    mode
}

#[test]
fn a_controller_granting_one_pair_serves_both_backends() {
    for gio in [true, false] {
        let emu = controller(if gio { "one-gio" } else { "one-direct" }, 1, 1);
        let g = geometry(2, 128);
        let mode = store_load_reopen(&emu, |m| if gio { options(g, m) } else { direct_options(g, m) });
        // gio_uring's executor needs a pair of its own; with none left the host drives the shared one.
        assert!(mode.contains("CPU-driven") && mode.contains("1 queue pairs"), "{mode}");
        assert!(emu.stats().bytes_written > 0);
    }
}

#[test]
fn every_namespace_of_a_controller_is_a_pool_drive() {
    for (pairs, gio) in [(1, true), (1, false), (3, true), (16, true), (2, false)] {
        let emu = controller(&format!("two-ns-{pairs}"), pairs, 2);
        let g = geometry(2, 128);
        let mode = store_load_reopen(&emu, |m| if gio { options(g, m) } else { direct_options(g, m) });
        let ctx = format!("{pairs} pairs, gio {gio}: {mode}");
        if gio && pairs >= 3 {
            assert!(mode.contains("IOCBs"), "{ctx}");
        } else {
            assert!(mode.contains("CPU-driven"), "{ctx}");
        }
    }
}

#[test]
fn a_pool_refuses_a_namespace_with_metadata_at_open() {
    let emu = EmulatedController::start(EmulatedConfig {
        name: "meta-ns".into(),
        namespaces: vec![NamespaceConfig { metadata_size: 8, ..NamespaceConfig::with_bytes(8 << 20, 512) }],
        ..EmulatedConfig::default()
    })
    .expect("emulated controller starts");
    for gio in [true, false] {
        let g = geometry(2, 128);
        let opts = if gio { options(g, OpenMode::Create) } else { direct_options(g, OpenMode::Create) };
        let e = KvStore::open(all_namespaces(&emu), opts).err().expect("refused");
        let msg = e.to_string();
        assert!(
            msg.contains("meta-ns namespace 1") && msg.contains("8 B metadata") && msg.contains("reformat"),
            "{msg}"
        );
    }
    assert_eq!(emu.stats().bytes_written, 0, "nothing was written to it");
}

#[test]
fn the_first_usable_namespace_is_taken_past_one_with_metadata() {
    let emu = EmulatedController::start(EmulatedConfig {
        name: "first-usable".into(),
        namespaces: vec![
            NamespaceConfig { metadata_size: 8, ..NamespaceConfig::with_bytes(8 << 20, 512) },
            NamespaceConfig::with_bytes(8 << 20, 512),
        ],
        ..EmulatedConfig::default()
    })
    .expect("emulated controller starts");
    let ctrl = Controller::new(emu.registers(), emu.dma_space(), Default::default()).expect("bring-up");
    assert_eq!(DriveSpec::first_namespace(ctrl).expect("namespace 2").nsid, 2);
}
