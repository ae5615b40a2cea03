//! Per-drive arbitration across engine processes on one tuttid (ABI 1.7): two client
//! processes, one storing and one loading on the same drives, never have a read and a write on
//! one drive at once (the daemon's emulated drives count every command that ran with the other
//! direction in flight, whichever client sent it); a client SIGKILLed while its row holds the
//! drives is cleared by the daemon, so the survivor's loads go on; a client SIGSTOPped with a
//! load in flight is waited on once (by the other client and by tuttid's journal writes), then
//! skipped until it moves again; garbage on the board is ignored and counted. Child processes
//! are this test binary run again on one test with `TUTTI_TEST_XPROC` set.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::child::{field, line_of, Said};
use common::*;
use std::ffi::CString;
use std::process::Child;
use std::ptr::null_mut;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tutti::*;
use tutti_daemon::arbitration::{Word, MAX_SLOTS};
use tutti_daemon::Daemon;
use tutti_driver::emulated::{CostModel, MixedModel};

const BLOCKS: u32 = 8;
/// Set in a child: `<role> <socket>`.
const ROLE: &str = "TUTTI_TEST_XPROC";
/// Rounds of stores the storing child makes.
const ROUNDS: u32 = 10;
const STORE_SEED: u8 = 0x51;
const LOAD_SEED: u8 = 0x21;

/// A tuttid on 2 slow emulated drives whose cost model collapses (and counts) transfers that
/// run while the other direction is in flight on the drive.
fn slow_daemon(tag: &str) -> (Daemon, std::path::PathBuf) {
    let cost = CostModel {
        read_bytes_per_sec: Some(20_000_000),
        write_bytes_per_sec: Some(10_000_000),
        mixed: Some(MixedModel { efficiency: 0.5, read_share: 0.5 }),
        ..CostModel::default()
    };
    start_daemon_with(&format!("xproc-{tag}"), cost)
}

fn connect(socket: &str, name: &str) -> Rt {
    let socket = CString::new(socket).unwrap();
    let name = CString::new(name).unwrap();
    let mut rt = null_mut();
    // SAFETY: a valid config and out pointer.
    ok(unsafe { tutti_runtime_connect(&client_config(&socket, &name), &mut rt) });
    Rt(rt)
}

fn sched_stats(rt: &Rt) -> tutti_sched_stats_t {
    let mut s = tutti_sched_stats_t {
        struct_size: std::mem::size_of::<tutti_sched_stats_t>() as u32,
        ..Default::default()
    };
    // SAFETY: a live handle and a full-size struct.
    ok(unsafe { tutti_sched_stats(rt.0, &mut s) });
    s
}

/// Loads `keys` into blocks 4.. and checks them against blocks 0.. of `seed`'s pattern.
fn load_and_check(rt: &Rt, mem: &mut Mem, keys: &[tutti_hash_t], seed: u8) {
    let to: Vec<u32> = (4..4 + keys.len() as u32).collect();
    for &b in &to {
        scribble(mem, b as usize, BLOCKS);
    }
    let st = load_all(rt, keys, &to);
    assert!(st.done == 1 && st.failed == 0, "{st:?}");
    for (from, &b) in to.iter().enumerate() {
        assert!(
            block_bytes(mem, b as usize, BLOCKS) == pattern(from, BLOCKS, seed),
            "block {b} (from {from})"
        );
    }
}

fn spawn(test: &str, role: &str, socket: &str) -> (Child, Said) {
    common::child::spawn(test, ROLE, &format!("{role} {socket}"))
}

/// The child's role, if this process is one: runs it and says so.
fn child_role() -> Option<(String, String)> {
    let v = std::env::var(ROLE).ok()?;
    let (role, socket) = v.split_once(' ').unwrap();
    Some((role.to_string(), socket.to_string()))
}

