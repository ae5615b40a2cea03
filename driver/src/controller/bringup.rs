//! Bring-up of a controller this process owns, following §7.6.1: CC.EN=0
//! and wait for CSTS.RDY=0 within CAP.TO; program AQA/ASQ/ACQ; CC with the
//! NVM command set, MPS from MPSMIN, IOSQES=6, IOCQES=4; CC.EN=1 and wait
//! for RDY=1; Identify; Set Features (Number of Queues); discover
//! namespaces. CSTS.CFS is checked at every wait.

use super::csts::wait_csts;
use super::owned::{AdminSettings, OwnedAdmin};
use super::DRIVER_MAX_TRANSFER;
use super::{AdminPath, Controller, ControllerInfo, ControllerOptions, NamespaceFormat, NamespaceInfo};
use crate::command::Command;
use crate::error::{DriverError, Result};
use crate::queue::{QueueCore, QueueRings};
use crate::spec::registers::{cq_head_doorbell, offset, sq_tail_doorbell};
use crate::spec::{Aqa, Cap, Cc, CommandSet, IdentifyController, IdentifyNamespace, SglSupport, Version};
use crate::transport::{DmaSpace, Doorbell, Registers};
use std::sync::Arc;

impl Controller {
    /// Brings the controller behind `regs`/`dma` up from whatever state it is in.
    pub fn new(
        regs: Arc<dyn Registers>,
        dma: Arc<dyn DmaSpace>,
        opts: ControllerOptions,
    ) -> Result<Arc<Self>> {
        let name = regs.name().to_string();
        let cap = Cap(regs.read64(offset::CAP)?);
        let version = Version(regs.read32(offset::VS)?);
        tracing::debug!(device = %name, ?cap, %version, "bring-up");
        if !cap.supports_nvm_command_set() {
            return Err(DriverError::Unsupported {
                device: name,
                what: "CAP.CSS: NVM command set not supported".into(),
            });
        }
        let page_shift = 12u32;
        if cap.mps_min_shift() > page_shift || cap.mps_max_shift() < page_shift {
            return Err(DriverError::Unsupported {
                device: name,
                what: format!(
                    "memory page sizes {}..={} bytes exclude the host's 4096",
                    1u64 << cap.mps_min_shift(),
                    1u64 << cap.mps_max_shift()
                ),
            });
        }
        if cap.max_queue_entries() < 2 {
            // §3.1.1: MQES is 0-based and 0 is invalid; a 1-entry queue holds nothing.
            return Err(DriverError::BadDeviceResponse {
                device: name,
                what: format!(
                    "CAP.MQES = {} (queues of {} entry); at least 2 are needed",
                    cap.0 & 0xffff,
                    cap.max_queue_entries()
                ),
            });
        }
        let ready_wait = opts.ready_wait(cap);

        // §7.6.1 step 1: disable and wait for RDY=0.
        let cc = Cc(regs.read32(offset::CC)?);
        if cc.enabled() {
            regs.write32(offset::CC, cc.with_enable(false).0)?;
        }
        wait_csts(&*regs, &name, ready_wait, "CSTS.RDY=0 after disabling", false, |c| !c.ready())?;

        // Admin queue.
        let admin_entries = (opts.admin_queue_entries as u32).clamp(2, cap.max_queue_entries().min(4096));
        let asq = dma.alloc(admin_entries as usize * 64)?;
        let acq = dma.alloc(admin_entries as usize * 16)?;
        regs.write32(offset::AQA, Aqa::new(admin_entries as u16, admin_entries as u16).0)?;
        regs.write64(offset::ASQ, asq.iova())?;
        regs.write64(offset::ACQ, acq.iova())?;
        let cc = Cc::default().with_css(0).with_page_shift(page_shift).with_iosqes(6).with_iocqes(4);
        regs.write32(offset::CC, cc.0)?;
        regs.write32(offset::CC, cc.with_enable(true).0)?;
        wait_csts(&*regs, &name, ready_wait, "CSTS.RDY=1 after enabling", true, |c| c.ready())?;

        let dstrd = cap.dstrd();
        let rings = QueueRings {
            qid: 0,
            depth: admin_entries,
            sq: asq,
            cq: acq,
            sq_doorbell: Doorbell::new(&regs, sq_tail_doorbell(0, dstrd))?,
            cq_doorbell: Doorbell::new(&regs, cq_head_doorbell(0, dstrd))?,
        };
        let core = QueueCore::new(&name, rings)?;
        let page = dma.alloc(4096)?;
        let settings = AdminSettings {
            requested: opts.io_queue_pairs.max(1),
            page_size: 1 << page_shift,
            admin_timeout: opts.admin_timeout,
            ready_wait,
        };
        let admin = OwnedAdmin::new(name.clone(), regs.clone(), core, page, settings);
        let mut info = ControllerInfo {
            device: name.clone(),
            vid: 0,
            model: String::new(),
            serial: String::new(),
            firmware: String::new(),
            version: version.to_string(),
            page_size: 1 << page_shift,
            mdts_bytes: None,
            max_transfer: DRIVER_MAX_TRANSFER,
            sgl: SglSupport::None,
            max_queue_entries: cap.max_queue_entries(),
            contiguous_queues_required: cap.contiguous_queues_required(),
            doorbell_stride: 4 << dstrd,
            io_queue_pairs: 0,
            volatile_write_cache: false,
            write_zeroes: false,
            dataset_management: false,
            ready_timeout_ms: cap.timeout_ms(),
            namespaces: Vec::new(),
        };
        // A controller that fails Identify is shut down again, as dropping it would.
        let identified = identify(&admin, &mut info, cap, opts.io_queue_pairs.max(1));
        if let Err(e) = identified {
            if let Err(down) = admin.shutdown() {
                tracing::warn!(device = %name, error = %down, "shutdown on drop failed");
            }
            return Err(e);
        }
        Ok(Controller::assemble(name, regs, dma, cap, opts, info, Box::new(admin)))
    }
}

