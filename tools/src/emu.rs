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
        if self.capacity_mib == 0 {
            anyhow::bail!("--capacity-mib must be at least 1");
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
            namespaces: vec![NamespaceConfig::with_bytes(self.capacity_mib << 20, self.lba_size)],
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
