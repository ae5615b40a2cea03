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
    drop(daemon);
    let _ = std::fs::remove_dir_all(dir);
}
