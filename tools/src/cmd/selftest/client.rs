//! `tutti selftest --client SOCKET` (hidden): one engine process as a client
//! of a running tuttid. It connects, registers host KV memory (on VFIO drives
//! this process maps it into the drives' IOMMU itself), stores a request,
//! loads it back into other blocks and checks every byte. With `--hold` it
//! stops in the middle of a load and waits to be killed, so that a test can
//! check what the daemon gives back for a client that dies then.

use crate::report::print_json;
use anyhow::{ensure, Context};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tutti_objstore::{chain_hashes, Backend, GioConfig, HostKvMemory, KvLayout, KvStore, LayoutKind};

const WAIT: Duration = Duration::from_secs(60);
/// How long `--hold` waits to be killed before it gives up and exits with an error.
const HOLD: Duration = Duration::from_secs(300);

#[derive(serde::Serialize)]
struct Report {
    client: String,
    seed: u64,
    drives: usize,
    chunks: u32,
    bytes_verified: u64,
}

/// The bytes of object (layer, kv) of the chunk stored from block `block` under `seed`.
fn pattern(seed: u64, block: u32, layer: u32, kv: u32, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (block as u64) << 40
        ^ (layer as u64) << 20
        ^ (kv as u64) << 8
        ^ 0x5851_f42d_4c95_7f2d;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        // xorshift64*: cheap, and no two objects of a run share their bytes.
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(len);
    out
}

fn offset(layout: &KvLayout, mem: &HostKvMemory, block: u32, layer: u32, kv: u32) -> usize {
    (layout.object_addr(block, layer, kv) - mem.addr()) as usize
}

pub fn run(socket: &Path, seed: u64, chunks: u32, hold: bool, json: bool) -> anyhow::Result<()> {
    let name = format!("selftest-client-{seed}");
    let mut gio = GioConfig::default();
    gio.host.blocks = 1;
    gio.sm_budget = 1;
    let store = tutti_daemon::remote::connect(socket, &name, &Backend::Gio(gio), Duration::from_secs(10))
        .with_context(|| format!("connecting to tuttid at {}", socket.display()))?;
    let g = *store.geometry();
    let bytes = KvLayout::bytes_needed(LayoutKind::Contiguous, &g, 2 * chunks);
    let mem = Arc::new(HostKvMemory::new(bytes as usize)?);
    let layout = KvLayout::contiguous(g, 2 * chunks, mem.addr())?;
    store.register_host(mem.clone(), layout.clone(), "selftest-client", b"")?;
    let object = g.object_bytes() as usize;
    for b in 0..chunks {
        for layer in 0..g.layers {
            for kv in 0..2 {
                mem.copy_in(offset(&layout, &mem, b, layer, kv), &pattern(seed, b, layer, kv, object))?;
            }
        }
    }
    // Tokens of this seed only: clients with different seeds store different requests.
    let tokens: Vec<u32> = (0..chunks * g.tokens_per_block)
        .map(|t| (seed as u32).wrapping_mul(1_000_003).wrapping_add(t))
        .collect();
    let hashes = chain_hashes(&tokens, g.tokens_per_block);
    let src: Vec<u32> = (0..chunks).collect();
    let rep = store.store_request(&hashes, &src, WAIT).context("storing the request")?;
    ensure!(rep.failed.is_empty(), "storing the request failed: {:?}", rep.failed);
    ensure!(
        rep.stored + rep.present == chunks,
        "{} of {chunks} chunks stored: {rep:?}",
        rep.stored + rep.present
    );

    mem.fill(0, mem.len(), 0)?;
    let found = store.lookup(&hashes).context("looking the request up")?;
    ensure!(found.hits() == chunks as usize, "{} of {chunks} chunks found after storing them", found.hits());
    let dst: Vec<u32> = (chunks..2 * chunks).collect();
    if hold {
        hold_mid_load(&store, &found.files, &dst, seed)?;
    }
    let st = store.load_request(&found.files, &dst, WAIT).context("loading the request")?;
    ensure!(st.done && st.failed == 0, "the load did not complete cleanly: {st:?}");
    let mut verified = 0u64;
    let mut got = vec![0u8; object];
    for (i, &b) in dst.iter().enumerate() {
        for layer in 0..g.layers {
            for kv in 0..2 {
                mem.copy_out(offset(&layout, &mem, b, layer, kv), &mut got)?;
                ensure!(
                    got == pattern(seed, i as u32, layer, kv, object),
                    "chunk {i} layer {layer} {} loaded into block {b} does not hold the bytes stored",
                    if kv == 0 { "K" } else { "V" }
                );
                verified += object as u64;
            }
        }
    }
    store.unpin(found.pin)?;
    store.unregister()?;
    let report = Report {
        client: name,
        seed,
        drives: store.stripe_map().drive_count() as usize,
        chunks,
        bytes_verified: verified,
    };
    if json {
        return print_json(&report);
    }
    println!(
        "selftest client {}: stored {} chunks on {} drives through tuttid, loaded them into other blocks, \
         {} bytes, every byte verified",
        report.seed, report.chunks, report.drives, report.bytes_verified
    );
    Ok(())
}

