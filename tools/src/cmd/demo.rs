//! `tutti demo` (first form): two emulated drives, random data round-tripped
//! through PRP and SGL on several queue pairs, every byte verified.

use crate::emu::EmulatedArgs;
use crate::report::{byte_bar, bytes, print_json};
use tutti_driver::command::DataMode;
use tutti_driver::emulated::EmulatedController;
use tutti_driver::selftest::{round_trip, SelftestOptions, SelftestReport};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Number of emulated drives.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub drives: u32,
    /// I/O queue pairs per drive, each driven by its own thread.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub queue_pairs: u32,
    /// Entries per I/O queue.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(2..=4096))]
    pub queue_depth: u32,
    /// Commands per queue pair and data mode.
    #[arg(long, default_value_t = 512)]
    pub commands: u32,
    #[command(flatten)]
    pub emu: EmulatedArgs,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(serde::Serialize)]
struct DemoReport {
    drives: Vec<SelftestReport>,
    total_bytes_verified: u64,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let opts = SelftestOptions {
        queue_pairs: args.queue_pairs,
        queue_depth: args.queue_depth,
        commands_per_queue: args.commands,
        modes: vec![DataMode::Prp, DataMode::Sgl],
        ..SelftestOptions::default()
    };
    let mut reports = Vec::new();
    for i in 0..args.drives as usize {
        let mut cfg = args.emu.config(i)?;
        cfg.max_io_queue_pairs = cfg.max_io_queue_pairs.max(args.queue_pairs as u16);
        let emu = EmulatedController::start(cfg)?;
        let ctrl = super::identify::bring_up(&emu)?;
        let mut opts = opts.clone();
        if !ctrl.info().sgl.available() {
            opts.modes = vec![DataMode::Prp];
        }
        let bar = byte_bar(0, ctrl.name(), args.json);
        let rep = round_trip(&ctrl, &opts, &|n| {
            bar.set_length(bar.length().unwrap_or(0).max(n));
            bar.set_position(n);
        })?;
        bar.finish_and_clear();
        reports.push(rep);
    }
    let total = reports.iter().flat_map(|r| &r.modes).map(|m| m.bytes_verified).sum();
    let report = DemoReport { drives: reports, total_bytes_verified: total };
    if args.json {
        return print_json(&report);
    }
    for r in &report.drives {
        println!(
            "{}: {} queue pairs × depth {}, {}-byte LBAs, {} queue wraps, {} ms",
            r.device, r.queue_pairs, r.queue_depth, r.lba_size, r.queue_wraps, r.elapsed_ms
        );
        for m in &r.modes {
            println!("  {:<4} {:>7} commands  {:>10} written, {:>10} verified", m.mode, m.commands, bytes(m.bytes_written), bytes(m.bytes_verified));
        }
    }
    println!("verified {} byte for byte", bytes(total));
    Ok(())
}