/// Storing child: ROUNDS stores of 4 blocks of its own pattern, each committed (tuttid
/// appends to its journals then, holding the drives on the board), then its counters.
fn storer(socket: &str) {
    let rt = connect(socket, "storer");
    let _mem = register_filled(&rt, BLOCKS, STORE_SEED);
    for r in 0..ROUNDS {
        let rep = store_all(&rt, &hashes(4, 500 + r), &[0, 1, 2, 3]);
        assert_eq!(rep.stored, 4, "round {r}");
    }
    let s = sched_stats(&rt);
    assert_eq!(s.xproc_active, 1);
    println!(
        "xproc-storer writes={} xproc_waits={} mixed={}",
        s.writes_issued, s.xproc_waits, s.mixed_issues
    );
    // SAFETY: a live handle.
    unsafe { ok(tutti_unregister_kv(rt.0)) };
}

#[test]
fn two_client_processes_never_put_a_read_and_a_write_on_one_drive() {
    if let Some((role, socket)) = child_role() {
        assert_eq!(role, "store");
        storer(&socket);
        return;
    }
    let (daemon, dir) = slow_daemon("two");
    let socket = daemon.socket().to_str().unwrap().to_string();
    let rt = connect(&socket, "loader");
    let mut mem = register_filled(&rt, BLOCKS, LOAD_SEED);
    let mine = hashes(4, 400);
    assert_eq!(store_all(&rt, &mine, &[0, 1, 2, 3]).stored, 4);
    let before: u64 = daemon.status().emulated_io.iter().map(|c| c.mixed_commands).sum();
    assert_eq!(before, 0);

    // The other process stores while this one loads, over and over, on the same two drives.
    let (mut child, lines) =
        spawn("two_client_processes_never_put_a_read_and_a_write_on_one_drive", "store", &socket);
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut loads = 0u32;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "the storing child did not finish");
        load_and_check(&rt, &mut mem, &mine, LOAD_SEED);
        loads += 1;
        // Room for the other process's writes: reads go first, across processes too.
        std::thread::sleep(Duration::from_millis(2));
    };
    reader.join().unwrap();
    let said: Vec<String> = rx.try_iter().collect();
    let report = said.iter().find_map(|l| l.find("xproc-storer").map(|at| l[at..].to_string()));
    let report = report.unwrap_or_else(|| panic!("the storing child did not report: {said:?}"));
    assert!(status.success(), "the storing child failed: {said:?}");
    assert!(loads > 0);
    // The drives never ran a read and a write together, whichever process sent them (the
    // child's data, and tuttid's journal appends at its commits).
    let ctrls = daemon.status().emulated_io;
    let mixed: u64 = ctrls.iter().map(|c| c.mixed_commands).sum();
    assert!(ctrls.len() == 2 && ctrls.iter().all(|c| c.commands > 0), "{ctrls:?}");
    assert_eq!(mixed, 0, "commands ran with the other direction in flight: {ctrls:?}");
    let s = sched_stats(&rt);
    assert_eq!((s.xproc_active, s.mixed_issues, s.xproc_stale_words, s.xproc_invalid_words), (1, 0, 0, 0));
    assert_eq!(field(&report, "writes"), (ROUNDS * LAYERS) as u64);
    // They did contend, and deferred to each other through the board.
    assert!(s.xproc_waits + field(&report, "xproc_waits") > 0, "loader {s:?}, storer {report}");

    // The other process's blocks are there, byte for byte.
    for r in 0..ROUNDS {
        assert_eq!(lookup(&rt, &hashes(4, 500 + r), 0).0, 4, "round {r}");
    }
    load_and_check(&rt, &mut mem, &hashes(4, 500 + ROUNDS - 1), STORE_SEED);
    // SAFETY: a live handle.
    unsafe { ok(tutti_unregister_kv(rt.0)) };
    drop(rt);
    drop(daemon);
    let _ = std::fs::remove_dir_all(dir);
}

