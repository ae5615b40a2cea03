//! The driver benches' batch helper (`driver/benches/common`) must turn every failure into an
//! error: a rejected submission, a failed completion and a completion that never comes (bounded
//! by the deadline, not a hang).

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../benches/common/mod.rs"]
#[allow(dead_code)]
mod common;

use common::{read_batch, BatchError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_driver::command::DataMode;
use tutti_driver::controller::{Controller, ControllerOptions};
use tutti_driver::queue::IoQueuePair;
use tutti_driver::spec::Status;
use tutti_driver::transport::DmaBuffer;
use tutti_emulator::{EmulatedConfig, EmulatedController, FaultAction, FaultMatch};

// Fields drop in order: the queue pair is deleted while the controller still runs.
struct Rig {
    qp: IoQueuePair,
    buf: DmaBuffer,
    _ctrl: Arc<Controller>,
    emu: EmulatedController,
}

fn rig(depth: u32) -> Rig {
    let emu = EmulatedController::start(EmulatedConfig::default()).unwrap();
    let ctrl = Controller::new(emu.registers(), emu.dma_space(), ControllerOptions::default()).unwrap();
    let qp = ctrl.create_io_queue_pair(depth).unwrap();
    let buf = ctrl.dma().alloc(32 * 4096).unwrap();
    Rig { qp, buf, _ctrl: ctrl, emu }
}

fn soon(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

#[test]
fn a_batch_that_completes_reports_every_completion() {
    let mut r = rig(64);
    let mut out = Vec::new();
    let n = read_batch(&mut r.qp, &r.buf, 32, DataMode::Sgl, &mut out, soon(10_000)).unwrap();
    assert_eq!(n, 32);
}

#[test]
fn a_lost_completion_ends_at_the_deadline_with_an_error() {
    let mut r = rig(64);
    r.emu.faults().inject(
        FaultMatch { qid: Some(1), skip: 1, ..Default::default() },
        FaultAction::DropCompletion,
        Some(1),
    );
    let mut out = Vec::new();
    let start = Instant::now();
    let e = read_batch(&mut r.qp, &r.buf, 4, DataMode::Prp, &mut out, soon(300)).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(30), "the wait was not bounded by its deadline");
    match e {
        BatchError::Deadline { got, want, .. } => assert_eq!((got, want), (3, 4)),
        other => panic!("expected a deadline error, got {other}"),
    }
}

#[test]
fn a_failed_completion_is_an_error() {
    let mut r = rig(64);
    let fail = FaultAction::Fail(Status::DATA_TRANSFER_ERROR);
    r.emu.faults().inject(FaultMatch { qid: Some(1), ..Default::default() }, fail, Some(1));
    let mut out = Vec::new();
    let e = read_batch(&mut r.qp, &r.buf, 2, DataMode::Sgl, &mut out, soon(10_000)).unwrap_err();
    assert!(matches!(e, BatchError::Failed { .. }), "expected a failed command, got {e}");
}

#[test]
fn a_rejected_submission_is_an_error() {
    // A queue of depth 4 holds 3 commands: the 4th submission of the batch cannot be placed.
    let mut r = rig(4);
    let mut out = Vec::new();
    let e = read_batch(&mut r.qp, &r.buf, 8, DataMode::Sgl, &mut out, soon(10_000)).unwrap_err();
    assert!(matches!(e, BatchError::Submit { .. }), "expected a submission error, got {e}");
}
