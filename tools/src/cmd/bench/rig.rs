//! The controllers a benchmark runs on: emulated (RAM or file media) by default,
//! or vfio-bound drives with `--drives`.

use crate::emu::EmulatedArgs;
use anyhow::Context;
use std::sync::Arc;
use tutti_driver::controller::{Controller, ControllerOptions};
use tutti_driver::pci::Bdf;
use tutti_driver::transport::vfio::{IommuMode, VfioDevice, VfioOptions};
use tutti_emulator::EmulatedController;

/// Where the drives come from, as flags.
#[derive(clap::Args, Debug, Clone)]
pub struct DriveArgs {
    /// Number of emulated drives (ignored with --drives).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub emulated: u32,
    /// PCI addresses of vfio-bound drives to run on instead (comma separated).
    /// Their contents are overwritten.
    #[arg(long, value_delimiter = ',')]
    pub drives: Vec<String>,
    /// Use vfio's unsafe no-IOMMU mode (with --drives).
    #[arg(long)]
    pub noiommu: bool,
    #[command(flatten)]
    pub emu: EmulatedArgs,
}

/// Brought-up controllers, namespace 1 of each used. Controllers drop before
/// the devices or emulators behind them.
pub struct Rig {
    pub ctrls: Vec<Arc<Controller>>,
    emus: Vec<EmulatedController>,
    devices: Vec<VfioDevice>,
}

impl Rig {
    /// Starts the drives; emulated ones get at least `min_bytes` of capacity each.
    pub fn start(args: &DriveArgs, min_bytes: u64) -> anyhow::Result<Rig> {
        if !args.drives.is_empty() {
            let opts = VfioOptions {
                mode: if args.noiommu { IommuMode::NoIommu } else { IommuMode::Type1 },
                ..VfioOptions::default()
            };
            let devices = args
                .drives
                .iter()
                .map(|s| {
                    let bdf: Bdf = s.parse()?;
                    VfioDevice::open(&bdf, &opts).with_context(|| format!("opening {bdf} through VFIO"))
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let ctrls = devices
                .iter()
                .map(|d| Ok(Controller::new(d.registers(), d.dma_space(), ControllerOptions::default())?))
                .collect::<anyhow::Result<Vec<_>>>()?;
            return Ok(Rig { ctrls, emus: Vec::new(), devices });
        }
        let mut emu = args.emu.clone();
        emu.capacity_mib = emu.capacity_mib.max(min_bytes.div_ceil(1 << 20));
        let emus = (0..args.emulated as usize)
            .map(|i| Ok(EmulatedController::start(emu.config(i)?)?))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let ctrls = emus.iter().map(super::super::identify::bring_up).collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Rig { ctrls, emus, devices: Vec::new() })
    }

    /// What the drives are, for reports.
    pub fn media(&self) -> String {
        match (&self.emus[..], &self.devices[..]) {
            ([e, ..], _) if matches!(e.config().media, tutti_emulator::MediaConfig::File(_)) => {
                "emulated (file media)".into()
            }
            ([_, ..], _) => "emulated (RAM media)".into(),
            _ => format!("VFIO ({})", self.ctrls.first().map_or("", |c| c.info().model.as_str()).trim()),
        }
    }

    /// The emulated controller behind controller `i`, if it is one.
    pub fn emulator(&self, i: usize) -> Option<&EmulatedController> {
        self.emus.get(i)
    }

    pub fn names(&self) -> Vec<String> {
        self.ctrls.iter().map(|c| c.name().to_string()).collect()
    }

    /// Namespace 1 of controller `i`: (LBA size, blocks).
    pub fn namespace(&self, i: usize) -> anyhow::Result<(u32, u64)> {
        let c = &self.ctrls[i];
        let ns = c.info().namespace(1).with_context(|| format!("{} has no namespace 1", c.name()))?;
        Ok((ns.lba_size, ns.blocks))
    }
}
