//! submit_layer: the executor expands (file, block) pairs through a layer
//! table into commands, striping each file's objects across the pool.
//!
//! The pool is three namespaces of one emulated controller: a table entry is
//! one IOVA for whichever drive the file puts an object on, so all pool drives
//! must share one DMA address space (as devices in one VFIO container do).

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::time::Duration;
use tutti_driver::command::DataMode;
use tutti_driver::transport::{DmaBuffer, IovaSegment};
use tutti_gio_uring::{
    GioError, GioOptions, IoStatus, Kv, LayerGeometry, LayerTable, Op, PairListId, PoolDrive, TableKind,
    Translation,
};

const OBJ: usize = 4096;
const LAYERS: u32 = 2;
const FILES: u32 = 600;

fn geometry() -> LayerGeometry {
    // Two commands per object.
    geometry_with([512; 3], 2048)
}

fn geometry_with(lba_sizes: [u32; 3], max_transfer: u64) -> LayerGeometry {
    LayerGeometry {
        layers: LAYERS,
        files: FILES,
        blocks: FILES,
        object_bytes: OBJ as u64,
        max_transfer,
        drives: (0..3)
            .map(|d| PoolDrive {
                drive: d,
                data_start_lba: 2048 + 8 * d as u64,
                lba_size: lba_sizes[d as usize],
            })
            .collect(),
    }
}

fn object_offset(block: u32, layer: u32, kv: Kv) -> usize {
    (((block * LAYERS + layer) * 2) as usize + kv as usize) * OBJ
}

fn table(kv_mem: &DmaBuffer, kind: TableKind) -> LayerTable {
    table_for(geometry(), kv_mem, kind)
}

fn table_for(g: LayerGeometry, kv_mem: &DmaBuffer, kind: TableKind) -> LayerTable {
    let mut t = LayerTable::new(g, kind).unwrap();
    for b in 0..FILES {
        for l in 0..LAYERS {
            for kv in [Kv::K, Kv::V] {
                let seg = [IovaSegment { iova: kv_mem.iova_at(object_offset(b, l, kv)), len: OBJ as u64 }];
                t.set_object(b, l, kv, &seg, 4096).unwrap();
            }
        }
    }
    t
}

fn run_layers(rig: &Rig, table: tutti_gio_uring::TableId, pairs: &[(u32, u32)], op: Op) {
    for layer in 0..LAYERS {
        let ids = rig.ring.submit_layer(table, layer, pairs, op, 3).unwrap();
        assert_eq!(ids.len(), pairs.len().div_ceil(512), "IOCBs of 512 pairs x 4 commands");
        for r in rig.ring.wait_cqe(&ids, Duration::from_secs(60)).unwrap() {
            assert!(
                r.is_ok(),
                "{op:?} layer {layer}: {:?}",
                r.failures.iter().take(3).map(|f| f.to_string()).collect::<Vec<_>>()
            );
            assert_eq!(r.completed, r.count);
        }
    }
}

