//! tuttid with real client processes: several engines storing and loading
//! at once (every byte checked), clients SIGKILLed mid-store and mid-load,
//! the daemon killed and restarted, a second owner, queue pairs running out.
//!
//! Client (and, where it must die, daemon) processes are this test binary
//! run again on the same test with `TUTTI_TEST_ROLE` set: every test starts
//! with `role_entry`, which does the role's work and exits in such a child.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../tests/support/reap.rs"]
mod reap;

#[path = "../../objstore/tests/common/mod.rs"]
mod common;

use common::{geometry, store_seeded, tokens, Kv};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tutti_daemon::remote::{connect, Client};
use tutti_daemon::{Daemon, DaemonConfig, DriveSource, SocketMode};
use tutti_emulator::{EmulatedConfig, MediaConfig, NamespaceConfig};
use tutti_objstore::{chain_hashes, Geometry, KvStore, LayoutKind, OpenMode, PoolOptions};

const WAIT: Duration = Duration::from_secs(30);
const CHUNKS: u32 = 6;
const MODEL: &str = "tiny-test-model";
/// Connections the silent child opens: more than tuttid's client limit.
const SILENT: usize = 300;

fn geo() -> Geometry {
    geometry(4, 64)
}

use common::client_backend as backend;

struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> TempDir {
        // Short: a socket path must fit in 108 bytes.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("tuttid-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn drives(dir: &Path, n: usize, pairs: u16) -> DriveSource {
    DriveSource::Emulated(
        (0..n)
            .map(|i| EmulatedConfig {
                name: format!("emu{i}"),
                serial: format!("TUTTID-{i}"),
                namespaces: vec![NamespaceConfig::with_bytes(16 << 20, 512)],
                media: MediaConfig::File(dir.join(format!("emu{i}.img"))),
                max_io_queue_pairs: pairs,
                ..EmulatedConfig::default()
            })
            .collect(),
    )
}

fn config(dir: &Path, pairs: u16, mode: OpenMode) -> DaemonConfig {
    DaemonConfig {
        socket: dir.join("tuttid.sock"),
        mode: SocketMode::Owner,
        drives: drives(dir, 2, pairs),
        pool: PoolOptions::new(geo(), mode),
        io_timeout: Duration::from_secs(2),
    }
}

fn client_store(socket: &Path, name: &str) -> KvStore {
    connect(socket, name, &backend(), Duration::from_secs(10)).expect("client connects")
}

/// Stores `CHUNKS` chunks seeded by `seed` from blocks 0.., loads them back
/// into other blocks and checks every byte. Returns the hashes.
fn store_and_verify(store: &KvStore, kv: &Kv, seed: u64) -> Vec<tutti_objstore::BlockHash> {
    let (hashes, rep) = store_seeded(store, kv, CHUNKS, seed);
    assert_eq!(rep.stored + rep.present, CHUNKS, "{rep:?}");
    assert!(rep.failed.is_empty(), "{rep:?}");
    verify(store, kv, &hashes, seed);
    hashes
}

/// Looks `hashes` up, loads them into blocks CHUNKS.. and checks the bytes.
fn verify(store: &KvStore, kv: &Kv, hashes: &[tutti_objstore::BlockHash], seed: u64) {
    kv.clear();
    let hit = store.lookup(hashes).expect("lookup");
    assert_eq!(hit.hits(), hashes.len(), "every chunk is found");
    let dst: Vec<u32> = (CHUNKS..CHUNKS + hashes.len() as u32).collect();
    let st = store.load_request(&hit.files, &dst, WAIT).expect("load");
    assert!(st.done && st.failed == 0, "{st:?}");
    for (i, &b) in dst.iter().enumerate() {
        assert!(
            kv.holds(b, seed + i as u64),
            "chunk {i} (seed {seed}) loaded into block {b} holds its bytes"
        );
    }
    store.unpin(hit.pin).expect("unpin");
}

fn new_kv(store: &KvStore) -> Kv {
    let kv = Kv::new(*store.geometry(), LayoutKind::Contiguous, 2 * CHUNKS);
    kv.register(store, MODEL);
    kv
}

// ---- child processes ----

