//! Bring-up, identify, queue behaviour and error paths against the emulated controller.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;
use tutti_driver::command::{Command, DataMode, DataPtr};
use tutti_driver::controller::{Controller, ControllerOptions};
use tutti_driver::spec::{SglDescriptor, SglSupport, Status};
use tutti_driver::transport::IovaSegment;
use tutti_driver::DriverError;
use tutti_emulator::{EmulatedConfig, EmulatedController, FaultMatch, NamespaceConfig};

fn start(cfg: EmulatedConfig) -> (EmulatedController, Arc<Controller>) {
    start_with(cfg, ControllerOptions::default())
}

fn start_with(cfg: EmulatedConfig, opts: ControllerOptions) -> (EmulatedController, Arc<Controller>) {
    let emu = EmulatedController::start(cfg).expect("emulated controller starts");
    let ctrl = Controller::new(emu.registers(), emu.dma_space(), opts).expect("bring-up succeeds");
    (emu, ctrl)
}

fn small(name: &str) -> EmulatedConfig {
    EmulatedConfig {
        name: name.into(),
        namespaces: vec![NamespaceConfig::with_bytes(16 << 20, 512)],
        ..EmulatedConfig::default()
    }
}

#[test]
fn identify_reports_what_the_controller_was_configured_with() {
    let cfg = EmulatedConfig {
        serial: "SN-42".into(),
        model: "unit model".into(),
        namespaces: vec![
            NamespaceConfig::with_bytes(8 << 20, 512),
            NamespaceConfig::with_bytes(32 << 20, 4096),
        ],
        mdts: 3,
        sgl: SglSupport::DwordAligned,
        max_io_queue_pairs: 5,
        max_queue_entries: 256,
        dstrd: 2,
        ..small("emu-id")
    };
    let (_emu, ctrl) = start(cfg);
    let info = ctrl.info();
    assert_eq!(info.serial, "SN-42");
    assert_eq!(info.model, "unit model");
    assert_eq!(info.mdts_bytes, Some(32 << 10));
    assert_eq!(info.max_transfer, 32 << 10);
    assert_eq!(info.sgl, SglSupport::DwordAligned);
    assert_eq!(info.io_queue_pairs, 5);
    assert_eq!(info.max_queue_entries, 256);
    assert_eq!(info.doorbell_stride, 16);
    assert_eq!(info.namespaces.len(), 2);
    assert_eq!(
        (info.namespaces[0].nsid, info.namespaces[0].blocks, info.namespaces[0].lba_size),
        (1, 16384, 512)
    );
    assert_eq!(
        (info.namespaces[1].nsid, info.namespaces[1].blocks, info.namespaces[1].lba_size),
        (2, 8192, 4096)
    );
}

#[test]
fn queue_pairs_are_limited_by_the_grant_and_depth_by_mqes() {
    let (_emu, ctrl) =
        start(EmulatedConfig { max_io_queue_pairs: 2, max_queue_entries: 64, ..small("emu-q") });
    assert!(matches!(ctrl.create_io_queue_pair(65), Err(DriverError::InvalidArgument(_))));
    let a = ctrl.create_io_queue_pair(64).expect("first pair");
    let b = ctrl.create_io_queue_pair(8).expect("second pair");
    assert!(matches!(ctrl.create_io_queue_pair(8), Err(DriverError::NoQueuePair { granted: 2, .. })));
    assert_eq!(ctrl.free_io_queue_pairs(), 0);
    drop(a);
    assert_eq!(ctrl.free_io_queue_pairs(), 1);
    // The freed qid (and the controller's queue) can be used again.
    let c = ctrl.create_io_queue_pair(8).expect("pair after delete");
    assert_ne!(b.qid(), c.qid());
}

