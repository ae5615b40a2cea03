//! submit_layer: the executor expands (file, block) pairs through a layer
//! table into commands, striping each file's objects across the pool.
//!
//! The pool is three namespaces of one emulated controller: a table entry is
//! one IOVA for whichever drive the file puts an object on, so all pool drives
//! must share one DMA address space (as devices in one VFIO container do).

mod common;

use common::*;
use std::time::Duration;
use tutti_driver::command::DataMode;
use tutti_driver::transport::{DmaBuffer, IovaSegment};
use tutti_gio_uring::{IoStatus, Kv, LayerGeometry, LayerTable, Op, PoolDrive, TableKind, Translation};

const OBJ: usize = 4096;
const LAYERS: u32 = 2;
const FILES: u32 = 600;

fn geometry() -> LayerGeometry {
    LayerGeometry {
        layers: LAYERS,
        files: FILES,
        blocks: FILES,
        object_bytes: OBJ as u64,
        lba_size: 512,
        // Two commands per object.
        max_transfer: 2048,
        drives: (0..3).map(|d| PoolDrive { drive: d, data_start_lba: 2048 + 8 * d as u64 }).collect(),
    }
}

fn object_offset(block: u32, layer: u32, kv: Kv) -> usize {
    (((block * LAYERS + layer) * 2) as usize + kv as usize) * OBJ
}

fn table(kv_mem: &DmaBuffer, kind: TableKind) -> LayerTable {
    let mut t = LayerTable::new(geometry(), kind).unwrap();
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