/// Runs the role this process was started for, if any (then exits).
fn role_entry() {
    let Ok(role) = std::env::var("TUTTI_TEST_ROLE") else { return };
    let dir = PathBuf::from(std::env::var("TUTTI_TEST_DIR").unwrap());
    let seed: u64 = std::env::var("TUTTI_TEST_SEED").map_or(1, |s| s.parse().unwrap());
    let socket = dir.join("tuttid.sock");
    let code = std::panic::catch_unwind(|| match role.as_str() {
        "daemon" | "slow-daemon" => {
            let mut cfg = config(&dir, 16, OpenMode::OpenOrCreate);
            if role == "slow-daemon" {
                // Every I/O command takes 100 ms: a load is still in flight when the test kills it.
                if let DriveSource::Emulated(list) = &mut cfg.drives {
                    for c in list {
                        c.cost.per_command = Duration::from_millis(100);
                    }
                }
            }
            let _d = Daemon::start(cfg).expect("daemon starts");
            println!("READY");
            // Killed by the test; bounded in case it is not.
            std::thread::sleep(Duration::from_secs(120));
        }
        "client" => {
            let store = client_store(&socket, &format!("client-{seed}"));
            let kv = new_kv(&store);
            for round in 0..3 {
                store_and_verify(&store, &kv, seed * 1000 + round);
            }
            println!("DONE");
        }
        "hang-store" => {
            let store = client_store(&socket, "hang-store");
            let kv = new_kv(&store);
            let g = *store.geometry();
            let hashes = chain_hashes(&tokens(seed, CHUNKS as usize, g.tokens_per_block), g.tokens_per_block);
            let src: Vec<u32> = (0..CHUNKS).collect();
            for &b in &src {
                kv.fill(b, seed + b as u64);
            }
            let s = store.begin_store(&hashes, &src).expect("begin");
            // Half the layers written, never committed.
            store.store_layer(s, 0, WAIT).expect("layer 0");
            println!("MIDSTORE");
            std::thread::sleep(Duration::from_secs(120));
        }
        "hang-load" => {
            let store = client_store(&socket, "hang-load");
            let kv = new_kv(&store);
            let hashes = store_and_verify(&store, &kv, seed);
            let hit = store.lookup(&hashes).expect("lookup");
            let dst: Vec<u32> = (CHUNKS..2 * CHUNKS).collect();
            let _job = store.submit_load(&hit.files, &dst, 0..store.geometry().layers).expect("load");
            println!("MIDLOAD");
            std::thread::sleep(Duration::from_secs(120));
        }
        "silent" => {
            // Connections that never say hello (a buggy or hostile peer of the same user).
            let mut held = Vec::new();
            for _ in 0..SILENT {
                match std::os::unix::net::UnixStream::connect(&socket) {
                    Ok(s) => held.push(s),
                    Err(e) => println!("connect failed: {e}"),
                }
            }
            println!("SILENT {}", held.len());
            std::thread::sleep(Duration::from_secs(120));
        }
        r => panic!("unknown role {r}"),
    });
    std::process::exit(if code.is_ok() { 0 } else { 101 });
}

/// Starts this binary in `role`; its stdout lines come through the channel.
/// `test` is the calling test: the child runs it again and takes the role at its start.
fn spawn(test: &str, role: &str, dir: &Path, seed: u64) -> (reap::Reap, mpsc::Receiver<String>) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env("TUTTI_TEST_ROLE", role)
        .env("TUTTI_TEST_DIR", dir)
        .env("TUTTI_TEST_SEED", seed.to_string());
    reap::spawn_lines(&mut cmd)
}

/// Waits (bounded) for a line from a child.
fn expect_line(rx: &mpsc::Receiver<String>, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            // The harness may print "test role_entry_point ... " on the same line.
            Ok(l) if l.trim_end().ends_with(want) => return,
            Ok(_) => continue,
            Err(e) => panic!("child never printed {want}: {e}"),
        }
    }
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < deadline, "child did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kill(child: &mut Child) {
    child.kill().unwrap(); // SIGKILL
    wait_exit(child);
}

