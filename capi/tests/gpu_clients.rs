//! tuttid clients that run the CUDA executor (ABI 1.8), on the stand-in libcuda.so: each
//! client process runs its own I/O kernels on the queue pairs the daemon leased to it, moves
//! CUDA KV memory through its own staging slots (staged) and host KV memory by DMA (direct),
//! and sees the other clients' commits. A GPU client SIGKILLed mid-load and mid-store is
//! released like any client: the survivors go on, nothing uncommitted becomes visible, no
//! lease or mapping is left. Every client process checks that its stores and loads ran
//! kernel blocks on the stand-in driver: a client whose layers went to host lanes instead
//! launches none, and fails.
//! Children are this test binary run again on one test with `TUTTI_TEST_GPU_CLIENT` set.
//! Skips (with the reason; under CI=true fails) without NVRTC.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../tests/support/skip.rs"]
mod skip;

mod common;

use common::child::{field, line_of, spawn, Said};
use common::device::DeviceMem;
use common::*;
use std::ffi::CString;
use std::io::Write;
use std::mem::size_of;
use std::process::Child;
use std::ptr;
use std::time::{Duration, Instant};
use tutti::*;
use tutti_cuda_standin::control::Standin;

const BLOCKS: u32 = 8;
/// Set in a child: `<role> <socket> [<args>...]`.
const ROLE: &str = "TUTTI_TEST_GPU_CLIENT";

fn nvrtc_missing() -> bool {
    if let Err(e) = tutti_kernels::nvrtc::load() {
        skip::skip(format!("{e} (scripts/nvrtc-check --install installs the NVRTC wheel)"));
        return true;
    }
    false
}

/// The child's role and arguments, if this process is one.
fn child_role() -> Option<Vec<String>> {
    Some(std::env::var(ROLE).ok()?.split(' ').map(str::to_string).collect())
}

/// Connects to `socket` as a client running the CUDA executor on the stand-in driver.
fn connect_gpu(socket: &str, name: &str) -> Rt {
    let socket = CString::new(socket).unwrap();
    let name = CString::new(name).unwrap();
    let driver = Standin::load().expect("the stand-in libcuda.so").path;
    let driver = CString::new(driver.to_str().unwrap()).unwrap();
    let mut cfg = client_config(&socket, &name);
    cfg.executor = TUTTI_EXECUTOR_GIO_CUDA;
    cfg.cuda_driver = driver.as_ptr();
    cfg.cuda_sm_count = 1;
    cfg.cuda_block_threads = 32;
    cfg.staging_slots = 8;
    let mut rt = ptr::null_mut();
    // SAFETY: a valid config (its strings outlive the call) and out pointer.
    ok(unsafe { tutti_runtime_connect(&cfg, &mut rt) });
    Rt(rt)
}

/// Kernels launched through the stand-in in this process so far (counted at launch, so
/// before the kernel posts a completion; its blocks are counted only once it returns).
fn launches() -> u64 {
    Standin::load().unwrap().stat("launches", 0).unwrap()
}

fn data_path(rt: &Rt) -> tutti_data_path_t {
    // SAFETY: all-zero bytes are a valid tutti_data_path_t.
    let mut d: tutti_data_path_t = unsafe { std::mem::zeroed() };
    d.struct_size = size_of::<tutti_data_path_t>() as u32;
    // SAFETY: a live handle and a writable struct.
    ok(unsafe { tutti_data_path(rt.0, &mut d) });
    d
}

/// Registers `dev` (device memory of the stand-in) as vLLM per-layer CUDA KV memory.
fn register_cuda(rt: &Rt, dev: &DeviceMem) {
    let per_layer = 2 * BLOCKS as u64 * OBJ as u64;
    let bases: Vec<u64> = (0..LAYERS as u64).map(|l| dev.ptr + l * per_layer).collect();
    let mut l = layout(TUTTI_LAYOUT_VLLM_PER_LAYER, BLOCKS);
    l.num_layers = LAYERS;
    l.k_bases = bases.as_ptr();
    l.memory = TUTTI_MEMORY_CUDA;
    // SAFETY: the device memory holds every object and outlives the registration.
    ok(unsafe { tutti_register_kv(rt.0, &l, ptr::null_mut()) });
}

