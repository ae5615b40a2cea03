//! `tutti identify --emulated`: bring a controller up through the same code
//! path a real drive uses and print what it reports.

use crate::emu::EmulatedArgs;
use crate::report::print_json;
use std::sync::Arc;
use tutti_driver::controller::{Controller, ControllerInfo, ControllerOptions};
use tutti_driver::emulated::EmulatedController;

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
    print_info(ctrl.info(), args.json)?;
    drop(ctrl);
    Ok(())
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
    }
    s
}

/// Brings an emulated controller up with default options (helper for other commands).
pub fn bring_up(emu: &EmulatedController) -> anyhow::Result<Arc<Controller>> {
    Ok(Controller::new(emu.registers(), emu.dma_space(), ControllerOptions::default())?)
}
