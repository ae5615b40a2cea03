//! Fault injection on emulated drives, so engines and bindings can test how
//! they handle per-block device failures without real broken hardware.
//!
//! Built only with the `fault-injection` cargo feature (the crate's tests
//! enable it; `cargo build -p tutti-capi --features fault-injection`): a
//! production `libtutti.so` does not export these calls. The header declares
//! them under `#if defined(TUTTI_FAULT_INJECTION)`; define it when building
//! against a library with the feature.

use crate::error::{guard, CapiError, Result};
use crate::jobs::{TUTTI_DIR_LOAD, TUTTI_DIR_STORE};
use crate::runtime::{tutti_runtime_t, Runtime};
use crate::status::TUTTI_OK;
use std::time::Duration;
use tutti_driver::spec::{IoOpcode, Status};
use tutti_emulator::{EmulatedController, FaultAction, FaultMatch};

const MAX_FAULTS: u32 = 1 << 20;
/// Longest deferral `tutti_emulated_delay_next` accepts, in ms.
pub const TUTTI_MAX_EMULATED_DELAY_MS: u32 = 60_000;

/// Emulated drive `drive` of the runtime, and the NVMe opcode of `direction`.
fn target(rt: &Runtime, drive: u32, direction: u32) -> Result<(&EmulatedController, IoOpcode)> {
    let emus = &rt.rig.emulated;
    if emus.is_empty() {
        return Err(CapiError::Unsupported("fault injection needs emulated drives".into()));
    }
    let emu = emus.get(drive as usize).ok_or_else(|| {
        CapiError::invalid("drive", format!("{drive} is not one of the {} emulated drives", emus.len()))
    })?;
    let opcode = match direction {
        TUTTI_DIR_LOAD => IoOpcode::Read,
        TUTTI_DIR_STORE => IoOpcode::Write,
        n => {
            return Err(CapiError::invalid(
                "direction",
                format!("{n} is not TUTTI_DIR_LOAD (1) or TUTTI_DIR_STORE (2)"),
            ))
        }
    };
    Ok((emu, opcode))
}

/// Makes the next `count` NVMe Read (`TUTTI_DIR_LOAD`) or Write
/// (`TUTTI_DIR_STORE`) commands that emulated drive `drive` (pool order)
/// executes fail with a media error (Unrecovered Read Error / Write Fault).
/// The blocks they carried are reported failed by their job; a failed Write
/// during `tutti_store_commit` (the index journal) fails that commit's
/// entries instead. `TUTTI_E_UNSUPPORTED` on VFIO drives.
///
/// # Safety
/// `rt` is a runtime handle (checked).
#[no_mangle]
pub unsafe extern "C" fn tutti_emulated_fail_next(
    rt: *mut tutti_runtime_t,
    drive: u32,
    direction: u32,
    count: u32,
) -> i32 {
    guard("tutti_emulated_fail_next", || {
        let rt = Runtime::get(rt)?;
        let (emu, opcode) = target(&rt, drive, direction)?;
        let status = match opcode {
            IoOpcode::Read => Status::UNRECOVERED_READ_ERROR,
            _ => Status::WRITE_FAULT,
        };
        if count == 0 || count > MAX_FAULTS {
            return Err(CapiError::invalid("count", format!("{count} is not within 1..={MAX_FAULTS}")));
        }
        // By opcode alone: the admin queue reuses these values for other
        // commands, but the store sends no admin commands while it runs.
        let when = FaultMatch { opcode: Some(opcode as u8), ..Default::default() };
        emu.faults().inject(when, FaultAction::Fail(status), Some(count));
        Ok(TUTTI_OK)
    })
}

/// Makes the next NVMe Read (`TUTTI_DIR_LOAD`) or Write (`TUTTI_DIR_STORE`)
/// command that emulated drive `drive` (pool order) fetches execute only
/// `delay_ms` (1..=`TUTTI_MAX_EMULATED_DELAY_MS`) later, as a drive that is
/// slow but not dead. With `delay_ms` past the runtime's `io_timeout_ms` the
/// host gives up on the command first and reports its blocks failed with an
/// unknown outcome (`tutti_job_status_t::unknown`), then the drive moves the
/// data anyway: a late write lands in a quarantined file
/// (`tutti_stats_t::quarantined_files`), a late read in the engine block.
/// On the gio_uring executors the host recovers the drive instead, which
/// aborts the late command: its blocks fail with a known outcome and
/// nothing lands.
/// `TUTTI_E_UNSUPPORTED` on VFIO drives.
///
/// The late command may write engine memory after its job has finished:
/// keep registered memory alive until `delay_ms` has passed.
///
/// # Safety
/// `rt` is a runtime handle (checked).
#[no_mangle]
pub unsafe extern "C" fn tutti_emulated_delay_next(
    rt: *mut tutti_runtime_t,
    drive: u32,
    direction: u32,
    delay_ms: u32,
) -> i32 {
    guard("tutti_emulated_delay_next", || {
        let rt = Runtime::get(rt)?;
        let (emu, opcode) = target(&rt, drive, direction)?;
        if delay_ms == 0 || delay_ms > TUTTI_MAX_EMULATED_DELAY_MS {
            return Err(CapiError::invalid(
                "delay_ms",
                format!("{delay_ms} is not within 1..={TUTTI_MAX_EMULATED_DELAY_MS}"),
            ));
        }
        // By opcode alone, as in `tutti_emulated_fail_next`.
        let when = FaultMatch { opcode: Some(opcode as u8), ..Default::default() };
        emu.faults().delay_execution_next(when, Duration::from_millis(delay_ms as u64));
        Ok(TUTTI_OK)
    })
}
