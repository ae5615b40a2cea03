//! `tutti identify --emulated`: bring a controller up through the same code
//! path a real drive uses and print what it reports.

use crate::emu::EmulatedArgs;
use crate::report::print_json;
use anyhow::{bail, Context};
use std::sync::Arc;
use tutti_driver::controller::{Controller, ControllerInfo, ControllerOptions};
use tutti_driver::pci::Bdf;
use tutti_emulator::{CostModel, EmulatedController};
use tutti_objstore::DriveSpec;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Identify an emulated controller (the only source this subcommand has;
    /// `tutti admin identify BDF` identifies a VFIO-bound drive).
    #[arg(long, required = true)]
    pub emulated: bool,
    #[command(flatten)]
    pub emu: EmulatedArgs,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let emu = EmulatedController::start(args.emu.config(0)?)?;
    let ctrl = Controller::new(emu.registers(), emu.dma_space(), ControllerOptions::default())?;
    let cost = CostReport::from(&emu.config().cost);
    if args.json {
        print_json(&EmulatedIdentity { info: ctrl.info(), cost_model: cost })?;
    } else {
        println!("{}\n{}", render_info(ctrl.info()), cost.render());
    }
    drop(ctrl);
    Ok(())
}

/// `identify --emulated --json`: what the controller reports, plus the
/// emulated drive's cost model (which no NVMe command reveals).
#[derive(serde::Serialize)]
struct EmulatedIdentity<'a> {
    #[serde(flatten)]
    info: &'a ControllerInfo,
    cost_model: CostReport,
}

/// The emulated drive's bandwidth and latency model, in the flags' units.
#[derive(serde::Serialize)]
struct CostReport {
    /// GB/s (10^9 bytes/s); null = unpaced.
    read_gbps: Option<f64>,
    write_gbps: Option<f64>,
    /// Microseconds.
    latency_us: f64,
    read_latency_us: f64,
    write_latency_us: f64,
    /// null = no collapse when mixed.
    mixed_efficiency: Option<f64>,
    mixed_read_share: Option<f64>,
}

impl From<&CostModel> for CostReport {
    fn from(c: &CostModel) -> Self {
        let gbps = |r: Option<u64>| r.map(|r| r as f64 / 1e9);
        let us = |d: std::time::Duration| d.as_secs_f64() * 1e6;
        CostReport {
            read_gbps: gbps(c.read_bytes_per_sec.or(c.bytes_per_sec)),
            write_gbps: gbps(c.write_bytes_per_sec.or(c.bytes_per_sec)),
            latency_us: us(c.per_command),
            read_latency_us: us(c.read_latency),
            write_latency_us: us(c.write_latency),
            mixed_efficiency: c.mixed.map(|m| m.efficiency),
            mixed_read_share: c.mixed.map(|m| m.read_share),
        }
    }
}

impl CostReport {
    fn render(&self) -> String {
        let gbps = |g: Option<f64>| g.map_or("unpaced".to_string(), |g| format!("{g} GB/s"));
        let mixed = match (self.mixed_efficiency, self.mixed_read_share) {
            (Some(e), Some(r)) => format!("mixed: {e} of the faster rate, reads get {r}"),
            _ => "mixed: no collapse".into(),
        };
        format!(
            "cost model    read {}, write {}; latency {} us (+{} read, +{} write); {mixed}",
            gbps(self.read_gbps),
            gbps(self.write_gbps),
            self.latency_us,
            self.read_latency_us,
            self.write_latency_us
        )
    }
}

/// Prints a controller's identity; shared by `identify --emulated` and `admin identify`.
pub fn print_info(info: &ControllerInfo, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(info);
    }
    println!("{}", render_info(info));
    Ok(())
}

/// The human-readable identity report.
pub fn render_info(info: &ControllerInfo) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let mdts = match info.mdts_bytes {
        Some(b) => format!("{} ({b} bytes)", crate::report::bytes(b)),
        None => "no limit".into(),
    };
    let sgl = match info.sgl {
        tutti_driver::spec::SglSupport::None => "not supported (PRP only)",
        tutti_driver::spec::SglSupport::Supported => "supported",
        tutti_driver::spec::SglSupport::DwordAligned => "supported, dword alignment required",
    };
    let _ = writeln!(s, "device        {}", info.device);
    let _ = writeln!(s, "model         {}", info.model);
    let _ = writeln!(s, "serial        {}", info.serial);
    let _ = writeln!(s, "firmware      {}", info.firmware);
    let _ = writeln!(s, "nvme version  {}", info.version);
    let _ = writeln!(s, "vendor id     {:#06x}", info.vid);
    let _ = writeln!(s, "MDTS          {mdts}");
    let _ = writeln!(s, "SGL           {sgl}");
    let _ = writeln!(s, "page size     {} bytes", info.page_size);
    let _ = writeln!(
        s,
        "queues        {} I/O queue pairs granted, up to {} entries each",
        info.io_queue_pairs, info.max_queue_entries
    );
    let _ = writeln!(s, "write cache   {}", if info.volatile_write_cache { "volatile" } else { "none" });
    let _ = write!(s, "namespaces    {}", info.namespaces.len());
    for ns in &info.namespaces {
        let _ = write!(
            s,
            "\n  nsid {:<4} {:>12} blocks × {:>4} B = {}",
            ns.nsid,
            ns.blocks,
            ns.lba_size,
            crate::report::bytes(ns.bytes())
        );
        let _ = write!(s, "\n             {} command set; {}", ns.command_set, ns.format);
        if let Some((what, _)) = ns.unusable() {
            let _ = write!(s, "\n             not usable by tutti: namespace {} {what}", ns.nsid);
        }
    }
    s
}

