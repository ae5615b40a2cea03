//! `tutti_contains_identity`: a runtime with no registration of its own (an
//! engine's scheduler) counts the leading chunks stored under an identity it
//! names — in-process and as a tuttid client — and only under that identity:
//! another model, salt or layout kind is a miss. Bad arguments are refused by name.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::ffi::CString;
use std::ptr::{null, null_mut};
use tutti::*;

fn contains(rt: &Rt, model: &str, salt: &[u8], kind: u32, keys: &[tutti_hash_t]) -> (i32, usize) {
    let model = CString::new(model).unwrap();
    let mut hits = usize::MAX;
    // SAFETY: valid strings, slices and out pointer.
    let code = unsafe {
        tutti_contains_identity(
            rt.0,
            model.as_ptr(),
            if salt.is_empty() { null() } else { salt.as_ptr() },
            salt.len(),
            kind,
            keys.as_ptr(),
            keys.len(),
            &mut hits,
        )
    };
    (code, hits)
}

/// `writer` stores 3 chunks under ("test-model", no salt, per-layer); `asker` has no registration.
fn check(writer: &Rt, asker: &Rt) {
    let keys = hashes(4, 31);
    assert_eq!(
        contains(asker, "test-model", b"", TUTTI_LAYOUT_VLLM_PER_LAYER, &keys),
        (TUTTI_OK, 0),
        "no registration needed: {}",
        last_error()
    );
    let _mem = register_filled(writer, 4, 7);
    let rep = store_all(writer, &keys[..3], &[0, 1, 2]);
    assert_eq!((rep.stored, rep.failed), (3, 0));

    assert_eq!(contains(asker, "test-model", b"", TUTTI_LAYOUT_VLLM_PER_LAYER, &keys), (TUTTI_OK, 3));
    assert_eq!(contains(asker, "test-model", b"", TUTTI_LAYOUT_VLLM_PER_LAYER, &keys[1..]), (TUTTI_OK, 2));
    let gap = [keys[3], keys[0]];
    assert_eq!(
        contains(asker, "test-model", b"", TUTTI_LAYOUT_VLLM_PER_LAYER, &gap),
        (TUTTI_OK, 0),
        "leading only"
    );
    assert_eq!(contains(asker, "other-model", b"", TUTTI_LAYOUT_VLLM_PER_LAYER, &keys), (TUTTI_OK, 0));
    assert_eq!(contains(asker, "test-model", b"tp1", TUTTI_LAYOUT_VLLM_PER_LAYER, &keys), (TUTTI_OK, 0));
    assert_eq!(contains(asker, "test-model", b"", TUTTI_LAYOUT_STRIDED, &keys), (TUTTI_OK, 0));
    assert_eq!(contains(asker, "test-model", b"", TUTTI_LAYOUT_VLLM_PER_LAYER, &[]), (TUTTI_OK, 0));
    // The same answer as the writer's own (registered) query, and nothing pinned by it.
    assert_eq!(lookup(writer, &keys, 0).0, 3);

    let (code, _) = contains(asker, "test-model", b"", 9, &keys);
    expect(code, TUTTI_E_INVALID_ARG, "layout_kind");
    let (code, _) = contains(asker, "", b"", TUTTI_LAYOUT_VLLM_PER_LAYER, &keys);
    expect(code, TUTTI_E_INVALID_ARG, "model");
    let model = CString::new("test-model").unwrap();
    let mut hits = 0usize;
    // SAFETY: NULL pointers are checked by the library.
    let code = unsafe { tutti_contains_identity(asker.0, null(), null(), 0, 1, keys.as_ptr(), 1, &mut hits) };
    expect(code, TUTTI_E_NULL_POINTER, "model");
    // SAFETY: as above.
    let code = unsafe {
        tutti_contains_identity(asker.0, model.as_ptr(), null(), 0, 1, keys.as_ptr(), 1, null_mut())
    };
    expect(code, TUTTI_E_NULL_POINTER, "out_hits");
    // SAFETY: as above.
    let code = unsafe {
        tutti_contains_identity(asker.0, model.as_ptr(), null(), 5, 1, keys.as_ptr(), 1, &mut hits)
    };
    expect(code, TUTTI_E_NULL_POINTER, "tenant_salt");
    // SAFETY: a stale handle is checked.
    let code = unsafe {
        tutti_contains_identity(null_mut(), model.as_ptr(), null(), 0, 1, keys.as_ptr(), 1, &mut hits)
    };
    assert_ne!(code, TUTTI_OK);
}

#[test]
fn an_in_process_runtime_counts_chunks_under_a_named_identity() {
    let rt = Rt::open(&config());
    // One runtime plays both parts: the question does not use its registration.
    let asker = Rt(rt.0);
    check(&rt, &asker);
    std::mem::forget(asker);
}

#[test]
fn a_client_without_kv_memory_counts_another_clients_chunks() {
    let (daemon, dir) = start_daemon("contains");
    let socket = CString::new(daemon.socket().to_str().unwrap()).unwrap();
    let connect = |name: &CString| {
        let cfg = client_config(&socket, name);
        let mut rt = null_mut();
        // SAFETY: a valid config and out pointer.
        ok(unsafe { tutti_runtime_connect(&cfg, &mut rt) });
        Rt(rt)
    };
    let (wn, sn) = (CString::new("worker").unwrap(), CString::new("scheduler").unwrap());
    let worker = connect(&wn);
    let scheduler = connect(&sn);
    check(&worker, &scheduler);
    drop(worker);
    drop(scheduler);
    drop(daemon);
    let _ = std::fs::remove_dir_all(dir);
}
