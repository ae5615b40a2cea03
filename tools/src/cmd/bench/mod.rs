//! `tutti bench`: microbenchmarks, each reported next to a baseline measured in the same run.

pub mod client;
pub mod commands;
pub mod common;
pub mod retrieve;
pub mod rig;
pub mod schedule;
pub mod sgl_vs_prp;
pub mod staged;

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
    /// A client of tuttid against an in-process runtime: host CPU per layer and per job, load and lookup times.
    Client(client::Args),
    /// The scheduler's policies (load-all, layer-wise, slack, slack+online) on real I/O through
    /// the runtime against emulated drives with the read/write collapse, beside the simulator.
    Schedule(schedule::Args),
    /// The staged path's copy alone (slot -> KV, KV -> slot) for the geometry's chunk sizes, against
    /// memcpy on the host executor or cuMemcpyAsync (the copy engine) with --cuda.
    Staged(staged::Args),
}

pub fn run(args: &Args) -> anyhow::Result<()> {
    match &args.which {
        Which::SglVsPrp(a) => sgl_vs_prp::run(a),
        Which::Retrieve(a) => retrieve::run(a),
        Which::Commands(a) => commands::run(a),
        Which::Client(a) => client::run(a),
        Which::Schedule(a) => schedule::run(a),
        Which::Staged(a) => staged::run(a),
    }
}
