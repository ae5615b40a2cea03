//! `tutti`: administer drives, run the demo, benchmarks, profiling and simulation.

mod cmd;
mod emu;
mod geometry_flags;
mod pattern;
mod plot;
mod progress;
mod report;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tutti",
    version,
    about = "GPU-initiated NVMe I/O for LLM KV cache",
    propagate_version = true
)]
struct Cli {
    /// Log level for diagnostics on stderr (error, warn, info, debug, trace).
    #[arg(long, global = true, default_value = "warn", env = "TUTTI_LOG")]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Bring a controller up and print its identity.
    Identify(cmd::identify::Args),
    /// Administer NVMe drives: list, bind to vfio-pci, unbind, identify through VFIO.
    Admin(cmd::admin::Args),
    /// Verify vfio-bound drives (read/write round trip, IOMMU fault checks); used by the QEMU harness.
    #[command(hide = true)]
    Selftest(cmd::selftest::Args),
    /// The main job: store a long request's KV cache on emulated (or VFIO) drives and load it back, layer by layer.
    Demo(cmd::demo::Args),
    /// Build a slack table for the I/O scheduler from an engine timing trace or the compute model.
    Profile(cmd::profile::Args),
    /// Model the layer-wise pipeline and compare I/O scheduling policies over a cache hit-rate sweep.
    Simulate(cmd::simulate::Args),
    /// Run tuttid: own the drives and the pool, serve engine processes on a Unix socket.
    Serve(cmd::serve::Args),
    /// Show what a running tuttid serves: clients, queue leases, pool usage, stores and loads in flight.
    Status(cmd::status::Args),
    /// Compile the I/O kernels with NVRTC; report registers, spills and parameter tables, write the cubin, check the SASS.
    Kernels(cmd::kernels::Args),
    /// Microbenchmarks (SGL vs PRP, retrieval, command rate), each against a baseline from the same run.
    Bench(cmd::bench::Args),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&cli.log).unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        // Colour codes only where a terminal shows them (not in log files, e.g. `tutti serve 2>log`).
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match &cli.command {
        Command::Identify(a) => cmd::identify::run(a),
        Command::Admin(a) => cmd::admin::run(a),
        Command::Selftest(a) => cmd::selftest::run(a),
        Command::Demo(a) => cmd::demo::run(a),
        Command::Profile(a) => cmd::profile::run(a),
        Command::Simulate(a) => cmd::simulate::run(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::Status(a) => cmd::status::run(a),
        Command::Kernels(a) => cmd::kernels::run(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tutti: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
