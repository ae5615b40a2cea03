//! tuttid's socket layer end to end: frames with fds, refusals, stale and live sockets,
//! disconnect accounting, client limits, and clients of a daemon that dies or stalls.

// Helpers outside #[test] functions may unwrap too: a panic is how a test fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs::File;
use std::io::{IoSlice, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use common::*;
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use tutti_daemon::wire::PROTOCOL_VERSION;
use tutti_daemon::{recv_frame, send_frame, Connection, DaemonError, Hello, Server, SocketMode};

const CALL: Duration = Duration::from_secs(20);

fn frame_bytes(body: &[u8]) -> Vec<u8> {
    let mut f = (body.len() as u32).to_le_bytes().to_vec();
    f.extend_from_slice(body);
    f
}

fn expect_malformed(stream: &UnixStream) -> String {
    match recv_frame::<Resp>(stream, soon()).unwrap().0 {
        Resp::Malformed(why) => why,
        other => panic!("expected a malformed reply, got {other:?}"),
    }
}

fn expect_closed(stream: &UnixStream) {
    let err = recv_frame::<Resp>(stream, soon()).unwrap_err();
    assert!(matches!(err, DaemonError::Closed), "expected the daemon to close, got {err}");
}

#[test]
fn requests_round_trip_with_0_1_and_8_fds() {
    let d = Daemon::start("fds", |s| s);
    let conn = Connection::connect(&d.path, CALL).unwrap();

    let (resp, fds): (Resp, _) = conn.call(&Req::Echo("plain".into()), &[], CALL).unwrap();
    assert_eq!(resp, Resp::Echo("plain".into()));
    assert!(fds.is_empty());

    for n in [1usize, 8] {
        let files: Vec<File> = (0..n)
            .map(|i| {
                let p = d.dir.join(&format!("f{n}-{i}"));
                File::options().read(true).write(true).create(true).truncate(true).open(p).unwrap()
            })
            .collect();
        let borrowed: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
        let text = format!("stamped by tuttid for {n}");
        let (resp, back): (Resp, _) = conn.call(&Req::Stamp(text.clone()), &borrowed, CALL).unwrap();
        assert_eq!(resp, Resp::Stamped(n));
        // The daemon wrote through the descriptors it received: the same files.
        for f in &files {
            let mut buf = vec![0u8; text.len()];
            f.read_exact_at(&mut buf, 0).unwrap();
            assert_eq!(buf, text.as_bytes());
        }
        // And the descriptors it sent back are the same files again, close-on-exec.
        assert_eq!(back.len(), n);
        for (fd, f) in back.iter().zip(&files) {
            let (a, b) = (File::from(fd.try_clone().unwrap()).metadata().unwrap(), f.metadata().unwrap());
            assert_eq!((a.dev(), a.ino()), (b.dev(), b.ino()));
            let flags = rustix::io::fcntl_getfd(fd).unwrap();
            assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
        }
    }
    drop(conn);
    d.stop();
}

#[test]
fn oversized_announced_length_is_refused_and_the_client_dropped() {
    let d = Daemon::start("oversize", |s| s);
    let (mut s, id) = raw_client(&d.path);
    s.write_all(&(1u32 << 31).to_le_bytes()).unwrap();
    let why = expect_malformed(&s);
    assert!(why.contains("2147483648 bytes is over the 16777216-byte limit"), "{why}");
    expect_closed(&s);
    d.handler.wait_for("the disconnect", |e| e.disconnected.contains(&id));
    d.stop();
}

#[test]
fn partial_frame_that_stalls_is_dropped_at_the_deadline() {
    let d = Daemon::start("stall", |s| s.with_frame_timeout(Duration::from_millis(300)));
    let (mut s, id) = raw_client(&d.path);
    let started = Instant::now();
    s.write_all(&100u32.to_le_bytes()).unwrap();
    s.write_all(b"{\"Echo\"").unwrap();
    let why = expect_malformed(&s);
    assert!(started.elapsed() >= Duration::from_millis(300), "dropped before the deadline");
    assert!(why.contains("timed out") && why.contains("11 of 104 bytes"), "{why}");
    expect_closed(&s);
    d.handler.wait_for("the disconnect", |e| e.disconnected.contains(&id));
    d.stop();
}

#[test]
fn garbage_json_gets_a_malformed_reply_and_the_connection_stays_usable() {
    let d = Daemon::start("garbage", |s| s);
    let (mut s, _) = raw_client(&d.path);
    s.write_all(&frame_bytes(b"{\"Echo\": 12")).unwrap();
    let why = expect_malformed(&s);
    assert!(why.contains("not a valid message"), "{why}");
    s.write_all(&frame_bytes(b"{\"Launch\": \"missiles\"}")).unwrap();
    let why = expect_malformed(&s);
    assert!(why.contains("Launch"), "{why}");
    send_frame(&s, &Req::Echo("still here".into()), &[]).unwrap();
    assert_eq!(recv_frame::<Resp>(&s, soon()).unwrap().0, Resp::Echo("still here".into()));
    drop(s);
    d.stop();
}

#[test]
fn nine_fds_are_refused_and_closed() {
    let d = Daemon::start("ninefds", |s| s);
    let (s, _) = raw_client(&d.path);
    let (pipe_r, pipe_w) = pipe().unwrap();
    let nine = vec![pipe_w.as_fd(); 9];
    let body = serde_json::to_vec(&Req::Echo("nine".into())).unwrap();
    let frame = frame_bytes(&body);
    {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(9))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        assert!(control.push(SendAncillaryMessage::ScmRights(&nine)));
        let n = rustix::net::sendmsg(&s, &[IoSlice::new(&frame)], &mut control, SendFlags::empty()).unwrap();
        assert_eq!(n, frame.len());
    }

    let why = expect_malformed(&s);
    assert!(why.contains("more than 8 file descriptors"), "{why}");
    // The daemon closed every copy it got: with ours closed too, the pipe reads end-of-file.
    drop(nine);
    drop(pipe_w);
    let mut reader = File::from(pipe_r);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 1];
        let _ = tx.send(reader.read(&mut buf).map_err(|e| e.to_string()));
    });
    let read = rx.recv_timeout(PATIENCE).expect("a refused descriptor is still open in the daemon");
    assert_eq!(read, Ok(0));

    // The connection is still in step.
    send_frame(&s, &Req::Echo("after".into()), &[]).unwrap();
    assert_eq!(recv_frame::<Resp>(&s, soon()).unwrap().0, Resp::Echo("after".into()));
    drop(s);
    d.stop();
}

