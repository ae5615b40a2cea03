//! A client of tuttid across a daemon SIGKILL and restart, through the C ABI (ABI 1.11): the
//! runtime reconnects by itself on its next call once a daemon is back on the same socket and
//! media, back in its state (its KV memory registered again, its queue pairs leased again, a new
//! executor and board slot), and loads every byte stored before the kill; while no daemon is
//! there every call fails at once naming tuttid; daemons that come back with another geometry,
//! or on other media, are refused naming what differs; a job in flight at the kill ends failed
//! (no block of it reported loaded without its bytes); a pin of before is not held; the counters
//! say it all (`reconnects`, `reconnect_attempts`, `disconnected_ns`). A control-only client
//! (an engine's scheduler) reconnects the same way; a client with `TUTTI_RECONNECT_OFF` does not.
//! Each daemon is this test binary run again with `TUTTI_TEST_RECONNECT` set: `Daemon::start`,
//! what `tutti serve` runs, on emulated drives whose media are files, so a restart on the same
//! files recovers the pool from its journals.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../tests/support/reap.rs"]
mod reap;

mod common;

use common::{block_bytes, expect, hashes, last_error, lookup, ok, Mem, Rt, LAYERS, OBJ};
use std::ffi::CString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::ptr::null_mut;
use std::time::{Duration, Instant};
use tutti::*;

/// Set in a daemon child: `socket|media dir|layers|ms per command`.
const ROLE: &str = "TUTTI_TEST_RECONNECT";
const TEST: &str = "a_client_reconnects_to_a_restarted_tuttid_and_refuses_another_pool";
const BLOCKS: u32 = 8;
const CHUNKS: usize = 4;

fn daemon_role(spec: &str) {
    use tutti_emulator::{CostModel, EmulatedConfig, MediaConfig, NamespaceConfig};
    use tutti_objstore::{Dtype, Geometry, OpenMode, PoolOptions};
    let parts: Vec<&str> = spec.split('|').collect();
    let (socket, media) = (PathBuf::from(parts[0]), PathBuf::from(parts[1]));
    let layers: u32 = parts[2].parse().unwrap();
    let ms: u64 = parts[3].parse().unwrap();
    let g = Geometry { layers, kv_heads: 2, head_dim: 64, tokens_per_block: common::TPB, dtype: Dtype::Bf16 };
    let drives = (0..2)
        .map(|i| EmulatedConfig {
            name: format!("emu{i}"),
            serial: format!("RECON-{}-{i}", media.file_name().unwrap().to_string_lossy()),
            namespaces: vec![NamespaceConfig::with_bytes(16 << 20, 512)],
            media: MediaConfig::File(media.join(format!("emu{i}.img"))),
            cost: CostModel { per_command: Duration::from_millis(ms), ..Default::default() },
            ..EmulatedConfig::default()
        })
        .collect();
    let _d = tutti_daemon::Daemon::start(tutti_daemon::DaemonConfig {
        socket,
        mode: tutti_daemon::SocketMode::Owner,
        drives: tutti_daemon::DriveSource::Emulated(drives),
        pool: PoolOptions::new(g, OpenMode::OpenOrCreate),
        io_timeout: Duration::from_secs(2),
    })
    .expect("tuttid starts");
    println!("READY");
    // Killed by the test; bounded in case it is not.
    std::thread::sleep(Duration::from_secs(300));
}

