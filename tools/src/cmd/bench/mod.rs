//! `tutti bench`: microbenchmarks, each reported next to a baseline measured in the same run.

pub mod commands;
pub mod plot;
pub mod retrieve;
pub mod sgl_vs_prp;

use std::path::PathBuf;

/// Output flags every benchmark takes: `#[command(flatten)] pub out: Output`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Output {
    /// Print the report as JSON on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write an SVG plot of the main curve to this path.
    #[arg(long, value_name = "PATH")]
    pub svg: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

impl Output {
    /// Prints `report` as JSON when `--json`, else `text`; writes `svg()` to `--svg` if given.
    pub fn emit<T: serde::Serialize>(
        &self,
        report: &T,
        text: &str,
        svg: impl FnOnce() -> String,
    ) -> anyhow::Result<()> {
        if let Some(path) = &self.svg {
            std::fs::write(path, svg()).map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
        }
        if self.json {
            crate::report::print_json(report)
        } else {
            print!("{text}");
            if let Some(path) = &self.svg {
                println!("plot written to {}", path.display());
            }
            Ok(())
        }
    }
}

/// Which benchmark to run.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub which: Which,
}

#[derive(clap::Subcommand, Debug)]
pub enum Which {
    /// The same KV objects read into scattered buffers with SGL and with PRP data pointers.
    SglVsPrp(sgl_vs_prp::Args),
    /// retrieve_layer of a long request against io_uring, pread and a plain memory copy.
    Retrieve(retrieve::Args),
    /// Submit-to-complete rate of small commands through the full stack against io_uring NOPs.
    Commands(commands::Args),
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    match &args.which {
        Which::SglVsPrp(a) => sgl_vs_prp::run(a),
        Which::Retrieve(a) => retrieve::run(a),
        Which::Commands(a) => commands::run(a),
    }
}