#[test]
fn too_many_malformed_frames_drop_the_client_once() {
    let d = Daemon::start("malformed", |s| s.with_malformed_limit(3));
    let (mut s, id) = raw_client(&d.path);
    for i in 1..=3 {
        s.write_all(&frame_bytes(b"nope")).unwrap();
        let why = expect_malformed(&s);
        assert_eq!(why.contains("closing the connection"), i == 3, "frame {i}: {why}");
    }
    expect_closed(&s);
    d.handler.wait_for("the disconnect", |e| e.disconnected.contains(&id));
    assert_eq!(d.handler.disconnects_of(id), 1);
    d.stop();
}

#[test]
fn disconnect_is_called_once_when_the_client_closes() {
    let d = Daemon::start("close", |s| s);
    let conn = Connection::connect(&d.path, CALL).unwrap();
    let id = conn.client_id();
    let _: (Resp, _) = conn.call(&Req::Echo("x".into()), &[], CALL).unwrap();
    drop(conn);
    d.handler.wait_for("the disconnect", |e| e.disconnected.contains(&id));
    d.stop();
}

#[test]
fn disconnect_is_called_once_when_the_client_process_is_killed() {
    let d = Daemon::start("sigkill", |s| s);
    let addr = sockaddr(&d.path);
    let pid = fork_child(|| {
        if raw_connect(&addr) < 0 {
            return 3;
        }
        loop {
            // SAFETY: pause is async-signal-safe; the parent ends this child with SIGKILL.
            unsafe { libc::pause() };
        }
    });
    d.handler.wait_for("the child to connect", |e| e.peers.values().any(|p| p.pid == pid));
    let id = d.handler.events(|e| *e.peers.iter().find(|(_, p)| p.pid == pid).unwrap().0);
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let status = wait_child(pid);
    assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL, "status {status:#x}");
    d.handler.wait_for("the disconnect", |e| e.disconnected.contains(&id));
    d.stop();
}