/// One `--drives` entry: a PCI address, optionally `/NSID` to use only that namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriveArg {
    pub bdf: Bdf,
    pub nsid: Option<u32>,
}

impl std::str::FromStr for DriveArg {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> anyhow::Result<Self> {
        let (bdf, nsid) = match s.split_once('/') {
            Some((b, n)) => {
                let nsid = n.parse::<u32>().ok().filter(|&n| n != 0 && n != u32::MAX).with_context(|| {
                    format!("--drives {s:?}: {n:?} is not a namespace id (1..=4294967294)")
                })?;
                (b, Some(nsid))
            }
            None => (s, None),
        };
        Ok(DriveArg { bdf: bdf.parse().with_context(|| format!("--drives {s:?}"))?, nsid })
    }
}

/// `--drives` entries grouped by controller, in first-seen order: each
/// controller once, with the namespaces asked for (empty: every usable one).
pub fn group_drives(list: &[String]) -> anyhow::Result<Vec<(Bdf, Vec<u32>)>> {
    let mut out: Vec<(Bdf, Vec<u32>, bool)> = Vec::new();
    for s in list {
        let a: DriveArg = s.parse()?;
        let i = match out.iter().position(|(b, ..)| *b == a.bdf) {
            Some(i) => i,
            None => {
                out.push((a.bdf.clone(), Vec::new(), false));
                out.len() - 1
            }
        };
        let (_, nsids, whole) = &mut out[i];
        match a.nsid {
            None => *whole = true,
            Some(n) if nsids.contains(&n) => bail!("--drives names {}/{n} twice", a.bdf),
            Some(n) => nsids.push(n),
        }
        if *whole && !nsids.is_empty() {
            bail!("--drives names {} both whole and as {}/NSID: give one or the other", a.bdf, a.bdf);
        }
    }
    Ok(out.into_iter().map(|(b, n, _)| (b, n)).collect())
}

/// The pool drives of one controller: the namespaces in `wanted`, each of
/// which must be usable, or (with `wanted` empty) every usable namespace,
/// skipping the others with a warning. No usable namespace is an error that
/// says why each was refused.
pub fn namespaces_of(ctrl: &Arc<Controller>, wanted: &[u32]) -> anyhow::Result<Vec<DriveSpec>> {
    if !wanted.is_empty() {
        return wanted
            .iter()
            .map(|&n| {
                ctrl.data_namespace(n)?;
                Ok(DriveSpec::new(ctrl.clone(), n))
            })
            .collect();
    }
    let mut specs = Vec::new();
    let mut refused = Vec::new();
    for ns in &ctrl.info().namespaces {
        match ctrl.data_namespace(ns.nsid) {
            Ok(_) => specs.push(DriveSpec::new(ctrl.clone(), ns.nsid)),
            Err(e) => {
                tracing::warn!(device = %ctrl.name(), nsid = ns.nsid, error = %e, "namespace skipped");
                refused.push(e.to_string());
            }
        }
    }
    if specs.is_empty() {
        if refused.is_empty() {
            bail!(
                "nvme {}: no active namespace (create one with `nvme create-ns` and attach it)",
                ctrl.name()
            );
        }
        bail!("nvme {}: no namespace tutti can use:\n  {}", ctrl.name(), refused.join("\n  "));
    }
    Ok(specs)
}

/// Brings an emulated controller up with default options (helper for other commands).
pub fn bring_up(emu: &EmulatedController) -> anyhow::Result<Arc<Controller>> {
    Ok(Controller::new(emu.registers(), emu.dma_space(), ControllerOptions::default())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drive_args_take_an_optional_namespace() {
        let a: DriveArg = "00:04.0/2".parse().unwrap();
        assert_eq!((a.bdf.to_string(), a.nsid), ("0000:00:04.0".to_string(), Some(2)));
        assert_eq!("0000:00:04.0".parse::<DriveArg>().unwrap().nsid, None);
        for bad in ["00:04.0/0", "00:04.0/x", "00:04.0/", "zz/1"] {
            assert!(bad.parse::<DriveArg>().is_err(), "{bad}");
        }
        let g = group_drives(&["00:04.0/1".into(), "00:05.0".into(), "00:04.0/2".into()]).unwrap();
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].1, vec![1, 2]);
        assert!(g[1].1.is_empty());
        assert!(group_drives(&["00:04.0".into(), "00:04.0/1".into()]).is_err());
        assert!(group_drives(&["00:04.0/1".into(), "00:04.0/1".into()]).is_err());
    }
}
