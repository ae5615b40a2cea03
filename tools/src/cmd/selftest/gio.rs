//! `tutti selftest --gio`: the gio_uring round trip on every vfio-bound drive at
//! once — the host executor (the CUDA kernel source compiled for the CPU) turns
//! IOCTXs into NVMe commands on the drives' queues, as the GPU would. Run with
//! SGL data pointers where the controller supports them, then with PRP, in the
//! executor's launch and persistent modes, with the kernel log watched for
//! IOMMU faults. `--emulated --gio` runs the same passes on two emulated
//! controllers (no fault log there).

use anyhow::{bail, Context};
use std::sync::Arc;
use std::time::Duration;
use tutti_driver::controller::Controller;
use tutti_driver::pci::Bdf;
use tutti_driver::transport::vfio::{FaultLog, IommuFault};
use tutti_gio_uring::executor::ExecMode;
use tutti_gio_uring::selftest::{round_trip, SelftestOptions, SelftestReport};

/// One pass: the data-pointer choice and executor mode, and what it moved.
#[derive(serde::Serialize)]
pub struct GioPass {
    pub force_prp: bool,
    pub mode: &'static str,
    pub report: SelftestReport,
}

/// Runs the passes over `ctrls` and fails on any error, differing byte, or (with
/// a fault log) IOMMU fault logged for one of `bdfs`.
pub fn run(
    ctrls: &[Arc<Controller>],
    mut faults: Option<(&mut FaultLog, &[Bdf])>,
    ioctx_per_iocb: u32,
) -> anyhow::Result<Vec<GioPass>> {
    if let Some((log, _)) = faults.as_mut() {
        log.drain()?;
    }
    let mut passes = Vec::new();
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
        let report = round_trip(ctrls, &opts).with_context(|| {
            format!(
                "gio_uring round trip ({mode_name}, {})",
                if force_prp { "PRP" } else { "SGL where supported" }
            )
        })?;
        if let Some((log, bdfs)) = faults.as_mut() {
            let seen: Vec<IommuFault> =
                log.drain()?.into_iter().filter(|f| bdfs.iter().any(|b| f.concerns(b))).collect();
            if !seen.is_empty() {
                bail!(
                    "the gio_uring round trip completed, but the IOMMU blocked {} DMA(s): {}",
                    seen.len(),
                    seen.iter().map(|f| f.message.as_str()).collect::<Vec<_>>().join(" | ")
                );
            }
        }
        passes.push(GioPass { force_prp, mode: mode_name, report });
    }
    Ok(passes)
}

pub fn print(passes: &[GioPass]) {
    for p in passes {
        let r = &p.report;
        println!(
            "selftest gio: {} executor, data pointers {}: {} commands, {} bytes verified on {}, \
             queues wrapped at least {} times",
            r.executor,
            r.data_pointers.join("/"),
            r.commands,
            r.bytes_verified,
            r.drives.join(", "),
            r.min_queue_wraps
        );
    }
}