#[test]
fn stop_makes_run_return_disconnects_everyone_and_removes_the_socket() {
    let d = Daemon::start("stop", |s| s);
    let a = Connection::connect(&d.path, CALL).unwrap();
    let b = Connection::connect(&d.path, CALL).unwrap();
    let path = d.path.clone();
    assert!(path.exists());
    assert!(a.lost().is_none());
    d.stop(); // Checks: run returned, socket gone, one disconnect per client.
    assert!(!path.exists());
    // Learnt without a call: the daemon hung up.
    let lost = a.lost().expect("the hang-up is seen");
    assert!(
        matches!(lost, DaemonError::ConnectionLost { .. }) && lost.to_string().contains("is gone"),
        "{lost}"
    );
    for c in [a, b] {
        let err = c.call::<_, Resp>(&Req::Echo("late".into()), &[], CALL).unwrap_err();
        assert!(matches!(err, DaemonError::ConnectionLost { .. }), "{err}");
    }
}

#[test]
fn clients_beyond_max_clients_are_refused() {
    let d = Daemon::start("max", |s| s.with_max_clients(2));
    let a = Connection::connect(&d.path, CALL).unwrap();
    let _b = Connection::connect(&d.path, CALL).unwrap();
    let err = Connection::connect(&d.path, CALL).unwrap_err();
    match &err {
        DaemonError::Refused { message, .. } => assert!(message.contains("at most 2 clients"), "{message}"),
        other => panic!("expected a refusal, got {other}"),
    }
    assert_eq!(d.handler.events(|e| e.connected.len()), 2, "a refused client reached the handler");
    let id = a.client_id();
    drop(a);
    d.handler.wait_for("the disconnect", |e| e.disconnected.contains(&id));
    let c = Connection::connect(&d.path, CALL).unwrap();
    let _: (Resp, _) = c.call(&Req::Echo("room again".into()), &[], CALL).unwrap();
    drop(c);
    drop(_b);
    d.stop();
}

