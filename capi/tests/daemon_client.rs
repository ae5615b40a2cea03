//! `tutti_runtime_connect`: two runtimes of this process are clients of a
//! tuttid; what one stores the other loads, byte for byte, through the same
//! calls as an in-process runtime. Bad configs are refused by name, and a
//! daemon that is not there is an error, not a hang.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::ffi::CString;
use std::ptr::{null, null_mut};
use std::time::{Duration, Instant};
use tutti::*;

const BLOCKS: u32 = 4;

fn connect(cfg: &tutti_client_config_t) -> (i32, Rt) {
    let mut rt = null_mut();
    // SAFETY: a valid config and out pointer.
    let code = unsafe { tutti_runtime_connect(cfg, &mut rt) };
    (code, Rt(rt))
}

#[test]
fn two_clients_share_the_daemons_pool_byte_for_byte() {
    let (daemon, dir) = start_daemon("share");
    let socket = CString::new(daemon.socket().to_str().unwrap()).unwrap();
    let (na, nb) = (CString::new("writer").unwrap(), CString::new("reader").unwrap());
    let (code, a) = connect(&client_config(&socket, &na));
    assert_eq!(code, TUTTI_OK, "{}", last_error());
    let (code, b) = connect(&client_config(&socket, &nb));
    assert_eq!(code, TUTTI_OK, "{}", last_error());
    let mut wrote = register_filled(&a, BLOCKS, 3);
    let keys = hashes(2, 99);
    let rep = store_all(&a, &keys, &[0, 1]);
    assert_eq!((rep.stored, rep.failed), (2, 0));
    let mut read = register_filled(&b, BLOCKS, 200);
    assert_eq!(lookup(&b, &keys, 0).0, 2, "the other client sees the committed chunks");
    let st = load_all(&b, &keys, &[3, 2]);
    assert_eq!((st.done, st.failed), (1, 0));
    assert_eq!(block_bytes(&mut read, 3, BLOCKS), block_bytes(&mut wrote, 0, BLOCKS));
    assert_eq!(block_bytes(&mut read, 2, BLOCKS), block_bytes(&mut wrote, 1, BLOCKS));
    let status = daemon.status();
    assert_eq!(status.clients.len(), 2, "{status:?}");
    assert!(status.clients.iter().all(|c| !c.queues.is_empty()), "each client leased its own queue pairs");
    let mut qids: Vec<_> = status.clients.iter().flat_map(|c| c.queues.clone()).collect();
    let n = qids.len();
    qids.sort();
    qids.dedup();
    assert_eq!(qids.len(), n, "no queue pair is leased twice: {status:?}");
    drop(a);
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !daemon.status().clients.is_empty() {
        assert!(Instant::now() < deadline, "closed clients are released");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(daemon);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bad_client_configs_are_refused_by_name() {
    let (daemon, dir) = start_daemon("bad");
    let socket = CString::new(daemon.socket().to_str().unwrap()).unwrap();
    let name = CString::new("bad").unwrap();
    let mut rt = null_mut();
    // SAFETY: NULL config is checked.
    expect(unsafe { tutti_runtime_connect(null(), &mut rt) }, TUTTI_E_NULL_POINTER, "config");
    let mut cfg = client_config(&socket, &name);
    cfg.socket = null();
    expect(connect(&cfg).0, TUTTI_E_NULL_POINTER, "socket");
    let empty = CString::new("").unwrap();
    expect(connect(&client_config(&empty, &name)).0, TUTTI_E_INVALID_ARG, "socket");
    let missing = CString::new(dir.join("nobody.sock").to_str().unwrap()).unwrap();
    let t = Instant::now();
    expect(connect(&client_config(&missing, &name)).0, TUTTI_E_IO, "no tuttid listening");
    assert!(t.elapsed() < Duration::from_secs(10));
    let mut cfg = client_config(&socket, &name);
    cfg.geometry.layers = LAYERS + 1;
    expect(connect(&cfg).0, TUTTI_E_INVALID_ARG, "geometry");
    let mut cfg = client_config(&socket, &name);
    cfg.executor = 9;
    expect(connect(&cfg).0, TUTTI_E_INVALID_ARG, "executor");
    let mut cfg = client_config(&socket, &name);
    cfg.struct_size = 3;
    expect(connect(&cfg).0, TUTTI_E_STRUCT_SIZE, "tutti_client_config_t");
    // ABI 1.8 fields, each checked before anything is leased.
    let driver = CString::new("/nonexistent/libcuda.so").unwrap();
    type Edit = fn(&mut tutti_client_config_t);
    let bad: [(Edit, &str); 8] = [
        (|c| c.exec_mode = 7, "exec_mode"),
        (|c| c.exec_mode = TUTTI_EXEC_MODE_INLINE, "only TUTTI_EXECUTOR_GIO_HOST"),
        (|c| c.exec_mode = TUTTI_EXEC_MODE_PERSISTENT, "cuda_sm_count"),
        (|c| c.cuda_block_threads = 48, "cuda_block_threads"),
        (|c| c.staging_slots = u32::MAX, "staging_slots"),
        (|c| c.cuda_driver = c"".as_ptr(), "cuda_driver"),
        (|c| c.cuda_device = u32::MAX, "cuda_device"),
        (|c| c.host_lane_blocks = 65, "host_lane_blocks"),
    ];
    for (set, what) in bad {
        let mut cfg = client_config(&socket, &name);
        cfg.executor = TUTTI_EXECUTOR_GIO_CUDA;
        cfg.cuda_driver = driver.as_ptr();
        set(&mut cfg);
        expect(connect(&cfg).0, TUTTI_E_INVALID_ARG, what);
    }
    let mut cfg = client_config(&socket, &name);
    cfg.executor = TUTTI_EXECUTOR_GIO_HOST;
    cfg.exec_mode = TUTTI_EXEC_MODE_INLINE;
    cfg.host_lane_blocks = 2;
    expect(connect(&cfg).0, TUTTI_E_INVALID_ARG, "host_lane_blocks is 2");
    let mut cfg = client_config(&socket, &name);
    cfg.executor = TUTTI_EXECUTOR_DIRECT;
    cfg.exec_mode = TUTTI_EXEC_MODE_LAUNCH;
    expect(connect(&cfg).0, TUTTI_E_INVALID_ARG, "exec_mode");
    let mut cfg = client_config(&socket, &name);
    cfg.executor = TUTTI_EXECUTOR_CONTROL;
    cfg.staging_slots = 4;
    expect(connect(&cfg).0, TUTTI_E_INVALID_ARG, "staging_slots");
    // A CUDA driver that is not there: unsupported, naming it; nothing is left leased.
    let mut cfg = client_config(&socket, &name);
    cfg.executor = TUTTI_EXECUTOR_GIO_CUDA;
    cfg.cuda_driver = driver.as_ptr();
    expect(connect(&cfg).0, TUTTI_E_UNSUPPORTED, "/nonexistent/libcuda.so");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !daemon.status().clients.is_empty() {
        assert!(Instant::now() < deadline, "refused clients are released: {:?}", daemon.status());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(daemon.status().controllers.iter().all(|c| c.client_mappings == 0));
    drop(daemon);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_abi_1_3_client_config_is_still_accepted() {
    let (daemon, dir) = start_daemon("abi13");
    let socket = CString::new(daemon.socket().to_str().unwrap()).unwrap();
    let name = CString::new("old").unwrap();
    let mut cfg = client_config(&socket, &name);
    cfg.struct_size = std::mem::offset_of!(tutti_client_config_t, exec_mode) as u32;
    // Past a 1.3 caller's struct_size nothing is read.
    cfg.exec_mode = 99;
    cfg.staging_slots = u32::MAX;
    let (code, rt) = connect(&cfg);
    assert_eq!(code, TUTTI_OK, "{}", last_error());
    let mut mem = register_filled(&rt, BLOCKS, 11);
    let keys = hashes(2, 13);
    assert_eq!(store_all(&rt, &keys, &[0, 1]).stored, 2);
    scribble(&mut mem, 3, BLOCKS);
    assert_eq!(load_all(&rt, &keys, &[3, 2]).failed, 0);
    assert_eq!(block_bytes(&mut mem, 3, BLOCKS), pattern(0, BLOCKS, 11));
    cfg.struct_size += 4;
    expect(connect(&cfg).0, TUTTI_E_STRUCT_SIZE, "tutti_client_config_t");
    drop(rt);
    drop(daemon);
    let _ = std::fs::remove_dir_all(dir);
}

/// `TUTTI_EXECUTOR_CONTROL`: an engine's scheduler. It leases no queue pair, maps nothing,
/// takes no arbitration slot; it sees what the other clients committed; it cannot register.
#[test]
fn a_control_only_client_leases_nothing_and_sees_the_pool() {
    let (daemon, dir) = start_daemon("control");
    let socket = CString::new(daemon.socket().to_str().unwrap()).unwrap();
    let (nw, nc) = (CString::new("worker").unwrap(), CString::new("scheduler").unwrap());
    let (code, worker) = connect(&client_config(&socket, &nw));
    assert_eq!(code, TUTTI_OK, "{}", last_error());
    let mut cfg = client_config(&socket, &nc);
    cfg.executor = TUTTI_EXECUTOR_CONTROL;
    let (code, sched) = connect(&cfg);
    assert_eq!(code, TUTTI_OK, "{}", last_error());
    let _mem = register_filled(&worker, BLOCKS, 3);
    let keys = hashes(3, 77);
    assert_eq!(store_all(&worker, &keys, &[0, 1, 2]).stored, 3);
    // The scheduler asks under the worker's identity, as vLLM's scheduler does.
    let salt: &[u8] = &[];
    let mut n = 0usize;
    // SAFETY: valid buffers and a live handle.
    ok(unsafe {
        tutti_contains_identity(
            sched.0,
            c"test-model".as_ptr(),
            salt.as_ptr(),
            0,
            TUTTI_LAYOUT_VLLM_PER_LAYER,
            keys.as_ptr(),
            keys.len(),
            &mut n,
        )
    });
    assert_eq!(n, 3, "the control-only client sees the worker's commits");
    let status = daemon.status();
    let c = status.clients.iter().find(|c| c.name == "scheduler").expect("listed");
    assert!(c.queues.is_empty() && c.mappings == 0 && c.arbitration_slot.is_none(), "{c:?}");
    let mem = Mem::new(2 * BLOCKS as usize * OBJ * LAYERS as usize);
    let per_layer = 2 * BLOCKS as u64 * OBJ as u64;
    let bases: Vec<u64> = (0..LAYERS as u64).map(|l| mem.addr() + l * per_layer).collect();
    let mut l = layout(TUTTI_LAYOUT_VLLM_PER_LAYER, BLOCKS);
    l.num_layers = LAYERS;
    l.k_bases = bases.as_ptr();
    // SAFETY: valid layout and live handle; refused before anything is mapped.
    expect(
        unsafe { tutti_register_kv(sched.0, &l, null_mut()) },
        TUTTI_E_UNSUPPORTED,
        "TUTTI_EXECUTOR_CONTROL",
    );
    let info = info(&sched);
    assert_eq!((info.drives, info.executor), (2, TUTTI_EXECUTOR_CONTROL));
    drop(sched);
    drop(worker);
    drop(daemon);
    let _ = std::fs::remove_dir_all(dir);
}
