//! `tutti admin`: find NVMe drives, hand them to vfio-pci and back, and
//! identify a bound drive through VFIO.

use crate::report::{bytes, print_json};
use anyhow::Context;
use tutti_driver::controller::{Controller, ControllerOptions};
use tutti_driver::pci::{Bdf, BindOptions, DriveInfo, PciSystem, VfioSupport};
use tutti_driver::transport::vfio::{IommuMode, VfioDevice, VfioOptions};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub command: AdminCommand,
    /// Print the report as JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(clap::Subcommand, Debug)]
pub enum AdminCommand {
    /// Every NVMe PCI function: address, driver, model, capacity, IOMMU group, block devices and their use.
    List,
    /// Take drives from the kernel and bind them to vfio-pci.
    Bind {
        /// PCI addresses (0000:00:04.0 or 00:04.0).
        #[arg(required = true)]
        bdfs: Vec<String>,
        /// Bind even if the drive is in use (mounted, swap, root, md RAID, LVM/device-mapper, ZFS,
        /// open by a process) or its use cannot be checked.
        #[arg(long)]
        force: bool,
        /// Also bind devices that are not NVMe controllers: a device whose memory BAR holds KV
        /// memory the drives DMA into peer to peer (`tutti demo --kv-device`).
        #[arg(long)]
        kv_device: bool,
    },
    /// Give drives bound to vfio-pci back to the kernel's nvme driver.
    Unbind {
        #[arg(required = true)]
        bdfs: Vec<String>,
    },
    /// Bring a vfio-bound drive up through VFIO and print its identity.
    Identify {
        bdf: String,
        /// Use vfio's unsafe no-IOMMU mode (machines without an IOMMU; testing only).
        #[arg(long)]
        noiommu: bool,
    },
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let sys = PciSystem::host();
    match &args.command {
        AdminCommand::List => list(&sys, args.json),
        AdminCommand::Bind { bdfs, force, kv_device } => {
            bind(&sys, &parse_bdfs(bdfs)?, BindOptions { force: *force, kv_device: *kv_device }, args.json)
        }
        AdminCommand::Unbind { bdfs } => unbind(&sys, &parse_bdfs(bdfs)?, args.json),
        AdminCommand::Identify { bdf, noiommu } => identify(&bdf.parse()?, *noiommu, args.json),
    }
}

fn parse_bdfs(list: &[String]) -> anyhow::Result<Vec<Bdf>> {
    Ok(list.iter().map(|s| s.parse::<Bdf>()).collect::<Result<_, _>>()?)
}

#[derive(serde::Serialize)]
struct ListReport {
    vfio: VfioSupport,
    drives: Vec<DriveInfo>,
}

fn list(sys: &PciSystem, json: bool) -> anyhow::Result<()> {
    let report = ListReport { vfio: sys.vfio_support(), drives: sys.drives().context("reading sysfs")? };
    if json {
        return print_json(&report);
    }
    let v = &report.vfio;
    println!(
        "vfio-pci {}, IOMMU {}{}",
        if v.vfio_pci_loaded { "loaded" } else { "not loaded (modprobe vfio-pci)" },
        if v.iommu_enabled { "on" } else { "off" },
        if v.noiommu_enabled { ", unsafe no-IOMMU mode enabled" } else { "" }
    );
    if report.drives.is_empty() {
        println!("no NVMe controllers (PCI class 0x010802) found");
        return Ok(());
    }
    println!(
        "{:<13} {:<9} {:>5}  {:<24} {:>10}  block devices",
        "address", "driver", "group", "model", "capacity"
    );
    for d in &report.drives {
        let f = &d.function;
        let model = match (&d.model, f.driver.as_deref()) {
            (Some(m), _) => m.clone(),
            (None, Some("vfio-pci")) => "(vfio-pci: tutti admin identify)".into(),
            (None, _) => "-".into(),
        };
        let devices: Vec<String> = d
            .block_devices
            .iter()
            .map(|b| {
                let uses: Vec<String> = b.uses.iter().map(describe_use).collect();
                if uses.is_empty() {
                    b.name.clone()
                } else {
                    format!("{} ({})", b.name, uses.join(", "))
                }
            })
            .collect();
        println!(
            "{:<13} {:<9} {:>5}  {:<24} {:>10}  {}",
            f.bdf,
            f.driver.as_deref().unwrap_or("-"),
            f.iommu_group.map_or("-".to_string(), |g| g.to_string()),
            model,
            d.capacity_bytes.map_or("-".to_string(), bytes),
            if devices.is_empty() { "-".to_string() } else { devices.join(", ") }
        );
    }
    Ok(())
}

fn describe_use(u: &tutti_driver::pci::Use) -> String {
    use tutti_driver::pci::Use;
    match u {
        Use::Mounted { device, mountpoint, .. } if mountpoint == "/" => format!("{device}: ROOT FILESYSTEM"),
        Use::Mounted { device, mountpoint, .. } => format!("{device} mounted at {mountpoint}"),
        Use::Swap { device } => format!("{device}: swap"),
        Use::RaidMember { device, array } => format!("{device}: in md array {array}"),
        Use::Holder { device, holder, name, .. } => {
            format!("{device}: under {}", name.as_deref().map_or(holder.clone(), |n| format!("{holder}/{n}")))
        }
        Use::ZfsMember { device } => format!("{device}: ZFS pool member"),
        Use::Busy { device } => format!("{device}: held exclusively"),
        Use::OpenBy { device, pid, comm } => format!("{device}: open by pid {pid} ({comm})"),
        Use::Unverified { source, .. } => format!("in use? {source} unreadable"),
    }
}

