//! What an H100 showed and no host thread can: a staged table whose KV memory
//! was plain pageable host memory killed the context (ILLEGAL_ADDRESS) at the
//! first copy. The CUDA executor now asks the driver about the KV ranges when
//! the table is registered and refuses what its kernels cannot reach, before
//! anything is allocated or launched. The stand-in answers
//! `cuPointerGetAttribute` from its record of allocations and registrations,
//! as the driver does.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod executor_common;

use executor_common::*;
use tutti_gio_uring::mem::{HostRange, MemKind};
use tutti_gio_uring::{ExecMode, Executor, Kv, LayerGeometry, LayerTable, PoolDrive, TableKind};

const PAGE: usize = 4096;

fn geometry() -> LayerGeometry {
    LayerGeometry {
        layers: 2,
        files: 4,
        blocks: 4,
        object_bytes: 8 << 10,
        max_transfer: 8 << 10,
        drives: vec![PoolDrive { drive: 0, data_start_lba: 64, lba_size: 512 }],
    }
}

fn kv_bytes(g: &LayerGeometry) -> usize {
    (g.blocks as u64 * g.layers as u64 * 2 * g.object_bytes) as usize
}

/// A staged table whose objects lie back to back from `base`.
fn table(g: &LayerGeometry, base: u64) -> LayerTable {
    let mut t = LayerTable::new(g.clone(), TableKind::Staged).unwrap();
    for b in 0..g.blocks {
        for l in 0..g.layers {
            for (i, kv) in [Kv::K, Kv::V].into_iter().enumerate() {
                let obj = ((b * g.layers + l) * 2 + i as u32) as u64;
                t.set_kv(b, l, kv, base + obj * g.object_bytes).unwrap();
            }
        }
    }
    t
}

/// Page-aligned plain host memory of `bytes`, and its aligned start.
fn pageable(bytes: usize) -> (Vec<u8>, u64) {
    let buf = vec![0u8; bytes + PAGE];
    let start = (buf.as_ptr() as u64).next_multiple_of(PAGE as u64);
    (buf, start)
}

#[test]
fn a_staged_table_over_memory_the_kernels_cannot_reach_is_refused_at_registration() {
    let _g = serial();
    let Some((s, path)) = standin() else { return };
    let rig = rig(config(&path, ExecMode::Launch), opts());
    let g = geometry();
    let bytes = kv_bytes(&g);

    // Plain pageable host memory: refused, naming the range and the driver's answer.
    let (buf, start) = pageable(bytes);
    let e = rig.ring.register_staged_table(&table(&g, start), 4).unwrap_err().to_string();
    assert!(e.contains(&format!("{start:#x}")) && e.contains("can reach"), "{e}");
    assert!(e.contains("first byte"), "{e}");

    // The same memory registered with the executor: accepted, and the table works as a table.
    // SAFETY: `buf` outlives the mapping (both live to the end of the test).
    let map = unsafe { rig.exec.map_host(start as *mut u8, bytes, HostRange::Memory) }.unwrap();
    // Kept registered to the end: a table unregistered now would free its staging memory
    // while the executor defers unregistering it, and the next table's staging memory could
    // land at the same address (ALREADY_REGISTERED; see the session note of 2026-11-24).
    let mapped = rig.ring.register_staged_table(&table(&g, map.exec_addr()), 4).unwrap();

    // Registered memory too short for the table: its last byte is refused.
    let (buf2, start2) = pageable(bytes);
    // SAFETY: `buf2` outlives the mapping (dropped after it).
    let short = unsafe { rig.exec.map_host(start2 as *mut u8, bytes / 2, HostRange::Memory) }.unwrap();
    let e = rig.ring.register_staged_table(&table(&g, short.exec_addr()), 4).unwrap_err().to_string();
    assert!(e.contains("last byte"), "{e}");
    drop(short);

    // CUDA device memory (what an engine's KV cache is on a GPU): accepted.
    let dev = rig.exec.alloc(MemKind::Private, bytes).unwrap();
    let on_device = rig.ring.register_staged_table(&table(&g, dev.exec_addr()), 4).unwrap();
    rig.ring.unregister_table(on_device).unwrap();
    rig.ring.unregister_table(mapped).unwrap();

    // Host buffers go last: an executor may release their registrations only once idle.
    drop(map);
    drop(rig);
    drop((buf, buf2));
    assert!(s.violations().is_empty(), "{:?}", s.violations());
}

#[test]
fn the_host_executor_reaches_any_memory_of_the_process() {
    let exec = tutti_gio_uring::HostExecutor::new(tutti_gio_uring::HostExecutorConfig::default()).unwrap();
    let (buf, start) = pageable(PAGE);
    exec.check_kernel_access(start, PAGE as u64).unwrap();
    drop(buf);
}

/// Memory whose mapping was dropped while the executor defers unregistering it (kernels
/// may run) is registered again: the engine unregisters its KV memory and registers the
/// same memory, or a new staged table's memory lands where a dropped one's was. The
/// driver refuses a range that is still registered; in launch mode the deferred
/// unregistration runs first, under a persistent kernel the refusal says why.
#[test]
fn memory_registered_again_after_its_mapping_was_dropped() {
    let _g = serial();
    let Some((s, path)) = standin() else { return };
    let (buf, start) = pageable(1 << 16);
    {
        let rig = rig(config(&path, ExecMode::Launch), opts());
        // SAFETY: `buf` outlives every mapping (dropped after the rig).
        let m = unsafe { rig.exec.map_host(start as *mut u8, 1 << 16, HostRange::Memory) }.unwrap();
        drop(m);
        // SAFETY: as above.
        let again = unsafe { rig.exec.map_host(start as *mut u8, 1 << 16, HostRange::Memory) };
        again.unwrap();
    }
    {
        let rig = rig(config(&path, ExecMode::Persistent), opts());
        round_trip(&rig, 4, 1);
        // SAFETY: as above.
        let m = unsafe { rig.exec.map_host(start as *mut u8, 1 << 16, HostRange::Memory) }.unwrap();
        drop(m);
        // SAFETY: as above.
        let e = unsafe { rig.exec.map_host(start as *mut u8, 1 << 16, HostRange::Memory) }.err().unwrap();
        let e = e.to_string();
        assert!(e.contains("persistent") && e.contains(&format!("{start:#x}")), "{e}");
    }
    drop(buf);
    assert!(s.violations().is_empty(), "{:?}", s.violations());
}