#[test]
fn layers_are_striped_by_the_formula_and_read_back_into_other_blocks() {
    let rig =
        rig(RigSpec { controllers: 1, namespaces: 3, ns_bytes: 16 << 20, depth: 64, ..Default::default() });
    let ctrl = rig.ctrls[0].clone();
    let kv_len = FILES as usize * LAYERS as usize * 2 * OBJ;
    let kv = ctrl.dma().alloc(kv_len).unwrap();
    fill(&kv, 77);
    let original = bytes(&kv);
    let sgl = rig.ring.register_table(&table(&kv, TableKind::Sgl)).unwrap();
    let info = rig.ring.table_info(sgl).unwrap();
    assert_eq!((info.chunks, info.ioctx_per_pair), (2, 4));

    // Store: block i is file i.
    let store: Vec<(u32, u32)> = (0..FILES).map(|i| (i, i)).collect();
    run_layers(&rig, sgl, &store, Op::Write);

    // Every object is on drive (f + j) mod 3 at data_start + (f * S + j / 3) * object_lbas.
    let g = geometry();
    let mut qp = ctrl.create_io_queue_pair(16).unwrap();
    let probe = ctrl.dma().alloc(OBJ).unwrap();
    for f in (0..FILES).step_by(37) {
        for l in 0..LAYERS {
            for kvh in [Kv::K, Kv::V] {
                let drive = g.drive_of(f, l, kvh);
                assert_eq!(drive, (f + 2 * l + kvh as u32) % 3);
                qp.read_buf(drive + 1, g.lba_of(f, l, kvh), &probe, 0, OBJ, DataMode::Auto).unwrap();
                let at = object_offset(f, l, kvh);
                assert_eq!(
                    first_diff(&bytes(&probe), &original[at..at + OBJ]),
                    None,
                    "file {f} layer {l} {kvh:?}"
                );
            }
        }
    }
    drop(qp);

    // Retrieve into other blocks through a PRP table: file f goes to block (f + 7) % FILES.
    kv.copy_in(0, &vec![0u8; kv_len]).unwrap();
    let prp = rig.ring.register_table(&table(&kv, TableKind::Prp)).unwrap();
    let retrieve: Vec<(u32, u32)> = (0..FILES).map(|f| (f, (f + 7) % FILES)).collect();
    run_layers(&rig, prp, &retrieve, Op::Read);
    let now = bytes(&kv);
    for f in 0..FILES {
        for l in 0..LAYERS {
            for kvh in [Kv::K, Kv::V] {
                let (src, dst) = (object_offset(f, l, kvh), object_offset((f + 7) % FILES, l, kvh));
                assert_eq!(
                    first_diff(&original[src..src + OBJ], &now[dst..dst + OBJ]),
                    None,
                    "file {f} layer {l} {kvh:?}"
                );
            }
        }
    }
    assert_eq!(rig.emus[0].stats().errors, 0);
    rig.ring.unregister_table(prp).unwrap();
    assert!(rig.ring.submit_layer(prp, 0, &retrieve, Op::Read, 1).is_err());
}

/// Drives of one pool with different LBA sizes: the executor places each object
/// in its drive's own LBAs (the table keeps sizes in 512-byte units), so layer
/// IOCBs serve a mixed pool instead of the host building every command.
#[test]
fn a_pool_with_mixed_lba_sizes_is_placed_in_each_drive_units() {
    let rig = rig(RigSpec {
        controllers: 1,
        namespaces: 3,
        ns_bytes: 16 << 20,
        ns_lba_sizes: vec![512, 4096, 512],
        depth: 64,
        ..Default::default()
    });
    let ctrl = rig.ctrls[0].clone();
    let kv_len = FILES as usize * LAYERS as usize * 2 * OBJ;
    let kv = ctrl.dma().alloc(kv_len).unwrap();
    fill(&kv, 91);
    let original = bytes(&kv);
    let g = geometry_with([512, 4096, 512], 4096);
    assert_eq!((g.object_lbas(0), g.object_lbas(1)), (8, 1));
    // A table that claims drive 1 has 512-byte LBAs is refused against the drive.
    let wrong = table_for(geometry_with([512; 3], 4096), &kv, TableKind::Sgl);
    let err = rig.ring.register_table(&wrong).unwrap_err().to_string();
    assert!(err.contains("LBA size 4096"), "{err}");
    let t = rig.ring.register_table(&table_for(g.clone(), &kv, TableKind::Sgl)).unwrap();
    let store: Vec<(u32, u32)> = (0..FILES).map(|i| (i, i)).collect();
    for layer in 0..LAYERS {
        let ids = rig.ring.submit_layer(t, layer, &store, Op::Write, 3).unwrap();
        for r in rig.ring.wait_cqe(&ids, Duration::from_secs(60)).unwrap() {
            assert!(r.is_ok(), "write layer {layer}: {:?}", r.failures.first().map(|f| f.to_string()));
        }
    }
    // Read objects back with the driver at the LBA the formula gives in each drive's units.
    let mut qp = ctrl.create_io_queue_pair(16).unwrap();
    let probe = ctrl.dma().alloc(OBJ).unwrap();
    let mut on_4k = 0;
    for f in (0..FILES).step_by(29) {
        for l in 0..LAYERS {
            for kvh in [Kv::K, Kv::V] {
                let drive = g.drive_of(f, l, kvh);
                on_4k += u32::from(drive == 1);
                qp.read_buf(drive + 1, g.lba_of(f, l, kvh), &probe, 0, OBJ, DataMode::Auto).unwrap();
                let at = object_offset(f, l, kvh);
                assert_eq!(
                    first_diff(&bytes(&probe), &original[at..at + OBJ]),
                    None,
                    "file {f} layer {l} {kvh:?}"
                );
            }
        }
    }
    assert!(on_4k > 0, "some objects live on the 4096-byte drive");
    drop(qp);
    // And through the executor into other blocks.
    kv.copy_in(0, &vec![0u8; kv_len]).unwrap();
    let retrieve: Vec<(u32, u32)> = (0..FILES).map(|f| (f, (f + 11) % FILES)).collect();
    for layer in 0..LAYERS {
        let ids = rig.ring.submit_layer(t, layer, &retrieve, Op::Read, 3).unwrap();
        for r in rig.ring.wait_cqe(&ids, Duration::from_secs(60)).unwrap() {
            assert!(r.is_ok(), "read layer {layer}: {:?}", r.failures.first().map(|f| f.to_string()));
        }
    }
    let now = bytes(&kv);
    for f in 0..FILES {
        for l in 0..LAYERS {
            for kvh in [Kv::K, Kv::V] {
                let (src, dst) = (object_offset(f, l, kvh), object_offset((f + 11) % FILES, l, kvh));
                assert_eq!(
                    first_diff(&original[src..src + OBJ], &now[dst..dst + OBJ]),
                    None,
                    "file {f} layer {l}"
                );
            }
        }
    }
    assert_eq!(rig.emus[0].stats().errors, 0);
}