/// A daemon child on `media` serving `socket`, started and ready.
fn daemon(socket: &Path, media: &Path, layers: u32, ms_per_command: u64) -> reap::Reap {
    std::fs::create_dir_all(media).unwrap();
    let spec = format!("{}|{}|{layers}|{ms_per_command}", socket.display(), media.display());
    let mut d = reap::Reap(
        Command::new(std::env::current_exe().unwrap())
            .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
            .env(ROLE, spec)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let out = BufReader::new(d.stdout.take().unwrap());
    assert!(
        out.lines().map_while(Result::ok).any(|l| l.trim_end().ends_with("READY")),
        "tuttid did not start"
    );
    d
}

fn kill(d: &mut reap::Reap) {
    d.kill().unwrap(); // SIGKILL
    d.wait().unwrap();
}

fn stats(rt: &Rt) -> tutti_stats_t {
    let mut s =
        tutti_stats_t { struct_size: std::mem::size_of::<tutti_stats_t>() as u32, ..Default::default() };
    // SAFETY: a live handle and a full-size struct.
    ok(unsafe { tutti_runtime_stats(rt.0, &mut s) });
    s
}

/// A lookup that must fail at once, as a runtime whose daemon is gone fails: an I/O error
/// naming tuttid, and `needle`.
#[track_caller]
fn fails_fast(rt: &Rt, keys: &[tutti_hash_t], needle: &str) -> String {
    let (mut hits, mut pin) = (0usize, 0u64);
    let t = Instant::now();
    // SAFETY: valid buffers and a live handle.
    let code =
        unsafe { tutti_kv_lookup(rt.0, keys.as_ptr(), keys.len(), TUTTI_LOOKUP_PIN, &mut hits, &mut pin) };
    let took = t.elapsed();
    let msg = last_error();
    expect(code, TUTTI_E_IO, "tuttid");
    assert!(msg.contains(needle), "wanted {needle:?} in: {msg}");
    // Well under one control deadline (5 s here): nothing waits for a daemon that is not there.
    assert!(took < Duration::from_secs(2), "the call took {took:?}: {msg}");
    msg
}

/// Calls `lookup` until it answers (the runtime reconnected) or `within` passes; the errors
/// meanwhile must name tuttid. Returns (hits, pin) and how many calls failed first.
fn until_back(rt: &Rt, keys: &[tutti_hash_t], within: Duration) -> (usize, u64, u32) {
    let end = Instant::now() + within;
    let mut failed = 0;
    loop {
        let (mut hits, mut pin) = (0usize, 0u64);
        // SAFETY: valid buffers and a live handle.
        let code = unsafe {
            tutti_kv_lookup(rt.0, keys.as_ptr(), keys.len(), TUTTI_LOOKUP_PIN, &mut hits, &mut pin)
        };
        if code == TUTTI_OK {
            return (hits, pin, failed);
        }
        expect(code, TUTTI_E_IO, "tuttid");
        failed += 1;
        assert!(Instant::now() < end, "no reconnect within {within:?}: {}", last_error());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Loads `keys` into `to` (all layers) and checks each block holds what block `from[i]` held
/// when it was stored (`want`).
fn load_and_check(rt: &Rt, mem: &mut Mem, keys: &[tutti_hash_t], to: &[u32], want: &[Vec<u8>]) {
    for &b in to {
        common::scribble(mem, b as usize, BLOCKS);
    }
    let st = common::load_all(rt, keys, to);
    assert_eq!(st.failed, 0, "{st:?}: {}", last_error());
    for (i, &b) in to.iter().enumerate() {
        assert!(block_bytes(mem, b as usize, BLOCKS) == want[i], "block {b} (chunk {i}) holds other bytes");
    }
}

#[test]
fn a_client_reconnects_to_a_restarted_tuttid_and_refuses_another_pool() {
    if let Ok(spec) = std::env::var(ROLE) {
        daemon_role(&spec);
        return;
    }
    let dir = std::env::temp_dir().join(format!("tutti-reconnect-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let socket_path = dir.join("tuttid.sock");
    let media = dir.join("media");
    // Commands take 30 ms on these drives, so a load submitted just before the kill is on them.
    let mut d1 = daemon(&socket_path, &media, LAYERS, 30);

    let socket = CString::new(socket_path.to_str().unwrap()).unwrap();
    let name = CString::new("reconnecting-engine").unwrap();
    let mut cfg = common::client_config(&socket, &name);
    cfg.reconnect_backoff_ms = 200;
    cfg.reconnect_deadline_ms = 120_000;
    let mut rt = null_mut();
    // SAFETY: a valid config and out pointer.
    ok(unsafe { tutti_runtime_connect(&cfg, &mut rt) });
    let rt = Rt(rt);
    // An engine's scheduler: control only.
    let cname = CString::new("reconnecting-scheduler").unwrap();
    let mut ccfg = common::client_config(&socket, &cname);
    ccfg.executor = TUTTI_EXECUTOR_CONTROL;
    let mut crt = null_mut();
    // SAFETY: as above.
    ok(unsafe { tutti_runtime_connect(&ccfg, &mut crt) });
    let crt = Rt(crt);
    // A client that does not reconnect.
    let oname = CString::new("no-reconnect").unwrap();
    let mut ocfg = common::client_config(&socket, &oname);
    ocfg.reconnect = TUTTI_RECONNECT_OFF;
    let mut ort = null_mut();
    // SAFETY: as above.
    ok(unsafe { tutti_runtime_connect(&ocfg, &mut ort) });
    let ort = Rt(ort);
    let pool_before = common::info(&rt).pool_id;

    let mut mem = common::register_filled(&rt, BLOCKS, 11);
    let keys = hashes(CHUNKS, 5);
    let from: Vec<u32> = (0..CHUNKS as u32).collect();
    let want: Vec<Vec<u8>> = from.iter().map(|&b| block_bytes(&mut mem, b as usize, BLOCKS)).collect();
    let rep = common::store_all(&rt, &keys, &from);
    assert_eq!(rep.stored as usize, CHUNKS, "{rep:?}");
    let to: Vec<u32> = (CHUNKS as u32..2 * CHUNKS as u32).collect();
    load_and_check(&rt, &mut mem, &keys, &to, &want);
    let (hits, old_pin) = lookup(&rt, &keys, TUTTI_LOOKUP_PIN);
    assert_eq!(hits, CHUNKS);
    assert_ne!(old_pin, 0);
    let before = stats(&rt);
    assert_eq!((before.reconnects, before.disconnected), (0, 0), "{before:?}");

    // A load on the drives when the daemon dies.
    let mut inflight = null_mut();
    // SAFETY: valid buffers and a live handle.
    ok(unsafe { tutti_load_submit(rt.0, keys.as_ptr(), to.as_ptr(), CHUNKS, 0, LAYERS, &mut inflight) });
    // And one the engine does not look at again until long after the reconnect: its reads
    // were admitted on every drive, and must not keep the new connection's writes waiting.
    let mut unwatched = null_mut();
    // SAFETY: as above.
    ok(unsafe { tutti_load_submit(rt.0, keys.as_ptr(), to.as_ptr(), CHUNKS, 0, LAYERS, &mut unwatched) });
    kill(&mut d1);

    // The job ends failed, naming tuttid; none of its blocks is reported loaded without its bytes.
    let mut st = common::status();
    let mut bitmap = [0u64; 1];
    st.failed_bitmap = bitmap.as_mut_ptr();
    st.failed_bitmap_words = 1;
    // SAFETY: a live job and a status whose bitmap has room for its blocks.
    let code = unsafe { tutti_job_wait(inflight, 60_000, &mut st) };
    expect(code, TUTTI_E_IO, "tuttid");
    // SAFETY: a live job, destroyed once (it drains, bounded by the command deadline).
    ok(unsafe { tutti_job_destroy(inflight) });

    // No daemon: every call fails at once, the first attempt made and reported.
    let first = fails_fast(&rt, &keys, "gone");
    assert!(first.contains("reconnecting"), "{first}");
    for _ in 0..20 {
        fails_fast(&rt, &keys, "gone");
    }
    let down = stats(&rt);
    assert_eq!(down.disconnected, 1, "{down:?}");
    assert!(down.reconnect_attempts >= 1, "{down:?}");
    // Fewer attempts than calls: between two, calls fail without one.
    assert!(down.reconnect_attempts < 21, "{down:?}");

    // A daemon on the same socket with another geometry (and media): refused, naming both.
    let mut other = daemon(&socket_path, &dir.join("media-8-layers"), 8, 0);
    let msg = until_refused(&rt, &keys, "formatted for");
    assert!(msg.contains("tutti serve"), "names the flags that would match: {msg}");
    kill(&mut other);
    // The same geometry on other media: another pool, refused naming both pools.
    let mut other = daemon(&socket_path, &dir.join("media-other"), LAYERS, 0);
    let msg = until_refused(&rt, &keys, "now serves pool");
    assert!(msg.contains("this runtime was connected to pool"), "{msg}");
    kill(&mut other);

    // Back on the same media and socket: the next calls reconnect with nothing done by the
    // engine; the chunks stored before the kill are found and load byte for byte.
    let t = Instant::now();
    let _d2 = daemon(&socket_path, &media, LAYERS, 0);
    let (hits, new_pin, _) = until_back(&rt, &keys, Duration::from_secs(5));
    assert_eq!(hits, CHUNKS, "every chunk stored before the kill is found again");
    assert_ne!(new_pin, 0);
    assert_ne!(new_pin, old_pin, "a pin of the new connection is not one of the old");
    let back = t.elapsed();
    assert_eq!(common::info(&rt).pool_id, pool_before, "the same pool");
    // The pin of before is not held by the new daemon: releasing it is a no-op.
    // SAFETY: a live handle.
    ok(unsafe { tutti_kv_unpin(rt.0, old_pin) });
    // SAFETY: a live handle.
    ok(unsafe { tutti_kv_unpin(rt.0, new_pin) });
    load_and_check(&rt, &mut mem, &keys, &to, &want);
    // New stores work and load back too.
    let keys2 = hashes(CHUNKS, 6);
    let from2: Vec<u32> = (0..CHUNKS as u32).collect();
    for &b in &from2 {
        // Fresh bytes in the source blocks, unlike anything stored before.
        let per = 2 * BLOCKS as usize * OBJ;
        for l in 0..LAYERS as usize {
            for kv in 0..2 {
                let o = l * per + kv * BLOCKS as usize * OBJ + b as usize * OBJ;
                for (i, x) in mem.bytes()[o..o + OBJ].iter_mut().enumerate() {
                    *x = (i as u8).wrapping_mul(7).wrapping_add(b as u8 ^ 0x5a);
                }
            }
        }
    }
    let want2: Vec<Vec<u8>> = from2.iter().map(|&b| block_bytes(&mut mem, b as usize, BLOCKS)).collect();
    let rep = common::store_all(&rt, &keys2, &from2);
    assert_eq!(rep.stored as usize, CHUNKS, "{rep:?}");
    load_and_check(&rt, &mut mem, &keys2, &to, &want2);

    // The job of before ends failed when it is looked at, whatever the new connection did.
    let mut st = common::status();
    // SAFETY: a live job and a status (no bitmap asked for).
    let code = unsafe { tutti_job_wait(unwatched, 60_000, &mut st) };
    expect(code, TUTTI_E_IO, "tuttid");
    // SAFETY: a live job, destroyed once.
    ok(unsafe { tutti_job_destroy(unwatched) });

    let after = stats(&rt);
    assert_eq!((after.reconnects, after.disconnected), (1, 0), "{after:?}");
    assert!(after.reconnect_attempts >= 3, "the refused daemons were attempts too: {after:?}");
    assert!(after.disconnected_ns > 0 && after.disconnected_ns < 600_000_000_000, "{after:?}");
    assert!(after.lookups > before.lookups, "the counters of before are kept: {after:?} {before:?}");
    assert!(after.bytes_loaded > before.bytes_loaded, "{after:?} {before:?}");

    // The daemon knows it by its name again, with its queue pairs leased.
    let status = tutti_daemon::remote::Client::connect(&socket_path, "probe", Duration::from_secs(5))
        .unwrap()
        .status()
        .unwrap();
    let me = status.clients.iter().find(|c| c.name == "reconnecting-engine").expect("the engine is a client");
    assert!(!me.queues.is_empty(), "its queue pairs are leased again: {me:?}");

    // The scheduler's control-only client is back too.
    let mut n = 0usize;
    let code = loop {
        // SAFETY: valid strings and buffers, a live handle.
        let code = unsafe {
            tutti_kv_contains_identity(
                crt.0,
                c"test-model".as_ptr(),
                std::ptr::null(),
                0,
                TUTTI_LAYOUT_VLLM_PER_LAYER,
                keys.as_ptr(),
                keys.len(),
                &mut n,
            )
        };
        if code == TUTTI_OK || t.elapsed() > Duration::from_secs(10) {
            break code;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    ok(code);
    assert_eq!(n, CHUNKS);
    assert_eq!(stats(&crt).reconnects, 1);
    // The client that does not reconnect stays disconnected.
    let (mut h, mut p) = (0usize, 0u64);
    // SAFETY: valid buffers and a live handle.
    let code = unsafe { tutti_kv_lookup(ort.0, keys.as_ptr(), keys.len(), 0, &mut h, &mut p) };
    expect(code, TUTTI_E_IO, "gone");
    assert_eq!(stats(&ort).reconnects, 0);
    eprintln!("reconnected {back:?} after the daemon was started again");

    // SAFETY: a live runtime.
    ok(unsafe { tutti_kv_unregister(rt.0) });
    drop(rt);
    drop(crt);
    drop(ort);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Calls `lookup` until it fails with `needle` (a daemon is there but refused); every failure
/// meanwhile names tuttid and comes at once.
fn until_refused(rt: &Rt, keys: &[tutti_hash_t], needle: &str) -> String {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let msg = fails_fast(rt, keys, "tuttid");
        if msg.contains(needle) {
            return msg;
        }
        assert!(Instant::now() < end, "no refusal naming {needle:?}: {msg}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
