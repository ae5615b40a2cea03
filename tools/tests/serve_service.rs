//! `tutti serve` as a service: its config file (a flag given wins; unknown keys and bad values
//! are named), the pool's geometry at start and in `tutti status` (a mismatch names the flags
//! that match), the systemd unit (`systemd-analyze verify`) and readiness notifications, and a
//! clean stop on SIGTERM while clients store and load.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod serving;

#[path = "../../tests/support/skip.rs"]
mod skip;

use serde_json::Value;
use serving::{serve_cmd, tutti, Engine, Serve, TempDir};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const FLAGS: &str = "--layers 4 --kv-heads 2 --head-dim 64 --block-tokens 16 --dtype bf16";

fn status_json(socket: &Path) -> Value {
    let out = tutti().args(["status", "--json", "--socket"]).arg(socket).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn serve_prints_the_geometry_status_shows_it_and_a_mismatch_names_the_flags_that_match() {
    let dir = TempDir::new("geo");
    // Text: the geometry and the flags that describe it, on a line of their own.
    let mut text = serving::reap::Reap(
        tutti()
            .args(["serve", "--emulated", "2", "--capacity-mib", "16", "--layers", "4", "--kv-heads", "2"])
            .args(["--head-dim", "64", "--dir"])
            .arg(&dir.0)
            .arg("--socket")
            .arg(dir.join("s.sock"))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(text.stdout.take().unwrap()));
    let first = lines.next().unwrap().unwrap();
    let second = lines.next().unwrap().unwrap();
    assert!(first.starts_with("tuttid ") && first.contains("serving pool"), "{first}");
    assert_eq!(
        second,
        format!(
            "geometry: 4 layers × 2 KV heads × head dim 64 × 16 tokens/block, bf16 (tutti serve {FLAGS})"
        )
    );
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(text.id() as i32, libc::SIGTERM) }, 0);
    assert!(serving::wait_exit(&mut text, Duration::from_secs(60)).success());

    let serve = Serve::start(serve_cmd(&dir.0));
    assert_eq!(serve.hello["serve_flags"], FLAGS, "{}", serve.hello);
    assert_eq!(serve.hello["geometry"]["kv_heads"], 2, "{}", serve.hello);
    let s = status_json(&serve.socket());
    assert_eq!(s["geometry"]["layers"], 4, "{s}");
    assert_eq!(s["geometry"]["tokens_per_block"], 16, "{s}");
    let out = tutti().args(["status", "--socket"]).arg(serve.socket()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "geometry: 4 layers × 2 KV heads × head dim 64 × 16 tokens/block, bf16 (tutti serve {FLAGS})"
        )),
        "{text}"
    );

    // A client whose KV has another geometry is refused, told both daemons' flags.
    let other = tutti_objstore::Geometry { kv_heads: 1, ..serving::common::geometry(4, 64) };
    let e =
        tutti_daemon::remote::connect_control(&serve.socket(), "tp2", Duration::from_secs(10), Some(&other))
            .map(|_| ())
            .unwrap_err()
            .to_string();
    assert!(e.contains(&format!("`tutti serve {FLAGS}`")), "names the serving daemon's flags: {e}");
    assert!(
        e.contains("`tutti serve --layers 4 --kv-heads 1 --head-dim 64 --block-tokens 16 --dtype bf16`"),
        "names the flags a daemon for this process needs: {e}"
    );
    assert!(serve.terminate().success());

    // A second serve on the pool with other flags: refused, naming the flags that open it.
    let out = tutti()
        .args(["serve", "--emulated", "2", "--capacity-mib", "16", "--layers", "8", "--kv-heads", "2"])
        .args(["--head-dim", "64", "--open", "open", "--dir"])
        .arg(&dir.0)
        .arg("--socket")
        .arg(dir.join("s.sock"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("formatted for 4 layers") && err.contains(&format!("`tutti serve {FLAGS}` opens it")),
        "{err}"
    );
}

