//! A recording handler, a daemon on a temporary socket, and fork helpers for the wire tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tutti_daemon::{recv_frame, Handler, Hello, PeerCred, Server, SocketMode};

/// How long a test waits for something that should happen at once, before failing.
pub const PATIENCE: Duration = Duration::from_secs(20);

#[derive(Debug, Serialize, Deserialize)]
pub enum Req {
    Echo(String),
    /// Write the text at offset 0 of every file that came with the request; send them back.
    Stamp(String),
    SleepMs(u64),
    /// The hello of a handler that wants one ([`Recorder::with_hello`]): accepted for version 1.
    Hello(u32),
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub enum Resp {
    Echo(String),
    Stamped(usize),
    Slept,
    Malformed(String),
    Welcome,
    Refused(String),
}

#[derive(Default, Debug)]
pub struct Events {
    pub connected: Vec<u64>,
    pub disconnected: Vec<u64>,
    pub peers: HashMap<u64, PeerCred>,
}

/// A handler that records what happened to it.
#[derive(Default)]
pub struct Recorder {
    next: AtomicU64,
    pub requests: AtomicUsize,
    events: Mutex<Events>,
    changed: Condvar,
    /// Connections must say `Req::Hello(1)` first.
    hello_first: bool,
    greeted: Mutex<HashSet<u64>>,
}

impl Recorder {
    /// A recorder whose connections must say hello first.
    pub fn with_hello() -> Recorder {
        Recorder { hello_first: true, ..Recorder::default() }
    }

    /// Waits until `done` holds for the events, or fails the test after [`PATIENCE`].
    pub fn wait_for(&self, what: &str, done: impl Fn(&Events) -> bool) {
        let deadline = Instant::now() + PATIENCE;
        let mut ev = self.events.lock().unwrap();
        while !done(&ev) {
            let now = Instant::now();
            assert!(now < deadline, "waited {PATIENCE:?} for {what}; events: {ev:?}");
            ev = self.changed.wait_timeout(ev, deadline - now).unwrap().0;
        }
    }

    pub fn events<R>(&self, f: impl FnOnce(&Events) -> R) -> R {
        f(&self.events.lock().unwrap())
    }

    pub fn disconnects_of(&self, client: u64) -> usize {
        self.events(|e| e.disconnected.iter().filter(|&&c| c == client).count())
    }
}

impl Handler for Recorder {
    type Req = Req;
    type Resp = Resp;

    fn connect(&self, peer: &PeerCred) -> Result<u64, String> {
        let id = self.next.fetch_add(1, Ordering::SeqCst) + 1;
        let mut ev = self.events.lock().unwrap();
        ev.connected.push(id);
        ev.peers.insert(id, *peer);
        self.changed.notify_all();
        Ok(id)
    }

    fn request(&self, client: u64, _peer: &PeerCred, req: Req, fds: Vec<OwnedFd>) -> (Resp, Vec<OwnedFd>) {
        self.requests.fetch_add(1, Ordering::SeqCst);
        match req {
            Req::Echo(s) => (Resp::Echo(s), Vec::new()),
            Req::Stamp(text) => {
                for fd in &fds {
                    let file = File::from(fd.try_clone().unwrap());
                    file.write_all_at(text.as_bytes(), 0).unwrap();
                }
                (Resp::Stamped(fds.len()), fds)
            }
            Req::SleepMs(ms) => {
                std::thread::sleep(Duration::from_millis(ms));
                (Resp::Slept, Vec::new())
            }
            Req::Hello(1) => {
                self.greeted.lock().unwrap().insert(client);
                (Resp::Welcome, Vec::new())
            }
            Req::Hello(v) => (Resp::Refused(format!("protocol {v}; this handler speaks 1")), Vec::new()),
        }
    }

    fn malformed(&self, _client: u64, why: &str) -> Resp {
        Resp::Malformed(why.to_string())
    }

    fn hello_first(&self) -> bool {
        self.hello_first
    }

    fn greeted(&self, client: u64) -> bool {
        !self.hello_first || self.greeted.lock().unwrap().contains(&client)
    }

    fn refusal(&self, _client: u64, why: &str) -> Resp {
        Resp::Refused(why.to_string())
    }

