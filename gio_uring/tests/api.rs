//! The IOCB lifecycle, bad requests, the executor-side wait, and the CUDA
//! executor on a machine without CUDA.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::time::Duration;
use tutti_driver::spec::SglDescriptor;
use tutti_gio_uring::{
    ioctx, CudaExecutor, CudaExecutorConfig, DataRef, GioError, GioOptions, GioUring, HostExecutor,
    HostExecutorConfig, IoCtx, Op,
};

/// `n` 4 KiB writes to drive 0 from consecutive pages of `buf`.
fn writes(buf: &tutti_driver::transport::DmaBuffer, n: usize) -> Vec<IoCtx> {
    (0..n)
        .map(|m| {
            ioctx(
                Op::Write,
                0,
                m as u64 * 8,
                8,
                DataRef::Sgl(SglDescriptor::data_block(buf.iova_at(m * 4096), 4096)),
            )
        })
        .collect()
}

#[test]
fn iocbs_move_through_their_states_and_stale_handles_are_refused() {
    let rig = rig(RigSpec {
        controllers: 1,
        opts: GioOptions { depth: 3, ..Default::default() },
        ..Default::default()
    });
    let buf = rig.ctrls[0].dma().alloc(64 * 4096).unwrap();
    let r = &rig.ring;

    assert!(matches!(r.get_iocb(4), Err(GioError::PoolExhausted { wanted: 4, free: 3, depth: 3 })));
    let ids = r.get_iocb(2).unwrap();
    assert!(matches!(r.get_iocb(2), Err(GioError::PoolExhausted { free: 1, .. })));
    // Nothing filled: cannot issue; cannot wait on what was not issued.
    assert!(r.issue(&ids[..1], 1).unwrap_err().to_string().contains("no IOCTXs"));
    assert!(matches!(r.wait_cqe(&ids[..1], Duration::from_millis(1)), Err(GioError::WrongState { .. })));
    assert!(r.set_ioctxs(ids[0], &[]).is_err());
    assert!(r.set_ioctxs(ids[0], &vec![IoCtx::default(); 2049]).is_err());
    r.set_ioctxs(ids[0], &writes(&buf, 64)).unwrap();
    assert!(r.issue(&ids[..1], 0).unwrap_err().to_string().contains("sm_budget"));
    assert!(r.issue(&[ids[0], ids[0]], 1).unwrap_err().to_string().contains("twice"));

    r.release(&ids[1..]).unwrap();
    assert!(matches!(r.release(&ids[1..]), Err(GioError::WrongState { .. })), "released twice");
    r.issue(&ids[..1], 1).unwrap();
    assert!(r.set_ioctxs(ids[0], &writes(&buf, 1)).is_err(), "refilled while in flight");
    assert!(r.release(&ids[..1]).is_err(), "released while in flight");
    assert_eq!(tutti_gio_uring::IocbId::from_raw(ids[0].to_raw()), ids[0]);
    let done = r.wait_cqe(&ids[..1], Duration::from_secs(20)).unwrap();
    assert_eq!((done[0].id, done[0].count, done[0].completed), (ids[0], 64, 64));
    assert!(done[0].clone().check().is_ok());

    // Collected: the handle is now stale, even once the slot is handed out again.
    assert!(r.wait_cqe(&ids[..1], Duration::from_millis(1)).is_err());
    let again = r.get_iocb(3).unwrap();
    assert!(again.iter().any(|n| n.index() == ids[0].index()));
    assert!(!again.contains(&ids[0]));
    assert!(matches!(r.set_ioctxs(ids[0], &writes(&buf, 1)), Err(GioError::WrongState { .. })));
}