#[derive(serde::Serialize)]
struct Outcome<T: serde::Serialize> {
    bdf: Bdf,
    ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<T>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

fn report_outcomes<T: serde::Serialize>(
    results: Vec<(Bdf, tutti_driver::Result<T>)>,
    json: bool,
    describe: impl Fn(&T) -> String,
    verb: &str,
    participle: &str,
) -> anyhow::Result<()> {
    let failed = results.iter().filter(|(_, r)| r.is_err()).count();
    let total = results.len();
    let outcomes: Vec<Outcome<T>> = results
        .into_iter()
        .map(|(bdf, r)| match r {
            Ok(v) => Outcome { bdf, ok: true, result: Some(v), error: None },
            Err(e) => Outcome { bdf, ok: false, result: None, error: Some(e.to_string()) },
        })
        .collect();
    if json {
        print_json(&outcomes)?;
    } else {
        for o in &outcomes {
            match (&o.result, &o.error) {
                (Some(v), _) => println!("{}: {}", o.bdf, describe(v)),
                (_, Some(e)) => println!("{}: {verb} refused: {e}", o.bdf),
                _ => {}
            }
        }
    }
    if failed > 0 {
        anyhow::bail!("{failed} of {total} drive(s) could not be {participle}");
    }
    Ok(())
}

fn bind(sys: &PciSystem, bdfs: &[Bdf], opts: BindOptions, json: bool) -> anyhow::Result<()> {
    use tutti_driver::pci::BindOutcome;
    let results = sys.bind(bdfs, opts);
    let group_dev =
        |g: &Option<u32>| g.map_or(String::new(), |g| format!(", IOMMU group {g} (/dev/vfio/{g})"));
    report_outcomes(
        results,
        json,
        |o| match o {
            BindOutcome::Bound { previous_driver, iommu_group } => format!(
                "bound to vfio-pci (was {}){}",
                previous_driver.as_deref().unwrap_or("unbound"),
                group_dev(iommu_group)
            ),
            BindOutcome::AlreadyBound { iommu_group } => {
                format!("already bound to vfio-pci{}", group_dev(iommu_group))
            }
        },
        "bind",
        "bound",
    )
}

fn unbind(sys: &PciSystem, bdfs: &[Bdf], json: bool) -> anyhow::Result<()> {
    use tutti_driver::pci::UnbindOutcome;
    report_outcomes(
        sys.unbind(bdfs),
        json,
        |o| match o {
            UnbindOutcome::Returned { driver: Some(d) } => {
                format!("returned to the kernel, now bound to {d}")
            }
            UnbindOutcome::Returned { driver: None } => {
                "released by vfio-pci, but no driver claimed it (modprobe nvme?)".to_string()
            }
            UnbindOutcome::NotBound { driver } => {
                format!(
                    "not bound to vfio-pci (driver: {}); nothing to do",
                    driver.as_deref().unwrap_or("none")
                )
            }
        },
        "unbind",
        "unbound",
    )
}

fn identify(bdf: &Bdf, noiommu: bool, json: bool) -> anyhow::Result<()> {
    let opts = VfioOptions {
        mode: if noiommu { IommuMode::NoIommu } else { IommuMode::Type1 },
        ..VfioOptions::default()
    };
    let dev = VfioDevice::open(bdf, &opts)?;
    let ctrl = Controller::new(dev.registers(), dev.dma_space(), ControllerOptions::default())
        .with_context(|| format!("bringing up {bdf} through VFIO"))?;
    super::identify::print_info(ctrl.info(), json)?;
    drop(ctrl);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        admin: Args,
    }

    #[test]
    fn parses_every_subcommand() {
        let a =
            Cli::try_parse_from(["t", "bind", "00:04.0", "0000:00:05.0", "--force", "--json"]).unwrap().admin;
        assert!(a.json);
        assert!(
            matches!(&a.command, AdminCommand::Bind { bdfs, force: true, kv_device: false } if bdfs.len() == 2)
        );
        let a = Cli::try_parse_from(["t", "--json", "list"]).unwrap().admin;
        assert!(a.json && matches!(a.command, AdminCommand::List));
        let a = Cli::try_parse_from(["t", "identify", "00:04.0", "--noiommu"]).unwrap().admin;
        assert!(matches!(a.command, AdminCommand::Identify { noiommu: true, .. }));
        assert!(Cli::try_parse_from(["t", "bind"]).is_err(), "bind needs an address");
    }

    #[test]
    fn every_use_has_a_short_description() {
        use tutti_driver::pci::Use;
        let d = |u: Use| describe_use(&u);
        assert_eq!(
            d(Use::RaidMember { device: "nvme0n1p1".into(), array: "md0".into() }),
            "nvme0n1p1: in md array md0"
        );
        let lv = Use::Holder {
            device: "nvme0n1".into(),
            holder: "dm-0".into(),
            name: Some("vg-a".into()),
            subsystem: None,
        };
        assert_eq!(d(lv), "nvme0n1: under dm-0/vg-a");
        assert_eq!(d(Use::ZfsMember { device: "nvme0n1".into() }), "nvme0n1: ZFS pool member");
        assert_eq!(
            d(Use::OpenBy { device: "nvme0n1".into(), pid: 7, comm: "dd".into() }),
            "nvme0n1: open by pid 7 (dd)"
        );
        let u = Use::Unverified { source: "/proc/swaps".into(), error: "gone".into() };
        assert_eq!(d(u), "in use? /proc/swaps unreadable");
    }

    #[test]
    fn rejects_malformed_addresses() {
        let e = parse_bdfs(&["0000:00:04.0".into(), "nvme0".into()]).unwrap_err().to_string();
        assert!(e.contains("\"nvme0\" is not a PCI address"), "{e}");
    }
}