/// Device memory of BLOCKS blocks holding `seed`'s pattern, registered with `rt`.
fn cuda_kv(rt: &Rt, seed: u8) -> DeviceMem {
    let dev = DeviceMem::new(2 * BLOCKS as usize * OBJ * LAYERS as usize);
    dev.write(&filled(BLOCKS, seed));
    register_cuda(rt, &dev);
    dev
}

/// Waits (bounded) until `rt` finds every one of `keys`.
fn await_keys(rt: &Rt, keys: &[tutti_hash_t]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while lookup(rt, keys, 0).0 < keys.len() {
        assert!(Instant::now() < deadline, "the other client's blocks never appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Loads `keys` into blocks 4.. of `dev` (all of it zeroed first) and checks them against blocks
/// 0.. of `seed`'s pattern; returns the kernels launched meanwhile.
fn load_cuda_and_check(rt: &Rt, dev: &DeviceMem, keys: &[tutti_hash_t], seed: u8) -> u64 {
    dev.zero();
    let to: Vec<u32> = (4..4 + keys.len() as u32).collect();
    let before = launches();
    let st = load_all(rt, keys, &to);
    assert!(st.done == 1 && st.failed == 0, "{st:?}");
    let ran = launches() - before;
    let mut back = dev.read();
    for (from, &b) in to.iter().enumerate() {
        assert!(
            block_bytes(&mut back, b as usize, BLOCKS) == pattern(from, BLOCKS, seed),
            "block {b} (from {from})"
        );
    }
    ran
}

fn keys_of(seed: u8) -> Vec<tutti_hash_t> {
    hashes(4, 700 + seed as u32)
}

/// A client with CUDA KV memory: stores its own 4 blocks, waits for `other`'s, loads them
/// back byte for byte, all through its CUDA executor on the staged path.
fn staged_client(socket: &str, me: u8, other: u8) {
    let rt = connect_gpu(socket, &format!("gpu-{me}"));
    assert_eq!(info(&rt).executor, TUTTI_EXECUTOR_GIO_CUDA);
    let dev = cuda_kv(&rt, me);
    let before = launches();
    let rep = store_all(&rt, &keys_of(me), &[0, 1, 2, 3]);
    assert_eq!((rep.stored, rep.failed), (4, 0));
    let stored_by_kernels = launches() - before;
    println!("gpu-client stored");
    await_keys(&rt, &keys_of(other));
    let loaded_by_kernels = load_cuda_and_check(&rt, &dev, &keys_of(other), other);
    let d = data_path(&rt);
    assert_eq!((d.mode, d.memory, d.staging_slots), (TUTTI_DATA_PATH_STAGED, TUTTI_MEMORY_CUDA, 8));
    assert_eq!(d.staged_bytes, 2 * 4 * 2 * LAYERS as u64 * OBJ as u64, "stored and loaded through slots");
    println!("gpu-client done stored_launches={stored_by_kernels} loaded_launches={loaded_by_kernels}");
    // SAFETY: a live handle.
    unsafe { ok(tutti_unregister_kv(rt.0)) };
}

/// Runs `role` of `test` in a child against `socket`.
fn child(test: &str, role: &str, socket: &str) -> (Child, Said) {
    spawn(test, ROLE, &format!("{role} {socket}"))
}

/// Waits (bounded) until the daemon lists no client and every lease and mapping is back.
fn await_released(daemon: &tutti_daemon::Daemon, free_before: &[u16]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = daemon.status();
        let free: Vec<u16> = s.controllers.iter().map(|c| c.free_pairs).collect();
        let mapped: u64 = s.controllers.iter().map(|c| c.client_mappings).sum();
        if s.clients.is_empty() && free == free_before && mapped == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "clients not released: {s:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn free_pairs(daemon: &tutti_daemon::Daemon) -> Vec<u16> {
    daemon.status().controllers.iter().map(|c| c.free_pairs).collect()
}

#[test]
fn two_gpu_client_processes_share_one_pool_byte_for_byte() {
    const TEST: &str = "two_gpu_client_processes_share_one_pool_byte_for_byte";
    if let Some(args) = child_role() {
        assert_eq!(args[0], "staged");
        staged_client(&args[1], args[2].parse().unwrap(), args[3].parse().unwrap());
        return;
    }
    if nvrtc_missing() {
        return;
    }
    let (daemon, dir) = start_daemon("gpu2");
    let socket = daemon.socket().to_str().unwrap().to_string();
    let free = free_pairs(&daemon);
    let (mut a, mut sa) = child(TEST, "staged", &format!("{socket} 17 99"));
    let (mut b, mut sb) = child(TEST, "staged", &format!("{socket} 99 17"));
    line_of(&mut sa, "gpu-client stored");
    line_of(&mut sb, "gpu-client stored");
    let status = daemon.status();
    assert_eq!(status.clients.len(), 2, "{status:?}");
    let mut qids: Vec<_> = status.clients.iter().flat_map(|c| c.queues.clone()).collect();
    assert!(status.clients.iter().all(|c| !c.queues.is_empty() && c.mappings > 0), "{status:?}");
    let n = qids.len();
    qids.sort();
    qids.dedup();
    assert_eq!(qids.len(), n, "each leased its own queue pairs: {status:?}");
    for (who, said) in [("a", &mut sa), ("b", &mut sb)] {
        let done = line_of(said, "gpu-client done");
        assert!(field(&done, "stored_launches") > 0, "{who}: the stores ran no kernel: {done}");
        assert!(field(&done, "loaded_launches") > 0, "{who}: the loads ran no kernel: {done}");
    }
    assert!(a.wait().unwrap().success() && b.wait().unwrap().success());
    await_released(&daemon, &free);
    drop(daemon);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_gpu_client_moves_host_kv_memory_directly() {
    const TEST: &str = "a_gpu_client_moves_host_kv_memory_directly";
    if let Some(args) = child_role() {
        assert_eq!(args[0], "direct");
        let rt = connect_gpu(&args[1], "gpu-direct");
        let mut mem = register_filled(&rt, BLOCKS, 0x2b);
        let before = launches();
        let keys = hashes(3, 811);
        assert_eq!(store_all(&rt, &keys, &[0, 1, 2]).stored, 3);
        for b in 4..7 {
            scribble(&mut mem, b, BLOCKS);
        }
        let st = load_all(&rt, &keys, &[6, 5, 4]);
        assert!(st.done == 1 && st.failed == 0, "{st:?}");
        for (i, b) in [6usize, 5, 4].into_iter().enumerate() {
            assert!(block_bytes(&mut mem, b, BLOCKS) == pattern(i, BLOCKS, 0x2b), "block {b}");
        }
        let d = data_path(&rt);
        assert_eq!((d.mode, d.memory, d.staged_bytes), (TUTTI_DATA_PATH_DIRECT, TUTTI_MEMORY_HOST, 0));
        println!("gpu-direct done launches={}", launches() - before);
        return;
    }
    if nvrtc_missing() {
        return;
    }
    let (daemon, dir) = start_daemon("gpudirect");
    let socket = daemon.socket().to_str().unwrap().to_string();
    let free = free_pairs(&daemon);
    let (mut c, mut said) = child(TEST, "direct", &socket);
    let done = line_of(&mut said, "gpu-direct done");
    assert!(field(&done, "launches") > 0, "the layers ran no kernel: {done}");
    assert!(c.wait().unwrap().success());
    await_released(&daemon, &free);
    drop(daemon);
    let _ = std::fs::remove_dir_all(dir);
}

/// Survivor: stores its blocks, then loads and checks them until its stdin says "stop";
/// then checks what the killed clients left: the loader's committed blocks, byte for
/// byte, and nothing of the uncommitted store.
fn survivor(socket: &str) {
    let rt = connect_gpu(socket, "survivor");
    let dev = cuda_kv(&rt, 5);
    assert_eq!(store_all(&rt, &keys_of(5), &[0, 1, 2, 3]).stored, 4);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    println!("survivor ready");
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut rounds = 0u64;
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "never told to stop");
        assert!(load_cuda_and_check(&rt, &dev, &keys_of(5), 5) > 0);
        rounds += 1;
    }
    // The killed loader committed its blocks before it was killed: they are served as written.
    assert_eq!(lookup(&rt, &keys_of(40), 0).0, 4);
    assert!(load_cuda_and_check(&rt, &dev, &keys_of(40), 40) > 0);
    // The killed storer never committed: none of its blocks is visible.
    assert_eq!(lookup(&rt, &keys_of(41), 0).0, 0, "an uncommitted store became visible");
    // Its files are free again: this client stores into the pool and reads back its own bytes.
    dev.write(&filled(BLOCKS, 6));
    assert_eq!(store_all(&rt, &keys_of(6), &[0, 1, 2, 3]).stored, 4);
    assert!(load_cuda_and_check(&rt, &dev, &keys_of(6), 6) > 0);
    println!("survivor done rounds={rounds}");
}

/// A client killed with work in flight: "load" stores its blocks, commits, then starts
/// loading them; "store" starts storing blocks it never commits. Then it says so and
/// waits to be killed.
fn victim(socket: &str, what: &str) {
    let rt = connect_gpu(socket, &format!("victim-{what}"));
    let _dev = cuda_kv(&rt, if what == "load" { 40 } else { 41 });
    let mut job = ptr::null_mut();
    // SAFETY: valid handles and buffers throughout; the process is killed holding them.
    unsafe {
        if what == "load" {
            assert_eq!(store_all(&rt, &keys_of(40), &[0, 1, 2, 3]).stored, 4);
            let keys = keys_of(40);
            ok(tutti_submit_load(rt.0, keys.as_ptr(), [4u32, 5, 6, 7].as_ptr(), 4, 0, LAYERS, &mut job));
        } else {
            let keys = keys_of(41);
            let mut st = ptr::null_mut();
            ok(tutti_store_begin(rt.0, keys.as_ptr(), [0u32, 1, 2, 3].as_ptr(), 4, &mut st));
            ok(tutti_store_submit(st, 0, LAYERS, &mut job));
        }
    }
    println!("victim in-flight");
    std::thread::sleep(Duration::from_secs(120));
}

#[test]
fn a_gpu_client_killed_mid_load_and_mid_store_is_released_and_the_others_go_on() {
    const TEST: &str = "a_gpu_client_killed_mid_load_and_mid_store_is_released_and_the_others_go_on";
    if let Some(args) = child_role() {
        match args[0].as_str() {
            "survivor" => survivor(&args[1]),
            "victim" => victim(&args[1], &args[2]),
            r => panic!("unknown role {r}"),
        }
        return;
    }
    if nvrtc_missing() {
        return;
    }
    // Every read and write takes 50 ms on the drive: a layer transfer is still in flight
    // when the victim is killed just after it submitted.
    let cost = tutti_emulator::CostModel {
        read_latency: Duration::from_millis(50),
        write_latency: Duration::from_millis(50),
        ..Default::default()
    };
    let (daemon, dir) = start_daemon_with("gpukill", cost);
    let socket = daemon.socket().to_str().unwrap().to_string();
    let free = free_pairs(&daemon);
    let (mut survivor, mut said) = child(TEST, "survivor", &socket);
    line_of(&mut said, "survivor ready");
    for what in ["load", "store"] {
        let (mut v, mut vsaid) = child(TEST, "victim", &format!("{socket} {what}"));
        line_of(&mut vsaid, "victim in-flight");
        let victim_pid = v.id() as i32;
        let status = daemon.status();
        let held = status.clients.iter().find(|c| c.pid == victim_pid).expect("the victim is a client");
        assert!(!held.queues.is_empty() && held.mappings > 0, "{held:?}");
        if what == "store" {
            assert_eq!(held.reservations, 1, "killed mid-store: {held:?}");
        } else {
            assert_eq!(held.loading_files, 4, "killed mid-load: {held:?}");
        }
        v.kill().unwrap();
        v.wait().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while daemon.status().clients.iter().any(|c| c.pid == victim_pid) {
            assert!(Instant::now() < deadline, "the killed client ({what}) was not released");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // Only the survivor holds anything now.
    let status = daemon.status();
    assert_eq!(status.clients.len(), 1, "{status:?}");
    let mapped: u64 = status.controllers.iter().map(|c| c.client_mappings).sum();
    assert_eq!(mapped as usize, status.clients[0].mappings, "the victims' mappings are gone: {status:?}");
    writeln!(survivor.stdin.take().unwrap(), "stop").unwrap();
    let done = line_of(&mut said, "survivor done");
    assert!(field(&done, "rounds") > 0, "{done}");
    assert!(survivor.wait().unwrap().success());
    await_released(&daemon, &free);
    drop(daemon);
    let _ = std::fs::remove_dir_all(dir);
}

/// A client whose CUDA KV memory GDRCopy maps (the stand-in's gdrapi): stores 4 blocks and
/// loads them back byte for byte, with the drives' DMA going straight into the mapping (P2P,
/// no staging slot), then holds everything until it is killed.
fn p2p_client(socket: &str) {
    // This child's only thread reads the environment from here on.
    std::env::set_var("TUTTI_GDRAPI", Standin::load().expect("the stand-in libcuda.so").path);
    std::env::remove_var("TUTTI_P2P");
    let rt = connect_gpu(socket, "gpu-p2p");
    let dev = cuda_kv(&rt, 23);
    let d = data_path(&rt);
    let text = |b: &[std::ffi::c_char]| -> String {
        b.iter().take_while(|&&c| c != 0).map(|&c| c as u8 as char).collect()
    };
    assert_eq!((d.mode, d.memory), (TUTTI_DATA_PATH_P2P, TUTTI_MEMORY_CUDA), "{}", text(&d.p2p_missing));
    assert_eq!(text(&d.p2p_provider), "gdrcopy");
    let keys = keys_of(23);
    let rep = store_all(&rt, &keys, &[0, 1, 2, 3]);
    assert_eq!((rep.stored, rep.failed), (4, 0));
    let ran = load_cuda_and_check(&rt, &dev, &keys, 23);
    assert_eq!(data_path(&rt).staged_bytes, 0, "no byte through a staging slot");
    println!("gpu-p2p ready launches={ran}");
    std::thread::sleep(Duration::from_secs(120));
}

#[test]
fn a_gpu_client_moves_cuda_kv_memory_peer_to_peer_and_a_killed_one_leaves_no_mapping() {
    const TEST: &str = "a_gpu_client_moves_cuda_kv_memory_peer_to_peer_and_a_killed_one_leaves_no_mapping";
    if let Some(args) = child_role() {
        assert_eq!(args[0], "p2p");
        p2p_client(&args[1]);
        return;
    }
    if nvrtc_missing() {
        return;
    }
    let (daemon, dir) = start_daemon("gpup2p");
    let socket = daemon.socket().to_str().unwrap().to_string();
    let free = free_pairs(&daemon);
    let (mut c, mut said) = child(TEST, "p2p", &socket);
    let ready = line_of(&mut said, "gpu-p2p ready");
    assert!(field(&ready, "launches") > 0, "the loads ran no kernel: {ready}");
    let pid = c.id() as i32;
    let status = daemon.status();
    let me = status.clients.iter().find(|x| x.pid == pid).expect("the P2P client is a client");
    // Its GPU memory (one allocation, whole GPU pages) mapped as device memory for each drive.
    let drives = status.controllers.len();
    assert!(
        me.device_mappings >= drives,
        "its GPU memory is mapped as device memory on {drives} drives: {me:?}"
    );
    assert!(me.mappings > me.device_mappings, "and its queues and staging as host memory: {me:?}");
    c.kill().unwrap();
    c.wait().unwrap();
    // Killed holding it all: the daemon drops every mapping, device memory's too.
    await_released(&daemon, &free);
    drop(daemon);
    let _ = std::fs::remove_dir_all(dir);
}