#[test]
fn pairs_outside_the_table_fail_per_ioctx() {
    let rig =
        rig(RigSpec { controllers: 1, namespaces: 3, ns_bytes: 16 << 20, depth: 32, ..Default::default() });
    let kv = rig.ctrls[0].dma().alloc(FILES as usize * LAYERS as usize * 2 * OBJ).unwrap();
    let t = rig.ring.register_table(&table(&kv, TableKind::Sgl)).unwrap();
    let pairs = [(0, 0), (FILES, 1), (2, FILES + 5), (3, 3)];
    let ids = rig.ring.submit_layer(t, 1, &pairs, Op::Write, 2).unwrap();
    let r = rig.ring.wait_cqe(&ids, Duration::from_secs(30)).unwrap().remove(0);
    assert_eq!((r.count, r.completed, r.failed), (16, 16, 8));
    for f in &r.failures {
        let want = if f.index / 4 == 1 { Translation::File } else { Translation::Block };
        assert!((4..12).contains(&f.index), "IOCTX {} of a valid pair failed: {}", f.index, f.status);
        assert_eq!(f.status, IoStatus::Translation(want));
    }
    assert!(rig
        .ring
        .submit_layer(t, LAYERS, &pairs, Op::Read, 1)
        .unwrap_err()
        .to_string()
        .contains("layer 2"));
    // A table whose objects do not fit the namespaces is refused.
    let mut g = geometry();
    g.files = 100_000;
    g.blocks = 1;
    let big = LayerTable::new(g, TableKind::Sgl).unwrap();
    assert!(rig.ring.register_table(&big).unwrap_err().to_string().contains("namespace has"));
}

/// Every layer of `range` of `list`, waited for; returns the IOCBs each layer took.
fn run_layers_list(
    rig: &Rig,
    table: tutti_gio_uring::TableId,
    list: PairListId,
    range: std::ops::Range<u32>,
    op: Op,
) -> usize {
    let mut iocbs = 0;
    for layer in 0..LAYERS {
        let ids = rig.ring.submit_layer_list(table, layer, list, range.clone(), op, 3).unwrap();
        assert_eq!(ids.len(), range.len().div_ceil(512), "IOCBs of 512 pairs x 4 commands");
        iocbs = ids.len();
        for r in rig.ring.wait_cqe(&ids, Duration::from_secs(60)).unwrap() {
            assert!(r.is_ok(), "{op:?} layer {layer}: {:?}", r.failures.first().map(|f| f.to_string()));
        }
    }
    iocbs
}

