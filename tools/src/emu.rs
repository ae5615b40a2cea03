//! Flags that describe emulated drives, shared by every subcommand that can run on them.

use clap::{Args, ValueEnum};
use std::path::PathBuf;
use tutti_driver::emulated::{EmulatedConfig, MediaConfig, NamespaceConfig};
use tutti_driver::spec::SglSupport;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum SglFlag {
    /// SGLs supported without alignment rules (SGLS = 01b).
    On,
    /// SGLs supported, dword alignment required (SGLS = 10b).
    Dword,
    /// No SGL support: PRP only.
    Off,
}

/// Where a pool's drives come from (`demo`, `serve`): emulated ones by
/// default, or NVMe drives bound to vfio-pci with `--drives`.
#[derive(Args, Clone, Debug)]
pub struct PoolDriveArgs {
    /// Number of emulated drives (ignored with --drives).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=32))]
    pub emulated: u32,
    /// PCI addresses of VFIO-bound drives to run on instead (comma separated).
    /// Every usable namespace of each becomes a pool drive; `BDF/NSID` takes
    /// only that namespace. Their contents are overwritten when a pool is
    /// created on them.
    #[arg(long, value_delimiter = ',')]
    pub drives: Vec<String>,
    /// Use vfio's unsafe no-IOMMU mode (with --drives; machines without an IOMMU, testing only).
    #[arg(long)]
    pub noiommu: bool,
    #[command(flatten)]
    pub emu: EmulatedArgs,
}

#[derive(Args, Clone, Debug)]
pub struct EmulatedArgs {
    /// Logical block size of each emulated namespace (512 or 4096).
    #[arg(long, default_value_t = 512, value_parser = parse_lba_size)]
    pub lba_size: u32,
    /// Capacity of each emulated drive in MiB.
    #[arg(long, default_value_t = 256)]
    pub capacity_mib: u64,
    /// Identify MDTS: maximum transfer = 2^MDTS × 4 KiB (0 = no limit).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u8).range(0..=8))]
    pub mdts: u8,
    /// SGL support the emulated controller reports.
    #[arg(long, value_enum, default_value_t = SglFlag::On)]
    pub sgl: SglFlag,
    /// Keep emulated media in files under this directory instead of RAM
    /// (`emu<i>.img`). One process owns them at a time: they are locked while in
    /// use and `emu<i>.img.owner` names the owner; a second user is refused.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Namespaces of each emulated controller, each of --capacity-mib.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub emu_namespaces: u32,
    /// I/O queue pairs each emulated controller grants (real controllers grant 1 to 128 or more).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub emu_queue_pairs: u16,
    /// Metadata bytes per block in the LBA format of the emulated namespaces
    /// (0 = none; a namespace with metadata is refused, as on a real drive).
    #[arg(long, default_value_t = 0)]
    pub emu_metadata: u16,
    /// Report the emulated namespaces as zoned (ZNS command set; refused, as on a real drive).
    #[arg(long)]
    pub emu_zoned: bool,
}

impl Default for EmulatedArgs {
    /// The flags' defaults.
    fn default() -> Self {
        EmulatedArgs {
            lba_size: 512,
            capacity_mib: 256,
            mdts: 5,
            sgl: SglFlag::On,
            dir: None,
            emu_namespaces: 1,
            emu_queue_pairs: 16,
            emu_metadata: 0,
            emu_zoned: false,
        }
    }
}

fn parse_lba_size(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n @ (512 | 4096)) => Ok(n),
        _ => Err(format!("LBA size must be 512 or 4096, not {s:?}")),
    }
}

impl EmulatedArgs {
    /// Configuration of emulated drive number `index`.
    pub fn config(&self, index: usize) -> anyhow::Result<EmulatedConfig> {
        if self.capacity_mib == 0 || self.capacity_mib > 1 << 30 {
            anyhow::bail!("--capacity-mib {} is not 1..=2^30", self.capacity_mib);
        }
        let media = match &self.dir {
            Some(d) => {
                std::fs::create_dir_all(d)
                    .map_err(|e| anyhow::anyhow!("cannot create --dir {}: {e}", d.display()))?;
                MediaConfig::File(d.join(format!("emu{index}.img")))
            }
            None => MediaConfig::Ram,
        };
        Ok(EmulatedConfig {
            name: format!("emu{index}"),
            serial: format!("TUTTI-EMU-{index}"),
            namespaces: vec![
                NamespaceConfig {
                    metadata_size: self.emu_metadata,
                    command_set: if self.emu_zoned { 2 } else { 0 },
                    ..NamespaceConfig::with_bytes(self.capacity_mib << 20, self.lba_size)
                };
                self.emu_namespaces as usize
            ],
            max_io_queue_pairs: self.emu_queue_pairs,
            mdts: self.mdts,
            sgl: match self.sgl {
                SglFlag::On => SglSupport::Supported,
                SglFlag::Dword => SglSupport::DwordAligned,
                SglFlag::Off => SglSupport::None,
            },
            media,
            ..EmulatedConfig::default()
        })
    }
}
