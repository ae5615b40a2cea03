//! `tutti demo` in one process: the request stored, retrieved and verified, then the pool
//! reopened and the prefix found and verified again; the report.

use super::args::{backend, Args, KvMemoryFlag};
use super::kv::{for_blocks, Kv};
use super::phase::{rate, retrieve, store_request, Phase};
use super::rig::Rig;
use crate::report::{bytes, print_json};
use anyhow::{bail, Context};
use tutti_objstore::{chain_hashes, KvStore, OpenMode, PoolInfo, PoolOptions, StoreOptions, TableSizes};

#[derive(serde::Serialize)]
struct Reopen {
    hits: usize,
    verified_bytes: u64,
    journal_records: u64,
    controllers_restarted: bool,
}

#[derive(serde::Serialize)]
struct Report {
    media: String,
    pool: PoolInfo,
    request_tokens: u32,
    request_blocks: u32,
    request_bytes: u64,
    layout: String,
    tables: TableSizes,
    hits_before_store: usize,
    store: Phase,
    retrieve: Phase,
    reopen: Option<Reopen>,
    /// `--kv-device`: the device memory after the run, for a check from outside.
    kv_device: Option<super::kv::KvDeviceReport>,
}

/// Why the pool cannot take the request, with remedies that exist for the
/// drives in use (`--capacity-mib` only for emulated ones).
fn too_small(files: u32, blocks: u32, tokens_per_block: u32, emulated: bool, drives: usize) -> String {
    let most = files as u64 * tokens_per_block as u64;
    let remedy = if emulated {
        format!("raise --capacity-mib or --emulated, or lower --tokens to at most {most}")
    } else {
        format!("lower --tokens to at most {most}, or add drives or namespaces to --drives (the pool has {drives})")
    };
    format!("the pool holds {files} blocks; the request needs {blocks}: {remedy}")
}

/// Runs the demo in this process.
pub(super) fn run(args: &Args) -> anyhow::Result<()> {
    let g = args.geometry.geometry()?;
    if args.tokens < g.tokens_per_block {
        bail!("--tokens {} is less than one block of {} tokens", args.tokens, g.tokens_per_block);
    }
    let blocks = args.tokens / g.tokens_per_block;
    let request_bytes = blocks as u64 * g.file_bytes();
    // Each emulated namespace holds its share of the request, plus room for metadata.
    let namespaces = args.pool_drives.emulated as u64 * args.pool_drives.emu.emu_namespaces as u64;
    let per_drive = request_bytes.div_ceil(namespaces) + request_bytes / 8 + (64 << 20);
    let rig = Rig::start(args, per_drive)?;
    let backend = backend(args);
    if matches!(args.kv_memory, KvMemoryFlag::Cuda | KvMemoryFlag::CudaGdr) && !args.cuda.cuda {
        bail!("--kv-memory cuda needs --cuda (the CUDA executor copies between staging and CUDA memory)");
    }
    // The engine's KV memory exists before the store starts its executor, as in an engine. On
    // an H100 (driver 580) a module load in another context waits for every running kernel, so
    // the KV memory's executor, made after a persistent I/O kernel started, would wait forever.
    let kv = Kv::for_args(args, g, blocks)?;
    let mode = if args.reuse { OpenMode::OpenOrCreate } else { OpenMode::Create };
    let opts = StoreOptions { pool: PoolOptions::new(g, mode), backend };
    let store = KvStore::open(rig.specs()?, opts.clone()).context("opening the pool")?;
    if store.stripe_map().files() < blocks {
        let (files, drives) = (store.stripe_map().files(), store.info().drives.len());
        bail!("{}", too_small(files, blocks, g.tokens_per_block, rig.is_emulated(), drives));
    }
    let tables = kv.register_with(&store, &args.model)?;
    let tokens: Vec<u32> = {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
        (0..args.tokens).map(|_| rng.gen_range(0..128_256)).collect()
    };
    let hashes = chain_hashes(&tokens, g.tokens_per_block);
    let hits_before_store = store.contains(&hashes)?;

    // Prefill: the engine's KV is computed into blocks 0..n and stored layer by layer.
    for_blocks(blocks, |b| kv.fill(args.seed, b, b))?;
    let store_phase = store_request(&store, &kv, &hashes, args)?;

    // Decode of a new request with the same prompt: its prefix is found and
    // loaded into other slots, each layer waited for before its attention.
    kv.clear()?;
    let loaded = retrieve(&store, &kv, &hashes, args, "retrieve")?;
    if loaded.hits as u32 != blocks {
        bail!("only {} of {blocks} blocks were found after storing them", loaded.hits);
    }

    let pool = store.info();
    let mut report = Report {
        media: rig.media().to_string(),
        pool,
        request_tokens: args.tokens,
        request_blocks: blocks,
        request_bytes,
        layout: kv.layout.kind().name().to_string(),
        tables,
        hits_before_store,
        store: store_phase,
        retrieve: loaded.phase,
        reopen: None,
        kv_device: None,
    };

    if !args.no_reopen {
        drop(store);
        let (rig, restarted) = rig.restart()?;
        let reopts = StoreOptions { pool: PoolOptions::new(g, OpenMode::Open), ..opts };
        let store = KvStore::open(rig.specs()?, reopts).context("reopening the pool")?;
        kv.register_with(&store, &args.model)?;
        kv.clear()?;
        let again = retrieve(&store, &kv, &hashes, args, "reopen")?;
        if again.hits as u32 != blocks {
            bail!("after reopening, {} of {blocks} blocks were found", again.hits);
        }
        report.reopen = Some(Reopen {
            hits: again.hits,
            verified_bytes: again.phase.verified_bytes,
            journal_records: store.info().replay.iter().map(|r| r.records).sum(),
            controllers_restarted: restarted,
        });
    }
    report.kv_device = kv.device_digest()?;
    if args.json {
        return print_json(&report);
    }
    print(&report);
    Ok(())
}

