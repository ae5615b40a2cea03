//! `tutti selftest --client`: engine processes on a `tutti serve` (emulated
//! drives here; the QEMU guest runs the same on VFIO drives): two at once,
//! every byte verified; one held mid-load and SIGKILLed, released by the
//! daemon; `--refusals` on a pool without VFIO controllers is an error.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../tests/support/reap.rs"]
mod reap;

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn tutti() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tutti"))
}

fn client(socket: &Path, seed: u64) -> Command {
    let mut c = tutti();
    c.args(["selftest", "--json", "--seed", &seed.to_string(), "--client"]).arg(socket);
    c
}

fn status(socket: &Path) -> Value {
    let out = tutti().args(["status", "--json", "--socket"]).arg(socket).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn client_processes_verify_their_bytes_and_a_killed_one_is_released() {
    let dir = std::env::temp_dir().join(format!("tutti-selftest-client-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("s.sock");
    let (mut daemon, line) = reap::spawn_first_line(
        tutti()
            .args(["serve", "--emulated", "2", "--capacity-mib", "16", "--layers", "4", "--kv-heads", "2"])
            .args(["--head-dim", "64", "--json", "--dir"])
            .arg(&dir)
            .arg("--socket")
            .arg(&socket),
    );
    assert!(line.contains("serving"), "{line}");
    let pairs_before = status(&socket)["controllers"].clone();

    // Two clients at once, each with its own request.
    let kids: Vec<_> =
        (1..=2).map(|seed| client(&socket, seed).stdout(Stdio::piped()).spawn().unwrap()).collect();
    for (i, k) in kids.into_iter().enumerate() {
        let out = k.wait_with_output().unwrap();
        assert!(out.status.success(), "client {}: {}", i + 1, String::from_utf8_lossy(&out.stderr));
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(r["seed"].as_u64(), Some(i as u64 + 1), "{r}");
        assert_eq!(r["drives"].as_u64(), Some(2), "{r}");
        // 4 chunks x 4 layers x K and V x 4 KiB objects.
        assert_eq!(r["bytes_verified"].as_u64(), Some(4 * 4 * 2 * 4096), "{r}");
    }

    // One held in the middle of a load, then SIGKILLed: the daemon gives back all it held.
    let (mut held, line) =
        reap::spawn_first_line(tutti().args(["selftest", "--seed", "3", "--hold", "--client"]).arg(&socket));
    assert!(line.contains("holding mid-load"), "{line}");
    let s = status(&socket);
    let c = s["clients"].as_array().unwrap().iter().find(|c| c["name"] == "selftest-client-3").cloned();
    let c = c.unwrap_or_else(|| panic!("the held client is listed: {s}"));
    assert!(!c["queues"].as_array().unwrap().is_empty() && c["pins"].as_u64() == Some(1), "{c}");
    held.kill().unwrap();
    held.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = status(&socket);
        if s["clients"].as_array().unwrap().len() == 1 {
            assert_eq!(s["controllers"], pairs_before, "every queue pair came back");
            assert_eq!(s["stats"]["index"]["pinned"].as_u64(), Some(0), "{s}");
            break;
        }
        assert!(Instant::now() < deadline, "the killed client is still held: {s}");
        std::thread::sleep(Duration::from_millis(50));
    }

    // --refusals needs VFIO controllers; on emulated ones it says so.
    let out = client(&socket, 4).arg("--refusals").output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no VFIO controller"), "{err}");

    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) }, 0);
    assert!(daemon.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
}
