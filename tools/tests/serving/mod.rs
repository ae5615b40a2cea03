//! What the tests of `tutti serve` as a service share: a temporary directory, a `tutti serve`
//! process and its first line, stopping it, and engine clients of it that store and load.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(dead_code)]

#[path = "../../../tests/support/reap.rs"]
pub mod reap;

#[path = "../../../objstore/tests/common/mod.rs"]
pub mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tutti_objstore::{chain_hashes, BlockHash, KvStore, LayoutKind};

pub const WAIT: Duration = Duration::from_secs(30);
pub const MODEL: &str = "serve-test-model";
/// Chunks (blocks) of every request the clients make.
pub const CHUNKS: u32 = 4;

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        // Short: a socket path must fit in 108 bytes.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("tsv-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn join(&self, p: &str) -> PathBuf {
        self.0.join(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn tutti() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tutti"))
}

/// `tutti serve` on two emulated drives with media files in `dir`, geometry 4 layers × 2 KV
/// heads × 64 (the objstore fixtures' `geometry(4, 64)`), socket `dir/s.sock`, `--json`.
pub fn serve_cmd(dir: &Path) -> Command {
    let mut c = tutti();
    c.args(["serve", "--json", "--emulated", "2", "--capacity-mib", "16"])
        .args(["--layers", "4", "--kv-heads", "2", "--head-dim", "64"])
        .arg("--dir")
        .arg(dir)
        .arg("--socket")
        .arg(dir.join("s.sock"));
    c
}

/// A running `tutti serve` and the JSON line it printed when it began serving.
pub struct Serve {
    pub child: reap::Reap,
    pub hello: Value,
    /// Its later stdout lines.
    pub lines: mpsc::Receiver<String>,
}

impl Serve {
    /// Starts `cmd` (which must have `--json`) and waits, bounded, for its first line.
    pub fn start(mut cmd: Command) -> Serve {
        let (mut child, rx) = reap::spawn_lines(&mut cmd);
        let line = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(l) => l,
            Err(e) => panic!("tutti serve printed nothing within 60 s ({e}); exit: {:?}", child.try_wait()),
        };
        let hello: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        Serve { child, hello, lines: rx }
    }

    pub fn socket(&self) -> PathBuf {
        PathBuf::from(self.hello["serving"].as_str().unwrap())
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// SIGTERM, then waits (bounded) for it to exit.
    pub fn terminate(mut self) -> ExitStatus {
        // SAFETY: kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(self.pid(), libc::SIGTERM) }, 0);
        wait_exit(&mut self.child, Duration::from_secs(60))
    }
}

pub fn wait_exit(child: &mut Child, within: Duration) -> ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < deadline, "the process did not exit within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub use common::client_backend as backend;

/// An engine client of the daemon at `socket` with KV memory of `2 × CHUNKS` blocks registered.
pub struct Engine {
    pub store: KvStore,
    pub kv: common::Kv,
}

impl Engine {
    pub fn connect(socket: &Path, name: &str) -> tutti_daemon::Result<Engine> {
        let store = tutti_daemon::remote::connect(socket, name, &backend(), Duration::from_secs(10))?;
        let kv = common::Kv::new(*store.geometry(), LayoutKind::Contiguous, 2 * CHUNKS);
        kv.register(&store, MODEL);
        Ok(Engine { store, kv })
    }

    pub fn hashes(&self, seed: u64) -> Vec<BlockHash> {
        let g = *self.store.geometry();
        chain_hashes(&common::tokens(seed, CHUNKS as usize, g.tokens_per_block), g.tokens_per_block)
    }

    /// Stores the `CHUNKS` chunks of `seed` (chunk i filled with pattern `seed + i`); the
    /// number stored now, or the error.
    pub fn store(&self, seed: u64) -> Result<u32, String> {
        let hashes = self.hashes(seed);
        let src: Vec<u32> = (0..CHUNKS).collect();
        for &b in &src {
            self.kv.fill(b, seed + b as u64);
        }
        let rep = self.store.store_request(&hashes, &src, WAIT).map_err(|e| e.to_string())?;
        if !rep.failed.is_empty() {
            return Err(format!("{:?}", rep.failed));
        }
        Ok(rep.stored + rep.present)
    }

    /// Looks up the chunks of `seed` and loads what is found into blocks `CHUNKS..`; how many
    /// were found, and whether each loaded one holds its bytes.
    pub fn load(&self, seed: u64) -> Result<(usize, bool), String> {
        let hashes = self.hashes(seed);
        self.kv.clear();
        let hit = self.store.lookup(&hashes).map_err(|e| e.to_string())?;
        if hit.hits() == 0 {
            return Ok((0, true));
        }
        let dst: Vec<u32> = (CHUNKS..CHUNKS + hit.hits() as u32).collect();
        let st = self.store.load_request(&hit.files, &dst, WAIT).map_err(|e| e.to_string());
        let _ = self.store.unpin(hit.pin);
        let st = st?;
        if !st.done || st.failed != 0 {
            return Err(format!("{st:?}"));
        }
        let good = dst.iter().enumerate().all(|(i, &b)| self.kv.holds(b, seed + i as u64));
        Ok((hit.hits(), good))
    }
}

/// `GET path` from `host:port` over HTTP/1.1 (bounded): the status code and the body.
pub fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    // Prometheus answers its API in chunks; a body in chunks is joined here.
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        let mut out = String::new();
        let mut rest = body;
        while let Some((len, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
            if n == 0 || tail.len() < n {
                break;
            }
            out.push_str(&tail[..n]);
            rest = tail[n..].trim_start_matches("\r\n");
        }
        out
    } else {
        body.to_string()
    };
    Ok((code, body))
}

/// The value of the sample `name{labels}` (labels as written, `pool` first) in an exposition.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.trim().parse().ok())
    })
}