/// Identify Controller, Set Features (Number of Queues) and the active
/// namespaces, into `info`; grants the I/O queue ids on `admin`.
fn identify(admin: &OwnedAdmin, info: &mut ControllerInfo, cap: Cap, want: u16) -> Result<()> {
    let name = info.device.clone();
    let bad = |what: String| DriverError::BadDeviceResponse { device: name.clone(), what };
    let id: IdentifyController = admin.read(Command::identify_controller())?;
    if id.sqes_required() > 6 || id.sqes_max() < 6 || id.cqes_required() > 4 || id.cqes_max() < 4 {
        return Err(DriverError::Unsupported {
            device: name.clone(),
            what: format!("queue entry sizes SQES={:#x} CQES={:#x} exclude 64/16 bytes", id.sqes, id.cqes),
        });
    }
    let mdts = id.max_transfer_bytes(cap.mps_min_shift());
    info.vid = id.vid;
    info.model = id.model();
    info.serial = id.serial();
    info.firmware = id.firmware();
    info.mdts_bytes = mdts;
    info.max_transfer = mdts.map_or(DRIVER_MAX_TRANSFER, |m| m.min(DRIVER_MAX_TRANSFER));
    info.sgl = id.sgl_support();
    info.volatile_write_cache = id.volatile_write_cache();
    info.write_zeroes = id.supports_write_zeroes();
    info.dataset_management = id.supports_dataset_management();

    // Number of Queues: DW0 returns the granted counts, 0-based (§5.21.1.7).
    let c = admin.command(Command::set_number_of_queues(want, want), None)?;
    let granted = ((c.dw0 & 0xffff) as u16).min((c.dw0 >> 16) as u16).saturating_add(1).min(want);
    info.io_queue_pairs = granted;
    admin.grant(granted)?;

    // Active namespaces (CNS 02h), then each one's geometry.
    let list: [u32; 1024] = admin.read(Command::identify_active_namespaces(0))?;
    let mut namespaces = Vec::new();
    let mut last = 0u32;
    for &nsid in list.iter().take_while(|&&n| n != 0) {
        // §5.15.4: the list is in increasing order of NSID, each at most NN.
        if nsid > id.nn || nsid <= last || nsid == u32::MAX {
            return Err(bad(format!(
                "active namespace list names nsid {nsid} (after {last}; NN = {})",
                id.nn
            )));
        }
        last = nsid;
        let ns: IdentifyNamespace = admin.read(Command::identify_namespace(nsid))?;
        let lba_size = match namespace_geometry(&ns) {
            Ok(Some(l)) => l,
            Ok(None) => {
                tracing::warn!(device = %name, nsid, nsze = ns.nsze, lbads = ns.active_format().lbads(), "namespace empty or its LBA size unusable; skipped");
                continue;
            }
            Err(what) => return Err(bad(format!("namespace {nsid}: {what}"))),
        };
        let command_set = command_set(admin, &name, nsid)?;
        let format = NamespaceFormat {
            index: ns.format_index(),
            data_size: lba_size,
            metadata_size: ns.active_format().metadata_size(),
            extended: ns.metadata_extended(),
            pi_type: ns.pi_type(),
            pi_first: ns.pi_first(),
        };
        namespaces.push(NamespaceInfo { nsid, blocks: ns.nsze, lba_size, format, command_set });
    }
    info.namespaces = namespaces;
    tracing::info!(device = %name, model = %info.model, namespaces = info.namespaces.len(), io_queue_pairs = granted, "controller ready");
    Ok(())
}