/// Holding child: announces writes in flight on every drive in its row (as a client killed
/// mid-store leaves it), says which slot, and waits to be killed.
fn holder(socket: &str) {
    let rt = connect(socket, "holder");
    let board = sched_board(rt.0).unwrap().expect("a client of tuttid has a board");
    let slot = board.slot();
    for d in 0..board.drives() {
        let w = board.raw_word(slot, d).unwrap();
        let g = Word::unpack(w.load(Ordering::SeqCst)).generation;
        w.store(Word { generation: g, writes_in_flight: 1, ..Word::default() }.pack(), Ordering::SeqCst);
    }
    println!("xproc-holder slot={slot}");
    std::thread::sleep(Duration::from_secs(120));
}

#[test]
fn a_client_killed_holding_the_drives_is_cleared_and_the_other_goes_on() {
    if let Some((role, socket)) = child_role() {
        assert_eq!(role, "hold");
        holder(&socket);
        return;
    }
    let (daemon, dir) = slow_daemon("kill");
    let socket = daemon.socket().to_str().unwrap().to_string();
    let rt = connect(&socket, "survivor");
    let mut mem = register_filled(&rt, BLOCKS, LOAD_SEED);
    let mine = hashes(4, 410);
    assert_eq!(store_all(&rt, &mine, &[0, 1, 2, 3]).stored, 4);
    let (mut child, mut lines) =
        spawn("a_client_killed_holding_the_drives_is_cleared_and_the_other_goes_on", "hold", &socket);
    let slot = field(&line_of(&mut lines, "xproc-holder"), "slot") as usize;
    let board = sched_board(rt.0).unwrap().unwrap();
    assert_ne!(slot, board.slot());
    assert_eq!(Word::unpack(board.raw_word(slot, 0).unwrap().load(Ordering::SeqCst)).writes_in_flight, 1);

    // While it lives, its writes hold this process's loads.
    let to = [4u32, 5, 6, 7];
    let mut job = null_mut();
    // SAFETY: valid handles and buffers.
    unsafe { ok(tutti_submit_load(rt.0, mine.as_ptr(), to.as_ptr(), 4, 0, LAYERS, &mut job)) };
    let mut st = status();
    // SAFETY: a live job handle.
    let code = unsafe { tutti_job_poll(job, &mut st) };
    assert_eq!(code, TUTTI_IN_PROGRESS, "{st:?}");
    assert_eq!(st.layers_done, 0, "{st:?}");
    assert!(sched_stats(&rt).xproc_waits > 0);

    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // The daemon sees the connection end and zeroes the dead client's row.
    let deadline = Instant::now() + Duration::from_secs(20);
    while daemon.status().clients.len() != 1 {
        assert!(Instant::now() < deadline, "tuttid still lists the killed client");
        std::thread::sleep(Duration::from_millis(5));
    }
    for d in 0..board.drives() {
        assert_eq!(board.raw_word(slot, d).unwrap().load(Ordering::SeqCst), 0, "drive {d}");
    }
    // The held load finishes, and not by waiting out the stale deadline.
    // SAFETY: a live job handle.
    unsafe {
        ok(tutti_job_wait(job, WAIT_MS, &mut st));
        ok(tutti_job_destroy(job));
    }
    assert!(st.done == 1 && st.failed == 0, "{st:?}");
    for (from, &b) in to.iter().enumerate() {
        assert!(block_bytes(&mut mem, b as usize, BLOCKS) == pattern(from, BLOCKS, LOAD_SEED), "block {b}");
    }
    let s = sched_stats(&rt);
    assert_eq!((s.xproc_stale_words, s.xproc_invalid_words), (0, 0), "{s:?}");
    load_and_check(&rt, &mut mem, &mine, LOAD_SEED);
    // SAFETY: a live handle.
    unsafe { ok(tutti_unregister_kv(rt.0)) };
    drop(rt);
    drop(daemon);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn garbage_on_the_board_is_ignored_counted_and_reported() {
    let (daemon, dir) = slow_daemon("garbage");
    let socket = daemon.socket().to_str().unwrap().to_string();
    let rt = connect(&socket, "engine");
    let mut mem = register_filled(&rt, BLOCKS, LOAD_SEED);
    let mine = hashes(2, 420);
    assert_eq!(store_all(&rt, &mine, &[0, 1]).stored, 2);
    let board = sched_board(rt.0).unwrap().unwrap();
    // Every count maxed out in a slot nobody holds, on both drives.
    for d in 0..2 {
        board.raw_word(MAX_SLOTS - 1, d).unwrap().store(u64::MAX >> 16, Ordering::SeqCst);
    }
    load_and_check(&rt, &mut mem, &mine, LOAD_SEED);
    let s = sched_stats(&rt);
    assert_eq!(s.xproc_waits, 0, "{s:?}");
    assert!(s.xproc_invalid_words >= 1, "{s:?}");
    // SAFETY: a live handle.
    unsafe { ok(tutti_unregister_kv(rt.0)) };
    drop(rt);
    drop(daemon);
    let _ = std::fs::remove_dir_all(dir);
}

/// Pausing child: stores its own blocks, submits a load of them and stops itself (SIGSTOP) with
/// the load in flight, as a worker in a long GC pause, under a debugger or in a frozen cgroup.
/// Continued, it finishes the load, checks every byte and reports.
fn pauser(socket: &str) {
    let rt = connect(socket, "pauser");
    let mut mem = register_filled(&rt, BLOCKS, PAUSE_SEED);
    let keys = hashes(4, 430);
    assert_eq!(store_all(&rt, &keys, &[0, 1, 2, 3]).stored, 4);
    for b in 4..8 {
        scribble(&mut mem, b, BLOCKS);
    }
    let to = [4u32, 5, 6, 7];
    let mut job = null_mut();
    // SAFETY: valid handles and buffers.
    unsafe { ok(tutti_submit_load(rt.0, keys.as_ptr(), to.as_ptr(), 4, 0, LAYERS, &mut job)) };
    let slot = sched_board(rt.0).unwrap().unwrap().slot();
    println!("xproc-pausing slot={slot}");
    // SAFETY: raise(2) on this process; the parent continues it with SIGCONT.
    assert_eq!(unsafe { libc::raise(libc::SIGSTOP) }, 0);
    let mut st = status();
    // SAFETY: a live job handle.
    unsafe {
        ok(tutti_job_wait(job, WAIT_MS, &mut st));
        ok(tutti_job_destroy(job));
    }
    assert!(st.done == 1 && st.failed == 0, "{st:?}");
    for (from, &b) in to.iter().enumerate() {
        assert!(block_bytes(&mut mem, b as usize, BLOCKS) == pattern(from, BLOCKS, PAUSE_SEED), "block {b}");
    }
    println!("xproc-resumed loaded=4");
    // SAFETY: a live handle.
    unsafe { ok(tutti_unregister_kv(rt.0)) };
}

/// The state letter of process `pid` (`T`: stopped).
fn proc_state(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // "pid (comm) S ...": the state follows the last ')'.
    stat[stat.rfind(')').unwrap() + 1..].trim_start().chars().next().unwrap()
}

const PAUSE_SEED: u8 = 0x7C;
/// Store-and-load rounds made while the other client is stopped.
const PAUSED_ROUNDS: u32 = 6;

#[test]
fn a_stopped_client_is_waited_on_once_then_skipped_by_the_others_and_by_tuttid() {
    if let Some((role, socket)) = child_role() {
        assert_eq!(role, "pause");
        pauser(&socket);
        return;
    }
    let (daemon, dir) = slow_daemon("pause");
    let socket = daemon.socket().to_str().unwrap().to_string();
    let rt = connect(&socket, "busy");
    let mut mem = register_filled(&rt, BLOCKS, LOAD_SEED);
    let mine = hashes(4, 440);
    assert_eq!(store_all(&rt, &mine, &[0, 1, 2, 3]).stored, 4);
    let (mut child, mut lines) = spawn(
        "a_stopped_client_is_waited_on_once_then_skipped_by_the_others_and_by_tuttid",
        "pause",
        &socket,
    );
    let slot = field(&line_of(&mut lines, "xproc-pausing"), "slot") as usize;
    let deadline = Instant::now() + Duration::from_secs(20);
    while proc_state(child.id()) != 'T' {
        assert!(Instant::now() < deadline, "the pausing child did not stop");
        std::thread::sleep(Duration::from_millis(5));
    }
    let board = sched_board(rt.0).unwrap().unwrap();
    assert_ne!(slot, board.slot());
    let holds_before = daemon.status().arbitration;

    // This client goes on storing and loading while the other is stopped with its load on the
    // board: its reads in flight hold this client's writes, and tuttid's journal writes.
    for r in 0..PAUSED_ROUNDS {
        assert_eq!(store_all(&rt, &hashes(4, 600 + r), &[0, 1, 2, 3]).stored, 4, "round {r}");
        load_and_check(&rt, &mut mem, &mine, LOAD_SEED);
    }
    // Waited on once, not once per store, per drive or per direction: the stopped client was
    // marked stale once, by this client and by tuttid, and skipped from then on.
    let s = sched_stats(&rt);
    let b = board.stats();
    assert_eq!(s.xproc_stale_words, 1, "{s:?}");
    assert!(b.stale_skips >= PAUSED_ROUNDS as u64, "every later store's writes skipped it: {b:?}");
    let holds = daemon.status().arbitration;
    assert_eq!(holds.stale_marks - holds_before.stale_marks, 1, "{holds:?}");
    // Each store holds the drives twice (reserve, commit); all but the first waited-out one skipped it.
    assert!(
        holds.stale_skips - holds_before.stale_skips >= 2 * PAUSED_ROUNDS as u64 - 1,
        "{holds_before:?} -> {holds:?}"
    );
    // tutti status names it, and since when.
    let status = daemon.status();
    let paused = status.clients.iter().find(|c| c.arbitration_slot == Some(slot as u32)).unwrap();
    let stale = paused.stale.clone().expect("the stopped client is reported stale");
    assert!(stale.skipped_by_holds && stale.unchanged_ms > 0, "{stale:?}");
    // The writes that went anyway met no read on the drives: the stopped client's reads had
    // been served (its row said otherwise only because it could not reap them), and what it
    // reads (files it holds a reference on) no write may touch. The drives count any command
    // run with the other direction in flight.
    let mixed: u64 = status.emulated_io.iter().map(|c| c.mixed_commands).sum();
    assert_eq!(mixed, 0, "{:?}", status.emulated_io);

    // Continued, it finishes its load with every byte right, and counts again.
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGCONT) }, 0);
    let resumed = line_of(&mut lines, "xproc-resumed");
    assert_eq!(field(&resumed, "loaded"), 4);
    assert!(child.wait().unwrap().success());
    assert_eq!(store_all(&rt, &hashes(4, 700), &[0, 1, 2, 3]).stored, 4);
    load_and_check(&rt, &mut mem, &mine, LOAD_SEED);
    assert!(board.stale_peers().is_empty(), "{:?}", board.stale_peers());
    // Every store made meanwhile is there, byte for byte.
    for r in 0..PAUSED_ROUNDS {
        assert_eq!(lookup(&rt, &hashes(4, 600 + r), 0).0, 4, "round {r}");
    }
    load_and_check(&rt, &mut mem, &hashes(4, 600), LOAD_SEED);
    // SAFETY: a live handle.
    unsafe { ok(tutti_unregister_kv(rt.0)) };
    drop(rt);
    drop(daemon);
    let _ = std::fs::remove_dir_all(dir);
}