#[test]
fn poll_cqe_collects_whatever_finished() {
    let rig = rig(RigSpec {
        controllers: 1,
        opts: GioOptions { depth: 4, ..Default::default() },
        ..Default::default()
    });
    let buf = rig.ctrls[0].dma().alloc(64 * 4096).unwrap();
    let ids = rig.ring.get_iocb(3).unwrap();
    for id in &ids {
        rig.ring.set_ioctxs(*id, &writes(&buf, 40)).unwrap();
    }
    rig.ring.issue(&ids, 2).unwrap();
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while got.len() < 3 && std::time::Instant::now() < deadline {
        got.extend(rig.ring.poll_cqe().unwrap());
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut seen: Vec<_> = got.iter().map(|r| r.id).collect();
    seen.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(seen, want);
    assert!(got.iter().all(|r| r.is_ok() && r.completed == 40));
    assert!(rig.ring.poll_cqe().unwrap().is_empty());
    assert_eq!(rig.ring.get_iocb(4).unwrap().len(), 4, "every IOCB went back to the pool");
}

#[test]
fn the_executor_side_wait_sees_completions() {
    let rig = rig(RigSpec {
        controllers: 1,
        opts: GioOptions { depth: 4, ..Default::default() },
        ..Default::default()
    });
    let buf = rig.ctrls[0].dma().alloc(64 * 4096).unwrap();
    let ids = rig.ring.get_iocb(2).unwrap();
    for id in &ids {
        rig.ring.set_ioctxs(*id, &writes(&buf, 64)).unwrap();
    }
    rig.ring.issue(&ids, 2).unwrap();
    // tt_gio_wait, run by host lanes, returns once both issues completed.
    assert_eq!(rig.ring.wait_on_executor(&ids, Duration::from_secs(20)).unwrap(), 2);
    assert!(rig.ring.wait_cqe(&ids, Duration::from_secs(1)).unwrap().iter().all(|r| r.is_ok()));
}

#[test]
fn bad_configurations_are_refused_with_reasons() {
    let exec = || std::sync::Arc::new(HostExecutor::new(HostExecutorConfig::default()).unwrap());
    let e = GioUring::init(16, Vec::new(), exec()).err().unwrap().to_string();
    assert!(e.contains("0 drives"), "{e}");
    let opts = GioOptions {
        command_timeout: Duration::from_secs(5),
        submit_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let e = GioUring::init_with(opts, Vec::new(), exec()).err().unwrap().to_string();
    assert!(e.contains("submit_timeout"), "{e}");
    let e =
        GioUring::init_with(GioOptions { depth: 0, ..Default::default() }, Vec::new(), exec()).err().unwrap();
    assert!(e.to_string().contains("depth 0"));
    assert!(HostExecutor::new(HostExecutorConfig { block_lanes: 48, ..Default::default() }).is_err());
}

#[test]
fn cuda_executor_reports_a_missing_driver_as_an_error() {
    // SAFETY: only probes whether libcuda can be loaded.
    let before = unsafe { cudarc::driver::sys::is_culib_present() };
    let made = CudaExecutor::new(CudaExecutorConfig { sm_count: Some(8), ..Default::default() });
    // A test running beside this one may load a driver library (the stand-in, on the CUDA
    // executor pass) while the call runs; once loaded it stays for the process. So: absent
    // before and after means the call saw no driver; present before means it saw one;
    // absent before and present after may have gone either way.
    // SAFETY: as above.
    let after = unsafe { cudarc::driver::sys::is_culib_present() };
    let present = before || after;
    match made {
        Err(GioError::NoCuda(why)) => {
            eprintln!("CudaExecutor::new: {why}");
            if !after {
                assert!(why.contains("libcuda"), "{why}");
            } else if before {
                assert!(why.contains("device"), "a driver was loaded before the call: {why}");
            }
        }
        Ok(e) => {
            assert!(present);
            eprintln!("CUDA is present here: {}", tutti_gio_uring::Executor::name(&e));
        }
        Err(other) => {
            assert!(present, "without libcuda the error must be NoCuda, got: {other}");
            eprintln!("CUDA present but the executor could not start: {other}");
        }
    }
}

#[test]
fn selftest_round_trip_over_sgl_and_prp() {
    use tutti_gio_uring::selftest::{round_trip, SelftestOptions};
    let r = rig(RigSpec { controllers: 2, ..Default::default() });
    let opts = SelftestOptions { iocbs: 2, queue_depth: 32, first_lba: 4096, ..Default::default() };
    let rep = round_trip(&r.ctrls, &opts).unwrap();
    assert_eq!(rep.commands, 2 * 2 * 2048);
    assert_eq!(rep.bytes_verified, 2 * 2048 * 4096);
    assert_eq!(rep.data_pointers, vec!["SGL", "SGL"]);
    // 4096 commands per drive, split evenly over its 2 queues of 32.
    assert_eq!(rep.min_queue_wraps, 2048 / 32, "{rep:?}");
    let prp =
        round_trip(&r.ctrls, &SelftestOptions { force_prp: true, command_bytes: 8192, iocbs: 1, ..opts })
            .unwrap();
    assert_eq!(prp.data_pointers, vec!["PRP", "PRP"]);
    assert_eq!(prp.bytes_verified, 2048 * 8192);
    let e = round_trip(
        &r.ctrls,
        &SelftestOptions { force_prp: true, command_bytes: 16384, ..Default::default() },
    );
    assert!(e.unwrap_err().to_string().contains("at most 8 KiB"));
}
