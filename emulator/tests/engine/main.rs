//! The emulated controller driven by hand, the way a device sees its host:
//! registers, queue memory and doorbells, with no driver code in between.
//! Every wait has a deadline; a "nothing happens" check waits a short,
//! fixed time and asserts nothing about how long anything took.

mod host;

use host::*;
use std::time::{Duration, Instant};
use tutti_driver::spec::registers::{offset, sq_tail_doorbell, ShutdownNotification};
use tutti_driver::spec::{
    Aqa, Cc, IdentifyController, IdentifyNamespace, Psdt, SglDescriptor, SglSupport, ShutdownStatus, Status,
    SubmissionEntry,
};
use tutti_emulator::{
    EmulatedConfig, EmulatedController, FaultAction, FaultMatch, MediaConfig, NamespaceConfig,
};
use zerocopy::FromBytes;

#[test]
fn identify_reports_the_configuration() {
    let cfg = EmulatedConfig {
        namespaces: vec![
            NamespaceConfig::with_bytes(8 << 20, 512),
            NamespaceConfig::with_bytes(16 << 20, 4096),
        ],
        serial: "SN-42".into(),
        model: "Model X".into(),
        mdts: 6,
        sgl: SglSupport::DwordAligned,
        max_queue_entries: 256,
        ..EmulatedConfig::default()
    };
    let mut h = Host::start(cfg);
    let cap = tutti_driver::spec::Cap(h.regs.read64(offset::CAP).unwrap());
    assert_eq!(cap.max_queue_entries(), 256);
    assert!(cap.contiguous_queues_required());
    assert_eq!(h.regs.read32(offset::VS).unwrap(), 0x0001_0400);

    // The data buffer starts mid-page, so PRP2 carries the second half.
    let buf = h.alloc(3 * PAGE);
    assert_ok(h.admin(identify(1, 0, buf.iova_at(0x800), buf.iova_at(PAGE))));
    let bytes = read_buf(&buf, 0x800, 4096);
    let id = IdentifyController::read_from_bytes(&bytes[..]).unwrap();
    assert_eq!(id.serial(), "SN-42");
    assert_eq!(id.model(), "Model X");
    assert_eq!(id.mdts, 6);
    assert_eq!(id.nn, 2);
    assert_eq!(id.sgl_support(), SglSupport::DwordAligned);
    assert_eq!((id.sqes, id.cqes), (0x66, 0x44));
    assert!(id.supports_write_zeroes() && id.supports_dataset_management());
    assert!(id.volatile_write_cache());

    assert_ok(h.admin(identify(0, 2, buf.iova(), 0)));
    let ns = IdentifyNamespace::read_from_bytes(&read_buf(&buf, 0, 4096)[..]).unwrap();
    assert_eq!((ns.nsze, ns.ncap, ns.nuse), (4096, 4096, 4096));
    assert_eq!(ns.lba_size(), Some(4096));
    assert_eq!(ns.nlbaf, 1);
    assert_eq!(ns.dlfeat & 0x7, 1, "deallocated blocks read as zeroes");

    assert_ok(h.admin(identify(2, 1, buf.iova(), 0)));
    let list = read_buf(&buf, 0, 12);
    assert_eq!(list, [2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);

    assert_status(h.admin(identify(0, 3, buf.iova(), 0)), Status::INVALID_NAMESPACE);
    assert_status(h.admin(identify(0x10, 0, buf.iova(), 0)), Status::INVALID_FIELD);
    assert_status(h.admin(sqe(0x7f)), Status::INVALID_OPCODE);
    let mut sgl = identify(1, 0, buf.iova(), 0);
    sgl.set_psdt(Psdt::SglContiguousMeta);
    let c = h.admin(sgl);
    assert_status(c, Status::INVALID_FIELD);
    assert!(c.status().dnr());
    // Abort: completes, reporting that nothing was aborted.
    let c = h.admin(SubmissionEntry { cdw10: 5 << 16, ..sqe(0x08) });
    assert_ok(c);
    assert_eq!(c.dw0 & 1, 1);
    assert_eq!(h.ctrl.stats().admin_commands, 8);
}

#[test]
fn io_queue_creation_follows_the_rules() {
    let cfg = EmulatedConfig { max_io_queue_pairs: 4, max_queue_entries: 64, ..EmulatedConfig::default() };
    let mut h = Host::start(cfg);
    let c = h.admin(set_queues(99, 99));
    assert_ok(c);
    assert_eq!(c.dw0, 3 | 3 << 16, "granted 4 SQs and 4 CQs, 0-based");
    let get = h.admin(SubmissionEntry { cdw10: 0x07, ..sqe(0x0a) });
    assert_eq!(get.dw0, 3 | 3 << 16);

    let mem = h.alloc(64 * 64);
    assert_status(h.admin(create_cq(5, 16, mem.iova())), Status::INVALID_QID);
    assert_status(h.admin(create_cq(0, 16, mem.iova())), Status::INVALID_QID);
    assert_status(h.admin(create_cq(1, 65, mem.iova())), Status::INVALID_QUEUE_SIZE);
    assert_status(h.admin(create_cq(1, 1, mem.iova())), Status::INVALID_QUEUE_SIZE);
    assert_status(h.admin(create_cq(1, 16, mem.iova_at(0x100))), Status::INVALID_FIELD);
    let mut not_contiguous = create_cq(1, 16, mem.iova());
    not_contiguous.cdw11 = 0;
    assert_status(h.admin(not_contiguous), Status::INVALID_FIELD);

    let shared_cq = Ring::new(&*h.dma, 1, 16, 32);
    assert_ok(h.admin(create_cq(1, 32, shared_cq.cq.iova())));
    assert_status(h.admin(create_cq(1, 32, shared_cq.cq.iova())), Status::INVALID_QID);
    assert_status(h.admin(create_sq(1, 16, 2, mem.iova())), Status::CQ_INVALID);
    assert_status(h.admin(create_sq(1, 16, 0, mem.iova())), Status::CQ_INVALID);
    assert_ok(h.admin(create_sq(1, 16, 1, shared_cq.sq.iova())));
    let second_sq = h.alloc(16 * 64);
    assert_ok(h.admin(create_sq(2, 16, 1, second_sq.iova())));
    assert_status(h.admin(set_queues(1, 1)), Status::COMMAND_SEQUENCE_ERROR);
    assert_status(h.admin(delete(0x04, 1)), Status::INVALID_QUEUE_DELETION);

    // Two SQs completing into one CQ: SQ 1 through `shared_cq`, SQ 2 placed by hand.
    let mut ring = shared_cq;
    ring.submit(&*h.regs, sqe(0x00).with_nsid(1), 7);
    let c = ring.reap(&*h.regs);
    assert_eq!((c.cid(), c.sq_id(), c.sq_head()), (7, 1, 1));
    second_sq
        .write_obj(0, &{
            let mut e = sqe(0x00).with_nsid(1);
            e.set_cid(8);
            e
        })
        .unwrap();
    h.regs.write32(sq_tail_doorbell(2, 0), 1).unwrap();
    let c = ring.reap(&*h.regs);
    assert_eq!((c.cid(), c.sq_id(), c.sq_head()), (8, 2, 1));
    assert_ok(c);

    assert_ok(h.admin(delete(0x00, 1)));
    assert_ok(h.admin(delete(0x00, 2)));
    assert_status(h.admin(delete(0x00, 2)), Status::INVALID_QID);
    assert_ok(h.admin(delete(0x04, 1)));
    assert_status(h.admin(delete(0x04, 1)), Status::INVALID_QID);
    // §5.21.1.7: the count is allocated once, before any I/O queue is created, and does not
    // change until a reset, even with every I/O queue deleted again (QEMU's controller agrees).
    assert_status(h.admin(set_queues(1, 1)), Status::COMMAND_SEQUENCE_ERROR);
    assert_status(h.admin(create_cq(5, 16, mem.iova())), Status::INVALID_QID);
}

#[test]
fn prp_write_then_read_round_trips() {
    let mut h = Host::start(EmulatedConfig::default());
    let mut q = h.create_pair(1, 16);
    // 64 KiB from a buffer that starts 0x200 into a page: PRP1 + a 16-entry list.
    let len = 64 * 1024;
    let src = h.alloc(len + PAGE);
    let bytes = pattern(len, 3);
    src.copy_in(0x200, &bytes).unwrap();
    let list = h.alloc(PAGE);
    build_prp_list(&list, &src, 1, 16);
    assert_ok(h.io(&mut q, rw(0x01, 100, 128, src.iova_at(0x200), list.iova())));

    // Read back into page-aligned memory: PRP1 + 15-entry list starting mid-page.
    let dst = h.alloc(len);
    let list = h.alloc(PAGE);
    for i in 0..15 {
        list.write_obj(0x800 + i * 8, &dst.iova_at((i + 1) * PAGE)).unwrap();
    }
    assert_ok(h.io(&mut q, rw(0x02, 100, 128, dst.iova(), list.iova_at(0x800))));
    assert!(read_buf(&dst, 0, len) == bytes, "read data differs from written data");
    let s = h.ctrl.stats();
    assert_eq!((s.bytes_written, s.bytes_read, s.commands, s.errors), (len as u64, len as u64, 2, 0));
}

#[test]
fn chained_prp_lists_round_trip() {
    // No MDTS limit, so one command can need more than one list page.
    let cfg = EmulatedConfig { mdts: 0, ..EmulatedConfig::default() };
    let mut h = Host::start(cfg);
    let mut q = h.create_pair(1, 4);
    let pages = 600; // PRP1 + 599 entries: 511 + chain on list page 1, 88 on page 2
    let src = h.alloc(pages * PAGE);
    let bytes = pattern(pages * PAGE, 9);
    src.copy_in(0, &bytes).unwrap();
    let list = h.alloc(2 * PAGE);
    build_prp_list(&list, &src, 1, pages - 1);
    let nlb = (pages * PAGE / 512) as u32;
    assert_ok(h.io(&mut q, rw(0x01, 0, nlb, src.iova(), list.iova())));
    let dst = h.alloc(pages * PAGE);
    let list = h.alloc(2 * PAGE);
    build_prp_list(&list, &dst, 1, pages - 1);
    assert_ok(h.io(&mut q, rw(0x02, 0, nlb, dst.iova(), list.iova())));
    assert!(read_buf(&dst, 0, pages * PAGE) == bytes);
}

#[test]
fn sgl_write_then_read_round_trips() {
    let mut h = Host::start(EmulatedConfig::default());
    let mut q = h.create_pair(1, 16);
    // Three scattered pieces described by a Last Segment list.
    let a = h.alloc(PAGE);
    let b = h.alloc(PAGE);
    let bytes = pattern(1536, 5);
    a.copy_in(0x10, &bytes[..700]).unwrap();
    b.copy_in(0, &bytes[700..1200]).unwrap();
    a.copy_in(0x800, &bytes[1200..]).unwrap();
    let seg = h.alloc(PAGE);
    let descs = [
        SglDescriptor::data_block(a.iova_at(0x10), 700),
        SglDescriptor::data_block(b.iova(), 500),
        SglDescriptor::data_block(a.iova_at(0x800), 336),
    ];
    for (i, d) in descs.iter().enumerate() {
        seg.write_obj(i * 16, d).unwrap();
    }
    let last = SglDescriptor::last_segment(seg.iova(), 48);
    assert_ok(h.io(&mut q, rw_sgl(0x01, 8, 3, last)));

    // Read back as one Data Block in SGL1.
    let dst = h.alloc(PAGE);
    assert_ok(h.io(&mut q, rw_sgl(0x02, 8, 3, SglDescriptor::data_block(dst.iova_at(3), 1536))));
    assert!(read_buf(&dst, 3, 1536) == bytes);

    // Bit bucket: drop the first block, keep the other two.
    dst.fill(0);
    seg.write_obj(0, &SglDescriptor::bit_bucket(512)).unwrap();
    seg.write_obj(16, &SglDescriptor::data_block(dst.iova(), 1024)).unwrap();
    assert_ok(h.io(&mut q, rw_sgl(0x02, 8, 3, SglDescriptor::last_segment(seg.iova(), 32))));
    assert!(read_buf(&dst, 0, 1024) == bytes[512..]);
    // A bit bucket in a write is refused, as is an SGL shorter than the transfer.
    let c = h.io(&mut q, rw_sgl(0x01, 8, 3, SglDescriptor::last_segment(seg.iova(), 32)));
    assert_status(c, Status::SGL_TYPE_INVALID);
    let c = h.io(&mut q, rw_sgl(0x02, 8, 3, SglDescriptor::data_block(dst.iova(), 1024)));
    assert_status(c, Status::DATA_SGL_LENGTH_INVALID);
}

#[test]
fn sgl_is_refused_without_sgl_support() {
    let mut h = Host::start(EmulatedConfig { sgl: SglSupport::None, ..EmulatedConfig::default() });
    let mut q = h.create_pair(1, 4);
    let buf = h.alloc(PAGE);
    let c = h.io(&mut q, rw_sgl(0x02, 0, 1, SglDescriptor::data_block(buf.iova(), 512)));
    assert_status(c, Status::INVALID_FIELD);
}

#[test]
fn malformed_io_commands_get_spec_statuses() {
    let mut h = Host::start(EmulatedConfig::default()); // 256 MiB of 512 B blocks, MDTS 5 (128 KiB)
    let blocks = (256u64 << 20) / 512;
    let mut q = h.create_pair(1, 16);
    let buf = h.alloc(2 * PAGE);
    let c = h.io(&mut q, rw(0x02, blocks - 1, 2, buf.iova(), buf.iova_at(PAGE)));
    assert_status(c, Status::LBA_OUT_OF_RANGE);
    assert!(c.status().dnr());
    assert_ok(h.io(&mut q, rw(0x02, blocks - 2, 2, buf.iova(), 0)));
    assert_status(h.io(&mut q, rw(0x02, 0, 1, buf.iova() + 2, 0)), Status::PRP_OFFSET_INVALID);
    assert_status(
        h.io(&mut q, rw(0x02, 0, 8, buf.iova_at(0x100), buf.iova_at(PAGE + 8))),
        Status::PRP_OFFSET_INVALID,
    );
    assert_status(h.io(&mut q, rw(0x02, 0, 1, 0x1000, 0)), Status::DATA_TRANSFER_ERROR);
    assert!(h.ctrl.stats().iommu_faults >= 1);
    assert_status(h.io(&mut q, rw(0x02, 0, 257, buf.iova(), 0)), Status::INVALID_FIELD); // over MDTS
    assert_status(h.io(&mut q, rw(0x02, 0, 1, buf.iova(), 0).with_nsid(0)), Status::INVALID_NAMESPACE);
    assert_status(h.io(&mut q, rw(0x02, 0, 1, buf.iova(), 0).with_nsid(2)), Status::INVALID_NAMESPACE);
    assert_status(h.io(&mut q, sqe(0x7e).with_nsid(1)), Status::INVALID_OPCODE);
    let mut reserved = rw(0x02, 0, 1, buf.iova(), 0);
    reserved.cdw0 |= 3 << 14;
    assert_status(h.io(&mut q, reserved), Status::INVALID_FIELD);
    assert_ok(h.io(&mut q, sqe(0x00).with_nsid(0xffff_ffff)));
    assert_status(h.io(&mut q, sqe(0x00).with_nsid(7)), Status::INVALID_NAMESPACE);
    assert_eq!(h.ctrl.stats().errors, 10);
}

#[test]
fn write_zeroes_and_deallocate_read_back_as_zeroes() {
    let mut h = Host::start(EmulatedConfig::default());
    let mut q = h.create_pair(1, 8);
    let buf = h.alloc(2 * PAGE);
    let bytes = pattern(8 * 512, 1);
    buf.copy_in(0, &bytes).unwrap();
    assert_ok(h.io(&mut q, rw(0x01, 0, 8, buf.iova(), buf.iova_at(PAGE))));
    let wz = SubmissionEntry { nsid: 1, cdw10: 1, cdw12: 1, ..sqe(0x08) }; // LBAs 1..=2
    assert_ok(h.io(&mut q, wz));
    let ranges = h.alloc(PAGE);
    // Range: attributes, NLB 2, SLBA 5.
    ranges.copy_in(0, &[0u8; 4]).unwrap();
    ranges.copy_in(4, &2u32.to_le_bytes()).unwrap();
    ranges.copy_in(8, &5u64.to_le_bytes()).unwrap();
    let dsm = SubmissionEntry { nsid: 1, dptr: [ranges.iova(), 0], cdw10: 0, cdw11: 1 << 2, ..sqe(0x09) };
    assert_ok(h.io(&mut q, dsm));
    buf.fill(0xff);
    assert_ok(h.io(&mut q, rw(0x02, 0, 8, buf.iova(), buf.iova_at(PAGE))));
    let out = read_buf(&buf, 0, 8 * 512);
    for lba in 0..8 {
        let block = &out[lba * 512..(lba + 1) * 512];
        if [1, 2, 5, 6].contains(&lba) {
            assert!(block.iter().all(|&b| b == 0), "LBA {lba} should read as zeroes");
        } else {
            assert_eq!(block, &bytes[lba * 512..(lba + 1) * 512], "LBA {lba} changed");
        }
    }
    // A range past the end is refused and deallocates nothing.
    ranges.copy_in(8, &u64::MAX.to_le_bytes()).unwrap();
    assert_status(h.io(&mut q, dsm), Status::LBA_OUT_OF_RANGE);
}

#[test]
fn a_dropped_completion_never_appears() {
    let mut h = Host::start(EmulatedConfig::default());
    let mut q = h.create_pair(1, 8);
    h.ctrl.faults().drop_next(FaultMatch { qid: Some(1), opcode: Some(0x01), ..Default::default() });
    let buf = h.alloc(PAGE);
    buf.copy_in(0, &pattern(512, 4)).unwrap();
    q.place(rw(0x01, 3, 1, buf.iova(), 0), 10);
    q.place(sqe(0x00).with_nsid(1), 11);
    q.ring_sq(&*h.regs);
    let c = q.reap(&*h.regs);
    assert_eq!(c.cid(), 11);
    assert_eq!(c.sq_head(), 2, "the dropped command was still consumed from the SQ");
    q.assert_quiet();
    assert_eq!(h.ctrl.stats().dropped_completions, 1);
    // The write itself was executed.
    let dst = h.alloc(PAGE);
    assert_ok(h.io(&mut q, rw(0x02, 3, 1, dst.iova(), 0)));
    assert_eq!(read_buf(&dst, 0, 512), pattern(512, 4));
}

#[test]
fn delayed_and_failed_commands() {
    let mut h = Host::start(EmulatedConfig::default());
    let mut q = h.create_pair(1, 8);
    let delay = FaultAction::Delay(Duration::from_millis(50));
    h.ctrl.faults().inject(FaultMatch { lba: Some(0..1), ..Default::default() }, delay, Some(1));
    let buf = h.alloc(PAGE);
    q.place(rw(0x01, 0, 1, buf.iova(), 0), 1);
    q.place(rw(0x01, 1, 1, buf.iova(), 0), 2);
    q.ring_sq(&*h.regs);
    // Both are fetched together; the delayed one completes second.
    let first = q.reap(&*h.regs);
    let second = q.reap(&*h.regs);
    assert_eq!((first.cid(), second.cid()), (2, 1));
    assert_ok(second);
    assert_eq!(second.sq_head(), 2);

    h.ctrl
        .faults()
        .fail_next(FaultMatch { opcode: Some(0x02), ..Default::default() }, Status::UNRECOVERED_READ_ERROR);
    buf.fill(0xaa);
    let c = h.io(&mut q, rw(0x02, 0, 1, buf.iova(), 0));
    assert_eq!(c.status(), Status::UNRECOVERED_READ_ERROR);
    assert_eq!(read_buf(&buf, 0, 4), [0xaa; 4], "a failed command moves no data");
}

#[test]
fn the_cost_model_delays_but_completes() {
    let cfg = EmulatedConfig {
        cost: tutti_emulator::CostModel {
            per_command: Duration::from_millis(2),
            bytes_per_sec: Some(64 << 20),
            ..Default::default()
        },
        ..EmulatedConfig::default()
    };
    let mut h = Host::start(cfg);
    let mut q = h.create_pair(1, 8);
    let buf = h.alloc(8 * PAGE);
    for i in 0..4u16 {
        q.place(rw(0x01, i as u64 * 8, 8, buf.iova(), 0), i);
    }
    q.ring_sq(&*h.regs);
    let mut cids: Vec<u16> =
        (0..4).map(|_| q.reap(&*h.regs)).inspect(|c| assert_ok(*c)).map(|c| c.cid()).collect();
    cids.sort();
    assert_eq!(cids, [0, 1, 2, 3]);
}

#[test]
fn reads_fetched_during_writes_are_paced_at_the_mixed_rate() {
    let cfg = EmulatedConfig {
        cost: tutti_emulator::CostModel {
            read_bytes_per_sec: Some(64 << 20),
            write_bytes_per_sec: Some(1 << 20),
            mixed: Some(tutti_emulator::MixedModel { efficiency: 0.4, read_share: 0.5 }),
            ..Default::default()
        },
        ..EmulatedConfig::default()
    };
    let mut h = Host::start(cfg);
    let mut q = h.create_pair(1, 16);
    let buf = h.alloc(8 * PAGE);
    // Four 4 KiB writes hold the write channel for ~16 ms; the reads behind them arrive meanwhile.
    for i in 0..4u16 {
        q.place(rw(0x01, i as u64 * 8, 8, buf.iova(), 0), i);
    }
    for i in 4..8u16 {
        q.place(rw(0x02, i as u64 * 8, 8, buf.iova(), 0), i);
    }
    q.ring_sq(&*h.regs);
    for _ in 0..8 {
        assert_ok(q.reap(&*h.regs));
    }
    let s = h.ctrl.stats();
    assert_eq!(s.cost_delayed_commands, 8, "{s:?}");
    assert!(s.mixed_commands >= 4, "the reads were paced as mixed: {s:?}");
    // Each mixed read: 4096 B at 0.5 × 0.4 × 64 MiB/s.
    let per_read = 4096.0 / (0.2 * (64u64 << 20) as f64) * 1e9;
    assert!(s.mixed_nanos as f64 >= 4.0 * per_read * 0.99, "{s:?}");
    assert_eq!((s.bytes_read, s.bytes_written), (4 * 4096, 4 * 4096));
}

#[test]
fn a_cost_model_that_makes_no_sense_is_refused() {
    let cfg = EmulatedConfig {
        cost: tutti_emulator::CostModel {
            read_bytes_per_sec: Some(1 << 30),
            mixed: Some(tutti_emulator::MixedModel { efficiency: 1.5, read_share: 0.5 }),
            ..Default::default()
        },
        ..EmulatedConfig::default()
    };
    let err = EmulatedController::start(cfg).err().expect("refused").to_string();
    assert!(err.contains("mixed efficiency 1.5"), "{err}");
}

#[test]
fn fatal_status_stops_the_controller_until_reset() {
    let mut h = Host::start(EmulatedConfig::default());
    h.ctrl.set_fatal();
    let c = h.wait_csts("CSTS.CFS = 1", |c| c.fatal());
    assert!(c.ready());
    let buf = h.alloc(PAGE);
    h.admin.submit(&*h.regs, identify(1, 0, buf.iova(), 0), 1);
    h.admin.assert_quiet();
    h.disable();
    h.enable();
    assert!(!h.csts().fatal());
    assert_ok(h.admin(identify(1, 0, buf.iova(), 0)));
}

#[test]
fn bad_enable_configuration_raises_cfs() {
    let ctrl = EmulatedController::start(EmulatedConfig::default()).unwrap();
    let (regs, dma) = (ctrl.registers(), ctrl.dma_space());
    let q = dma.alloc(PAGE).unwrap();
    let mut h = Host { ctrl, regs, admin: Ring::new(&*dma, 0, 2, 2), dma, cid: 0 };
    let bad: [(u32, u64, Cc); 4] = [
        (Aqa::new(1, 16).0, q.iova(), cc_enabled()), // one-entry admin SQ
        (Aqa::new(16, 16).0, q.iova() + 0x100, cc_enabled()), // unaligned ASQ
        (Aqa::new(16, 16).0, q.iova(), cc_enabled().with_page_shift(20)), // MPS above MPSMAX
        (Aqa::new(16, 16).0, q.iova(), cc_enabled().with_iosqes(0)),
    ];
    for (aqa, asq, cc) in bad {
        h.regs.write32(offset::AQA, aqa).unwrap();
        h.regs.write64(offset::ASQ, asq).unwrap();
        h.regs.write64(offset::ACQ, q.iova()).unwrap();
        h.regs.write32(offset::CC, cc.0).unwrap();
        let c = h.wait_csts("CSTS.CFS for a bad configuration", |c| c.fatal());
        assert!(!c.ready(), "{cc:?}");
        h.disable();
    }
    h.enable();
}

#[test]
fn shutdown_flushes_file_media() {
    let path = std::env::temp_dir().join(format!("tutti-engine-shutdown-{}", std::process::id()));
    let cfg = EmulatedConfig {
        media: MediaConfig::File(path.clone()),
        namespaces: vec![NamespaceConfig::with_bytes(1 << 20, 4096)],
        ..EmulatedConfig::default()
    };
    let bytes = pattern(PAGE, 8);
    {
        let mut h = Host::start(cfg.clone());
        let mut q = h.create_pair(1, 4);
        let buf = h.alloc(PAGE);
        buf.copy_in(0, &bytes).unwrap();
        assert_ok(h.io(&mut q, rw(0x01, 7, 1, buf.iova(), 0)));
        let cc = cc_enabled().with_shutdown(ShutdownNotification::Normal);
        h.regs.write32(offset::CC, cc.0).unwrap();
        let c = h.wait_csts("CSTS.SHST = complete", |c| c.shutdown_status() == ShutdownStatus::Complete);
        assert!(c.ready());
        // After shutdown the controller takes no more commands.
        q.submit(&*h.regs, sqe(0x00).with_nsid(1), 99);
        q.assert_quiet();
        h.disable();
        assert_eq!(h.csts().shutdown_status(), ShutdownStatus::Normal);
    }
    let mut h = Host::start(cfg);
    let mut q = h.create_pair(1, 4);
    let buf = h.alloc(PAGE);
    assert_ok(h.io(&mut q, rw(0x02, 7, 1, buf.iova(), 0)));
    assert!(read_buf(&buf, 0, PAGE) == bytes);
    drop(h);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn a_full_cq_is_never_overwritten() {
    let mut h = Host::start(EmulatedConfig::default());
    // A 2-entry CQ holds one completion: full when tail + 1 == head.
    let mut q = Ring::new(&*h.dma, 1, 4, 2);
    assert_ok(h.admin(create_cq(1, 2, q.cq.iova())));
    assert_ok(h.admin(create_sq(1, 4, 1, q.sq.iova())));
    let flush = sqe(0x00).with_nsid(1);
    q.place(flush, 1);
    q.place(flush, 2);
    q.ring_sq(&*h.regs);
    let start = Instant::now();
    while !q.posted(0, true) {
        assert!(start.elapsed() < DEADLINE);
        pause(0);
    }
    std::thread::sleep(QUIET);
    assert!(!q.posted(1, true), "the second completion overwrote a full CQ");
    let first = q.peek(0);
    assert_eq!((first.cid(), first.sq_head()), (1, 1), "the second command was not even fetched");
    // Consuming the first entry makes room for the second.
    let c = q.try_reap(&*h.regs).unwrap();
    assert_eq!(c.cid(), 1);
    let c = q.reap(&*h.regs);
    assert_eq!((c.cid(), c.sq_head()), (2, 2));
    // The CQ wrapped: the next entry lands in slot 0 with the phase inverted.
    let c = h.io(&mut q, flush);
    assert!(!c.phase());
    assert_ok(c);
}

#[test]
fn out_of_range_doorbells_are_ignored() {
    let mut h = Host::start(EmulatedConfig::default());
    let mut q = h.create_pair(1, 4);
    q.place(sqe(0x00).with_nsid(1), 1);
    h.regs.write32(sq_tail_doorbell(1, 0), 9).unwrap();
    q.assert_quiet();
    q.ring_sq(&*h.regs);
    assert_eq!(q.reap(&*h.regs).cid(), 1);
    assert!(!h.csts().fatal());
}

#[test]
fn deleting_an_sq_aborts_its_delayed_commands() {
    let mut h = Host::start(EmulatedConfig::default());
    let mut q = h.create_pair(1, 4);
    let stall = FaultAction::Delay(Duration::from_secs(30));
    h.ctrl.faults().inject(FaultMatch { qid: Some(1), ..Default::default() }, stall, Some(1));
    q.submit(&*h.regs, sqe(0x00).with_nsid(1), 5);
    // Delete only once the command has been fetched (it is held back, not queued).
    let start = Instant::now();
    while h.ctrl.stats().commands == 0 {
        assert!(start.elapsed() < DEADLINE);
        std::thread::yield_now();
    }
    assert_ok(h.admin(delete(0x00, 1)));
    // §5.6: the aborted command's completion is posted before the deletion completes.
    assert!(q.posted(0, true));
    let c = q.try_reap(&*h.regs).unwrap();
    assert_eq!((c.cid(), c.sq_id()), (5, 1));
    assert_status(c, Status::ABORTED_SQ_DELETION);
    assert_ok(h.admin(delete(0x04, 1)));
}

#[test]
fn queues_may_be_non_contiguous_when_cap_cqr_is_clear() {
    let mut h =
        Host::start(EmulatedConfig { contiguous_queues_required: false, ..EmulatedConfig::default() });
    let cap = tutti_driver::spec::Cap(h.regs.read64(offset::CAP).unwrap());
    assert!(!cap.contiguous_queues_required());
    // A 128-entry SQ over two pages given in reverse order: entries 0..64 live in
    // the buffer's second page, 64..128 in its first.
    let mut q = Ring::new(&*h.dma, 1, 128, 256);
    let lists = h.alloc(2 * PAGE);
    lists.write_obj(0, &q.sq.iova_at(PAGE)).unwrap();
    lists.write_obj(8, &q.sq.iova()).unwrap();
    lists.write_obj(PAGE, &q.cq.iova()).unwrap();
    let mut cq_cmd = create_cq(1, 256, lists.iova_at(PAGE));
    cq_cmd.cdw11 = 0;
    assert_ok(h.admin(cq_cmd));
    let mut sq_cmd = create_sq(1, 128, 1, lists.iova());
    sq_cmd.cdw11 &= !1;
    assert_ok(h.admin(sq_cmd));
    let n = 70u16;
    for i in 0..n {
        let mut e = sqe(0x00).with_nsid(1);
        e.set_cid(100 + i);
        let slot = i as usize;
        let at = if slot < 64 { PAGE + slot * 64 } else { (slot - 64) * 64 };
        q.sq.write_obj(at, &e).unwrap();
    }
    h.regs.write32(sq_tail_doorbell(1, 0), n as u32).unwrap();
    let cids: Vec<u16> =
        (0..n).map(|_| q.reap(&*h.regs)).inspect(|c| assert_ok(*c)).map(|c| c.cid()).collect();
    assert_eq!(cids, (100..100 + n).collect::<Vec<_>>());
}
