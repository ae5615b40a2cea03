//! The selftest's recovery step (`tutti selftest --gio`): passes on one ring,
//! every drive recovered between them, and a recovery the controller refuses
//! reported against the drive it concerns.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;
use tutti_driver::controller::{Controller, ControllerOptions};
use tutti_driver::spec::Status;
use tutti_emulator::{EmulatedConfig, EmulatedController, FaultMatch, NamespaceConfig};
use tutti_gio_uring::selftest::{Selftest, SelftestOptions};
use tutti_gio_uring::GioError;

fn controllers(n: usize) -> (Vec<EmulatedController>, Vec<Arc<Controller>>) {
    let emus: Vec<EmulatedController> = (0..n)
        .map(|c| {
            EmulatedController::start(EmulatedConfig {
                name: format!("emu{c}"),
                namespaces: vec![NamespaceConfig::with_bytes(16 << 20, 512)],
                ..EmulatedConfig::default()
            })
            .expect("emulated controller starts")
        })
        .collect();
    let ctrls = emus
        .iter()
        .map(|e| {
            Controller::new(e.registers(), e.dma_space(), ControllerOptions::default()).expect("bring-up")
        })
        .collect();
    (emus, ctrls)
}

fn opts() -> SelftestOptions {
    SelftestOptions { iocbs: 2, ioctx_per_iocb: 128, queue_depth: 16, ..SelftestOptions::default() }
}

#[test]
fn passes_verify_on_queues_recreated_between_them() {
    let (_emus, ctrls) = controllers(2);
    let test = Selftest::new(&ctrls, &opts()).unwrap();
    let before = test.pass(0).unwrap();
    let recovered = test.recover_all(Duration::from_secs(10)).unwrap();
    assert_eq!(recovered.iter().map(|r| r.drive.as_str()).collect::<Vec<_>>(), ["emu0 ns 1", "emu1 ns 1"]);
    for r in &recovered {
        assert_eq!(r.qids, [1, 2], "both queue pairs of {}", r.drive);
        assert_eq!((r.expired_commands, r.dead_queues), (0, 0));
    }
    let after = test.pass(1).unwrap();
    assert_eq!(after.bytes_verified, before.bytes_verified);
    assert_eq!(after.commands, before.commands);
    // Recovery restarts the tickets: the wraps are those of the pass after it alone.
    assert!(after.min_queue_wraps >= 1 && after.min_queue_wraps <= before.min_queue_wraps);
}

#[test]
fn a_refused_queue_deletion_fails_the_recovery_of_that_drive() {
    let (emus, ctrls) = controllers(2);
    let test = Selftest::new(&ctrls, &opts()).unwrap();
    test.pass(0).unwrap();
    // Delete I/O Submission Queue (admin opcode 0x00) refused on the second controller.
    emus[1].faults().fail_next(
        FaultMatch { qid: Some(0), opcode: Some(0x00), ..Default::default() },
        Status::INTERNAL_ERROR,
    );
    let err = test.recover_all(Duration::from_secs(10)).unwrap_err();
    assert!(matches!(&err, GioError::DriveFailed { drive: 1, .. }), "{err:?}");
    assert!(err.to_string().contains("emu1 ns 1"), "the error names the drive: {err}");
    // Its queues stay closed: a pass cannot verify on them.
    assert!(test.pass(1).is_err());
}
