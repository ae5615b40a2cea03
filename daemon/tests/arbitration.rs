//! The per-drive arbitration board tuttid shares with its clients: a slot per client, given
//! back (its row zeroed) when the client goes; garbage on the board ignored and counted; a
//! stuck word ignored after the stale deadline; a board that is not what the daemon described
//! refused with a clear error; an old client refused at hello.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tutti_daemon::arbitration::{board_len, SharedArbitration, Word, MAX_SLOTS};
use tutti_daemon::proto::{ArbitrationReply, ErrorKind, Request, Response, PROTOCOL};
use tutti_daemon::remote::{connect_arbitrated, Client};
use tutti_daemon::{Daemon, DaemonConfig, DaemonError, DriveSource, SocketMode};
use tutti_driver::emulated::{EmulatedConfig, NamespaceConfig};
use tutti_objstore::{Backend, Dtype, Geometry, GioConfig, KvStore, OpenMode, PoolOptions};

const MS: u64 = 1_000_000;

struct Tmp(PathBuf);
impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn daemon(tag: &str) -> (Daemon, Tmp) {
    let dir = std::env::temp_dir().join(format!("tuttid-arb-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let g = Geometry { layers: 4, kv_heads: 2, head_dim: 64, tokens_per_block: 16, dtype: Dtype::Bf16 };
    let drives = (0..2)
        .map(|i| EmulatedConfig {
            name: format!("emu{i}"),
            serial: format!("ARB-{tag}-{i}"),
            namespaces: vec![NamespaceConfig::with_bytes(16 << 20, 512)],
            ..EmulatedConfig::default()
        })
        .collect();
    let d = Daemon::start(DaemonConfig {
        socket: dir.join("tuttid.sock"),
        mode: SocketMode::Owner,
        drives: DriveSource::Emulated(drives),
        pool: PoolOptions::new(g, OpenMode::Create),
        io_timeout: Duration::from_secs(2),
    })
    .unwrap();
    (d, Tmp(dir))
}

fn backend() -> Backend {
    let mut gio = GioConfig::default();
    gio.host.blocks = 1;
    Backend::Gio(gio)
}

fn client(d: &Daemon, name: &str) -> (KvStore, std::sync::Arc<SharedArbitration>) {
    connect_arbitrated(d.socket(), name, &backend(), Duration::from_secs(10), None).unwrap()
}

/// Waits (bounded) until the daemon lists `n` clients.
fn until_clients(d: &Daemon, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while d.status().clients.len() != n {
        assert!(Instant::now() < deadline, "the daemon still lists {} clients", d.status().clients.len());
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn clients_get_their_own_slots_and_see_each_other() {
    let (d, _dir) = daemon("slots");
    let (_a_store, a) = client(&d, "a");
    let (_b_store, b) = client(&d, "b");
    assert_ne!(a.slot(), b.slot());
    assert_eq!((a.drives(), a.slots()), (2, MAX_SLOTS));
    let listed: Vec<Option<u32>> = d.status().clients.iter().map(|c| c.arbitration_slot).collect();
    assert_eq!(listed, vec![Some(a.slot() as u32), Some(b.slot() as u32)]);
    // A write in flight of b on drive 1 holds a's reads there, not on drive 0.
    b.publish(1, 0, 1, 0);
    assert!(!a.clear(false, &[1], 0));
    assert!(a.clear(false, &[0], 0));
    // A read of a that is ready (not started) holds b's writes: reads first.
    b.publish(1, 0, 0, 0);
    a.publish(0, 0, 0, 1);
    assert!(!b.clear(true, &[0], 0));
    assert!(b.clear(false, &[0], 0), "reads do not hold reads");
    a.publish(0, 0, 0, 0);
    assert!(b.clear(true, &[0, 1], 0));
    assert_eq!(a.stats().invalid_words + b.stats().stale_words, 0);
}

#[test]
fn a_departed_client_holds_nothing_and_a_survivor_of_its_slot_stops_announcing() {
    let (d, _dir) = daemon("gone");
    let (_a_store, a) = client(&d, "a");
    let (b_store, b) = client(&d, "b");
    b.publish(0, 0, 3, 0);
    b.publish(1, 2, 0, 5);
    assert!(!a.clear(false, &[0], 0) && !a.clear(true, &[1], 0));
    // b's connection ends (its store goes; its view of the board lives on).
    drop(b_store);
    until_clients(&d, 1);
    for drive in 0..2 {
        assert_eq!(a.raw_word(b.slot(), drive).unwrap().load(Ordering::SeqCst), 0, "row of b zeroed");
    }
    assert!(a.clear(false, &[0, 1], 0) && a.clear(true, &[0, 1], 0));
    // What b announces now is not written: its generation is gone.
    b.publish(0, 0, 1, 0);
    assert!(b.is_lost());
    assert_eq!(a.raw_word(b.slot(), 0).unwrap().load(Ordering::SeqCst), 0);
    // The slot goes to the next client, with a new generation.
    let (_c_store, c) = client(&d, "c");
    assert_eq!(c.slot(), b.slot());
    c.publish(0, 0, 1, 0);
    assert!(!c.is_lost());
    assert!(!a.clear(false, &[0], 0));
}

#[test]
fn garbage_on_the_board_is_ignored_and_counted() {
    let (d, _dir) = daemon("garbage");
    let (_a_store, a) = client(&d, "a");
    let (_b_store, b) = client(&d, "b");
    // Huge counts in a slot nobody holds (generation 0).
    let free = MAX_SLOTS - 1;
    a.raw_word(free, 0).unwrap().store(u64::MAX >> 16, Ordering::SeqCst);
    assert!(a.clear(false, &[0], 0) && a.clear(true, &[0], 0));
    assert_eq!(a.stats().invalid_words, 1, "counted once while it stays the same");
    // Implausible counts in a held slot.
    let g = Word::unpack(a.raw_word(b.slot(), 1).unwrap().load(Ordering::SeqCst)).generation;
    let absurd = Word { generation: g, writes_in_flight: 60_000, ..Word::default() }.pack();
    a.raw_word(b.slot(), 1).unwrap().store(absurd, Ordering::SeqCst);
    assert!(a.clear(false, &[1], 0));
    assert_eq!(a.stats().invalid_words, 2);
    // No slot beyond the board.
    assert!(a.raw_word(MAX_SLOTS, 0).is_none() && a.raw_word(0, 2).is_none());
    // b's next announcement replaces the garbage in its own row.
    b.publish(1, 0, 0, 0);
    assert!(!b.is_lost());
    assert!(a.clear(false, &[1], 0));
    assert_eq!(a.stats().stale_words, 0);
}

#[test]
fn a_stuck_word_blocks_until_the_stale_deadline_then_is_ignored_until_it_changes() {
    let (d, _dir) = daemon("stale");
    let (_a_store, a) = client(&d, "a");
    let (_b_store, b) = client(&d, "b");
    a.set_stale_after(Duration::from_millis(100));
    b.publish(0, 0, 1, 0);
    // The board's clock is the caller's: no sleeping, no timing.
    assert!(!a.clear(false, &[0], 1000 * MS));
    assert!(!a.clear(false, &[0], 1099 * MS));
    assert!(a.clear(false, &[0], 1100 * MS), "ignored once stuck for the deadline");
    assert!(a.clear(false, &[0], 5000 * MS));
    assert_eq!(a.stats().stale_words, 1);
    // It changes (the peer is alive): it blocks again.
    b.publish(0, 0, 2, 0);
    assert!(!a.clear(false, &[0], 5001 * MS));
    b.publish(0, 0, 0, 0);
    assert!(a.clear(false, &[0], 5002 * MS));
}

#[test]
fn a_board_that_is_not_what_the_daemon_described_is_refused() {
    let (d, _dir) = daemon("attach");
    let c = Client::connect(d.socket(), "raw", Duration::from_secs(10)).unwrap();
    let (reply, mut fds) = c.call_fds(Request::Arbitration).unwrap();
    let Response::Arbitration(r) = reply else { panic!("{reply:?}") };
    assert_eq!(fds.len(), 1);
    let fd = fds.pop().unwrap();
    let dup = || fd.try_clone().unwrap();
    let refused = |reply: ArbitrationReply, drives: usize, needle: &str| {
        let e = SharedArbitration::attach(dup(), &reply, drives).unwrap_err().to_string();
        assert!(e.contains(needle), "{e}");
    };
    refused(ArbitrationReply { slot: r.slots, ..r }, 2, "slot");
    refused(ArbitrationReply { generation: 0, ..r }, 2, "generation");
    refused(r, 3, "the pool has 3");
    refused(ArbitrationReply { slots: r.slots - 1, ..r }, 2, "63 slots");
    refused(ArbitrationReply { generation: r.generation.wrapping_add(1), ..r }, 2, "generation");
    // A file that is not the board: right size, wrong header.
    let f = tempfile_of(board_len(r.slots as usize, 2));
    let e = SharedArbitration::attach(f, &r, 2).unwrap_err().to_string();
    assert!(e.contains("sealed") || e.contains("header"), "{e}");
    // The real one maps.
    let board = SharedArbitration::attach(fd, &r, 2).unwrap();
    assert_eq!(board.slot(), r.slot as usize);
    // One slot per client.
    match c.call(Request::Arbitration) {
        Err(DaemonError::Rejected { kind: ErrorKind::Invalid, message, .. }) => {
            assert!(message.contains("already"), "{message}")
        }
        other => panic!("a second slot for one client: {other:?}"),
    }
}

fn tempfile_of(len: usize) -> std::os::fd::OwnedFd {
    let p = std::env::temp_dir().join(format!("tuttid-arb-fake-{}", std::process::id()));
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(len as u64).unwrap();
    let _ = std::fs::remove_file(&p);
    f.into()
}

#[test]
fn a_client_of_the_previous_protocol_is_refused_at_hello_naming_both() {
    let (d, _dir) = daemon("proto");
    let conn = tutti_daemon::Connection::connect(d.socket(), Duration::from_secs(10)).unwrap();
    let (resp, _): (Response, _) = conn
        .call(&Request::Hello { protocol: PROTOCOL - 1, name: "old".into() }, &[], Duration::from_secs(10))
        .unwrap();
    match resp {
        Response::Error { kind: ErrorKind::Protocol, message } => {
            assert!(message.contains(&format!("protocol {PROTOCOL}")), "{message}");
            assert!(message.contains(&format!("client {}", PROTOCOL - 1)), "{message}");
        }
        other => panic!("an old client was answered {other:?}"),
    }
    // The refusal ends the connection: nothing more is served on it.
    let err = conn.call::<Request, Response>(&Request::Stats, &[], Duration::from_secs(10)).unwrap_err();
    assert!(matches!(err, tutti_daemon::DaemonError::ConnectionLost { .. }), "{err}");
    assert_eq!(d.status().waiting_for_hello, 0, "{:?}", d.status());
}

#[test]
fn a_stuck_peer_is_waited_on_once_whatever_the_drive_or_direction_until_it_changes() {
    let (d, _dir) = daemon("once");
    let (_a_store, a) = client(&d, "a");
    let (_b_store, b) = client(&d, "b");
    a.set_stale_after(Duration::from_millis(100));
    // b is stopped with reads in flight on both drives and one ready on drive 1.
    b.publish(0, 1, 0, 0);
    b.publish(1, 2, 0, 1);
    // a's writes wait for it on drive 0 ...
    assert!(!a.clear(true, &[0], 1000 * MS));
    // ... and on drive 1: the same clock, started by the first check (no new 100 ms).
    assert!(!a.clear(true, &[1], 1050 * MS));
    assert!(a.clear(true, &[0, 1], 1100 * MS), "stale after one deadline, on every drive");
    assert_eq!(a.stats().stale_words, 1);
    // Reads of a are not blocked by it, and do not clear the mark: writes still skip it.
    assert!(a.clear(false, &[0, 1], 1200 * MS));
    assert!(a.clear(true, &[1], 1201 * MS) && a.clear(true, &[0], 1202 * MS));
    assert_eq!(a.stats().stale_words, 1, "marked once, not per drive, direction or unit");
    assert_eq!(a.stats().stale_skips, 3, "each write check since the mark skipped it");
    assert_eq!(a.stale_peers(), vec![(b.slot(), 1000 * MS)]);
    // b resumes: its row changes, so it counts again (and has its own deadline again).
    b.publish(1, 1, 0, 1);
    assert!(!a.clear(true, &[1], 1300 * MS));
    assert!(a.stale_peers().is_empty());
    b.publish(0, 0, 0, 0);
    b.publish(1, 0, 0, 0);
    assert!(a.clear(true, &[0, 1], 1301 * MS));
}
