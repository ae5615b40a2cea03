//! The emulated controller parks on its register file's wake word when idle:
//! a doorbell write wakes it, and a doorbell written without a wake is still
//! served by the park's timeout.

// Test code: a panic is how a test fails, in helpers as in #[test] functions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_driver::command::Command;
use tutti_driver::controller::{Controller, ControllerOptions};
use tutti_driver::transport::wake::WAKE_PARKED;
use tutti_driver::transport::{DoorbellKind, Registers};
use tutti_emulator::{EmulatedConfig, EmulatedController, NamespaceConfig};

fn cfg(name: &str) -> EmulatedConfig {
    EmulatedConfig {
        name: name.into(),
        namespaces: vec![NamespaceConfig::with_bytes(16 << 20, 512)],
        ..EmulatedConfig::default()
    }
}

/// Waits (bounded) until the controller thread has parked on its wake word.
fn wait_parked(emu: &EmulatedController) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while emu.register_file().wake().load(Ordering::Acquire) != WAKE_PARKED {
        assert!(Instant::now() < deadline, "the idle controller never parked");
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[test]
fn a_doorbell_wakes_a_parked_controller() {
    let emu = EmulatedController::start(cfg("emu-wake")).expect("starts");
    let ctrl =
        Controller::new(emu.registers(), emu.dma_space(), ControllerOptions::default()).expect("bring-up");
    let mut qp = ctrl.create_io_queue_pair(8).expect("queue pair");
    for _ in 0..3 {
        wait_parked(&emu);
        let before = emu.stats();
        let cid = qp.submit(Command::flush(1), 0).expect("fits");
        qp.ring();
        assert!(qp.wait(cid).expect("completes").status.is_success());
        let after = emu.stats();
        // The SQ doorbell's writer swapped the word and woke the thread: the
        // park did not end by its timeout.
        assert!(after.woken > before.woken, "not woken by the doorbell: {before:?} -> {after:?}");
    }
}

/// BAR0 of an emulated controller as a writer that knows nothing of the wake
/// word sees it (a client built before it, say): doorbell stores only.
struct NoWake(Arc<dyn Registers>);

impl Registers for NoWake {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn read32(&self, offset: usize) -> tutti_driver::Result<u32> {
        self.0.read32(offset)
    }
    fn write32(&self, offset: usize, value: u32) -> tutti_driver::Result<()> {
        self.0.write32(offset, value)
    }
    fn doorbell_ptr(&self, offset: usize) -> tutti_driver::Result<(std::ptr::NonNull<u32>, DoorbellKind)> {
        self.0.doorbell_ptr(offset)
    }
}

#[test]
fn a_doorbell_without_a_wake_is_served_by_the_park_timeout() {
    let emu = EmulatedController::start(cfg("emu-nowake")).expect("starts");
    let regs: Arc<dyn Registers> = Arc::new(NoWake(emu.registers()));
    let ctrl = Controller::new(regs, emu.dma_space(), ControllerOptions::default()).expect("bring-up");
    let mut qp = ctrl.create_io_queue_pair(8).expect("queue pair");
    for _ in 0..3 {
        wait_parked(&emu);
        let before = emu.stats();
        let cid = qp.submit(Command::flush(1), 0).expect("fits");
        qp.ring();
        // Bounded by the I/O timeout (10 s): a park without a timeout would never end.
        assert!(qp.wait(cid).expect("completes").status.is_success());
        let after = emu.stats();
        assert_eq!(after.woken, before.woken, "nobody knew the wake word");
    }
}

#[test]
fn an_idle_controller_parks_instead_of_polling() {
    let emu = EmulatedController::start(cfg("emu-idle")).expect("starts");
    let _ctrl =
        Controller::new(emu.registers(), emu.dma_space(), ControllerOptions::default()).expect("bring-up");
    wait_parked(&emu);
    let before = emu.stats().parks;
    std::thread::sleep(Duration::from_millis(300));
    let parks = emu.stats().parks - before;
    // Parks grow to 2 ms, so 300 ms idle is about 150 of them (fewer on a
    // loaded machine, never more); a thread sleeping 200 µs steps (the
    // controller before it parked) woke 1,500 times.
    assert!(parks <= 400, "{parks} parks in 300 ms of idle");
    assert!(parks >= 1);
}
