//! One owner per media: a second runtime on an `emulated_dir` that a live
//! runtime owns, in this process or another, in any open mode, is refused with
//! `TUTTI_E_BUSY` naming the holder, and the first runtime's KV is untouched.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::ffi::CString;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::ptr::null_mut;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tutti::*;

/// Set in the child process of the two-process test: the directory it holds.
const HOLD_ENV: &str = "TUTTI_TEST_ONE_OWNER_HOLD";
const BLOCKS: u32 = 4;

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tutti-capi-owner-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn config_in(dir: &CString, mode: u32) -> tutti_runtime_config_t {
    let mut cfg = config();
    cfg.emulated_dir = dir.as_ptr();
    cfg.open_mode = mode;
    cfg
}

fn unregister(rt: &Rt) {
    // SAFETY: a live handle.
    ok(unsafe { tutti_unregister_kv(rt.0) });
}

/// Opens a runtime that must be refused as a second owner; returns the message.
fn refused(cfg: &tutti_runtime_config_t) -> String {
    let mut rt = null_mut();
    // SAFETY: valid config and out pointer.
    let code = unsafe { tutti_runtime_open(cfg, &mut rt) };
    let msg = last_error();
    if code == TUTTI_OK {
        // SAFETY: the handle just opened.
        unsafe { tutti_runtime_close(rt) };
    }
    assert_eq!(code, TUTTI_E_BUSY, "a second owner got {} ({code}): {msg}", name(code));
    assert!(rt.is_null());
    eprintln!("refused as expected: {msg}");
    msg
}

#[test]
fn second_runtime_on_live_media_is_refused_and_the_first_keeps_its_bytes() {
    let dir = temp_dir("same");
    let cdir = CString::new(dir.to_str().unwrap()).unwrap();
    let keys = hashes(2, 7);
    let a = Rt::open(&config_in(&cdir, TUTTI_OPEN_CREATE));
    let mut mem = register_filled(&a, BLOCKS, 0);
    let rep = store_all(&a, &keys, &[0, 1]);
    assert_eq!(rep.stored, 2);
    let expected = [block_bytes(&mut mem, 0, BLOCKS), block_bytes(&mut mem, 1, BLOCKS)];

    // Runtime B, same directory, same process: refused in every mode, naming the media and us.
    let me = format!("pid {}", std::process::id());
    for mode in [TUTTI_OPEN_CREATE, TUTTI_OPEN_OR_CREATE, TUTTI_OPEN_EXISTING] {
        let msg = refused(&config_in(&cdir, mode));
        assert!(msg.contains("emu0.img") && msg.contains(&me) && msg.contains("this process"), "{msg}");
    }

    // A's lookups hit and its loads return A's bytes.
    mem.bytes().fill(0);
    assert_eq!(lookup(&a, &keys, 0).0, 2);
    let st = load_all(&a, &keys, &[0, 1]);
    assert_eq!(st.failed, 0);
    for (b, want) in expected.iter().enumerate() {
        assert!(block_bytes(&mut mem, b, BLOCKS) == *want, "block {b}: runtime A got bytes it did not store");
    }
    unregister(&a);
    drop(a);

    // Closed, the media open again, and hold A's pool.
    let b = Rt::open(&config_in(&cdir, TUTTI_OPEN_EXISTING));
    let _mem = register_filled(&b, BLOCKS, 0);
    assert_eq!(lookup(&b, &keys, 0).0, 2);
    unregister(&b);
    drop(b);
    for i in 0..2 {
        assert!(!dir.join(format!("emu{i}.img.owner")).exists(), "emu{i}: owner record left after close");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// In the child: owns the pool in `dir`, stores one chunk, says "holder-ready", and
/// holds on until its stdin closes (or a deadline passes).
fn hold(dir: &Path) {
    let cdir = CString::new(dir.to_str().unwrap()).unwrap();
    let rt = Rt::open(&config_in(&cdir, TUTTI_OPEN_CREATE));
    let _mem = register_filled(&rt, BLOCKS, 100);
    assert_eq!(store_all(&rt, &hashes(1, 99), &[0]).stored, 1);
    // libtest may have printed the test's name on this line already.
    println!("\nholder-ready {}", std::process::id());
    std::io::stdout().flush().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut sink = String::new();
        let _ = std::io::stdin().read_line(&mut sink);
        let _ = tx.send(());
    });
    let _ = rx.recv_timeout(Duration::from_secs(120));
    unregister(&rt);
}

#[test]
fn second_process_on_live_media_is_refused_naming_it() {
    if let Some(dir) = std::env::var_os(HOLD_ENV) {
        hold(Path::new(&dir));
        return;
    }
    let dir = temp_dir("proc");
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "second_process_on_live_media_is_refused_naming_it",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HOLD_ENV, &dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if let Some((_, pid)) = line.split_once("holder-ready ") {
                let _ = tx.send(pid.trim().to_string());
            }
        }
    });
    let ready = rx.recv_timeout(Duration::from_secs(120));
    let Ok(pid) = ready else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the holder process did not open the pool within 120 s");
    };
    assert_eq!(pid, child.id().to_string());

    // The child owns the media: opening them here in create mode is refused, naming it.
    let cdir = CString::new(dir.to_str().unwrap()).unwrap();
    let msg = refused(&config_in(&cdir, TUTTI_OPEN_CREATE));
    assert!(msg.contains("emu0.img") && msg.contains(&format!("pid {pid}")), "{msg}");
    assert!(!msg.contains("this process"), "{msg}");

    // The holder dies without closing: its owner record stays behind, but the lock went with it.
    child.kill().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the killed holder did not exit within 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(dir.join("emu0.img.owner").exists(), "expected the dead holder's record to remain");

    // The refused create formatted nothing: the child's chunk is there, with its bytes.
    let rt = Rt::open(&config_in(&cdir, TUTTI_OPEN_EXISTING));
    let keys = hashes(1, 99);
    let mut mem = register_filled(&rt, BLOCKS, 100);
    let want = block_bytes(&mut mem, 0, BLOCKS);
    mem.bytes().fill(0);
    assert_eq!(lookup(&rt, &keys, 0).0, 1);
    assert_eq!(load_all(&rt, &keys, &[0]).failed, 0);
    assert!(block_bytes(&mut mem, 0, BLOCKS) == want, "the holder's chunk lost its bytes");
    unregister(&rt);
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
}