#[test]
fn a_config_file_sets_the_flags_a_given_flag_wins_and_mistakes_name_their_key() {
    let dir = TempDir::new("cfg");
    let config = dir.join("tuttid.toml");
    let write = |text: &str| std::fs::write(&config, text).unwrap();
    write(&format!(
        "socket = \"{}\"\nmetrics = \"127.0.0.1:0\"\n[drives]\nemulated = 2\n[pool]\nlayers = 4\nkv_heads = 2\n\
         head_dim = 64\n[emulated]\ncapacity_mib = 16\ndir = \"{}\"\n[limits]\nio_timeout_ms = 3000\n",
        dir.join("c.sock").display(),
        dir.0.display()
    ));
    // The file alone, then a flag that overrides one key (and an environment variable another).
    let check = |extra: &[&str], env: Option<(&str, &str)>| -> Value {
        let mut c = tutti();
        c.args(["serve", "--check-config", "--config"]).arg(&config).args(extra).env_remove("TUTTI_SOCKET");
        if let Some((k, v)) = env {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let v = check(&[], None);
    assert_eq!(v["serve_flags"], FLAGS, "{v}");
    assert_eq!((v["io_timeout_ms"].as_u64(), v["drives"]["emulated"].as_u64()), (Some(3000), Some(2)), "{v}");
    assert_eq!(v["socket"], dir.join("c.sock").to_str().unwrap(), "{v}");
    let v = check(&["--kv-heads", "8", "--io-timeout-ms", "2000"], Some(("TUTTI_SOCKET", "/tmp/env.sock")));
    assert_eq!(v["geometry"]["kv_heads"], 8, "the flag wins: {v}");
    assert_eq!(v["io_timeout_ms"], 2000, "the flag wins, even when it gives the default: {v}");
    assert_eq!(v["socket"], "/tmp/env.sock", "the environment variable wins: {v}");
    assert_eq!(v["geometry"]["layers"], 4, "the other keys stay: {v}");

    // A real serve from the file: it serves where the file says, with the geometry it says.
    let mut c = tutti();
    c.args(["serve", "--json", "--config"]).arg(&config).env_remove("TUTTI_SOCKET");
    let serve = Serve::start(c);
    assert_eq!(serve.socket(), dir.join("c.sock"));
    assert_eq!(serve.hello["serve_flags"], FLAGS);
    // `tutti status` works against it as against any other.
    let st = status_json(&serve.socket());
    assert_eq!(
        (st["pid"].as_i64(), st["geometry"]["head_dim"].as_u64()),
        (Some(serve.pid() as i64), Some(64)),
        "{st}"
    );
    assert!(serve.hello["metrics"].as_str().unwrap().starts_with("http://127.0.0.1:"), "{}", serve.hello);
    assert!(serve.terminate().success());

    // Mistakes: each names the key; exit status 2 (a usage error: no restart helps).
    let refused = |text: &str, want: &[&str]| {
        write(text);
        let out = tutti().args(["serve", "--check-config", "--config"]).arg(&config).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{text:?}: {err}");
        for w in want {
            assert!(err.contains(w), "{text:?}: {err} lacks {w:?}");
        }
    };
    refused("[pool]\nkv_head = 2\n", &["unknown key `pool.kv_head`", "pool.kv_heads"]);
    refused("socket_path = \"/x\"\n", &["unknown key `socket_path`"]);
    refused("[geometry]\nlayers = 4\n", &["unknown table [geometry]", "[pool]"]);
    refused("[drives]\nemulated = 0\n", &["key `drives.emulated` = 0", "0 is not in 1..=32"]);
    refused("[pool]\nlayers = 0\n", &["key `pool.layers` = 0"]);
    refused("[pool]\ndtype = \"bf17\"\n", &["key `pool.dtype` = \"bf17\"", "fp8_e4m3"]);
    refused("[pool]\nopen = \"sometimes\"\n", &["key `pool.open`", "open-or-create"]);
    refused("metrics = \"localhost\"\n", &["key `metrics`", "socket address"]);
    refused("[drives]\nnoiommu = \"yes\"\n", &["key `drives.noiommu`", "true or false"]);
    refused("[limits]\nio_timeout_ms = 0\n", &["key `limits.io_timeout_ms` = 0"]);
    refused("[pool\n", &["not valid TOML"]);
    let out =
        tutti().args(["serve", "--check-config", "--config", "/nonexistent/tuttid.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/tuttid.toml: cannot read it"));

    // The example shipped next to the unit parses.
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../contrib/tuttid.toml");
    let out = tutti()
        .args(["serve", "--check-config", "--config"])
        .arg(&example)
        .env_remove("TUTTI_SOCKET")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["socket"], "/run/tutti/tuttid.sock", "{v}");
    assert_eq!(v["drives"]["vfio"].as_array().map(|a| a.len()), Some(2), "{v}");
}

#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    let have = std::process::Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        return skip::skip("systemd-analyze is not installed (Debian: apt-get install systemd)");
    }
    let dir = TempDir::new("unit");
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../contrib/systemd/tuttid.service"),
    )
    .unwrap();
    assert!(unit.contains("ExecStart=/usr/local/bin/tutti serve --config /etc/tutti/tuttid.toml"), "{unit}");
    // The unit as shipped, but for where the binary is here (verify checks that it exists).
    let here = unit.replace("/usr/local/bin/tutti", env!("CARGO_BIN_EXE_tutti"));
    let verify = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        // No running systemd is needed: verify loads the unit into a manager of its own.
        let out = std::process::Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(&path)
            .output()
            .unwrap();
        let said =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), said)
    };
    let (ok, said) = verify("tuttid.service", &here);
    assert!(ok && !said.contains("tuttid.service"), "systemd-analyze verify: {said}");
    // Negative control: an unknown key is only a warning to systemd, and this test catches it.
    let (_, said) = verify("tuttid.service", &here.replace("KillSignal=", "KilSignal="));
    assert!(said.contains("Unknown key") && said.contains("KilSignal"), "{said}");
}

