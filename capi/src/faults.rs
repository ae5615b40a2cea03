//! Fault injection on emulated drives, so engines and bindings can test how
//! they handle per-block device failures without real broken hardware.

use crate::error::{guard, CapiError};
use crate::jobs::{TUTTI_DIR_LOAD, TUTTI_DIR_STORE};
use crate::runtime::{tutti_runtime_t, Runtime};
use crate::status::TUTTI_OK;
use tutti_driver::emulated::{FaultAction, FaultMatch};
use tutti_driver::spec::{IoOpcode, Status};

const MAX_FAULTS: u32 = 1 << 20;

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
        let emus = &rt.rig.emulated;
        if emus.is_empty() {
            return Err(CapiError::Unsupported("fault injection needs emulated drives".into()));
        }
        let emu = emus.get(drive as usize).ok_or_else(|| {
            CapiError::invalid("drive", format!("{drive} is not one of the {} emulated drives", emus.len()))
        })?;
        let (opcode, status) = match direction {
            TUTTI_DIR_LOAD => (IoOpcode::Read, Status::UNRECOVERED_READ_ERROR),
            TUTTI_DIR_STORE => (IoOpcode::Write, Status::WRITE_FAULT),
            n => {
                return Err(CapiError::invalid(
                    "direction",
                    format!("{n} is not TUTTI_DIR_LOAD (1) or TUTTI_DIR_STORE (2)"),
                ))
            }
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
