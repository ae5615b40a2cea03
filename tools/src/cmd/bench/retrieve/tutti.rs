//! The method under test: the object store on RAM-backed emulated drives,
//! layers moved by gio_uring's host executor. The request is stored first
//! (setup, not measured), then retrieved as an engine does: one
//! `submit_load` for all layers (validation and registering the (file,
//! block) pairs with the executor, once), then `wait_layer` before each
//! layer's attention. The store submits each layer as IOCB headers naming
//! the registered pairs; the executor expands them into NVMe commands from
//! the device-resident layer table.
//!
//! Host CPU is split as the store accounts it (the calling thread's CPU time
//! in both): per-request setup (`JobStatus::setup_ns`), per-layer submission
//! (`JobStatus::layer_submit_ns`), and the rest of the thread's CPU in
//! `submit_load` and `wait_layer` (polling for completions) as wait CPU.

use super::data::Dataset;
use super::measure::{Calls, Method};
// The object store's own clock for its setup and submission CPU, so the figures compare.
use crate::emu::{EmulatedArgs, SglFlag};
use crate::progress::byte_bar;
use anyhow::{bail, Context};
use rand::{Rng, SeedableRng};
use std::ops::Range;
use std::time::Duration;
use tutti_emulator::EmulatedController;
use tutti_gio_uring::{ExecMode, HostExecutorConfig};
use tutti_objstore::thread_cpu_ns;
use tutti_objstore::{
    chain_hashes, Backend, DriveSpec, FileId, GioConfig, KvStore, OpenMode, PoolOptions, StoreOptions,
};

/// Deadline of every wait on the drives.
const WAIT: Duration = Duration::from_secs(120);

/// Counters of the last run, per layer.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct PerLayer {
    pub nvme_commands: f64,
    /// Calls into the I/O path the host made (1: one submit_layer).
    pub host_calls: f64,
    /// Commands whose fields the host wrote (0: the executor built them all).
    pub host_built: f64,
    /// (file, block) pairs the host copied to submit the layer (0: the
    /// executor read them from the list registered once for the request).
    pub host_pairs: f64,
    /// The request's pairs were registered with the executor at submit_load.
    pub pairs_registered: bool,
}

pub struct Tutti {
    /// Declared before the controllers: the store (and its queues) goes first.
    store: KvStore,
    files: Vec<FileId>,
    pin: u64,
    pub io_mode: String,
    pub drives: u32,
    pub last: PerLayer,
    _emus: Vec<EmulatedController>,
}

