//! `tutti serve` and `tutti status` through the binary: the daemon announces
//! itself, reports its pool and controllers, refuses a second daemon on the
//! same media naming the holder, and stops cleanly on SIGTERM (socket removed).

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../tests/support/reap.rs"]
mod reap;

use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

fn serve(dir: &Path, socket: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tutti"));
    c.args(["serve", "--emulated", "2", "--capacity-mib", "16", "--layers", "4", "--kv-heads", "2"])
        .args(["--head-dim", "64", "--json", "--dir"])
        .arg(dir)
        .arg("--socket")
        .arg(dir.join(socket));
    c
}

fn wait(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < deadline, "tutti serve did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn serve_reports_status_refuses_a_second_owner_and_stops_on_sigterm() {
    let dir = std::env::temp_dir().join(format!("tutti-serve-cli-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (mut daemon, line) = reap::spawn_first_line(&mut serve(&dir, "a.sock"));
    let hello: Value = serde_json::from_str(&line).expect("one JSON line when serving");
    assert_eq!(hello["pid"].as_u64(), Some(daemon.id() as u64), "{hello}");
    let socket = dir.join("a.sock");
    assert_eq!(hello["serving"].as_str(), Some(socket.to_str().unwrap()));

    let out = Command::new(env!("CARGO_BIN_EXE_tutti"))
        .args(["status", "--json", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["pid"].as_u64(), Some(daemon.id() as u64));
    assert_eq!(s["controllers"].as_array().unwrap().len(), 2, "{s}");
    assert!(s["stats"]["index"]["files"].as_u64().unwrap() > 0, "{s}");
    assert_eq!(s["clients"].as_array().unwrap().len(), 1, "the status command itself: {s}");
    let text =
        Command::new(env!("CARGO_BIN_EXE_tutti")).args(["status", "--socket"]).arg(&socket).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("0 clients") && text.contains("controller emu0"), "{text}");

    // The same media under another socket: refused, naming this daemon.
    let second = serve(&dir, "b.sock").output().unwrap();
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains(&daemon.id().to_string()), "names the holder: {err}");

    // SIGTERM: a clean stop, the socket gone.
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) }, 0);
    assert!(wait(&mut daemon).success());
    assert!(!socket.exists(), "the socket file was removed");
    assert!(!dir.join("a.sock.owner").exists(), "and its owner record");
    let gone =
        Command::new(env!("CARGO_BIN_EXE_tutti")).args(["status", "--socket"]).arg(&socket).output().unwrap();
    assert!(!gone.status.success());
    assert!(String::from_utf8_lossy(&gone.stderr).contains("no tuttid listening"), "{gone:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_client_reports_both_sides_and_their_ratios() {
    let out = Command::new(env!("CARGO_BIN_EXE_tutti"))
        .args(["bench", "client", "--layers", "4", "--blocks", "4", "--loads", "2", "--lookups", "10"])
        .args(["--json", "--quiet"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    for side in ["in_process", "client"] {
        for k in ["submit_ns_per_layer", "setup_ns_per_job", "load_us_median", "lookup_us_median"] {
            assert!(r[side][k].as_f64().unwrap() > 0.0, "{side}.{k}: {r}");
        }
    }
    let ratio = |k: &str, f: &str| {
        r[k].as_f64().unwrap() - r["client"][f].as_f64().unwrap() / r["in_process"][f].as_f64().unwrap()
    };
    assert!(ratio("ratio_lookup", "lookup_us_median").abs() < 1e-9, "{r}");
    assert!(ratio("ratio_submit_per_layer", "submit_ns_per_layer").abs() < 1e-9, "{r}");
}

#[test]
fn serve_with_idle_exit_leaves_after_its_last_client_and_removes_the_socket() {
    let dir = std::env::temp_dir().join(format!("tutti-serve-idle-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (mut daemon, _) = reap::spawn_first_line(serve(&dir, "idle.sock").args(["--idle-exit-s", "1"]));
    let socket = dir.join("idle.sock");
    // A client held for longer than the idle period: the daemon stays.
    let client = tutti_daemon::remote::Client::connect(&socket, "held", Duration::from_secs(10)).unwrap();
    let held = Instant::now();
    while held.elapsed() < Duration::from_millis(2500) {
        assert!(daemon.try_wait().unwrap().is_none(), "tuttid left while a client was connected");
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = Command::new(env!("CARGO_BIN_EXE_tutti"))
        .args(["status", "--json", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["clients"].as_array().unwrap().len(), 2, "the held client and the status command: {s}");
    // The last client leaves: the daemon exits after the idle period.
    drop(client);
    assert!(wait(&mut daemon).success(), "a clean exit after the idle period");
    assert!(!socket.exists(), "the socket file was removed");
    // The media is free again: a new daemon on it starts (and is stopped at once).
    let (mut again, line) = reap::spawn_first_line(&mut serve(&dir, "idle.sock"));
    assert!(line.contains("serving"), "{line}");
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(again.id() as i32, libc::SIGTERM) }, 0);
    assert!(wait(&mut again).success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn status_on_the_socket_of_a_killed_daemon_says_none_listens_and_names_who_left_it() {
    let dir = std::env::temp_dir().join(format!("tutti-serve-killed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (mut daemon, _) = reap::spawn_first_line(&mut serve(&dir, "k.sock"));
    let pid = daemon.id();
    daemon.kill().unwrap(); // SIGKILL: the socket file and its owner record stay behind
    wait(&mut daemon);
    let socket = dir.join("k.sock");
    assert!(socket.exists() && dir.join("k.sock.owner").exists());
    let out =
        Command::new(env!("CARGO_BIN_EXE_tutti")).args(["status", "--socket"]).arg(&socket).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no tuttid listening") && err.contains("stale"), "{err}");
    assert!(err.contains(&format!("pid {pid}")) && err.contains("no longer running"), "{err}");
    // A new daemon replaces the stale socket (and the record names it now).
    let (mut again, line) = reap::spawn_first_line(&mut serve(&dir, "k.sock"));
    assert!(line.contains("serving"), "{line}");
    let record = std::fs::read_to_string(dir.join("k.sock.owner")).unwrap();
    assert!(record.contains(&format!("pid={}", again.id())), "{record}");
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(again.id() as i32, libc::SIGTERM) }, 0);
    assert!(wait(&mut again).success());
    let _ = std::fs::remove_dir_all(&dir);
}
