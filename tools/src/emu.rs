//! Flags that describe emulated drives, shared by every subcommand that can run on them.

use clap::{Args, ValueEnum};
use std::path::PathBuf;
use tutti_driver::spec::SglSupport;
use tutti_emulator::{CostModel, EmulatedConfig, MediaConfig, MixedModel, NamespaceConfig};

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
    /// Commit each emulated drive's RAM when it starts (every page faulted in), as a
    /// drive's capacity exists before it is written: stores to fresh media then cost a
    /// copy, not a kernel page fault per 4 KiB. Takes the drives' full capacity in RAM
    /// at once. Not with --dir.
    #[arg(long, conflicts_with = "dir")]
    pub emu_prefault: bool,
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
    /// Read bandwidth of each emulated drive in GB/s (10^9 bytes/s; unset = unpaced).
    /// Reads and writes are paced on separate channels.
    #[arg(long, value_parser = parse_gbps)]
    pub emu_read_gbps: Option<f64>,
    /// Write bandwidth of each emulated drive in GB/s (unset = unpaced).
    #[arg(long, value_parser = parse_gbps)]
    pub emu_write_gbps: Option<f64>,
    /// Latency added to every emulated I/O command, in microseconds (0..=10000000).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000_000))]
    pub emu_latency_us: u64,
    /// Extra latency of each emulated Read, in microseconds (0..=10000000).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000_000))]
    pub emu_read_latency_us: u64,
    /// Extra latency of each emulated Write, in microseconds (0..=10000000).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000_000))]
    pub emu_write_latency_us: u64,
    /// Bandwidth collapse while reads and writes share an emulated drive: the
    /// drive keeps this fraction, in (0, 1], of its faster direction's rate
    /// (0.4 = a 60% collapse). Needs --emu-read-gbps or --emu-write-gbps.
    #[arg(long, value_parser = parse_fraction)]
    pub emu_mixed_efficiency: Option<f64>,
    /// Share of the mixed bandwidth that reads get, in (0, 1); writes get the
    /// rest. Default 0.5; needs --emu-mixed-efficiency.
    #[arg(long, value_parser = parse_fraction)]
    pub emu_mixed_read_share: Option<f64>,
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
            emu_prefault: false,
            emu_namespaces: 1,
            emu_queue_pairs: 16,
            emu_metadata: 0,
            emu_zoned: false,
            emu_read_gbps: None,
            emu_write_gbps: None,
            emu_latency_us: 0,
            emu_read_latency_us: 0,
            emu_write_latency_us: 0,
            emu_mixed_efficiency: None,
            emu_mixed_read_share: None,
        }
    }
}

fn parse_lba_size(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n @ (512 | 4096)) => Ok(n),
        _ => Err(format!("LBA size must be 512 or 4096, not {s:?}")),
    }
}

fn parse_gbps(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(g) if (0.001..=1000.0).contains(&g) => Ok(g),
        _ => Err(format!("bandwidth must be a number of GB/s in 0.001..=1000, not {s:?}")),
    }
}

fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(format!("must be a fraction in (0, 1], not {s:?}")),
    }
}

impl EmulatedArgs {
    /// The cost model the bandwidth and latency flags describe.
    pub fn cost_model(&self) -> anyhow::Result<CostModel> {
        let rate = |g: Option<f64>| g.map(|g| (g * 1e9) as u64);
        let mixed = match (self.emu_mixed_efficiency, self.emu_mixed_read_share) {
            (None, None) => None,
            (None, Some(_)) => anyhow::bail!("--emu-mixed-read-share needs --emu-mixed-efficiency"),
            (Some(efficiency), share) => {
                if self.emu_read_gbps.is_none() && self.emu_write_gbps.is_none() {
                    anyhow::bail!("--emu-mixed-efficiency needs --emu-read-gbps or --emu-write-gbps");
                }
                let read_share = share.unwrap_or(0.5);
                if read_share >= 1.0 {
                    anyhow::bail!(
                        "--emu-mixed-read-share {read_share} is not below 1 (writes would get nothing)"
                    );
                }
                Some(MixedModel { efficiency, read_share })
            }
        };
        let us = std::time::Duration::from_micros;
        let cost = CostModel {
            per_command: us(self.emu_latency_us),
            bytes_per_sec: None,
            read_bytes_per_sec: rate(self.emu_read_gbps),
            write_bytes_per_sec: rate(self.emu_write_gbps),
            read_latency: us(self.emu_read_latency_us),
            write_latency: us(self.emu_write_latency_us),
            mixed,
        };
        cost.validate().map_err(anyhow::Error::msg)?;
        Ok(cost)
    }

    /// Configuration of emulated drive number `index`.
    pub fn config(&self, index: usize) -> anyhow::Result<EmulatedConfig> {
        if self.capacity_mib == 0 || self.capacity_mib > 1 << 30 {
            anyhow::bail!("--capacity-mib {} is not 1..=2^30", self.capacity_mib);
        }
        let cost = self.cost_model()?;
        let media = match &self.dir {
            Some(d) => {
                std::fs::create_dir_all(d)
                    .map_err(|e| anyhow::anyhow!("cannot create --dir {}: {e}", d.display()))?;
                MediaConfig::File(d.join(format!("emu{index}.img")))
            }
            None if self.emu_prefault => MediaConfig::RamPrefaulted,
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
            cost,
            ..EmulatedConfig::default()
        })
    }
}
