//! `tutti selftest --gio`: the gio_uring round trip on every vfio-bound drive at
//! once — the host executor (the CUDA kernel source compiled for the CPU) turns
//! IOCTXs into NVMe commands on the drives' queues, as the GPU would. Run with
//! SGL data pointers where the controller supports them, then with PRP, in the
//! executor's launch and persistent modes, with the kernel log watched for
//! IOMMU faults. `--emulated --gio` runs the same passes on two emulated
//! controllers (no fault log there).
//!
//! The last pass's ring then recovers every drive — each queue pair deleted
//! and created again through the admin queue — and runs one more verified
//! pass, with a fresh pattern, on the recreated queues.

use anyhow::{bail, Context};
use std::sync::Arc;
use std::time::Duration;
use tutti_driver::controller::Controller;
use tutti_driver::pci::Bdf;
use tutti_driver::transport::vfio::{FaultLog, IommuFault};
use tutti_gio_uring::executor::ExecMode;
use tutti_gio_uring::selftest::{DriveRecovery, Selftest, SelftestOptions, SelftestReport};

/// How long recovery waits for admitted commands to leave a drive's queues
/// (none are in flight between passes; this only bounds a stuck executor).
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// One pass: the data-pointer choice and executor mode, and what it moved.
#[derive(serde::Serialize)]
pub struct GioPass {
    pub force_prp: bool,
    pub mode: &'static str,
    pub report: SelftestReport,
}

/// Every drive of the last pass's ring recovered, and the pass run after it.
#[derive(serde::Serialize)]
pub struct GioRecovery {
    /// The executor mode of the ring that was recovered.
    pub mode: &'static str,
    pub drives: Vec<DriveRecovery>,
    /// The verified pass on the recreated queues.
    pub pass: SelftestReport,
}

#[derive(serde::Serialize)]
pub struct GioReport {
    pub passes: Vec<GioPass>,
    pub recovery: GioRecovery,
}

/// Fails on an IOMMU fault logged for one of the drives since the last drain.
fn check_faults(faults: &mut Option<(&mut FaultLog, &[Bdf])>, what: &str) -> anyhow::Result<()> {
    if let Some((log, bdfs)) = faults.as_mut() {
        let seen: Vec<IommuFault> =
            log.drain()?.into_iter().filter(|f| bdfs.iter().any(|b| f.concerns(b))).collect();
        if !seen.is_empty() {
            bail!(
                "{what} completed, but the IOMMU blocked {} DMA(s): {}",
                seen.len(),
                seen.iter().map(|f| f.message.as_str()).collect::<Vec<_>>().join(" | ")
            );
        }
    }
    Ok(())
}

/// Runs the passes over `ctrls`, then recovers every drive and runs one more
/// pass; fails on any error, failed recovery, differing byte, or (with a fault
/// log) IOMMU fault logged for one of `bdfs`.
pub fn run(
    ctrls: &[Arc<Controller>],
    mut faults: Option<(&mut FaultLog, &[Bdf])>,
    ioctx_per_iocb: u32,
) -> anyhow::Result<GioReport> {
    if let Some((log, _)) = faults.as_mut() {
        log.drain()?;
    }
    let mut passes = Vec::new();
    let mut last = None;
    for (force_prp, mode, mode_name) in [
        (false, ExecMode::Launch, "launch"),
        (true, ExecMode::Launch, "launch"),
        (false, ExecMode::Persistent, "persistent"),
    ] {
        let opts = SelftestOptions {
            mode,
            queue_pairs: 2,
            queue_depth: 64,
            iocbs: 2,
            ioctx_per_iocb,
            command_bytes: 4096,
            force_prp,
            timeout: Duration::from_secs(120),
            ..SelftestOptions::default()
        };
        let what = format!(
            "gio_uring round trip ({mode_name}, {})",
            if force_prp { "PRP" } else { "SGL where supported" }
        );
        // One ring's queue pairs on the controllers at a time.
        drop(last.take());
        let test = Selftest::new(ctrls, &opts).with_context(|| what.clone())?;
        let report = test.pass(0).with_context(|| what.clone())?;
        check_faults(&mut faults, &format!("the {what}"))?;
        passes.push(GioPass { force_prp, mode: mode_name, report });
        last = Some((test, mode_name));
    }
    let (test, mode) = last.context("no gio_uring pass ran")?;
    // A failed recovery names its drive (and the step the controller refused).
    let drives = test.recover_all(RECOVERY_TIMEOUT).context("recovering the drives of the gio_uring ring")?;
    check_faults(&mut faults, "the recovery of the drives")?;
    let names = drives.iter().map(|d| d.drive.as_str()).collect::<Vec<_>>().join(", ");
    let what = format!("the verified gio_uring pass on the recovered queues of {names}");
    let pass = test.pass(1).with_context(|| what.clone())?;
    check_faults(&mut faults, &what)?;
    Ok(GioReport { passes, recovery: GioRecovery { mode, drives, pass } })
}

fn print_pass(prefix: &str, r: &SelftestReport) {
    println!(
        "{prefix}: {} executor, data pointers {}: {} commands, {} bytes verified on {}, \
         queues wrapped at least {} times",
        r.executor,
        r.data_pointers.join("/"),
        r.commands,
        r.bytes_verified,
        r.drives.join(", "),
        r.min_queue_wraps
    );
}

pub fn print(g: &GioReport) {
    for p in &g.passes {
        print_pass("selftest gio", &p.report);
    }
    for d in &g.recovery.drives {
        println!(
            "selftest gio recovery: {}: {} queue pair(s) (qid {}) deleted and created again in {:.1} ms \
             ({} expired command(s), {} dead queue(s) before)",
            d.drive,
            d.qids.len(),
            d.qids.iter().map(u16::to_string).collect::<Vec<_>>().join(", "),
            d.elapsed_us as f64 / 1000.0,
            d.expired_commands,
            d.dead_queues
        );
    }
    print_pass("selftest gio recovery: after recovery", &g.recovery.pass);
}
