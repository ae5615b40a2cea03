//! `tutti selftest --drives BDF,...` (hidden): the read/write verification of
//! `tutti demo`, run on vfio-bound drives, with the kernel log watched for IOMMU
//! faults; optionally a negative test that points a command at an unmapped IOVA.
//! The QEMU guest harness runs it; on a real machine it checks a bound drive.
//! `--probe` adds the conformance probes of [`probe`] (also on `--emulated` drives).
//! `--client SOCKET` is one engine process on a running tuttid instead ([`client`]).

mod client;
mod gio;
mod probe;

use crate::progress::byte_bar;
use crate::report::{bytes, print_json};
use anyhow::{bail, Context};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_driver::command::{Command, DataMode};
use tutti_driver::controller::{Controller, ControllerInfo, ControllerOptions};
use tutti_driver::pci::Bdf;
use tutti_driver::selftest::{round_trip, SelftestOptions, SelftestReport};
use tutti_driver::transport::vfio::{
    FaultLog, HugepagePolicy, IommuFault, IommuMode, VfioDevice, VfioOptions,
};
use tutti_driver::transport::IovaSegment;

/// A device address no mapping is ever made at: below 2^39 (every VT-d
/// implementation translates it), far above what the IOVA allocator reaches.
const UNMAPPED_IOVA: u64 = 0x7f_0000_0000;
/// How long the kernel gets to log a fault after the command completed.
const FAULT_LOG_WAIT: Duration = Duration::from_secs(2);

