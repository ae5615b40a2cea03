//! `tutti`: administer drives, run the demo, benchmarks, profiling and simulation.

mod cmd;
mod emu;
mod geometry_flags;
mod pattern;
mod plot;
mod progress;
mod report;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::ffi::OsString;

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

/// Which flags of `tutti serve` the command line (or their environment variables) gave.
struct CommandLine<'m>(&'m clap::ArgMatches);

impl cmd::serve::config::Given for CommandLine<'_> {
    fn given(&self, flag: &str) -> bool {
        let given = |m: &clap::ArgMatches, id: &str| {
            matches!(
                m.value_source(id),
                Some(clap::parser::ValueSource::CommandLine | clap::parser::ValueSource::EnvVariable)
            )
        };
        let cmd = Cli::command();
        let find = |c: &clap::Command| {
            c.get_arguments().find(|a| a.get_long() == Some(flag)).map(|a| a.get_id().as_str().to_string())
        };
        if let Some(id) = find(&cmd) {
            return given(self.0, &id);
        }
        match (cmd.find_subcommand("serve").and_then(find), self.0.subcommand_matches("serve")) {
            (Some(id), Some(sub)) => given(sub, &id),
            _ => false,
        }
    }
}

/// Checks one key of a config file with the parser of the flag it stands for.
fn check_serve_words(words: &[OsString]) -> Result<(), String> {
    let argv = [OsString::from("tutti"), OsString::from("serve")].into_iter().chain(words.iter().cloned());
    Cli::command().try_get_matches_from(argv).map(|_| ()).map_err(|e| {
        // clap's message and its hints (possible values), without the usage lines.
        let text = e.render().to_string();
        let said: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("Usage:") && !l.starts_with("For more information"))
            .collect();
        said.join(" ").trim_start_matches("error: ").to_string()
    })
}

/// The command line, with the flags of `tutti serve --config FILE` added where the command line
/// gave none.
fn parse() -> Result<Cli, anyhow::Error> {
    let matches = Cli::command().get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let Command::Serve(serve) = &cli.command else { return Ok(cli) };
    let Some(path) = &serve.config else { return Ok(cli) };
    let extra = cmd::serve::config::flags_from_file(path, &CommandLine(&matches), &check_serve_words)?;
    Cli::try_parse_from(std::env::args_os().chain(extra))
        .map_err(|e| anyhow::anyhow!("--config {}: {}", path.display(), e.render().to_string().trim_end()))
}

fn main() -> std::process::ExitCode {
    let cli = match parse() {
        Ok(cli) => cli,
        Err(e) => {
            eprintln!("tutti: error: {e:#}");
            // A usage error, as clap's: the same start would fail the same way (a service
            // manager should not restart it; the unit in contrib/ says so).
            return std::process::ExitCode::from(2);
        }
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_of_serve_has_a_key_and_every_key_a_flag() {
        use cmd::serve::config::{KEYS, NOT_IN_FILE};
        let cli = Cli::command();
        let serve = cli.find_subcommand("serve").unwrap();
        let flags: Vec<&str> =
            cli.get_arguments().chain(serve.get_arguments()).filter_map(|a| a.get_long()).collect();
        for f in &flags {
            assert!(
                NOT_IN_FILE.contains(f) || KEYS.iter().any(|k| k.flag == *f),
                "--{f} of tutti serve has no key in the config file"
            );
        }
        for k in KEYS {
            assert!(
                flags.contains(&k.flag),
                "key {} names --{}, which tutti serve does not have",
                k.key,
                k.flag
            );
        }
    }
}