/// Waits (bounded) until the daemon lists only `n` clients besides the asker.
fn wait_clients(socket: &Path, n: usize) -> tutti_daemon::proto::StatusReport {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let c = Client::connect(socket, "probe", Duration::from_secs(5)).unwrap();
        let s = c.status().unwrap();
        if s.clients.iter().filter(|x| x.id != c.id()).count() == n {
            return s;
        }
        assert!(Instant::now() < deadline, "clients did not go away: {s:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn concurrent_client_processes_store_and_load_every_byte() {
    role_entry();
    let dir = TempDir::new("concurrent");
    let daemon = Daemon::start(config(&dir.0, 16, OpenMode::Create)).unwrap();
    let mut kids: Vec<_> = (1..=3)
        .map(|seed| spawn("concurrent_client_processes_store_and_load_every_byte", "client", &dir.0, seed))
        .collect();
    for (child, rx) in &mut kids {
        let st = wait_exit(child);
        let lines: Vec<String> = rx.try_iter().collect();
        assert!(
            st.success() && lines.iter().any(|l| l.trim_end().ends_with("DONE")),
            "client exited {st}: {lines:?}"
        );
    }
    // What the other processes stored is visible here, byte for byte.
    let store = client_store(daemon.socket(), "checker");
    let kv = new_kv(&store);
    let g = *store.geometry();
    for seed in 1..=3u64 {
        for round in 0..3 {
            let s = seed * 1000 + round;
            let hashes = chain_hashes(&tokens(s, CHUNKS as usize, g.tokens_per_block), g.tokens_per_block);
            verify(&store, &kv, &hashes, s);
        }
    }
    let status = daemon.status();
    assert_eq!(status.clients.len(), 1, "only the checker is left: {status:?}");
    assert_eq!(status.stats.index.valid, 9 * CHUNKS, "{status:?}");
}

#[test]
fn a_client_killed_mid_store_leaves_nothing_visible_and_nothing_held() {
    role_entry();
    let dir = TempDir::new("midstore");
    let daemon = Daemon::start(config(&dir.0, 16, OpenMode::Create)).unwrap();
    let free_pairs: Vec<u16> = daemon.status().controllers.iter().map(|c| c.free_pairs).collect();
    let (mut child, rx) =
        spawn("a_client_killed_mid_store_leaves_nothing_visible_and_nothing_held", "hang-store", &dir.0, 77);
    expect_line(&rx, "MIDSTORE");
    let during = daemon.status();
    assert_eq!(during.clients.len(), 1);
    assert_eq!(during.clients[0].reservations, 1, "{during:?}");
    assert!(!during.clients[0].queues.is_empty(), "the client leased queue pairs: {during:?}");
    kill(&mut child);
    let after = wait_clients(daemon.socket(), 0);
    assert_eq!(after.stats.index.reserved, 0, "the reservation was dropped: {after:?}");
    assert_eq!(after.stats.index.valid, 0, "nothing uncommitted became visible: {after:?}");
    assert_eq!(after.stats.index.free, after.stats.index.files, "{after:?}");
    let pairs: Vec<u16> = after.controllers.iter().map(|c| c.free_pairs).collect();
    assert_eq!(pairs, free_pairs, "the client's queue pairs were deleted and given back");
    // The chunks it was storing are a miss; another client stores them anew.
    let store = client_store(daemon.socket(), "after");
    let kv = new_kv(&store);
    let g = *store.geometry();
    let hashes = chain_hashes(&tokens(77, CHUNKS as usize, g.tokens_per_block), g.tokens_per_block);
    assert_eq!(store.contains(&hashes).unwrap(), 0);
    store_and_verify(&store, &kv, 77);
}

#[test]
fn a_client_killed_mid_load_releases_its_pins_and_references() {
    role_entry();
    let dir = TempDir::new("midload");
    let daemon = Daemon::start(config(&dir.0, 16, OpenMode::Create)).unwrap();
    let (mut child, rx) =
        spawn("a_client_killed_mid_load_releases_its_pins_and_references", "hang-load", &dir.0, 5);
    expect_line(&rx, "MIDLOAD");
    let during = daemon.status();
    assert_eq!(during.stats.index.pinned, CHUNKS, "{during:?}");
    kill(&mut child);
    let after = wait_clients(daemon.socket(), 0);
    assert_eq!((after.stats.index.pinned, after.stats.index.busy), (0, 0), "{after:?}");
    assert_eq!(after.stats.index.valid, CHUNKS, "committed chunks stay: {after:?}");
    // Another client loads them, byte for byte.
    let store = client_store(daemon.socket(), "after");
    let kv = new_kv(&store);
    let g = *store.geometry();
    let hashes = chain_hashes(&tokens(5, CHUNKS as usize, g.tokens_per_block), g.tokens_per_block);
    verify(&store, &kv, &hashes, 5);
}

#[test]
fn a_killed_daemon_fails_its_clients_within_their_deadline_and_recovers_on_restart() {
    role_entry();
    let dir = TempDir::new("restart");
    let (mut d1, rx) = spawn(
        "a_killed_daemon_fails_its_clients_within_their_deadline_and_recovers_on_restart",
        "daemon",
        &dir.0,
        0,
    );
    expect_line(&rx, "READY");
    let socket = dir.0.join("tuttid.sock");
    let store = client_store(&socket, "survivor");
    let kv = new_kv(&store);
    let hashes = store_and_verify(&store, &kv, 42);
    kill(&mut d1);
    let t = Instant::now();
    assert!(store.lookup(&hashes).is_err(), "a dead daemon answers no lookup");
    assert!(t.elapsed() < Duration::from_secs(15), "the error came within the deadline: {:?}", t.elapsed());
    drop(kv);
    drop(store);
    let (mut d2, rx) = spawn(
        "a_killed_daemon_fails_its_clients_within_their_deadline_and_recovers_on_restart",
        "daemon",
        &dir.0,
        0,
    );
    expect_line(&rx, "READY");
    let store = client_store(&socket, "after-restart");
    let kv = new_kv(&store);
    verify(&store, &kv, &hashes, 42);
    drop(kv);
    drop(store);
    kill(&mut d2);
}

#[test]
fn a_load_in_flight_when_the_daemon_dies_ends_within_its_deadline() {
    role_entry();
    let dir = TempDir::new("dieload");
    let test = "a_load_in_flight_when_the_daemon_dies_ends_within_its_deadline";
    let (mut d, rx) = spawn(test, "slow-daemon", &dir.0, 0);
    expect_line(&rx, "READY");
    let socket = dir.0.join("tuttid.sock");
    let store = client_store(&socket, "orphan");
    let kv = new_kv(&store);
    let hashes = store_and_verify(&store, &kv, 8);
    let hit = store.lookup(&hashes).unwrap();
    kv.clear();
    let dst: Vec<u32> = (CHUNKS..2 * CHUNKS).collect();
    let job = store.submit_load(&hit.files, &dst, 0..store.geometry().layers).unwrap();
    kill(&mut d);
    // The wait learns at once that tuttid is gone, and says so.
    let e = store.wait(job, Duration::from_secs(60)).unwrap_err();
    assert!(matches!(e, tutti_objstore::ObjError::PeerGone(_)), "{e}");
    assert!(e.to_string().contains("tuttid") && e.to_string().contains("gone"), "{e}");
    assert!(store.poll(job).is_err() && store.lookup(&hashes).is_err(), "every later call fails too");
    // The commands in flight never complete (the emulated drives died with the daemon): the
    // client's own command deadline (2 s) ends them, with an unknown outcome, and no drive is
    // recovered or blamed for it.
    let t = Instant::now();
    let st = store.drain(job, Duration::from_secs(60)).unwrap();
    assert!(t.elapsed() < Duration::from_secs(30), "the load ended within its deadlines: {:?}", t.elapsed());
    assert!(st.done && st.failed > 0, "a load cut off by the daemon's death reports failed blocks: {st:?}");
    let why = st.first_error.clone().unwrap_or_default();
    assert!(why.contains("tuttid") && !why.contains("recovery of drive"), "{why}");
    let s = store.stats();
    assert_eq!((s.recoveries, s.recovery_failures, s.quarantined_files), (0, 0, 0), "{s:?}");
    // No block is reported loaded that does not hold its bytes.
    for (i, &b) in dst.iter().enumerate() {
        if !st.block_failed(i as u32) {
            assert!(kv.holds(b, 8 + i as u64), "block {b} reported loaded holds its bytes");
        }
    }
    store.release(job).unwrap();
}

#[test]
fn a_second_owner_is_refused_naming_the_holder() {
    role_entry();
    let dir = TempDir::new("owner");
    let daemon = Daemon::start(config(&dir.0, 16, OpenMode::Create)).unwrap();
    // Same media, another socket.
    let mut other = config(&dir.0, 16, OpenMode::Create);
    other.socket = dir.0.join("other.sock");
    let e = Daemon::start(other).err().expect("second daemon on the same media is refused").to_string();
    assert!(e.contains(&std::process::id().to_string()), "names the holder: {e}");
    assert!(!dir.0.join("other.sock").exists());
    // Same socket, other media.
    let dir2 = TempDir::new("owner2");
    let mut same_socket = config(&dir2.0, 16, OpenMode::Create);
    same_socket.socket = daemon.socket().to_path_buf();
    let e = Daemon::start(same_socket).err().expect("second daemon on a live socket is refused").to_string();
    assert!(e.contains(&std::process::id().to_string()), "names the listening pid: {e}");
    // The first one still serves.
    let store = client_store(daemon.socket(), "still");
    let kv = new_kv(&store);
    store_and_verify(&store, &kv, 3);
}

#[test]
fn controllers_granting_one_queue_pair_still_serve_every_client() {
    role_entry();
    let dir = TempDir::new("onepair");
    // One pair per controller: the daemon's metadata path holds it, so no client can lease
    // one; the daemon moves their layers on that shared pair.
    let daemon = Daemon::start(config(&dir.0, 1, OpenMode::Create)).unwrap();
    let a = client_store(daemon.socket(), "proxied-a");
    let b = client_store(daemon.socket(), "proxied-b");
    assert!(a.info().backend.contains("proxied"), "{:?}", a.info().backend);
    let (ka, kb) = (new_kv(&a), new_kv(&b));
    let ha = store_and_verify(&a, &ka, 21);
    store_and_verify(&b, &kb, 22);
    // Each sees the other's chunks, byte for byte.
    verify(&b, &kb, &ha, 21);
    let s = daemon.status();
    assert!(s.clients.iter().all(|c| c.proxied && c.queues.is_empty()), "{s:?}");
    assert_eq!(s.controllers.iter().map(|c| c.free_pairs).collect::<Vec<_>>(), vec![0, 0]);
    drop((ka, kb));
    drop((a, b));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !daemon.status().clients.is_empty() {
        assert!(Instant::now() < deadline, "closed clients were released: {:?}", daemon.status());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(daemon.status().stats.index.valid, 2 * CHUNKS);
}

#[test]
fn malformed_and_foreign_requests_get_clear_errors_and_the_daemon_goes_on() {
    role_entry();
    use tutti_daemon::proto::{ErrorKind, Request, Response};
    use tutti_objstore::io::{Direction, Pair};
    use tutti_objstore::{BlockHash, IdentityId, Verdict};
    let dir = TempDir::new("malformed");
    let daemon = Daemon::start(config(&dir.0, 16, OpenMode::Create)).unwrap();
    let t = Duration::from_secs(10);
    let conn = tutti_daemon::Connection::connect(daemon.socket(), t).unwrap();
    let call = |req: &Request| -> Response { conn.call::<Request, Response>(req, &[], t).unwrap().0 };
    let refused = |r: Response, kind: ErrorKind, needle: &str| match r {
        Response::Error { kind: k, message } => {
            assert_eq!(k, kind, "{message}");
            assert!(message.contains(needle), "{message:?} names {needle:?}");
        }
        r => panic!("expected an error naming {needle:?}, got {r:?}"),
    };
    // Anything before hello is refused, and the connection closed; so is a hello of another
    // protocol or with too long a name.
    let long = "n".repeat(tutti_daemon::proto::MAX_NAME + 1);
    let before: [(Request, ErrorKind, &str); 3] = [
        (Request::Stats, ErrorKind::Protocol, "before hello"),
        (Request::Hello { protocol: 999, name: "x".into() }, ErrorKind::Protocol, "protocol"),
        (Request::Hello { protocol: tutti_daemon::proto::PROTOCOL, name: long }, ErrorKind::Invalid, "name"),
    ];
    for (req, kind, needle) in before {
        let early = tutti_daemon::Connection::connect(daemon.socket(), t).unwrap();
        refused(early.call::<Request, Response>(&req, &[], t).unwrap().0, kind, needle);
        let closed = early.call::<Request, Response>(&Request::Stats, &[], t).unwrap_err();
        assert!(closed.to_string().contains("gone"), "{closed}");
    }
    assert!(matches!(
        call(&Request::Hello { protocol: tutti_daemon::proto::PROTOCOL, name: "fuzzer".into() }),
        Response::Welcome { .. }
    ));
    // A frame that is JSON but no request: answered, and the connection stays.
    let garbage: Response = conn.call(&serde_json::json!({"NoSuchRequest": 1}), &[], t).unwrap().0;
    refused(garbage, ErrorKind::Invalid, "malformed");
    let id = IdentityId(7);
    refused(call(&Request::Unpin { pin: 12345 }), ErrorKind::Invalid, "pin 12345");
    refused(
        call(&Request::Settle { id: 99, verdicts: vec![Verdict::Commit], report: None }),
        ErrorKind::Invalid,
        "reservation 99",
    );
    refused(
        call(&Request::EndLoad { files: vec![0], report: None }),
        ErrorKind::Invalid,
        "no load reference",
    );
    refused(call(&Request::BeginLoad { identity: id, files: vec![0] }), ErrorKind::Invalid, "file 0");
    refused(call(&Request::Map { ctrl: 9, addr: 4096, len: 4096 }), ErrorKind::Invalid, "controller 9");
    refused(call(&Request::Map { ctrl: 0, addr: 4096, len: 0 }), ErrorKind::Invalid, "empty");
    refused(call(&Request::Map { ctrl: 0, addr: u64::MAX - 10, len: 4096 }), ErrorKind::Invalid, "wraps");
    refused(call(&Request::Unmap { ctrl: 0, iova: 0x1000 }), ErrorKind::Invalid, "not this client's");
    // The VFIO requests name a controller that is not a VFIO device: refused, nothing sent.
    refused(call(&Request::VfioFds { ctrl: 0 }), ErrorKind::Invalid, "not a VFIO device");
    refused(call(&Request::ReserveIova { ctrl: 1, len: 4096 }), ErrorKind::Invalid, "not a VFIO device");
    refused(
        call(&Request::Mapped { ctrl: 0, iova: 0x10_0000, vaddr: 0 }),
        ErrorKind::Invalid,
        "not a VFIO device",
    );
    refused(call(&Request::VfioFds { ctrl: 7 }), ErrorKind::Invalid, "controller 7");
    refused(
        call(&Request::CreateQueues { ctrl: 0, qid: 3, depth: 16, sq_iova: 0, cq_iova: 0 }),
        ErrorKind::Invalid,
        "not leased",
    );
    let Response::Qid(qid) = call(&Request::ClaimQueue { ctrl: 0, purpose: "fuzz".into() }) else { panic!() };
    refused(
        call(&Request::CreateQueues {
            ctrl: 0,
            qid,
            depth: 16,
            sq_iova: 0x10_0000_0000,
            cq_iova: 0x10_0000_0000,
        }),
        ErrorKind::Invalid,
        "not mapped for this client",
    );
    refused(call(&Request::DeleteQueues { ctrl: 0, qid }), ErrorKind::Invalid, "does not exist");
    assert!(matches!(call(&Request::ReleaseQueue { ctrl: 0, qid }), Response::Ok));
    // The proxied data path checks what it is asked to move.
    refused(call(&Request::ProxyPoll { token: 5 }), ErrorKind::Invalid, "proxy-attach first");
    refused(
        call(&Request::ProxySubmit {
            layer: 0,
            pairs: vec![Pair { file: 0, block: 0 }],
            dir: Direction::Load,
            registered: None,
        }),
        ErrorKind::Invalid,
        "no load reference",
    );
    refused(
        call(&Request::ProxySubmit {
            layer: 0,
            pairs: vec![Pair { file: 0, block: 0 }],
            dir: Direction::Store,
            registered: None,
        }),
        ErrorKind::Invalid,
        "no reservation",
    );
    let bad_layout = tutti_objstore::io::proxy::LayoutSpec { num_blocks: 0, block_stride: 0, layers: vec![] };
    refused(call(&Request::ProxyAttach { layout: bad_layout }), ErrorKind::Invalid, "");
    let many = vec![BlockHash(1); tutti_daemon::proto::MAX_HASHES + 1];
    refused(call(&Request::Lookup { identity: id, hashes: many }), ErrorKind::Invalid, "at most");
    // Reserve, then settle with the wrong number of verdicts.
    let Response::Reserved { id: rid, entries } =
        call(&Request::Reserve { identity: id, hashes: vec![BlockHash(5), BlockHash(6)] })
    else {
        panic!()
    };
    assert_eq!(entries.len(), 2);
    refused(
        call(&Request::Settle { id: rid, verdicts: vec![], report: None }),
        ErrorKind::Invalid,
        "2 new files",
    );
    // Another client cannot touch it.
    let other = tutti_daemon::Connection::connect(daemon.socket(), t).unwrap();
    let hello = Request::Hello { protocol: tutti_daemon::proto::PROTOCOL, name: "other".into() };
    let _: (Response, _) = other.call(&hello, &[], t).unwrap();
    let (r, _): (Response, _) = other
        .call(
            &Request::Settle { id: rid, verdicts: vec![Verdict::Commit, Verdict::Commit], report: None },
            &[],
            t,
        )
        .unwrap();
    refused(r, ErrorKind::Invalid, "not this client's");
    drop(other);
    // The owner gives it up; nothing became visible.
    assert!(matches!(
        call(&Request::Settle { id: rid, verdicts: vec![Verdict::GiveUp, Verdict::GiveUp], report: None }),
        Response::Settled(_)
    ));
    let s = daemon.status();
    assert_eq!((s.stats.index.valid, s.stats.index.reserved), (0, 0), "{s:?}");
    drop(conn);
    // Still serving real clients.
    let store = client_store(daemon.socket(), "after-fuzz");
    let kv = new_kv(&store);
    store_and_verify(&store, &kv, 11);
}

#[test]
fn three_hundred_silent_connections_do_not_lock_engines_out() {
    role_entry();
    let dir = TempDir::new("silent");
    let daemon = Daemon::start(config(&dir.0, 16, OpenMode::Create)).unwrap();
    const { assert!(SILENT > tutti_daemon::server::DEFAULT_MAX_CLIENTS) };
    let (mut child, rx) =
        spawn("three_hundred_silent_connections_do_not_lock_engines_out", "silent", &dir.0, 0);
    expect_line(&rx, &format!("SILENT {SILENT}"));
    // Once the daemon has taken them all, it keeps at most DEFAULT_MAX_PRE_HELLO of them, apart
    // from the clients (the oldest are dropped as newer ones come).
    let deadline = Instant::now() + Duration::from_secs(20);
    let s = loop {
        let s = daemon.status();
        if s.clients_served >= SILENT as u64
            && s.waiting_for_hello <= tutti_daemon::server::DEFAULT_MAX_PRE_HELLO
        {
            break s;
        }
        assert!(Instant::now() < deadline, "the silent connections were not taken or not bounded: {s:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(s.clients.is_empty(), "{s:?}");
    // Engines still connect, store and load, while the silent ones stay connected.
    let store = client_store(daemon.socket(), "engine");
    let kv = new_kv(&store);
    store_and_verify(&store, &kv, 31);
    let other = client_store(daemon.socket(), "engine-2");
    let kv2 = new_kv(&other);
    store_and_verify(&other, &kv2, 32);
    let s = daemon.status();
    assert_eq!(s.clients.len(), 2, "{s:?}");
    assert!(s.clients_served > SILENT as u64, "{s:?}");
    assert!(child.try_wait().unwrap().is_none(), "the silent child is still there");
    kill(&mut child);
    drop((kv, kv2));
    drop((store, other));
}
