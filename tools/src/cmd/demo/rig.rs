//! The drives the demo runs on: emulated controllers, or devices bound to vfio-pci.

use super::args::Args;
use crate::emu::EmulatedArgs;
use anyhow::Context;
use tutti_driver::controller::{Controller, ControllerOptions};
use tutti_driver::transport::vfio::{IommuMode, VfioDevice, VfioOptions};
use tutti_emulator::EmulatedController;
use tutti_objstore::DriveSpec;

/// The drives the demo runs on. Emulated controllers live as long as this
/// value, so RAM media survives the store being closed and reopened.
pub(super) enum Rig {
    Emulated {
        emus: Vec<EmulatedController>,
        args: EmulatedArgs,
    },
    /// Each device with the namespaces asked for (empty: every usable one).
    Vfio {
        devices: Vec<(VfioDevice, Vec<u32>)>,
    },
}

impl Rig {
    pub fn start(args: &Args, per_drive: u64) -> anyhow::Result<Rig> {
        if !args.pool_drives.drives.is_empty() {
            let opts = VfioOptions {
                mode: if args.pool_drives.noiommu { IommuMode::NoIommu } else { IommuMode::Type1 },
                ..VfioOptions::default()
            };
            let devices = crate::cmd::identify::group_drives(&args.pool_drives.drives)?
                .into_iter()
                .map(|(bdf, nsids)| {
                    let dev = VfioDevice::open(&bdf, &opts)
                        .with_context(|| format!("opening {bdf} through VFIO"))?;
                    Ok((dev, nsids))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            return Ok(Rig::Vfio { devices });
        }
        let mut emu = args.pool_drives.emu.clone();
        emu.capacity_mib = emu.capacity_mib.max(per_drive.div_ceil(1 << 20));
        let emus = (0..args.pool_drives.emulated as usize)
            .map(|i| Ok(EmulatedController::start(emu.config(i)?)?))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Rig::Emulated { emus, args: emu })
    }

    /// Brings every controller up and returns the pool's drives in order.
    pub fn specs(&self) -> anyhow::Result<Vec<DriveSpec>> {
        let ctrls = match self {
            Rig::Emulated { emus, .. } => emus
                .iter()
                .map(|e| Ok((crate::cmd::identify::bring_up(e)?, Vec::new())))
                .collect::<anyhow::Result<Vec<_>>>()?,
            Rig::Vfio { devices } => devices
                .iter()
                .map(|(d, nsids)| {
                    let c = Controller::new(d.registers(), d.dma_space(), ControllerOptions::default())?;
                    Ok((c, nsids.clone()))
                })
                .collect::<anyhow::Result<Vec<_>>>()?,
        };
        let mut specs = Vec::new();
        for (c, nsids) in ctrls {
            specs.extend(crate::cmd::identify::namespaces_of(&c, &nsids)?);
        }
        Ok(specs)
    }

    pub fn is_emulated(&self) -> bool {
        matches!(self, Rig::Emulated { .. })
    }

    /// File-backed emulated drives are stopped and started again from their
    /// files, as after a process restart; RAM media and real drives stay.
    pub fn restart(self) -> anyhow::Result<(Rig, bool)> {
        match self {
            Rig::Emulated { emus, args } if args.dir.is_some() => {
                let cfgs: Vec<_> = emus.iter().map(|e| e.config().clone()).collect();
                drop(emus);
                let emus = cfgs.into_iter().map(EmulatedController::start).collect::<Result<Vec<_>, _>>()?;
                Ok((Rig::Emulated { emus, args }, true))
            }
            rig => Ok((rig, false)),
        }
    }

    pub fn media(&self) -> &'static str {
        match self {
            Rig::Emulated { args, .. } if args.dir.is_some() => "emulated (file media)",
            Rig::Emulated { .. } => "emulated (RAM media)",
            Rig::Vfio { .. } => "VFIO",
        }
    }
}