#[derive(clap::Args, Debug)]
pub struct Args {
    /// PCI addresses of vfio-bound drives, comma separated.
    #[arg(long, value_delimiter = ',', required_unless_present_any = ["emulated", "client"])]
    pub drives: Vec<String>,
    /// DMA memory per drive (comma separated, matched to --drives; the last repeats).
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    pub hugepages: Vec<HugepageFlag>,
    /// I/O queue pairs per drive, each driven by its own thread.
    #[arg(long, default_value_t = 4)]
    pub queue_pairs: u32,
    #[arg(long, default_value_t = 32)]
    pub queue_depth: u32,
    /// Commands per queue pair and data mode.
    #[arg(long, default_value_t = 128)]
    pub commands: u32,
    /// Skip the read/write verification.
    #[arg(long)]
    pub no_verify: bool,
    /// Point a Read at an unmapped IOVA and require that the IOMMU fault is caught.
    #[arg(long)]
    pub iommu_negative: bool,
    /// Send the conformance probes (edge-case commands with the status the spec requires).
    #[arg(long)]
    pub probe: bool,
    /// Also run the gio_uring round trip on all drives at once through the host executor
    /// (SGL where supported, then PRP; launch and persistent modes).
    #[arg(long)]
    pub gio: bool,
    /// IOCTXs per IOCB in the --gio round trip (two IOCBs per pass, spread over the drives).
    #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u32).range(1..=2048))]
    pub gio_ioctx: u32,
    /// Probe an emulated controller instead of vfio-bound drives (with --probe).
    #[arg(long)]
    pub emulated: bool,
    #[command(flatten)]
    pub emu: crate::emu::EmulatedArgs,
    /// Be a client of the tuttid listening at this socket: store a request, load it
    /// back into other blocks, verify every byte (no drives are opened here).
    #[arg(long, conflicts_with_all = ["drives", "emulated", "gio", "probe", "iommu_negative"])]
    pub client: Option<std::path::PathBuf>,
    /// With --client: the seed of the request's tokens and bytes.
    #[arg(long, default_value_t = 1, requires = "client")]
    pub seed: u64,
    /// With --client: chunks (KV blocks) in the request.
    #[arg(long, default_value_t = 4, requires = "client", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub chunks: u32,
    /// With --client: stop in the middle of the load and wait to be killed.
    #[arg(long, requires = "client")]
    pub hold: bool,
    /// With --client: first check that tuttid refuses queue memory outside the IOVA
    /// ranges this client mapped, on every VFIO controller.
    #[arg(long, requires = "client")]
    pub refusals: bool,
    /// Use vfio's unsafe no-IOMMU mode.
    #[arg(long)]
    pub noiommu: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum HugepageFlag {
    Auto,
    Always,
    Never,
}

#[derive(serde::Serialize)]
struct DriveReport {
    bdf: Bdf,
    hugepages: String,
    model: String,
    serial: String,
    lba_size: u32,
    blocks: u64,
    max_transfer: u64,
    sgl: bool,
    io_queue_pairs: u16,
    /// Verification of the first usable namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    verify: Option<SelftestReport>,
    /// Verification of every further usable namespace of the drive.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    verify_namespaces: Vec<SelftestReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    negative: Option<Vec<NegativeReport>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    probes: Option<Vec<probe::ProbeResult>>,
}

/// An unmapped-IOVA command and what became of it.
#[derive(serde::Serialize)]
struct NegativeReport {
    command: &'static str,
    iova: u64,
    /// The status the controller posted.
    status: String,
    /// The command counted as failed (by its status or by an IOMMU fault).
    failed: bool,
    faults: Vec<IommuFault>,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    if let Some(socket) = &args.client {
        if args.refusals && client::check_refusals(socket, args.seed)? == 0 {
            bail!("--refusals: the pool at {} has no VFIO controller", socket.display());
        }
        return client::run(socket, args.seed, args.chunks, args.hold, args.json);
    }
    if args.emulated && args.gio {
        let emus = (0..2usize)
            .map(|i| tutti_emulator::EmulatedController::start(args.emu.config(i)?).map_err(Into::into))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let ctrls = emus
            .iter()
            .map(|e| {
                Controller::new(e.registers(), e.dma_space(), ControllerOptions::default())
                    .map_err(Into::into)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let report = gio::run(&ctrls, None, args.gio_ioctx)?;
        if args.json {
            return print_json(&report);
        }
        gio::print(&report);
        return Ok(());
    }
    if args.emulated {
        if !args.probe {
            bail!("--emulated only goes with --probe or --gio (`tutti demo` verifies emulated drives)");
        }
        let emu = tutti_emulator::EmulatedController::start(args.emu.config(0)?)?;
        let ctrl = Controller::new(emu.registers(), emu.dma_space(), ControllerOptions::default())?;
        let results = probe::run(&ctrl)?;
        if args.json {
            return print_json(&results);
        }
        probe::print(ctrl.name(), &results);
        return Ok(());
    }
    let mut log = FaultLog::open()?;
    let mut reports = Vec::new();
    for (i, s) in args.drives.iter().enumerate() {
        let bdf: Bdf = s.parse()?;
        let flag = args.hugepages.get(i).or(args.hugepages.last()).copied().unwrap_or(HugepageFlag::Auto);
        reports.push(drive(&bdf, flag, args, &mut log).with_context(|| format!("self-test of {bdf}"))?);
    }
    let gio = if args.gio {
        let (mut bdfs, mut devices, mut ctrls) = (Vec::new(), Vec::new(), Vec::new());
        for (i, s) in args.drives.iter().enumerate() {
            let bdf: Bdf = s.parse()?;
            let flag = args.hugepages.get(i).or(args.hugepages.last()).copied().unwrap_or(HugepageFlag::Auto);
            let dev = VfioDevice::open(&bdf, &vfio_options(flag, args))
                .with_context(|| format!("opening {bdf}"))?;
            ctrls.push(
                Controller::new(dev.registers(), dev.dma_space(), ControllerOptions::default())
                    .with_context(|| format!("bringing up {bdf}"))?,
            );
            bdfs.push(bdf);
            devices.push(dev);
        }
        let report = gio::run(&ctrls, Some((&mut log, &bdfs)), args.gio_ioctx)?;
        drop(ctrls);
        drop(devices);
        Some(report)
    } else {
        None
    };
    if args.json {
        // Without --gio the report stays the plain per-drive list it always was.
        return match &gio {
            Some(g) => print_json(&serde_json::json!({ "drives": reports, "gio": g })),
            None => print_json(&reports),
        };
    }
    for r in &reports {
        print_report(r);
    }
    if let Some(g) = &gio {
        gio::print(g);
    }
    Ok(())
}

fn vfio_options(flag: HugepageFlag, args: &Args) -> VfioOptions {
    VfioOptions {
        mode: if args.noiommu { IommuMode::NoIommu } else { IommuMode::Type1 },
        hugepages: match flag {
            HugepageFlag::Auto => HugepagePolicy::Auto,
            HugepageFlag::Always => HugepagePolicy::Always,
            HugepageFlag::Never => HugepagePolicy::Never,
        },
        ..VfioOptions::default()
    }
}

fn drive(bdf: &Bdf, flag: HugepageFlag, args: &Args, log: &mut FaultLog) -> anyhow::Result<DriveReport> {
    let dev = VfioDevice::open(bdf, &vfio_options(flag, args))?;
    let ctrl = Controller::new(dev.registers(), dev.dma_space(), ControllerOptions::default())?;
    let info = ctrl.info().clone();
    // Every namespace tutti can use (others are skipped with a warning naming why).
    let usable = crate::cmd::identify::namespaces_of(&ctrl, &[])?;
    let first = usable.first().map_or(1, |d| d.nsid);
    let ns = info.namespace(first).cloned().context("the first usable namespace vanished")?;
    let mut report = DriveReport {
        bdf: bdf.clone(),
        hugepages: format!("{flag:?}").to_lowercase(),
        model: info.model.clone(),
        serial: info.serial.clone(),
        lba_size: ns.lba_size,
        blocks: ns.blocks,
        max_transfer: info.max_transfer,
        sgl: info.sgl.available(),
        io_queue_pairs: info.io_queue_pairs,
        verify: None,
        verify_namespaces: Vec::new(),
        negative: None,
        probes: None,
    };
    log.drain()?;
    if !args.no_verify {
        report.verify = Some(verify(&ctrl, &info, args, first)?);
        for d in usable.iter().skip(1) {
            report.verify_namespaces.push(verify(&ctrl, &info, args, d.nsid)?);
        }
        let faults: Vec<IommuFault> = log.drain()?.into_iter().filter(|f| f.concerns(bdf)).collect();
        if !faults.is_empty() {
            bail!(
                "every command completed, but the IOMMU blocked {} DMA(s) of {bdf}: {}",
                faults.len(),
                faults.iter().map(|f| f.message.as_str()).collect::<Vec<_>>().join(" | ")
            );
        }
    }
    if args.iommu_negative {
        let mut negs = Vec::new();
        // A Read makes the device write host memory; a Write makes it read host memory.
        for write in [false, true] {
            let neg = unmapped_iova(&ctrl, bdf, ns.lba_size, write, log)?;
            if !neg.failed {
                bail!(
                    "a {} pointed at unmapped IOVA {UNMAPPED_IOVA:#x} completed with {} and no IOMMU fault \
                     was logged: a DMA outside our mappings went unnoticed",
                    neg.command,
                    neg.status
                );
            }
            negs.push(neg);
        }
        report.negative = Some(negs);
    }
    if args.probe {
        report.probes = Some(probe::run(&ctrl)?);
    }
    drop(ctrl);
    Ok(report)
}

fn verify(
    ctrl: &Arc<Controller>,
    info: &ControllerInfo,
    args: &Args,
    nsid: u32,
) -> anyhow::Result<SelftestReport> {
    let opts = SelftestOptions {
        nsid,
        queue_pairs: args.queue_pairs.min(info.io_queue_pairs as u32).max(1),
        queue_depth: args.queue_depth,
        commands_per_queue: args.commands,
        modes: if info.sgl.available() { vec![DataMode::Prp, DataMode::Sgl] } else { vec![DataMode::Prp] },
        ..SelftestOptions::default()
    };
    let bar = byte_bar(0, ctrl.name(), args.json);
    let rep = round_trip(ctrl, &opts, &|n| {
        bar.set_length(bar.length().unwrap_or(0).max(n));
        bar.set_position(n);
    })?;
    bar.finish_and_clear();
    Ok(rep)
}

/// A one-block Read or Write whose data pointer is an IOVA nothing is mapped
/// at. The IOMMU must block the controller's DMA; whatever status the
/// controller posts, a fault logged for this device marks the command failed.
fn unmapped_iova(
    ctrl: &Arc<Controller>,
    bdf: &Bdf,
    lba_size: u32,
    write: bool,
    log: &mut FaultLog,
) -> anyhow::Result<NegativeReport> {
    log.drain()?;
    let mut qp = ctrl.create_io_queue_pair(8)?;
    let seg = [IovaSegment { iova: UNMAPPED_IOVA, len: lba_size as u64 }];
    let (cmd, name) =
        if write { (Command::write(1, 0, 1), "Write") } else { (Command::read(1, 0, 1), "Read") };
    let cid = qp.submit_data(cmd, &seg, DataMode::Prp, 0)?;
    qp.ring();
    let status = match qp.wait(cid) {
        Ok(c) => c.status,
        Err(e) => e.status().with_context(|| format!("waiting for the unmapped-IOVA {name}: {e}"))?,
    };
    let deadline = Instant::now() + FAULT_LOG_WAIT;
    let mut faults = Vec::new();
    while faults.is_empty() && Instant::now() < deadline {
        faults.extend(log.drain()?.into_iter().filter(|f| f.concerns(bdf)));
        std::thread::sleep(Duration::from_millis(20));
    }
    let status_text = status.to_string();
    for f in &faults {
        eprintln!(
            "{bdf} qid {} cid {cid}: {name} completed with status {status_text} but the IOMMU blocked its DMA \
             (fault addr {}): counted as FAILED — {}",
            qp.qid(),
            f.addr.map_or("?".into(), |a| format!("{a:#x}")),
            f.message
        );
    }
    Ok(NegativeReport {
        command: name,
        iova: UNMAPPED_IOVA,
        failed: !faults.is_empty() || !status.is_success(),
        status: status_text,
        faults,
    })
}

fn print_report(r: &DriveReport) {
    println!("selftest {}: {} serial {}", r.bdf, r.model, r.serial);
    println!(
        "selftest {}:   {} × {}-byte LBAs ({}), max transfer {}, SGL {}, {} I/O queue pairs, hugepages {}",
        r.bdf,
        r.blocks,
        r.lba_size,
        bytes(r.blocks * r.lba_size as u64),
        bytes(r.max_transfer),
        if r.sgl { "yes" } else { "no" },
        r.io_queue_pairs,
        r.hugepages
    );
    for v in r.verify.iter().chain(&r.verify_namespaces) {
        for m in &v.modes {
            println!(
                "selftest {}:   nsid {} {} verified {} bytes ({}) in {} commands on {} queue pairs",
                r.bdf,
                v.nsid,
                m.mode,
                m.bytes_verified,
                bytes(m.bytes_verified),
                m.commands,
                v.queue_pairs
            );
        }
    }
    if r.verify.is_some() {
        println!("selftest {}:   no IOMMU faults", r.bdf);
    }
    if let Some(p) = &r.probes {
        probe::print(r.bdf.as_str(), p);
    }
    for n in r.negative.iter().flatten() {
        println!(
            "selftest {}:   {} at unmapped IOVA {:#x}: status {}, {} IOMMU fault(s) logged -> command reported \
             FAILED (as it must)",
            r.bdf,
            n.command,
            n.iova,
            n.status,
            n.faults.len()
        );
    }
}