impl Tutti {
    /// Starts `drives` emulated drives, opens a pool with the data set's
    /// geometry, registers its KV memory and stores the whole request.
    pub fn setup(
        ds: &Dataset,
        drives: u32,
        exec: ExecMode,
        exec_blocks: u32,
        quiet: bool,
    ) -> anyhow::Result<Tutti> {
        let g = ds.g;
        let request = ds.blocks as u64 * g.file_bytes();
        // Each drive holds its share of the request plus room for metadata.
        let per_drive = request.div_ceil(drives as u64) + request / 8 + (64 << 20);
        let emu = EmulatedArgs {
            lba_size: 512,
            capacity_mib: per_drive.div_ceil(1 << 20),
            mdts: 5,
            sgl: SglFlag::On,
            ..EmulatedArgs::default()
        };
        let emus = (0..drives as usize)
            .map(|i| Ok(EmulatedController::start(emu.config(i)?)?))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let specs = emus
            .iter()
            .map(|e| Ok(DriveSpec::first_namespace(crate::cmd::identify::bring_up(e)?)?))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let opts = StoreOptions {
            pool: PoolOptions::new(g, OpenMode::Create),
            backend: Backend::Gio(GioConfig {
                host: HostExecutorConfig { mode: exec, blocks: exec_blocks, ..Default::default() },
                sm_budget: exec_blocks,
                ..Default::default()
            }),
        };
        let store = KvStore::open(specs, opts).context("opening the pool on the emulated drives")?;
        if store.stripe_map().files() < ds.blocks {
            bail!("the pool holds {} blocks; the request needs {}", store.stripe_map().files(), ds.blocks);
        }
        store.register_host(ds.kv.clone(), ds.layout.clone(), "llama-3-8b", b"")?;
        let io_mode = store.info().io_mode;

        let mut rng = rand::rngs::StdRng::seed_from_u64(ds.seed);
        let tokens: Vec<u32> =
            (0..ds.blocks * g.tokens_per_block).map(|_| rng.gen_range(0..128_256)).collect();
        let hashes = chain_hashes(&tokens, g.tokens_per_block);
        ds.fill_slots_in_order()?;
        let src: Vec<u32> = (0..ds.blocks).collect();
        let bar = byte_bar(request, "store", quiet);
        let session = store.begin_store(&hashes, &src)?;
        let jobs =
            (0..g.layers).map(|l| store.submit_store(session, l..l + 1)).collect::<Result<Vec<_>, _>>()?;
        for job in jobs {
            let st = store.wait(job, WAIT)?;
            if !st.done {
                bail!("storing a layer did not finish within {WAIT:?}");
            }
            store.release(job)?;
            bar.inc(request / g.layers as u64);
        }
        let rep = store.commit_store(session)?;
        bar.finish_and_clear();
        if let Some((i, why)) = rep.failed.first() {
            bail!("{} of {} blocks were not stored; block {i}: {why}", rep.failed.len(), ds.blocks);
        }
        let hit = store.lookup(&hashes)?;
        if hit.hits() as u32 != ds.blocks {
            store.unpin(hit.pin)?;
            bail!("only {} of {} stored blocks were found", hit.hits(), ds.blocks);
        }
        Ok(Tutti {
            store,
            files: hit.files,
            pin: hit.pin,
            io_mode,
            drives,
            last: PerLayer::default(),
            _emus: emus,
        })
    }
}

impl Method for Tutti {
    fn name(&self) -> &'static str {
        "tutti"
    }

    fn describe(&self) -> String {
        format!(
            "one KvStore::submit_load per request, wait_layer per layer, on {} emulated drives: {}",
            self.drives, self.io_mode
        )
    }

    /// One load job for all layers (as an engine submits a request), then
    /// each layer waited for in order, as before its attention.
    fn retrieve(&mut self, ds: &Dataset, n: u32, layers: Range<u32>) -> anyhow::Result<Calls> {
        let (files, dst) = (&self.files[..n as usize], &ds.dst[..n as usize]);
        let t0 = thread_cpu_ns();
        let job = self.store.submit_load(files, dst, layers.clone());
        let mut thread_ns = thread_cpu_ns().saturating_sub(t0);
        let job = job?;
        for l in layers.clone() {
            let t0 = thread_cpu_ns();
            let st = self.store.wait_layer(job, l, WAIT);
            thread_ns += thread_cpu_ns().saturating_sub(t0);
            if !st?.layer_is_done(l) {
                self.store.cancel(job)?;
                bail!("layer {l} did not load within {WAIT:?}");
            }
        }
        let t0 = thread_cpu_ns();
        let st = self.store.release(job)?;
        thread_ns += thread_cpu_ns().saturating_sub(t0);
        if st.failed > 0 {
            bail!("{} blocks failed: {}", st.failed, st.first_error.unwrap_or_default());
        }
        if st.layer_submit_ns.len() != layers.len() {
            bail!("the job reports {} layers, not {}", st.layer_submit_ns.len(), layers.len());
        }
        let k = layers.len() as f64;
        self.last = PerLayer {
            nvme_commands: st.commands as f64 / k,
            host_calls: st.host_calls as f64 / k,
            host_built: st.host_built as f64 / k,
            host_pairs: st.host_pairs as f64 / k,
            pairs_registered: st.pairs_registered,
        };
        Ok(Calls {
            cpu_ns: st.layer_submit_ns.clone(),
            // Everything else the thread spent in submit_load, wait_layer and release.
            wait_cpu_ns: thread_ns.saturating_sub(st.setup_ns + st.submit_ns),
            setup_cpu_ns: st.setup_ns,
        })
    }
}

impl Drop for Tutti {
    fn drop(&mut self) {
        if let Err(e) = self.store.unpin(self.pin) {
            tracing::warn!(error = %e, "unpinning the benchmark's files");
        }
    }
}
