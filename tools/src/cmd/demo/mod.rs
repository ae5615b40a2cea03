//! `tutti demo`: the main job. A pool of drives (4 emulated by default, or
//! VFIO-bound drives with `--drives`), KV memory registered with a model's
//! geometry (Llama-3-8B by default), the KV of one long request stored layer
//! by layer, looked up by its chained hashes and retrieved layer by layer into
//! other engine slots, every byte verified; then the pool is reopened and the
//! cached prefix found and verified again.
//!
//! - `args.rs`: the flags; `rig.rs`: the drives; `kv.rs`: the engine's KV memory;
//! - `phase.rs`: one timed store or retrieval and what it measured;
//! - `single.rs`: the demo in one process; `clients.rs`: the demo with N engine processes.

mod args;
mod clients;
mod kv;
mod phase;
mod rig;
mod single;

pub use args::{Args, CudaArgs};

/// `tutti demo`: in this process, with `--clients N` engine processes, or as one of them.
pub fn run(args: &Args) -> anyhow::Result<()> {
    if let Some(socket) = &args.client_of {
        return clients::client(args, socket);
    }
    if let Some(n) = args.clients {
        return clients::run(args, n);
    }
    single::run(args)
}
