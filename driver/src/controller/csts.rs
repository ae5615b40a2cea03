//! The CC/CSTS handshakes: waiting for CSTS to change within a deadline,
//! Controller Fatal Status, and the §7.6.2 shutdown notification.

use crate::error::{DriverError, Result};
use crate::queue::backoff;
use crate::spec::registers::{offset, ShutdownNotification};
use crate::spec::{Cc, Csts, ShutdownStatus};
use crate::transport::Registers;
use std::time::{Duration, Instant};

/// An error if the controller reports Controller Fatal Status.
pub(super) fn check_fatal(regs: &dyn Registers, name: &str) -> Result<()> {
    if Csts(regs.read32(offset::CSTS)?).fatal() {
        return Err(DriverError::ControllerFatal { device: name.to_string(), context: String::new() });
    }
    Ok(())
}

/// Orderly shutdown (§7.6.2): CC.SHN = normal, wait up to `wait` for SHST = complete.
pub(super) fn shut_down(regs: &dyn Registers, name: &str, wait: Duration) -> Result<()> {
    let cc = Cc(regs.read32(offset::CC)?);
    regs.write32(offset::CC, cc.with_shutdown(ShutdownNotification::Normal).0)?;
    wait_csts(regs, name, wait, "CSTS.SHST=complete after shutdown notification", false, |c| {
        c.shutdown_status() == ShutdownStatus::Complete
    })?;
    tracing::info!(device = %name, "controller shut down");
    Ok(())
}

/// Polls CSTS until `done` holds, CFS appears, or `timeout` passes.
pub(super) fn wait_csts(
    regs: &dyn Registers,
    name: &str,
    timeout: Duration,
    what: &str,
    fatal_is_error: bool,
    done: impl Fn(Csts) -> bool,
) -> Result<()> {
    let start = Instant::now();
    let mut spins = 0;
    loop {
        let csts = Csts(regs.read32(offset::CSTS)?);
        if csts.fatal() && fatal_is_error {
            return Err(DriverError::ControllerFatal {
                device: name.to_string(),
                context: format!(" while waiting for {what}"),
            });
        }
        if done(csts) {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            if csts.fatal() {
                return Err(DriverError::ControllerFatal {
                    device: name.to_string(),
                    context: format!("; gave up after {timeout:?} waiting for {what}"),
                });
            }
            return Err(DriverError::Timeout {
                device: name.to_string(),
                what: what.to_string(),
                waited: timeout,
            });
        }
        backoff(&mut spins);
    }
}