/// The namespace's I/O command set from its Namespace Identification
/// Descriptor list (CNS 03h). A controller that does not implement the
/// list (before NVMe 1.3) has only the NVM command set.
fn command_set(admin: &OwnedAdmin, name: &str, nsid: u32) -> Result<CommandSet> {
    let page: [u8; 4096] = match admin.read(Command::identify_namespace_descriptors(nsid)) {
        Ok(p) => p,
        Err(DriverError::CommandFailed { status, .. }) => {
            tracing::debug!(device = %name, nsid, %status, "no namespace descriptor list; NVM command set assumed");
            return Ok(CommandSet::Nvm);
        }
        Err(e) => return Err(e),
    };
    match crate::spec::identify::descriptor_csi(&page) {
        Ok(csi) => Ok(csi.map_or(CommandSet::Nvm, CommandSet::from_csi)),
        Err(what) => Err(DriverError::BadDeviceResponse {
            device: name.to_string(),
            what: format!("namespace {nsid} descriptor list: {what}"),
        }),
    }
}

/// Checks the sizes Identify Namespace reports: `Ok(Some(lba_size))` for a
/// namespace the driver can address, `Ok(None)` for one to skip (no blocks,
/// or blocks below 512 B or above 64 KiB), an error for values no
/// controller may report (a format index past NLBAF, a size in bytes past
/// 2^64).
pub fn namespace_geometry(ns: &IdentifyNamespace) -> std::result::Result<Option<u32>, String> {
    if ns.format_index() > ns.nlbaf {
        return Err(format!(
            "FLBAS selects LBA format {} of the {} it has (NLBAF {})",
            ns.format_index(),
            ns.nlbaf as u32 + 1,
            ns.nlbaf
        ));
    }
    if ns.nsze == 0 {
        return Ok(None);
    }
    let Some(lba_size) = ns.lba_size() else { return Ok(None) };
    if ns.nsze.checked_mul(lba_size as u64).is_none() {
        return Err(format!("NSZE {} blocks of {lba_size} bytes is more than 2^64 bytes", ns.nsze));
    }
    Ok(Some(lba_size))
}

#[cfg(test)]
mod tests {
    use super::namespace_geometry;
    use crate::spec::{IdentifyNamespace, LbaFormat};

    #[test]
    fn namespace_sizes_from_the_device_are_bounded() {
        let mut ns = IdentifyNamespace::new_zeroed();
        ns.lbaf[0] = LbaFormat::new(12, 0).0;
        ns.nsze = 1 << 20;
        assert_eq!(namespace_geometry(&ns), Ok(Some(4096)));
        ns.nsze = 0;
        assert_eq!(namespace_geometry(&ns), Ok(None));
        ns.nsze = u64::MAX / 1024;
        assert!(namespace_geometry(&ns).unwrap_err().contains("2^64"));
        ns.nsze = 8;
        ns.flbas = 3; // format 3 of 1
        assert!(namespace_geometry(&ns).unwrap_err().contains("NLBAF 0"));
        ns.flbas = 0;
        ns.lbaf[0] = LbaFormat::new(40, 0).0;
        assert_eq!(namespace_geometry(&ns), Ok(None), "a 2^40-byte block is skipped, not shifted");
    }
}