#[test]
fn a_one_pair_controller_shares_its_pair_and_says_so_when_out() {
    let (_emu, ctrl) = start(EmulatedConfig { max_io_queue_pairs: 1, ..small("emu-1p") });
    assert_eq!(ctrl.info().io_queue_pairs, 1);
    let shared = ctrl.shared_io_queue_pair(32).expect("the one pair, shared");
    // Every caller gets the same pair while anyone holds it: no second qid needed.
    let again = ctrl.shared_io_queue_pair(8).expect("shared again");
    assert!(Arc::ptr_eq(&shared, &again));
    let buf = ctrl.dma().alloc(4096).unwrap();
    buf.fill(0x5a);
    shared.lock().unwrap().write_buf(1, 3, &buf, 0, 4096, DataMode::Auto).expect("write on the shared pair");
    buf.fill(0);
    again.lock().unwrap().read_buf(1, 3, &buf, 0, 4096, DataMode::Auto).expect("read on the shared pair");
    let mut back = vec![0u8; 4096];
    buf.copy_out(0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0x5a));
    // A second, private pair: a clear error with the drive and the numbers.
    let Err(e) = ctrl.create_raw_queue_pair(16) else { panic!("a second pair was granted") };
    let msg = e.to_string();
    assert!(matches!(e, DriverError::NoQueuePair { granted: 1, requested: 16, .. }), "{msg}");
    assert!(
        msg.contains("emu-1p") && msg.contains("granted 1 of the 16") && msg.contains("raw queue pair"),
        "{msg}"
    );
    drop((shared, again));
    // Released with its last holder.
    assert_eq!(ctrl.free_io_queue_pairs(), 1);
    ctrl.create_raw_queue_pair(16).expect("the pair is free again");
}

#[test]
fn round_trip_on_four_queue_pairs_from_four_threads() {
    let (emu, ctrl) = start(EmulatedConfig { max_queue_entries: 1024, ..small("emu-rt") });
    let opts = tutti_driver::selftest::SelftestOptions {
        queue_pairs: 4,
        queue_depth: 16,
        commands_per_queue: 400,
        max_blocks: 24,
        ..Default::default()
    };
    let rep = tutti_driver::selftest::round_trip(&ctrl, &opts, &|_| {}).expect("round trip verifies");
    let prp = rep.modes.iter().find(|m| m.mode == "PRP").expect("PRP ran");
    let sgl = rep.modes.iter().find(|m| m.mode == "SGL").expect("SGL ran");
    assert!(prp.bytes_verified > 0 && sgl.bytes_verified > 0);
    // 4 queues × 2 modes × 400 commands × (write + read) on 16-entry queues: every queue wraps many times.
    assert_eq!(prp.commands + sgl.commands, 4 * 2 * 400 * 2);
    assert!(rep.queue_wraps >= 4 * 50, "queues wrapped {} times", rep.queue_wraps);
    let stats = emu.stats();
    assert_eq!(stats.errors, 0);
    assert_eq!(stats.iommu_faults, 0);
    assert!(stats.bytes_written >= prp.bytes_written + sgl.bytes_written);
}

#[test]
fn prp_only_controllers_with_4k_blocks_and_small_mdts() {
    let cfg = EmulatedConfig {
        namespaces: vec![NamespaceConfig::with_bytes(32 << 20, 4096)],
        mdts: 1,
        sgl: SglSupport::None,
        ..small("emu-prp")
    };
    let (_emu, ctrl) = start(cfg);
    assert_eq!(ctrl.info().max_transfer, 8192);
    let qp = ctrl.create_io_queue_pair(8).expect("queue pair");
    assert!(matches!(qp.resolve_mode(DataMode::Sgl), Err(DriverError::Unsupported { .. })));
    assert_eq!(qp.resolve_mode(DataMode::Auto).ok(), Some(DataMode::Prp));
    drop(qp);
    let opts = tutti_driver::selftest::SelftestOptions {
        queue_pairs: 2,
        queue_depth: 8,
        commands_per_queue: 64,
        modes: vec![DataMode::Prp],
        ..Default::default()
    };
    let rep = tutti_driver::selftest::round_trip(&ctrl, &opts, &|_| {}).expect("PRP round trip");
    assert_eq!(rep.lba_size, 4096);
}