/// Starts the load, waits for its first layer, says so, and waits to be killed.
fn hold_mid_load(
    store: &KvStore,
    files: &[tutti_objstore::FileId],
    dst: &[u32],
    seed: u64,
) -> anyhow::Result<()> {
    let layers = store.geometry().layers;
    let job = store.submit_load(files, dst, 0..layers).context("submitting the held load")?;
    store.wait_layer(job, 0, WAIT).context("waiting for the first layer of the held load")?;
    println!("selftest client {seed}: holding mid-load (job submitted, layer 0 of {layers} done)");
    let t = Instant::now();
    while t.elapsed() < HOLD {
        std::thread::sleep(Duration::from_millis(200));
    }
    anyhow::bail!("--hold: nobody killed this client within {HOLD:?}")
}

/// On every VFIO controller of the pool, the daemon's checks of queue memory:
/// rings in an IOVA range this client reserved but never mapped, or outside
/// every range it holds, are refused before any command reaches the
/// controller; rings in a range it mapped are accepted, and that range cannot
/// be given back while the queues exist; once they are deleted the daemon
/// unmaps what this process mapped there.
pub fn check_refusals(socket: &Path, seed: u64) -> anyhow::Result<usize> {
    use tutti_daemon::proto::{ControllerKind, ErrorKind, Request, Response};
    use tutti_daemon::DaemonError;
    use tutti_driver::transport::vfio::ClientContainer;
    const RANGE: usize = 64 << 10;
    let c = tutti_daemon::remote::Client::connect(socket, "selftest-refusals", Duration::from_secs(10))?;
    let Response::Pool(pool) = c.call(Request::Pool)? else {
        anyhow::bail!("tuttid answered pool with no pool")
    };
    let mut checked = 0;
    for (i, ctrl) in pool.controllers.iter().enumerate() {
        if !matches!(ctrl.kind, ControllerKind::Vfio { .. }) {
            continue;
        }
        let dev = &ctrl.info.device;
        let i = i as u32;
        let refused = |req: Request, needle: &str, what: &str| -> anyhow::Result<()> {
            match c.call(req) {
                Err(DaemonError::Rejected { kind: ErrorKind::Invalid, message, .. })
                    if message.contains(needle) =>
                {
                    Ok(())
                }
                Err(e) => anyhow::bail!("{dev}: {what}: refused for another reason: {e}"),
                Ok(r) => anyhow::bail!("{dev}: {what}: accepted ({r:?})"),
            }
        };
        let Response::Qid(qid) = c.call(Request::ClaimQueue { ctrl: i, purpose: "refusal check".into() })?
        else {
            anyhow::bail!("tuttid answered claim-queue with no queue id")
        };
        let Response::Iova(iova) = c.call(Request::ReserveIova { ctrl: i, len: RANGE as u64 })? else {
            anyhow::bail!("tuttid answered reserve-iova with no IOVA")
        };
        let create =
            |sq: u64, cq: u64| Request::CreateQueues { ctrl: i, qid, depth: 16, sq_iova: sq, cq_iova: cq };
        let outside = "not inside IOVA ranges this client reserved and mapped";
        let half = (RANGE / 2) as u64;
        refused(create(iova, iova + half), outside, "queues in a range reserved but never mapped")?;

        // Map memory of ours there, as a client does.
        let (_, fds) = c.call_fds(Request::VfioFds { ctrl: i })?;
        let container = fds.into_iter().next().context("vfio-fds sent no container")?;
        let container = ClientContainer::from_fd(container, dev)?;
        let layout = std::alloc::Layout::from_size_align(RANGE, 4096)?;
        // SAFETY: a non-zero size.
        let mem = unsafe { std::alloc::alloc_zeroed(layout) };
        anyhow::ensure!(!mem.is_null(), "out of memory");
        let result = (|| -> anyhow::Result<()> {
            container.map_dma(mem, iova, RANGE as u64)?;
            c.call(Request::Mapped { ctrl: i, iova, vaddr: mem as u64 })?;
            refused(create(iova + (1 << 20), iova), outside, "queues with the SQ outside every range")?;
            refused(create(iova, iova + RANGE as u64 - 64), outside, "queues with the CQ past the range")?;
            c.call(create(iova, iova + half)).with_context(|| format!("{dev}: queues in a mapped range"))?;
            refused(
                Request::Unmap { ctrl: i, iova },
                "delete the queues first",
                "giving back a range with live rings",
            )?;
            c.call(Request::DeleteQueues { ctrl: i, qid })?;
            // Still mapped by this process: the daemon unmaps it as it takes the range back.
            c.call(Request::Unmap { ctrl: i, iova })?;
            c.call(Request::ReleaseQueue { ctrl: i, qid })?;
            Ok(())
        })();
        // On an error the device may still reach the memory: leaked rather than freed.
        if result.is_ok() {
            // SAFETY: allocated above with this layout; the daemon unmapped it (Unmap succeeded).
            unsafe { std::alloc::dealloc(mem, layout) };
        }
        result?;
        checked += 1;
    }
    println!(
        "selftest client {seed}: queue memory outside the client's mapped IOVA ranges refused, and a range \
         with live rings kept, on {checked} VFIO controllers"
    );
    Ok(checked)
}
