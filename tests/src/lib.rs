//! Shared fixtures for tutti's cross-crate tests and the QEMU/VFIO harness.

/// The read/write verification every controller is put through; it lives in
/// the driver (`tutti_driver::selftest`) so that `tutti demo` and the guest
/// harness run the very same code.
pub mod verify {
    pub use tutti_driver::selftest::{
        round_trip, ModeReport, SelftestOptions as VerifyOptions, SelftestReport as VerifyReport,
    };
}

use std::sync::Arc;
use tutti_driver::controller::{Controller, ControllerOptions};
use tutti_emulator::{EmulatedConfig, EmulatedController};

/// Starts an emulated controller and brings it up with default options.
pub fn emulated(cfg: EmulatedConfig) -> tutti_driver::Result<(EmulatedController, Arc<Controller>)> {
    let emu = EmulatedController::start(cfg)?;
    let ctrl = Controller::new(emu.registers(), emu.dma_space(), ControllerOptions::default())?;
    Ok((emu, ctrl))
}