#[test]
fn dword_aligned_sgl_rule_is_honoured() {
    let (_emu, ctrl) = start(EmulatedConfig { sgl: SglSupport::DwordAligned, ..small("emu-dw") });
    let mut qp = ctrl.create_io_queue_pair(8).expect("queue pair");
    let buf = ctrl.dma().alloc(8192).expect("buffer");
    let odd =
        [IovaSegment { iova: buf.iova() + 2, len: 510 }, IovaSegment { iova: buf.iova() + 1024, len: 2 }];
    let err =
        qp.submit_data(Command::read(1, 0, 1), &odd, DataMode::Sgl, 0).expect_err("odd segments refused");
    assert!(err.to_string().contains("dword"), "{err}");
    let ok =
        [IovaSegment { iova: buf.iova() + 4, len: 508 }, IovaSegment { iova: buf.iova() + 1024, len: 4 }];
    let cid =
        qp.submit_data(Command::read(1, 0, 1), &ok, DataMode::Sgl, 0).expect("aligned segments accepted");
    qp.ring();
    assert!(qp.wait(cid).expect("completes").status.is_success());
}

/// Submits one raw command and returns its completion status.
fn raw_status(ctrl: &Arc<Controller>, cmd: Command) -> Status {
    let mut qp = ctrl.create_io_queue_pair(4).expect("queue pair");
    let cid = qp.submit(cmd, 0).expect("submit");
    qp.ring();
    qp.wait(cid).expect("completion").status
}

#[test]
fn malformed_commands_get_the_spec_status() {
    let (_emu, ctrl) = start(small("emu-bad"));
    let buf = ctrl.dma().alloc(3 * 4096).expect("buffer");
    let b = buf.iova();
    let cases: Vec<(&str, Command, Status)> = vec![
        (
            "PRP1 not dword aligned",
            Command::read(1, 0, 1).data(DataPtr::Prp { prp1: b + 2, prp2: 0 }),
            Status::PRP_OFFSET_INVALID,
        ),
        (
            "PRP2 with an offset",
            Command::read(1, 0, 16).data(DataPtr::Prp { prp1: b, prp2: b + 4096 + 8 }),
            Status::PRP_OFFSET_INVALID,
        ),
        (
            "unknown SGL type",
            Command::read(1, 0, 1).data(DataPtr::Sgl(tutti_driver::spec::SglDescriptor {
                id: 0x50,
                ..SglDescriptor::data_block(b, 512)
            })),
            Status::SGL_TYPE_INVALID,
        ),
        (
            "SGL shorter than the transfer",
            Command::read(1, 0, 2).data(DataPtr::Sgl(SglDescriptor::data_block(b, 512))),
            Status::DATA_SGL_LENGTH_INVALID,
        ),
        (
            "LBA past the namespace",
            Command::read(1, 32767, 2).data(DataPtr::Sgl(SglDescriptor::data_block(b, 1024))),
            Status::LBA_OUT_OF_RANGE,
        ),
        (
            "namespace that does not exist",
            Command::read(7, 0, 1).data(DataPtr::Sgl(SglDescriptor::data_block(b, 512))),
            Status::INVALID_NAMESPACE,
        ),
        (
            "transfer above MDTS",
            Command::read(1, 0, 512).data(DataPtr::Sgl(SglDescriptor::data_block(b, 512 * 512))),
            Status::INVALID_FIELD,
        ),
        (
            "unmapped data address",
            Command::read(1, 0, 1).data(DataPtr::Sgl(SglDescriptor::data_block(0x10, 512))),
            Status::DATA_TRANSFER_ERROR,
        ),
    ];
    for (what, cmd, want) in cases {
        let got = raw_status(&ctrl, cmd);
        assert_eq!(got.code(), want.code(), "{what}: got {got}, want {want}");
    }
}

#[test]
fn a_buffer_unmapped_after_use_is_a_data_transfer_error() {
    // The controller remembers translations of recent DMA (an IOTLB); an unmap must end them.
    let (emu, ctrl) = start(small("emu-unmapped"));
    let mut v = vec![0u8; 4096];
    // SAFETY: `v` outlives the mapping, which is dropped below.
    let m = unsafe { ctrl.dma().map(v.as_mut_ptr(), v.len()) }.expect("mapping");
    let iova = m.segments()[0].iova;
    let read = || Command::read(1, 0, 8).data(DataPtr::Sgl(SglDescriptor::data_block(iova, 4096)));
    assert!(raw_status(&ctrl, read()).is_success(), "a read into a mapped buffer succeeds");
    drop(m);
    let faults = emu.stats().iommu_faults;
    let got = raw_status(&ctrl, read());
    assert_eq!(got.code(), Status::DATA_TRANSFER_ERROR.code(), "read into an unmapped buffer: got {got}");
    assert!(emu.stats().iommu_faults > faults, "the IOMMU counted the fault");
    drop(v);
}

