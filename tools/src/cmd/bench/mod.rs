//! `tutti bench`: microbenchmarks, each reported next to a baseline measured in the same run.

pub mod commands;
pub mod retrieve;
pub mod sgl_vs_prp;

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
