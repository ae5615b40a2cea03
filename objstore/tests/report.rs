//! The data-path report a client of tuttid sends with its end-loads and settles: bytes per
//! drive as the stripe map places them (failed blocks left out), layers, latencies and the
//! queue pairs' commands and errors.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use tutti_driver::spec::Status;
use tutti_emulator::FaultMatch;
use tutti_objstore::{chain_hashes, LayoutKind, OpenMode};

const READ: u8 = 0x02;

#[test]
fn the_report_counts_each_drives_bytes_layers_latencies_and_failures() {
    let g = geometry(4, 128);
    let d = Drives::uniform(3, 512, 8 << 20);
    let store = open(&d, g, OpenMode::Create);
    let kv = Kv::new(g, LayoutKind::Contiguous, 12);
    kv.register(&store, "m");
    let hashes = chain_hashes(&tokens(5, 6, g.tokens_per_block), g.tokens_per_block);
    let blocks: Vec<u32> = (0..6).collect();
    for &b in &blocks {
        kv.fill(b, 700 + b as u64);
    }
    assert_eq!(store.store_request(&hashes, &blocks, WAIT).unwrap().stored, 6);
    let files = store.lookup(&hashes).unwrap().files;
    let map = store.stripe_map().clone();
    let obj = g.object_bytes();
    // Where the stripe map puts each object, less the (file, layer) pairs left out.
    let per_drive = |skip: Option<(u32, u32)>| {
        let mut bytes = vec![0u64; 3];
        for &f in &files {
            for layer in 0..g.layers {
                if skip == Some((f, layer)) {
                    continue;
                }
                for j in [2 * layer, 2 * layer + 1] {
                    bytes[map.drive_of(f, j) as usize] += obj;
                }
            }
        }
        bytes
    };
    let r = store.data_report();
    assert_eq!(r.bytes_stored, 6 * 4 * 2 * obj);
    assert_eq!(r.drives.iter().map(|d| d.bytes_stored).collect::<Vec<_>>(), per_drive(None));
    assert_eq!(r.store_latency.count(), r.layers_stored);
    assert!(r.layers_stored >= 4 && r.store_latency.sum_ns > 0, "{r:?}");
    assert_eq!((r.bytes_loaded, r.layers_loaded, r.load_latency.count()), (0, 0, 0));

    // A load with one failed read: chunk 4's V object of layer 2.
    let at = map.locate(files[4], 5);
    d.emus[at.drive as usize].faults().fail_next(
        FaultMatch { opcode: Some(READ), lba: Some(at.lba..at.lba + 1), ..Default::default() },
        Status::UNRECOVERED_READ_ERROR,
    );
    let dst: Vec<u32> = (6..12).collect();
    let st = store.load_request(&files, &dst, WAIT).unwrap();
    assert_eq!(st.failed, 1, "{st:?}");
    let r = store.data_report();
    // The failed block's layer counts neither its K nor its V: the block failed in that layer.
    assert_eq!(r.bytes_loaded, (6 * 4 - 1) * 2 * obj);
    assert_eq!(r.drives.iter().map(|d| d.bytes_loaded).collect::<Vec<_>>(), per_drive(Some((files[4], 2))));
    assert_eq!((r.layers_loaded, r.load_latency.count()), (4, 4), "one job of 4 layers");
    assert_eq!(r.failed_blocks, 1);
    let errors: Vec<u64> = r.drives.iter().map(|d| d.status_errors).collect();
    assert_eq!(errors.iter().sum::<u64>(), 1, "{errors:?}");
    assert_eq!(errors[at.drive as usize], 1, "the error is the failing drive's: {errors:?}");
    assert_eq!(r.drives.iter().map(|d| d.commands).sum::<u64>(), r.commands, "{r:?}");
    assert_eq!(r.drives.iter().map(|d| d.timeouts).sum::<u64>(), 0);
    // Counts only grow: a later report is never below an earlier one.
    let later = store.data_report();
    assert!(later.not_below(&r));
}