#[test]
fn the_driver_refuses_lbas_past_the_namespace_before_submitting() {
    let (emu, ctrl) = start(small("emu-range"));
    let mut qp = ctrl.create_io_queue_pair(4).expect("queue pair");
    let buf = ctrl.dma().alloc(4096).expect("buffer");
    let before = emu.stats().commands;
    let err = qp.read_buf(1, 32767, &buf, 0, 1024, DataMode::Auto).expect_err("refused");
    assert!(err.to_string().contains("past the end of namespace 1"), "{err}");
    assert_eq!(emu.stats().commands, before, "nothing reached the controller");
}

#[test]
fn injected_failures_name_queue_cid_and_status() {
    let (emu, ctrl) = start(small("emu-fail"));
    let mut qp = ctrl.create_io_queue_pair(8).expect("queue pair");
    let buf = ctrl.dma().alloc(4096).expect("buffer");
    emu.faults()
        .fail_next(FaultMatch { opcode: Some(0x02), ..Default::default() }, Status::UNRECOVERED_READ_ERROR);
    let err = qp.read_buf(1, 0, &buf, 0, 4096, DataMode::Prp).expect_err("read fails");
    let msg = err.to_string();
    assert_eq!(err.status(), Some(Status::UNRECOVERED_READ_ERROR));
    assert!(
        msg.contains(&format!("qid {}", qp.qid()))
            && msg.contains("Read failed: Media/Unrecovered Read Error (0x0281)"),
        "{msg}"
    );
    // The next read is unaffected.
    qp.read_buf(1, 0, &buf, 0, 4096, DataMode::Prp).expect("read succeeds after the fault");
}

#[test]
fn a_dropped_completion_is_a_timeout_naming_queue_and_cid() {
    let opts = ControllerOptions { io_timeout: Duration::from_millis(300), ..Default::default() };
    let (emu, ctrl) = start_with(small("emu-drop"), opts);
    let mut qp = ctrl.create_io_queue_pair(8).expect("queue pair");
    let buf = ctrl.dma().alloc(4096).expect("buffer");
    emu.faults().drop_next(FaultMatch { opcode: Some(0x01), ..Default::default() });
    let seg = [IovaSegment { iova: buf.iova(), len: 512 }];
    let cid = qp.submit_data(Command::write(1, 8, 1), &seg, DataMode::Sgl, 0).expect("submit");
    qp.ring();
    let err = qp.wait(cid).expect_err("times out");
    match &err {
        DriverError::CommandTimeout { qid, cid: c, command, .. } => {
            assert_eq!((*qid, *c, *command), (qp.qid(), cid, "Write"));
        }
        other => panic!("expected a command timeout, got {other}"),
    }
    assert!(
        err.to_string().contains(&format!("qid {} cid {cid}: Write did not complete", qp.qid())),
        "{err}"
    );
    // The queue stays usable and the abandoned CID is not handed out again.
    let cid2 = qp.submit_data(Command::read(1, 8, 1), &seg, DataMode::Sgl, 0).expect("submit after timeout");
    assert_ne!(cid2, cid);
    qp.ring();
    assert!(qp.wait(cid2).expect("completes").status.is_success());
    assert_eq!(emu.stats().dropped_completions, 1);
}

/// Reads LBA `lba` of namespace 1 through `qp` into a fresh buffer.
fn read_lba(ctrl: &Arc<Controller>, qp: &mut tutti_driver::queue::IoQueuePair, lba: u64) -> Vec<u8> {
    let buf = ctrl.dma().alloc(4096).expect("buffer");
    qp.read_buf(1, lba, &buf, 0, 512, DataMode::Sgl).expect("read");
    let mut out = vec![0u8; 512];
    buf.copy_out(0, &mut out).expect("copy out");
    out
}