#[test]
fn peer_with_another_uid_is_refused_before_any_request() {
    if !is_root() {
        return skip_or_fail("acting as another uid needs root");
    }
    let d = Daemon::start("nobody", |s| s);
    // Open the file system's door so that the peer-credential check is what refuses.
    std::fs::set_permissions(&d.dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&d.path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let addr = sockaddr(&d.path);
    let (pipe_r, pipe_w) = pipe().unwrap();
    let out = pipe_w.as_raw_fd();
    let pid = fork_child(|| {
        // SAFETY: async-signal-safe system calls on a stack buffer and fds from before the fork.
        unsafe {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(65534) != 0
                || libc::setuid(65534) != 0
            {
                return 3;
            }
            let fd = raw_connect(&addr);
            if fd < 0 {
                return 4;
            }
            // Bounded: a daemon that lets this peer in would otherwise keep it waiting.
            let limit = libc::timeval { tv_sec: 10, tv_usec: 0 };
            let size = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
            if libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&limit as *const libc::timeval).cast(),
                size,
            ) != 0
            {
                return 6;
            }
            let mut buf = [0u8; 4096];
            let mut got = 0usize;
            loop {
                let n = libc::read(fd, buf.as_mut_ptr().add(got).cast(), buf.len() - got);
                if n <= 0 {
                    break;
                }
                got += n as usize;
            }
            if libc::write(out, buf.as_ptr().cast(), got) != got as isize {
                return 5;
            }
            0
        }
    });
    drop(pipe_w);
    let status = wait_child(pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "child status {status:#x}");
    let mut bytes = Vec::new();
    File::from(pipe_r).read_to_end(&mut bytes).unwrap();
    // The child got exactly one refusal frame, then the end of the stream.
    let len = u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
    assert_eq!(bytes.len(), 4 + len);
    let hello: Hello = serde_json::from_slice(&bytes[4..]).unwrap();
    match hello {
        Hello::Refused { message } => assert!(message.contains("uid 65534"), "{message}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(d.handler.events(|e| e.connected.len()), 0, "the refused peer reached the handler");
    d.stop();
}

#[test]
fn socket_mode_is_0600_for_the_owner_and_0660_with_a_group() {
    let dir = TestDir::new("mode");
    // A missing parent directory is created closed to others.
    let owner_path = dir.join("run/owner.sock");
    let s = Server::bind(&owner_path, SocketMode::Owner).unwrap();
    let m = std::fs::metadata(&owner_path).unwrap();
    assert_eq!(m.mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(dir.join("run")).unwrap().mode() & 0o777, 0o700);
    drop(s);
    assert!(!owner_path.exists(), "dropping the server leaves its socket file");

    // As root any group will do; otherwise our own.
    // SAFETY: getegid has no preconditions.
    let gid = if is_root() { 4321 } else { unsafe { libc::getegid() } };
    let group_path = dir.join("group.sock");
    let s = Server::bind(&group_path, SocketMode::Group(gid)).unwrap();
    let m = std::fs::metadata(&group_path).unwrap();
    assert_eq!(m.mode() & 0o777, 0o660);
    assert_eq!(m.gid(), gid);
    drop(s);
}

#[test]
fn stale_socket_is_replaced() {
    let dir = TestDir::new("stale");
    let path = dir.join("tuttid.sock");
    drop(UnixListener::bind(&path).unwrap()); // the file stays; nobody listens
    assert!(path.exists());
    let server = Server::bind(&path, SocketMode::Owner).unwrap();
    // The new socket answers.
    let _c = UnixStream::connect(&path).unwrap();
    drop(server);
}

#[test]
fn live_socket_is_refused_naming_its_pid() {
    let dir = TestDir::new("live");
    let path = dir.join("tuttid.sock");
    let _live = UnixListener::bind(&path).unwrap();
    let err = Server::bind(&path, SocketMode::Owner).unwrap_err();
    let me = std::process::id() as i32;
    assert!(matches!(err, DaemonError::InUse { pid: Some(pid), .. } if pid == me), "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&format!("pid {me}")) && msg.contains("tuttid.sock"), "{msg}");
    assert!(path.exists(), "the live socket was removed");
    // Still served: the listener is untouched.
    let _c = UnixStream::connect(&path).unwrap();
}

#[test]
fn regular_file_at_the_path_is_refused_and_left_in_place() {
    let dir = TestDir::new("regular");
    let path = dir.join("tuttid.sock");
    std::fs::write(&path, b"precious").unwrap();
    let err = Server::bind(&path, SocketMode::Owner).unwrap_err();
    assert!(matches!(err, DaemonError::NotASocket { kind: "a regular file", .. }), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"precious");
}

#[test]
fn connecting_to_a_missing_socket_says_how_to_start_tuttid() {
    let dir = TestDir::new("missing");
    let path = dir.join("nobody-home.sock");
    let err = Connection::connect(&path, CALL).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, DaemonError::NotListening { .. }), "{msg}");
    assert!(msg.contains("nobody-home.sock") && msg.contains("tutti serve"), "{msg}");
}

#[test]
fn call_fails_within_its_deadline_when_the_daemon_dies() {
    let dir = TestDir::new("dies");
    let path = dir.join("tuttid.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let hello = frame_bytes(
        &serde_json::to_vec(&Hello::Welcome { protocol: PROTOCOL_VERSION, client: 7, daemon_pid: 0 })
            .unwrap(),
    );
    let lfd = listener.as_raw_fd();
    // A stand-in daemon: greets one client, reads its request, and is SIGKILLed mid-call.
    let pid = fork_child(|| {
        // SAFETY: async-signal-safe system calls on buffers prepared before the fork.
        unsafe {
            let fd = libc::accept(lfd, std::ptr::null_mut(), std::ptr::null_mut());
            if fd < 0 || libc::write(fd, hello.as_ptr().cast(), hello.len()) != hello.len() as isize {
                return 3;
            }
            let mut buf = [0u8; 64];
            if libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) <= 0 {
                return 4;
            }
            libc::kill(libc::getpid(), libc::SIGKILL);
            5
        }
    });
    drop(listener);
    let conn = Connection::connect(&path, CALL).unwrap();
    assert_eq!(conn.client_id(), 7);
    let err = conn.call::<_, Resp>(&Req::Echo("are you there".into()), &[], CALL).unwrap_err();
    // Seen as the end of the stream, not by waiting out the deadline.
    assert!(matches!(err, DaemonError::ConnectionLost { .. }), "{err}");
    let status = wait_child(pid);
    assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL, "status {status:#x}");
    let err = conn.call::<_, Resp>(&Req::Echo("again".into()), &[], CALL).unwrap_err();
    assert!(err.to_string().contains("tuttid at") && err.to_string().contains("is gone"), "{err}");
}