#[test]
fn a_registered_pair_list_moves_the_same_bytes_as_inline_pairs() {
    let rig =
        rig(RigSpec { controllers: 1, namespaces: 3, ns_bytes: 16 << 20, depth: 64, ..Default::default() });
    let kv_len = FILES as usize * LAYERS as usize * 2 * OBJ;
    let kv = rig.ctrls[0].dma().alloc(kv_len).unwrap();
    fill(&kv, 91);
    let original = bytes(&kv);
    let t = rig.ring.register_table(&table(&kv, TableKind::Sgl)).unwrap();
    let store: Vec<(u32, u32)> = (0..FILES).map(|i| (i, i)).collect();
    run_layers(&rig, t, &store, Op::Write);

    // The same retrieve, inline and through a registered list, lands the same bytes.
    let retrieve: Vec<(u32, u32)> = (0..FILES).map(|f| (f, (f + 7) % FILES)).collect();
    kv.copy_in(0, &vec![0u8; kv_len]).unwrap();
    run_layers(&rig, t, &retrieve, Op::Read);
    let inline = bytes(&kv);
    kv.copy_in(0, &vec![0u8; kv_len]).unwrap();
    let list = rig.ring.register_pairs(&retrieve).unwrap();
    assert_eq!(rig.ring.pair_list_len(list).unwrap(), FILES);
    assert_eq!(run_layers_list(&rig, t, list, 0..FILES, Op::Read), 2);
    let listed = bytes(&kv);
    assert_eq!(first_diff(&inline, &listed), None, "list and inline retrieves differ");
    for f in 0..FILES {
        for l in 0..LAYERS {
            for kvh in [Kv::K, Kv::V] {
                let (src, dst) = (object_offset(f, l, kvh), object_offset((f + 7) % FILES, l, kvh));
                assert_eq!(first_diff(&original[src..src + OBJ], &listed[dst..dst + OBJ]), None, "file {f}");
            }
        }
    }

    // A sub-range starting mid-list: IOCB k starts at pair 37 + 512 k; pairs before 37 stay untouched.
    kv.copy_in(0, &vec![0u8; kv_len]).unwrap();
    assert_eq!(run_layers_list(&rig, t, list, 37..FILES, Op::Read), 2);
    let part = bytes(&kv);
    for f in 0..FILES {
        let dst = object_offset((f + 7) % FILES, 0, Kv::K);
        let want = if f >= 37 { &listed[dst..dst + OBJ] } else { &vec![0u8; OBJ][..] };
        assert_eq!(first_diff(want, &part[dst..dst + OBJ]), None, "file {f} (range 37..)");
    }
    assert_eq!(rig.emus[0].stats().errors, 0);
    assert_eq!(rig.ring.pair_lists_in_use().unwrap(), 1);
    rig.ring.unregister_pairs(list).unwrap();
    assert_eq!(rig.ring.pair_lists_in_use().unwrap(), 0);
}

