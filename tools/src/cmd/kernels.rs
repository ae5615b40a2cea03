//! `tutti kernels`: compiles the I/O kernels with NVRTC and reports what the
//! GPU will run: per kernel, registers, spills and the parameter table (read
//! back from the cubin); optionally writes the cubin (a machine without
//! NVRTC 12 loads it through `TUTTI_GIO_CUBIN`, see `scripts/gpu-check`) and
//! checks the machine code with nvdisasm (every doorbell store fenced).

use crate::report::print_json;
use anyhow::{bail, Context};
use std::path::PathBuf;
use std::time::Duration;
use tutti_kernels::{cubin, nvrtc, sass};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Target architecture.
    #[arg(long, default_value = "sm_90")]
    pub arch: String,
    /// Write the cubin here.
    #[arg(long)]
    pub cubin: Option<PathBuf>,
    /// Also disassemble the cubin with nvdisasm and check every doorbell store's fences and the
    /// staged copy loop (128-bit, strong system-scope loads, several in flight).
    #[arg(long)]
    pub sass: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(serde::Serialize)]
struct Kernel {
    name: String,
    registers: u32,
    spill_store_bytes: u32,
    spill_load_bytes: u32,
    stack_bytes: u32,
    shared_bytes: u32,
    param_bytes: Vec<u32>,
    max_threads: Option<u32>,
}

#[derive(serde::Serialize)]
struct SassReport {
    nvdisasm: String,
    doorbell_stores: usize,
    violations: Vec<String>,
    /// The staged path's copy loop (`tt_warp_copy`) in each kernel that has one.
    staged_copy: Vec<CopyLoopReport>,
}

#[derive(serde::Serialize)]
struct CopyLoopReport {
    function: String,
    loads: Vec<String>,
    stores: Vec<String>,
    /// 128-bit loads each lane issues before the first store that needs one.
    loads_in_flight: usize,
    all_128_bit: bool,
    loads_strong_sys: bool,
    local_in_loop: usize,
}

impl CopyLoopReport {
    fn ok(&self) -> bool {
        self.all_128_bit && self.loads_strong_sys && self.loads_in_flight >= 2 && self.local_in_loop == 0
    }
}

#[derive(serde::Serialize)]
struct Report {
    arch: String,
    nvrtc: String,
    cubin_bytes: usize,
    cubin_path: Option<String>,
    kernels: Vec<Kernel>,
    sass: Option<SassReport>,
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let from = nvrtc::load().context("loading NVRTC")?;
    let (major, minor) = nvrtc::version()?;
    let compiled = nvrtc::compile_gio(&args.arch)?;
    if let Some(path) = &args.cubin {
        std::fs::write(path, &compiled.cubin).with_context(|| format!("writing {}", path.display()))?;
    }
    let parsed = cubin::parse(&compiled.cubin)?;
    let kernels = compiled
        .kernels
        .iter()
        .map(|k| {
            let info = parsed.kernel(&k.name);
            Kernel {
                name: k.name.clone(),
                registers: k.registers,
                spill_store_bytes: k.spill_stores,
                spill_load_bytes: k.spill_loads,
                stack_bytes: k.stack_frame,
                shared_bytes: k.shared_bytes,
                param_bytes: info.map(|i| i.param_sizes()).unwrap_or_default(),
                max_threads: info.and_then(|i| i.max_threads),
            }
        })
        .collect();
    let sass = if args.sass {
        let tool = sass::find_nvdisasm()?;
        let text = sass::disassemble(&tool, &compiled.cubin, Duration::from_secs(120))?;
        let funcs = sass::parse(&text);
        let r = sass::check(&funcs)?;
        let staged_copy = funcs
            .iter()
            .filter(|f| f.name.contains("tt_warp_copy"))
            .map(|f| {
                let l = sass::copy_loop(f).unwrap_or_default();
                CopyLoopReport {
                    function: f.name.clone(),
                    all_128_bit: l.all_128_bit(),
                    loads_strong_sys: l.loads_strong_sys(),
                    loads_in_flight: l.in_flight,
                    local_in_loop: l.local,
                    loads: l.loads,
                    stores: l.stores,
                }
            })
            .collect();
        Some(SassReport {
            nvdisasm: tool.display().to_string(),
            doorbell_stores: r.mmio_stores(),
            violations: r
                .violations
                .iter()
                .map(|v| format!("{} @ {:#x}: {}", v.function, v.addr, v.what))
                .collect(),
            staged_copy,
        })
    } else {
        None
    };
    let report = Report {
        arch: args.arch.clone(),
        nvrtc: format!("{major}.{minor} ({from})"),
        cubin_bytes: compiled.cubin.len(),
        cubin_path: args.cubin.as_ref().map(|p| p.display().to_string()),
        kernels,
        sass,
    };
    if args.json {
        print_json(&report)?;
    } else {
        println!(
            "I/O kernels for {} (NVRTC {}), cubin {} bytes",
            report.arch, report.nvrtc, report.cubin_bytes
        );
        println!(
            "  {:<20} {:>9} {:>13} {:>13} {:>8} {:>11}  params (bytes)",
            "kernel", "registers", "spill st (B)", "spill ld (B)", "smem (B)", "max threads"
        );
        for k in &report.kernels {
            println!(
                "  {:<20} {:>9} {:>13} {:>13} {:>8} {:>11}  {:?}",
                k.name,
                k.registers,
                k.spill_store_bytes,
                k.spill_load_bytes,
                k.shared_bytes,
                k.max_threads.map(|t| t.to_string()).unwrap_or_else(|| "-".into()),
                k.param_bytes
            );
        }
        if let Some(p) = &report.cubin_path {
            println!("cubin written to {p}");
        }
        if let Some(s) = &report.sass {
            println!(
                "SASS ({}): {} doorbell stores, {} unfenced",
                s.nvdisasm,
                s.doorbell_stores,
                s.violations.len()
            );
            for v in &s.violations {
                println!("  {v}");
            }
            for c in &s.staged_copy {
                println!(
                    "staged copy {}: {} loads in flight before the first dependent store, {}, {}{}",
                    c.function,
                    c.loads_in_flight,
                    c.loads.first().map_or("no load", String::as_str),
                    c.stores.first().map_or("no store", String::as_str),
                    if c.ok() {
                        ""
                    } else {
                        "  (NOT as required: 128-bit, strong system-scope loads, >= 2 in flight, no spills)"
                    }
                );
            }
        }
    }
    if let Some(s) = &report.sass {
        if !s.violations.is_empty() {
            bail!("{} doorbell stores lack their system fences", s.violations.len());
        }
        if s.staged_copy.is_empty() || s.staged_copy.iter().any(|c| !c.ok()) {
            bail!("the staged copy loop is not 128-bit with several strong system-scope loads in flight");
        }
    }
    Ok(())
}