#[test]
fn a_timed_out_call_poisons_the_connection() {
    let d = Daemon::start("poison", |s| s);
    let conn = Connection::connect(&d.path, CALL).unwrap();
    let wait = Duration::from_millis(200);
    let started = Instant::now();
    let err = conn.call::<_, Resp>(&Req::SleepMs(1500), &[], wait).unwrap_err();
    assert!(started.elapsed() >= wait);
    assert!(matches!(err, DaemonError::Timeout { .. }), "{err}");
    // The late reply to the sleep must never be taken for the echo's.
    let err = conn.call::<_, Resp>(&Req::Echo("next".into()), &[], CALL).unwrap_err();
    let msg = err.to_string();
    // Refused at once, naming the call that broke the connection.
    assert!(msg.contains("is gone") && msg.contains("timed out"), "{msg}");
    d.handler.wait_for("the disconnect", |e| !e.disconnected.is_empty());
    assert_eq!(
        d.handler.requests.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the echo reached the daemon"
    );
    drop(conn);
    d.stop();
}

#[test]
fn idle_clients_are_not_timed_out() {
    let d = Daemon::start("idle", |s| s.with_frame_timeout(Duration::from_millis(100)));
    let conn = Connection::connect(&d.path, CALL).unwrap();
    // Idle for several frame timeouts: only a frame that has begun has a deadline.
    std::thread::sleep(Duration::from_millis(500));
    let (resp, _): (Resp, _) = conn.call(&Req::Echo("still connected".into()), &[], CALL).unwrap();
    assert_eq!(resp, Resp::Echo("still connected".into()));
    assert_eq!(d.handler.events(|e| e.disconnected.len()), 0);
    drop(conn);
    d.stop();
}

/// Sockets in this network namespace bound to (or accepted on) `path`, from /proc/net/unix:
/// the listener and one per accepted connection still open in this process.
fn sockets_on(path: &std::path::Path) -> usize {
    let table = std::fs::read_to_string("/proc/net/unix").unwrap();
    let want = path.to_str().unwrap();
    table.lines().skip(1).filter(|l| l.split_whitespace().nth(7) == Some(want)).count()
}

/// Waits (bounded) until `done`, or fails naming `what`.
fn eventually(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "waited {PATIENCE:?} for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn descriptors_of_closed_connections_are_released_without_another_accept() {
    let d = Daemon::start("fdrelease", |s| s);
    assert_eq!(sockets_on(&d.path), 1, "the listener alone");
    let conns: Vec<Connection> = (0..20).map(|_| Connection::connect(&d.path, CALL).unwrap()).collect();
    for c in &conns {
        let _: (Resp, _) = c.call(&Req::Echo("x".into()), &[], CALL).unwrap();
    }
    assert_eq!(sockets_on(&d.path), 21, "one accepted socket per connection");
    drop(conns);
    // No one connects from here on: the daemon's descriptors go when each peer hangs up.
    eventually("the accepted sockets to be closed", || sockets_on(&d.path) == 1);
    d.handler.wait_for("20 disconnects", |e| e.disconnected.len() == 20);
    d.stop();
}

/// Reads the daemon's greeting off a raw connection.
fn greeted_raw(path: &std::path::Path) -> UnixStream {
    let s = UnixStream::connect(path).unwrap();
    match recv_frame::<Hello>(&s, soon()).unwrap().0 {
        Hello::Welcome { .. } => s,
        other => panic!("expected a welcome, got {other:?}"),
    }
}

fn expect_refused(stream: &UnixStream, needle: &str) {
    match recv_frame::<Resp>(stream, soon()).unwrap().0 {
        Resp::Refused(why) => assert!(why.contains(needle), "{why:?} names {needle:?}"),
        other => panic!("expected a refusal naming {needle:?}, got {other:?}"),
    }
}