#[test]
fn a_write_with_delayed_execution_lands_after_the_host_gave_up() {
    let opts = ControllerOptions { io_timeout: Duration::from_millis(200), ..Default::default() };
    let (emu, ctrl) = start_with(small("emu-late"), opts);
    let mut qp = ctrl.create_io_queue_pair(8).expect("queue pair");
    let old = ctrl.dma().alloc(4096).expect("buffer");
    old.copy_in(0, &[0xAA; 512]).expect("fill");
    qp.write_buf(1, 8, &old, 0, 512, DataMode::Sgl).expect("first write");

    let new = ctrl.dma().alloc(4096).expect("buffer");
    new.copy_in(0, &[0x55; 512]).expect("fill");
    emu.faults().delay_execution_next(
        FaultMatch { opcode: Some(0x01), ..Default::default() },
        Duration::from_millis(800),
    );
    let seg = [IovaSegment { iova: new.iova(), len: 512 }];
    let cid = qp.submit_data(Command::write(1, 8, 1), &seg, DataMode::Sgl, 0).expect("submit");
    qp.ring();
    let err = qp.wait(cid).expect_err("the host gives up on the write");
    assert!(matches!(err, DriverError::CommandTimeout { .. }), "{err}");
    // Reported failed, but nothing has moved yet: the media still holds the old data.
    assert_eq!(read_lba(&ctrl, &mut qp, 8), vec![0xAA; 512], "the write must not execute before its delay");

    // Later the controller executes it anyway: the late write reaches the media.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let got = read_lba(&ctrl, &mut qp, 8);
        if got == vec![0x55; 512] {
            break;
        }
        assert_eq!(got, vec![0xAA; 512], "the media holds either the old or the late data");
        assert!(std::time::Instant::now() < deadline, "the deferred write never executed");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Its completion arrives for an abandoned CID and is discarded; the queue stays usable.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while qp.in_flight() > 0 {
        let mut out = Vec::new();
        qp.reap(&mut out).expect("reap");
        assert!(out.is_empty(), "a late completion must not be reported as another command's: {out:?}");
        assert!(std::time::Instant::now() < deadline, "the late completion never arrived");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!((emu.stats().dropped_completions, emu.stats().late_executions), (0, 1));
}

#[test]
fn deleting_the_queue_aborts_a_command_whose_execution_was_deferred() {
    let opts = ControllerOptions { io_timeout: Duration::from_millis(200), ..Default::default() };
    let (emu, ctrl) = start_with(small("emu-late-delete"), opts);
    let mut qp = ctrl.create_io_queue_pair(8).expect("queue pair");
    let buf = ctrl.dma().alloc(4096).expect("buffer");
    buf.copy_in(0, &[0x77; 512]).expect("fill");
    emu.faults().delay_execution_next(
        FaultMatch { opcode: Some(0x01), ..Default::default() },
        Duration::from_millis(600),
    );
    let seg = [IovaSegment { iova: buf.iova(), len: 512 }];
    let cid = qp.submit_data(Command::write(1, 16, 1), &seg, DataMode::Sgl, 0).expect("submit");
    qp.ring();
    assert!(matches!(qp.wait(cid), Err(DriverError::CommandTimeout { .. })));
    // §5.6: deleting the SQ aborts what it still holds; the write never executes.
    drop(qp);
    let mut qp = ctrl.create_io_queue_pair(8).expect("queue pair");
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(read_lba(&ctrl, &mut qp, 16), vec![0u8; 512], "an aborted deferred write must not land");
    assert_eq!(emu.stats().late_executions, 0);
}

#[test]
fn recovering_the_pair_aborts_a_late_write_and_frees_every_slot() {
    let opts = ControllerOptions { io_timeout: Duration::from_millis(200), ..Default::default() };
    let (emu, ctrl) = start_with(small("emu-recover"), opts);
    let mut qp = ctrl.create_io_queue_pair(8).expect("queue pair");
    let old = ctrl.dma().alloc(4096).expect("buffer");
    old.copy_in(0, &[0xAA; 512]).expect("fill");
    qp.write_buf(1, 24, &old, 0, 512, DataMode::Sgl).expect("first write");

    let new = ctrl.dma().alloc(4096).expect("buffer");
    new.copy_in(0, &[0x55; 512]).expect("fill");
    let hold = Duration::from_millis(800);
    emu.faults().delay_execution_next(FaultMatch { opcode: Some(0x01), ..Default::default() }, hold);
    let held_at = std::time::Instant::now();
    let err = qp.write_buf(1, 24, &new, 0, 512, DataMode::Sgl).expect_err("the host gives up on the write");
    assert!(matches!(err, DriverError::CommandTimeout { .. }), "{err}");
    assert_eq!(qp.in_flight(), 1, "the abandoned write keeps its slot until recovery");

    let report = qp.recover().expect("recover");
    assert_eq!((report.abandoned, report.outstanding, report.parked), (1, 0, 0));
    assert_eq!((qp.in_flight(), qp.free_slots()), (0, qp.depth() - 1));

    // Past the hold the write would have landed, had the SQ deletion not aborted it.
    std::thread::sleep(
        (held_at + hold + Duration::from_millis(300)).saturating_duration_since(std::time::Instant::now()),
    );
    assert_eq!(emu.stats().late_executions, 0);
    assert_eq!(read_lba(&ctrl, &mut qp, 24), vec![0xAA; 512], "the late write reached the media");

    // Every slot carries a command again: depth - 1 writes in flight at once,
    // with fresh CIDs and phase, each completing as itself.
    let n = qp.depth() as usize - 1;
    let buf = ctrl.dma().alloc(n * 4096).expect("buffer");
    for i in 0..n {
        buf.copy_in(i * 4096, &[0x10 + i as u8; 512]).expect("fill");
    }
    let mut cids = Vec::new();
    for i in 0..n {
        let seg = [IovaSegment { iova: buf.iova_at(i * 4096), len: 512 }];
        let cmd = Command::write(1, 32 + i as u64, 1);
        cids.push(qp.submit_data(cmd, &seg, DataMode::Sgl, i as u64).expect("submit after recovery"));
    }
    assert_eq!(qp.free_slots(), 0);
    qp.ring();
    for (i, cid) in cids.into_iter().enumerate() {
        let c = qp.wait(cid).expect("completion after recovery");
        assert!(c.status.is_success(), "{:?}", c.status);
        assert_eq!(c.token, i as u64);
    }
    for i in 0..n {
        assert_eq!(read_lba(&ctrl, &mut qp, 32 + i as u64), vec![0x10 + i as u8; 512]);
    }
    assert_eq!(qp.free_slots(), qp.depth() - 1);
}

#[test]
fn a_failed_recovery_leaves_the_pair_unusable() {
    let opts = ControllerOptions { io_timeout: Duration::from_millis(200), ..Default::default() };
    let (emu, ctrl) = start_with(small("emu-recover-fail"), opts);
    let mut qp = ctrl.create_io_queue_pair(8).expect("queue pair");
    // Delete I/O Submission Queue (admin opcode 0x00) fails.
    emu.faults().fail_next(
        FaultMatch { qid: Some(0), opcode: Some(0x00), ..Default::default() },
        Status::INTERNAL_ERROR,
    );
    let err = qp.recover().expect_err("the delete fails");
    assert_eq!(err.status(), Some(Status::INTERNAL_ERROR), "{err}");
    assert!(qp.is_unusable());

    let buf = ctrl.dma().alloc(4096).expect("buffer");
    let calls = [
        qp.write_buf(1, 0, &buf, 0, 512, DataMode::Sgl).expect_err("write on an unusable pair"),
        qp.submit(Command::flush(1), 0).expect_err("submit on an unusable pair"),
        qp.reap(&mut Vec::new()).expect_err("reap on an unusable pair"),
        qp.recover().expect_err("a second recovery on unknown state"),
    ];
    for err in calls {
        assert!(matches!(err, DriverError::QueueUnusable { .. }), "{err}");
        assert!(err.to_string().contains("controller reset"), "{err}");
    }
}

#[test]
fn queue_full_is_back_pressure_not_an_overwrite() {
    let (_emu, ctrl) = start(small("emu-full"));
    let mut qp = ctrl.create_io_queue_pair(4).expect("queue pair");
    for _ in 0..3 {
        qp.submit(Command::flush(1), 0).expect("fits");
    }
    assert!(matches!(
        qp.submit(Command::flush(1), 0),
        Err(DriverError::QueueFull { depth: 4, in_flight: 3, .. })
    ));
    qp.ring();
    let mut done = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while done.len() < 3 && std::time::Instant::now() < deadline {
        qp.reap(&mut done).expect("reap");
    }
    assert_eq!(done.len(), 3);
    assert!(qp.submit(Command::flush(1), 0).is_ok());
}

#[test]
fn controller_fatal_status_is_reported() {
    let opts = ControllerOptions { io_timeout: Duration::from_millis(500), ..Default::default() };
    let (emu, ctrl) = start_with(small("emu-cfs"), opts);
    let mut qp = ctrl.create_io_queue_pair(4).expect("queue pair");
    emu.set_fatal();
    let cid = qp.submit(Command::flush(1), 0).expect("submit");
    qp.ring();
    let err = qp.wait(cid).expect_err("fails");
    assert!(matches!(err, DriverError::ControllerFatal { .. }), "{err}");
    assert!(ctrl.status().expect("csts").fatal());

    // A controller that is fatal from the start fails bring-up with the same error.
    let emu2 = EmulatedController::start(small("emu-cfs2")).expect("start");
    emu2.set_fatal();
    let err = Controller::new(
        emu2.registers(),
        emu2.dma_space(),
        ControllerOptions { ready_timeout: Some(Duration::from_millis(500)), ..Default::default() },
    )
    .expect_err("bring-up fails");
    assert!(matches!(err, DriverError::ControllerFatal { .. }), "{err}");
}

#[test]
fn write_zeroes_deallocate_and_flush() {
    let (_emu, ctrl) = start(small("emu-wz"));
    let mut qp = ctrl.create_io_queue_pair(8).expect("queue pair");
    let buf = ctrl.dma().alloc(8192).expect("buffer");
    buf.fill(0x5a);
    qp.write_buf(1, 100, &buf, 0, 8192, DataMode::Auto).expect("write");
    qp.flush(1).expect("flush");
    qp.write_zeroes(1, 100, 4).expect("write zeroes");
    qp.deallocate(1, &[(108, 4)]).expect("deallocate");
    let back = ctrl.dma().alloc(8192).expect("buffer");
    back.fill(0xff);
    qp.read_buf(1, 100, &back, 0, 8192, DataMode::Auto).expect("read");
    let mut got = vec![0u8; 8192];
    back.copy_out(0, &mut got).expect("copy");
    assert!(got[..2048].iter().all(|&b| b == 0), "write zeroes range reads zero");
    assert!(got[2048..4096].iter().all(|&b| b == 0x5a), "untouched range keeps data");
    assert!(got[4096..6144].iter().all(|&b| b == 0), "deallocated range reads zero");
    assert!(got[6144..].iter().all(|&b| b == 0x5a));
}

#[test]
fn shutdown_is_orderly_and_idempotent() {
    let (_emu, ctrl) = start(small("emu-shn"));
    ctrl.shutdown().expect("shutdown");
    assert_eq!(ctrl.status().expect("csts").shutdown_status(), tutti_driver::spec::ShutdownStatus::Complete);
    ctrl.shutdown().expect("second shutdown is a no-op");
    assert!(ctrl.is_shut_down());
}

#[test]
fn bring_up_waits_for_a_slow_ready_and_can_be_repeated() {
    let cfg = EmulatedConfig { ready_delay: Duration::from_millis(50), ..small("emu-slow") };
    let emu = EmulatedController::start(cfg).expect("start");
    let ctrl = Controller::new(emu.registers(), emu.dma_space(), ControllerOptions::default())
        .expect("first bring-up");
    let mut qp = ctrl.create_io_queue_pair(4).expect("qp");
    let buf = ctrl.dma().alloc(4096).expect("buf");
    buf.fill(7);
    qp.write_buf(1, 0, &buf, 0, 4096, DataMode::Auto).expect("write");
    drop(qp);
    drop(ctrl);
    // A second bring-up (reset from a shut-down, enabled controller) sees the same data.
    let ctrl = Controller::new(emu.registers(), emu.dma_space(), ControllerOptions::default())
        .expect("second bring-up");
    let mut qp = ctrl.create_io_queue_pair(4).expect("qp");
    let back = ctrl.dma().alloc(4096).expect("buf");
    qp.read_buf(1, 0, &back, 0, 4096, DataMode::Auto).expect("read");
    let mut got = vec![0u8; 4096];
    back.copy_out(0, &mut got).expect("copy");
    assert!(got.iter().all(|&b| b == 7));
}

#[test]
fn namespaces_with_metadata_protection_or_zones_are_refused_with_their_format() {
    let ns = |ms: u16, extended: bool, pi: u8, csi: u8| NamespaceConfig {
        metadata_size: ms,
        extended_metadata: extended,
        pi_type: pi,
        command_set: csi,
        ..NamespaceConfig::with_bytes(4 << 20, 512)
    };
    let cfg = EmulatedConfig {
        namespaces: vec![ns(0, false, 0, 0), ns(8, true, 0, 0), ns(8, false, 1, 0), ns(0, false, 0, 2)],
        ..small("emu-fmt")
    };
    let (_emu, ctrl) = start(cfg);
    let info = ctrl.info();
    assert_eq!(info.namespaces.len(), 4, "every namespace is listed, usable or not");
    let f = |i: usize| info.namespaces[i].format;
    assert_eq!((f(0).data_size, f(0).metadata_size, f(0).pi_type), (512, 0, 0));
    assert_eq!((f(1).metadata_size, f(1).extended), (8, true));
    assert_eq!((f(2).metadata_size, f(2).extended, f(2).pi_type), (8, false, 1));
    assert_eq!(info.namespaces[3].command_set, tutti_driver::spec::CommandSet::Zoned);
    assert_eq!(info.namespaces[0].command_set, tutti_driver::spec::CommandSet::Nvm);

    ctrl.data_namespace(1).expect("a plain namespace is usable");
    let refused = |nsid: u32| {
        let e = ctrl.data_namespace(nsid).expect_err("refused");
        assert!(matches!(e, DriverError::UnusableNamespace { .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("emu-fmt") && msg.contains(&format!("namespace {nsid}")), "{msg}");
        msg
    };
    let m = refused(2);
    assert!(m.contains("8 B metadata (extended LBA)") && m.contains("reformat"), "{m}");
    let m = refused(3);
    assert!(m.contains("separate buffer") && m.contains("protection information type 1"), "{m}");
    let m = refused(4);
    assert!(m.contains("Zoned Namespace command set") && m.contains("NVM command set"), "{m}");

    // The synchronous I/O helpers refuse them before anything reaches the drive.
    let mut qp = ctrl.create_io_queue_pair(8).expect("queue pair");
    let buf = ctrl.dma().alloc(4096).unwrap();
    for nsid in 2..=4 {
        let e = qp.write_buf(nsid, 0, &buf, 0, 512, DataMode::Auto).expect_err("refused");
        assert!(matches!(e, DriverError::UnusableNamespace { .. }), "{e}");
    }
    qp.write_buf(1, 0, &buf, 0, 512, DataMode::Auto).expect("plain namespace works");
}

/// BAR0 of an emulated controller whose CAP reads with MQES = 0 (a 1-entry queue).
struct ZeroMqes(Arc<dyn tutti_driver::transport::Registers>);

impl tutti_driver::transport::Registers for ZeroMqes {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn read32(&self, offset: usize) -> tutti_driver::Result<u32> {
        let v = self.0.read32(offset)?;
        Ok(if offset == 0 { v & !0xffff } else { v })
    }
    fn write32(&self, offset: usize, value: u32) -> tutti_driver::Result<()> {
        self.0.write32(offset, value)
    }
    fn doorbell_ptr(
        &self,
        offset: usize,
    ) -> tutti_driver::Result<(std::ptr::NonNull<u32>, tutti_driver::transport::DoorbellKind)> {
        self.0.doorbell_ptr(offset)
    }
}

#[test]
fn a_cap_with_one_entry_queues_is_an_error_not_a_panic() {
    let emu = EmulatedController::start(small("emu-mqes")).expect("starts");
    let regs: Arc<dyn tutti_driver::transport::Registers> = Arc::new(ZeroMqes(emu.registers()));
    let e = Controller::new(regs, emu.dma_space(), ControllerOptions::default()).expect_err("refused");
    assert!(matches!(e, DriverError::BadDeviceResponse { .. }), "{e}");
    assert!(e.to_string().contains("CAP.MQES = 0"), "{e}");
}