#[test]
fn serve_tells_systemd_it_is_ready_once_it_serves_and_when_it_stops() {
    let dir = TempDir::new("notify");
    let notify_path = dir.join("notify");
    let sock = UnixDatagram::bind(&notify_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut cmd = serve_cmd(&dir.0);
    cmd.env("NOTIFY_SOCKET", &notify_path);
    let serve = Serve::start(cmd);
    let mut buf = [0u8; 512];
    let n = sock.recv(&mut buf).expect("READY=1 within 60 s");
    let msg = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(msg.starts_with("READY=1\n") && msg.contains("STATUS=serving pool"), "{msg}");
    // Ready means served: a client connects at once.
    tutti_daemon::remote::Client::connect(&serve.socket(), "after-ready", Duration::from_secs(2)).unwrap();
    let socket = serve.socket();
    assert!(serve.terminate().success());
    let n = sock.recv(&mut buf).expect("STOPPING=1");
    assert_eq!(&buf[..n], b"STOPPING=1");
    assert!(!socket.exists());
    // An abstract-namespace NOTIFY_SOCKET (as systemd gives) works too.
    let name = format!("tutti-notify-test-{}", std::process::id());
    let abs = {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        UnixDatagram::bind_addr(&addr).unwrap()
    };
    abs.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut cmd = serve_cmd(&dir.0);
    cmd.env("NOTIFY_SOCKET", format!("@{name}"));
    let serve = Serve::start(cmd);
    let n = abs.recv(&mut buf).expect("READY=1 on the abstract socket");
    assert!(buf[..n].starts_with(b"READY=1"));
    assert!(serve.terminate().success());
}

/// What one engine thread saw: the seeds whose every chunk it saw stored, the seeds of the
/// store it was in when the daemon went (their outcome unknown to it), and how it ended.
#[derive(Default, Debug)]
struct Seen {
    committed: Vec<u64>,
    unsure: Vec<u64>,
    rounds: u64,
    end: String,
}

#[test]
fn sigterm_under_load_stops_cleanly_and_the_restarted_pool_holds_exactly_what_was_committed() {
    let dir = TempDir::new("term");
    // Room for every store the engines may make (no eviction: every commit must be found after
    // the restart); writes take a while, so stores and commits are in flight when SIGTERM comes.
    let serve_cmd = || {
        let mut cmd = tutti();
        cmd.args([
            "serve",
            "--json",
            "--emulated",
            "2",
            "--capacity-mib",
            "64",
            "--emu-write-latency-us",
            "3000",
        ])
        .args(["--layers", "4", "--kv-heads", "2", "--head-dim", "64", "--dir"])
        .arg(&dir.0)
        .arg("--socket")
        .arg(dir.join("s.sock"));
        cmd
    };
    let serve = Serve::start(serve_cmd());
    let socket = serve.socket();
    let stop = Arc::new(AtomicBool::new(false));
    let seen: Vec<Arc<Mutex<Seen>>> = (0..3).map(|_| Arc::default()).collect();
    let threads: Vec<_> = seen
        .iter()
        .enumerate()
        .map(|(t, seen)| {
            let (socket, stop, seen) = (socket.clone(), stop.clone(), seen.clone());
            std::thread::spawn(move || {
                let engine = match Engine::connect(&socket, &format!("engine-{t}")) {
                    Ok(e) => e,
                    Err(e) => {
                        seen.lock().unwrap().end = format!("connect: {e}");
                        return;
                    }
                };
                // Bounded, and within the pool's room (3 × 150 × 4 files); the daemon is stopped
                // long before. Seeds below 50000 give distinct tokens (`common::tokens`).
                for round in 0..150u64 {
                    let seed = t as u64 * 10_000 + round * serving::CHUNKS as u64;
                    match engine.store(seed) {
                        Ok(n) if n == serving::CHUNKS => seen.lock().unwrap().committed.push(seed),
                        Ok(n) => panic!("stored {n} of {} chunks with the daemon up", serving::CHUNKS),
                        Err(e) => {
                            let mut s = seen.lock().unwrap();
                            s.unsure.push(seed);
                            s.end = format!("store: {e}");
                            return;
                        }
                    }
                    match engine.load(seed) {
                        Ok((n, good)) => {
                            assert!(n == serving::CHUNKS as usize && good, "{n} found, bytes good: {good}")
                        }
                        Err(e) => {
                            seen.lock().unwrap().end = format!("load: {e}");
                            return;
                        }
                    }
                    seen.lock().unwrap().rounds += 1;
                    if stop.load(Ordering::Relaxed) {
                        seen.lock().unwrap().end = "stopped by the test".into();
                        return;
                    }
                }
                seen.lock().unwrap().end = "ran every round".into();
            })
        })
        .collect();
    // Under load: every engine has committed a few stores.
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen.iter().any(|s| s.lock().unwrap().committed.len() < 3) {
        assert!(Instant::now() < deadline, "the engines did not get going: {seen:?}");
        assert!(!threads.iter().any(|t| t.is_finished()), "an engine ended early: {seen:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    let t0 = Instant::now();
    let status = serve.terminate();
    let took = t0.elapsed();
    assert!(status.success(), "tuttid exits 0 on SIGTERM: {status:?}");
    stop.store(true, Ordering::Relaxed);
    // Every engine learns it (an error, not a hang): each thread ends within its deadlines.
    let deadline = Instant::now() + Duration::from_secs(60);
    for t in threads {
        while !t.is_finished() {
            assert!(Instant::now() < deadline, "an engine hung after the daemon stopped: {seen:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
        t.join().unwrap();
    }
    let seen: Vec<Seen> = seen.into_iter().map(|s| std::mem::take(&mut *s.lock().unwrap())).collect();
    eprintln!("stopped in {took:?}; engines: {seen:?}");
    assert!(seen.iter().all(|s| !s.end.is_empty()), "each engine ended: {seen:?}");
    // Nothing left behind: the socket, its owner record, the media's owner records.
    for f in ["s.sock", "s.sock.owner", "emu0.img.owner", "emu1.img.owner"] {
        assert!(!dir.join(f).exists(), "{f} was left behind");
    }

    // The next daemon opens the pool (it must exist: --open open) from a consistent journal.
    let mut again = serve_cmd();
    again.args(["--open", "open"]);
    let serve = Serve::start(again);
    let engine = Engine::connect(&serve.socket(), "checker").unwrap();
    let info = engine.store.info();
    assert!(!info.formatted_now);
    for r in &info.replay {
        assert_eq!(
            (r.dropped_pages, r.foreign_records),
            (0, 0),
            "no torn or foreign journal page: {:?}",
            info.replay
        );
    }
    let committed: usize = seen.iter().map(|s| s.committed.len()).sum();
    assert!(committed >= 9);
    for s in &seen {
        for &seed in &s.committed {
            assert_eq!(engine.load(seed).unwrap(), (serving::CHUNKS as usize, true), "committed seed {seed}");
        }
        // The store in flight at the stop: committed whole (the commit finished before the
        // client heard) or not visible at all; either way, what is found holds its bytes.
        for &seed in &s.unsure {
            let (found, good) = engine.load(seed).unwrap();
            assert!(
                good && (found == 0 || found == serving::CHUNKS as usize),
                "seed {seed}: {found} found, good {good}"
            );
        }
    }
    let st = status_json(&serve.socket());
    assert_eq!(st["stats"]["index"]["quarantined"], 0, "{st}");
    assert_eq!(st["stats"]["index"]["reserved"], 0, "nothing half-written survives: {st}");
    assert!(serve.terminate().success());
}