#[test]
fn a_connection_that_says_nothing_is_closed_at_the_idle_limit() {
    let d = Daemon::start_with("silent", Recorder::with_hello(), |s| {
        s.with_pre_hello_idle(Duration::from_millis(300)).with_hello_timeout(Duration::from_secs(60))
    });
    let s = greeted_raw(&d.path);
    let id = d.handler.events(|e| e.connected[0]);
    expect_refused(&s, "nothing was said");
    expect_closed(&s);
    d.handler.wait_for("the disconnect", |e| e.disconnected.contains(&id));
    eventually("the daemon's socket to be closed", || sockets_on(&d.path) == 1);
    d.stop();
}

#[test]
fn a_hello_trickled_byte_by_byte_is_cut_at_the_hello_deadline() {
    // The frame deadline alone (60 s) would let it go on; the hello deadline does not.
    let d = Daemon::start_with("trickle", Recorder::with_hello(), |s| {
        s.with_hello_timeout(Duration::from_millis(800))
            .with_pre_hello_idle(Duration::from_millis(300))
            .with_frame_timeout(Duration::from_secs(60))
    });
    let mut s = greeted_raw(&d.path);
    let frame = frame_bytes(&serde_json::to_vec(&Req::Hello(1)).unwrap());
    for &b in &frame[..frame.len() - 1] {
        if s.write_all(&[b]).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(150));
    }
    let why = expect_malformed(&s);
    assert!(why.contains("timed out") && why.contains("closing"), "{why}");
    expect_closed(&s);
    d.stop();
}

#[test]
fn a_refused_hello_is_answered_and_the_connection_closed() {
    let d = Daemon::start_with("refusedhello", Recorder::with_hello(), |s| s);
    let s = greeted_raw(&d.path);
    send_frame(&s, &Req::Hello(2), &[]).unwrap();
    expect_refused(&s, "protocol 2");
    expect_closed(&s);
    // So is anything else before hello.
    let s = greeted_raw(&d.path);
    send_frame(&s, &Req::Echo("before hello".into()), &[]).unwrap();
    assert_eq!(recv_frame::<Resp>(&s, soon()).unwrap().0, Resp::Echo("before hello".into()));
    expect_closed(&s);
    // A good hello keeps the connection.
    let s = greeted_raw(&d.path);
    send_frame(&s, &Req::Hello(1), &[]).unwrap();
    assert_eq!(recv_frame::<Resp>(&s, soon()).unwrap().0, Resp::Welcome);
    send_frame(&s, &Req::Echo("after hello".into()), &[]).unwrap();
    assert_eq!(recv_frame::<Resp>(&s, soon()).unwrap().0, Resp::Echo("after hello".into()));
    drop(s);
    d.stop();
}

#[test]
fn silent_connections_cannot_take_the_places_of_clients() {
    // Every deadline far away: only the cap on connections without hello protects the clients.
    let d = Daemon::start_with("flood", Recorder::with_hello(), |s| {
        s.with_max_clients(4)
            .with_max_pre_hello(8)
            .with_hello_timeout(Duration::from_secs(600))
            .with_pre_hello_idle(Duration::from_secs(600))
    });
    let silent: Vec<UnixStream> = (0..300).map(|_| UnixStream::connect(&d.path).unwrap()).collect();
    // The daemon keeps at most 8 of them (and a few it is still closing).
    d.handler.wait_for("300 connections", |e| e.connected.len() == 300);
    d.handler.wait_for("all but 8 dropped", |e| e.connected.len() - e.disconnected.len() <= 8);
    let clients: Vec<Connection> = (0..4)
        .map(|_| {
            let c = Connection::connect(&d.path, CALL).unwrap();
            let (r, _): (Resp, _) = c.call(&Req::Hello(1), &[], CALL).unwrap();
            assert_eq!(r, Resp::Welcome);
            c
        })
        .collect();
    for c in &clients {
        let (r, _): (Resp, _) = c.call(&Req::Echo("served".into()), &[], CALL).unwrap();
        assert_eq!(r, Resp::Echo("served".into()));
    }
    // The client limit still holds for those that say hello.
    let fifth = Connection::connect(&d.path, CALL);
    match fifth {
        Err(DaemonError::Refused { message, .. }) => {
            assert!(message.contains("at most 4 clients"), "{message}")
        }
        other => panic!("a fifth client was not refused: {:?}", other.map(|c| c.client_id())),
    }
    drop(silent);
    drop(clients);
    d.stop();
}