    fn disconnect(&self, client: u64) {
        let mut ev = self.events.lock().unwrap();
        ev.disconnected.push(client);
        self.changed.notify_all();
    }
}

/// A unique directory under the temp dir, removed when dropped.
pub struct TestDir(pub PathBuf);

impl TestDir {
    pub fn new(tag: &str) -> TestDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("tutti-wire-{}-{n}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TestDir(dir)
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A server running in a thread on a socket in its own temp dir.
pub struct Daemon {
    pub handler: Arc<Recorder>,
    pub path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<tutti_daemon::Result<()>>>,
    pub dir: TestDir,
}

impl Daemon {
    pub fn start(tag: &str, configure: impl FnOnce(Server) -> Server) -> Daemon {
        Daemon::start_with(tag, Recorder::default(), configure)
    }

    /// As [`Daemon::start`], with this handler.
    pub fn start_with(tag: &str, handler: Recorder, configure: impl FnOnce(Server) -> Server) -> Daemon {
        let dir = TestDir::new(tag);
        let path = dir.join("tuttid.sock");
        let server = configure(Server::bind(&path, SocketMode::Owner).unwrap());
        let handler = Arc::new(handler);
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (handler, stop) = (Arc::clone(&handler), Arc::clone(&stop));
            std::thread::spawn(move || server.run(handler, stop))
        };
        Daemon { handler, path, stop, thread: Some(thread), dir }
    }

    /// Stops the server and checks that every connected client got exactly one disconnect.
    pub fn stop(mut self) {
        self.stop_and_join();
        assert!(!self.path.exists(), "the socket file is left behind");
        self.handler.events(|ev| {
            for id in &ev.connected {
                let n = ev.disconnected.iter().filter(|&c| c == id).count();
                assert_eq!(n, 1, "client {id} got {n} disconnects; events: {ev:?}");
            }
            assert_eq!(ev.connected.len(), ev.disconnected.len(), "{ev:?}");
        });
    }

    fn stop_and_join(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let deadline = Instant::now() + PATIENCE;
            while !t.is_finished() {
                assert!(Instant::now() < deadline, "run did not return {PATIENCE:?} after stop");
                std::thread::sleep(Duration::from_millis(10));
            }
            t.join().unwrap().unwrap();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.thread.is_some() && !std::thread::panicking() {
            self.stop_and_join();
        } else {
            self.stop.store(true, Ordering::SeqCst);
        }
    }
}

/// A raw connection that has read the daemon's greeting; returns it and the client id.
pub fn raw_client(path: &Path) -> (UnixStream, u64) {
    let s = UnixStream::connect(path).unwrap();
    let (hello, _) = recv_frame::<Hello>(&s, Instant::now() + PATIENCE).unwrap();
    match hello {
        Hello::Welcome { client, .. } => (s, client),
        other => panic!("expected a welcome, got {other:?}"),
    }
}

pub fn soon() -> Instant {
    Instant::now() + PATIENCE
}

/// A `sockaddr_un` for `path`, built before a fork so the child need not allocate.
pub fn sockaddr(path: &Path) -> libc::sockaddr_un {
    // SAFETY: sockaddr_un is plain old data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    assert!(bytes.len() < addr.sun_path.len());
    for (dst, &b) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = b as libc::c_char;
    }
    addr
}

/// Connects a new socket to `addr` with raw system calls (safe to call in a forked child).
/// Returns the fd, or -1.
pub fn raw_connect(addr: &libc::sockaddr_un) -> libc::c_int {
    // SAFETY: plain system calls on a local address struct that outlives them.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
        if fd < 0 {
            return -1;
        }
        let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
        if libc::connect(fd, (addr as *const libc::sockaddr_un).cast(), len) != 0 {
            return -1;
        }
        fd
    }
}

/// Forks; the child runs `child` (which must only make async-signal-safe calls: the parent
/// has other threads) and exits with its result. Returns the child's pid.
pub fn fork_child(child: impl FnOnce() -> libc::c_int) -> libc::pid_t {
    // SAFETY: the child only runs `child`, which by contract makes async-signal-safe calls
    // on memory prepared before the fork, then `_exit`s without running destructors.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork failed: {}", std::io::Error::last_os_error());
        if pid == 0 {
            libc::_exit(child());
        }
        pid
    }
}

/// Waits for a child and returns its raw wait status.
pub fn wait_child(pid: libc::pid_t) -> libc::c_int {
    let mut status = 0;
    // SAFETY: waiting for our own child into a local.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(rc, pid, "waitpid: {}", std::io::Error::last_os_error());
    status
}

/// True when running as root (needed to act as another uid).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Skips (prints why) outside CI, fails under `CI=true`.
pub fn skip_or_fail(why: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("prerequisite missing under CI: {why}");
    }
    eprintln!("skipped: {why}");
}

/// A close-on-exec pipe: (read end, write end).
pub fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two-element array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors are new and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}