fn print(r: &Report) {
    let p = &r.pool;
    let g = &p.geometry;
    println!(
        "pool {} on {} drives ({}): {} files of {} ({} objects of {}, {} command(s) each)",
        p.pool,
        p.drives.len(),
        r.media,
        p.files,
        bytes(p.file_bytes),
        2 * g.layers,
        bytes(p.object_bytes),
        p.chunks
    );
    for d in &p.drives {
        println!(
            "  {:<14} {:<6} {:>5}-byte LBAs, {:>10}, max transfer {}",
            d.device,
            format!("ns {}", d.nsid),
            d.lba_size,
            bytes(d.blocks * d.lba_size as u64),
            bytes(d.max_transfer)
        );
    }
    println!("KV: {g}, {} layout", r.layout);
    println!("I/O: {}", p.io_mode);
    if let Some(dp) = &p.data_path {
        match (&dp.p2p_missing, &dp.provider) {
            (Some(why), _) => println!("data path: {} ({})", dp.mode, why),
            (None, Some(provider)) => println!("data path: {} ({provider})", dp.mode),
            (None, None) => println!("data path: {}", dp.mode),
        }
    }
    println!(
        "request: {} tokens = {} blocks = {} of KV ({} already cached)",
        r.request_tokens,
        r.request_blocks,
        bytes(r.request_bytes),
        r.hits_before_store
    );
    let t = &r.tables;
    println!("P2P table: {} SGL descriptors in {} table(s) = {}; PRP lists for the same commands: {} of entries, {} as 4-KiB list pages",
        t.descriptors, t.tables, bytes(t.sgl_bytes), bytes(t.prp_entry_bytes), bytes(t.prp_page_bytes));
    for (name, ph) in [("store", &r.store), ("retrieve", &r.retrieve)] {
        println!("{name:<9} {:>10} in {:.2} s = {}; per layer {:.0} commands, {:.1} host calls ({:.1} µs host CPU + {:.1} µs setup), {:.0} built by the host{}",
            bytes(ph.bytes), ph.seconds, rate(ph.gib_per_sec), ph.commands_per_layer, ph.host_calls_per_layer,
            ph.host_submit_us_per_layer, ph.host_setup_us_per_layer, ph.host_built_per_layer,
            if ph.verified_bytes > 0 { format!("; {} verified", bytes(ph.verified_bytes)) } else { String::new() });
    }
    if let Some(o) = &r.reopen {
        println!(
            "reopen    {} of {} blocks found from {} journal records{}; {} verified",
            o.hits,
            r.request_blocks,
            o.journal_records,
            if o.controllers_restarted { " (controllers restarted from their files)" } else { "" },
            bytes(o.verified_bytes)
        );
    }
    if let Some(d) = &r.kv_device {
        println!(
            "KV device memory: {}: {} bytes at BAR offset {}, {} of them non-zero, fnv1a64 {}",
            d.provider, d.bytes, d.offset, d.nonzero, d.fnv1a64
        );
    }
    println!("every byte verified");
}

#[cfg(test)]
mod tests {
    use super::too_small;

    #[test]
    fn a_pool_too_small_names_remedies_of_the_drives_in_use() {
        let real = too_small(10, 40, 16, false, 2);
        assert!(real.contains("--tokens to at most 160") && real.contains("--drives"), "{real}");
        assert!(!real.contains("--capacity-mib") && !real.contains("--emulated"), "{real}");
        let emu = too_small(10, 40, 16, true, 4);
        assert!(emu.contains("--capacity-mib"), "{emu}");
    }
}