#[test]
fn bad_pair_list_references_fail_per_ioctx_and_are_never_followed() {
    let rig =
        rig(RigSpec { controllers: 1, namespaces: 3, ns_bytes: 16 << 20, depth: 32, ..Default::default() });
    let kv = rig.ctrls[0].dma().alloc(FILES as usize * LAYERS as usize * 2 * OBJ).unwrap();
    let t = rig.ring.register_table(&table(&kv, TableKind::Sgl)).unwrap();
    let pairs: Vec<(u32, u32)> = (0..10).map(|i| (i, i)).collect();
    let list = rig.ring.register_pairs(&pairs).unwrap();
    let max = rig.ring.options().max_pair_lists;

    // Refused on the host: a range past the list, a stale handle, nothing to do.
    let e = rig.ring.submit_layer_list(t, 0, list, 5..11, Op::Read, 1).unwrap_err().to_string();
    assert!(e.contains("holds 10"), "{e}");
    let stale = PairListId::from_raw(list.to_raw() + (1 << 32));
    let e = rig.ring.submit_layer_list(t, 0, stale, 0..1, Op::Read, 1).unwrap_err().to_string();
    assert!(e.contains("not registered"), "{e}");
    assert!(rig.ring.submit_layer_list(t, 0, list, 3..3, Op::Read, 1).is_err());

    // Not checked on the host: the executor must refuse each reference by itself.
    let ids = rig.ring.get_iocb(4).unwrap();
    let cases = [
        (list.index() + 1, 0, 3, Some(Translation::PairList)), // a free slot
        (max + 1000, 0, 2, Some(Translation::PairList)),       // beyond the registry
        (list.index(), 8, 4, Some(Translation::PairRange)),    // 8 + 4 > 10
        (list.index(), 2, 3, None),                            // inside: moves data
    ];
    for (&id, &(slot, first, n, _)) in ids.iter().zip(&cases) {
        rig.ring.fill_layer_list(id, t, 1, slot, first, n, Op::Write).unwrap();
    }
    rig.ring.issue(&ids, 2).unwrap();
    let results = rig.ring.wait_cqe(&ids, Duration::from_secs(30)).unwrap();
    for (r, &(slot, first, n, want)) in results.iter().zip(&cases) {
        assert_eq!((r.count, r.completed), (n * 4, n * 4), "slot {slot} pairs {first}+{n}");
        match want {
            Some(why) => {
                assert_eq!(r.failed, r.count, "slot {slot} pairs {first}+{n}");
                assert!(
                    r.failures.iter().all(|f| f.status == IoStatus::Translation(why)),
                    "{:?}",
                    r.failures
                );
            }
            None => assert!(r.is_ok(), "{:?}", r.failures.first().map(|f| f.to_string())),
        }
    }
    assert_eq!(rig.emus[0].stats().errors, 0);
}

#[test]
fn a_pair_list_in_use_cannot_be_unregistered_and_slots_are_reused() {
    let mut opts = GioOptions { depth: 16, ..Default::default() };
    opts.max_pair_lists = 2;
    let rig = rig(RigSpec { controllers: 1, namespaces: 3, ns_bytes: 16 << 20, opts, ..Default::default() });
    let kv = rig.ctrls[0].dma().alloc(FILES as usize * LAYERS as usize * 2 * OBJ).unwrap();
    let t = rig.ring.register_table(&table(&kv, TableKind::Sgl)).unwrap();
    let pairs: Vec<(u32, u32)> = (0..40).map(|i| (i, i)).collect();
    let list = rig.ring.register_pairs(&pairs).unwrap();

    // In flight until collected: the executor may still read the list.
    let ids = rig.ring.submit_layer_list(t, 0, list, 0..40, Op::Write, 2).unwrap();
    let e = rig.ring.unregister_pairs(list).unwrap_err().to_string();
    assert!(e.contains("in flight"), "{e}");
    assert!(rig.ring.wait_cqe(&ids, Duration::from_secs(30)).unwrap().iter().all(|r| r.is_ok()));
    // Being filled counts too.
    let filling = rig.ring.get_iocb(1).unwrap();
    rig.ring.fill_layer_list(filling[0], t, 0, list.index(), 0, 1, Op::Read).unwrap();
    assert!(rig.ring.unregister_pairs(list).is_err());
    rig.ring.release(&filling).unwrap();
    rig.ring.unregister_pairs(list).unwrap();
    assert!(rig.ring.unregister_pairs(list).is_err(), "unregistered twice");
    assert!(rig.ring.submit_layer_list(t, 0, list, 0..1, Op::Read, 1).is_err(), "stale handle used");

    // Two slots serve any number of lists registered one after another; a third at once is refused.
    for round in 0..200u32 {
        let a = rig.ring.register_pairs(&pairs[..1 + (round % 40) as usize]).unwrap();
        assert_ne!(a, list, "a reused slot gets a new generation");
        rig.ring.unregister_pairs(a).unwrap();
    }
    let a = rig.ring.register_pairs(&pairs).unwrap();
    let b = rig.ring.register_pairs(&pairs).unwrap();
    assert!(matches!(rig.ring.register_pairs(&pairs), Err(GioError::PairListsFull { slots: 2 })));
    assert_eq!(rig.ring.pair_lists_in_use().unwrap(), 2);
    rig.ring.unregister_pairs(a).unwrap();
    rig.ring.unregister_pairs(b).unwrap();
    assert!(rig.ring.register_pairs(&[]).is_err());
}
