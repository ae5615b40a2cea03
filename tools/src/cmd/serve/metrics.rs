//! `tutti serve --metrics ADDR`: the exposition (`exposition.rs`) on a small HTTP server of its
//! own (one thread, one connection at a time, every read and write bounded).

use super::exposition::exposition;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the accept loop looks at the stop flag.
const POLL: Duration = Duration::from_millis(100);
/// How long a scraper has to send its request, and to take the answer.
const PEER_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest request head read.
const MAX_REQUEST: usize = 8192;

/// The metrics endpoint: a thread answering `GET /metrics` until stopped.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `addr` and serves scrapes from `source`.
    pub fn start(addr: SocketAddr, source: tutti_daemon::MetricsSource) -> anyhow::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| anyhow::anyhow!("--metrics {addr}: cannot listen there: {e}"))?;
        let addr = listener.local_addr().map_err(|e| anyhow::anyhow!("--metrics {addr}: {e}"))?;
        listener.set_nonblocking(true).map_err(|e| anyhow::anyhow!("--metrics {addr}: {e}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("tuttid-metrics".into())
            .spawn(move || serve(listener, &source, &s))
            .map_err(|e| anyhow::anyhow!("starting the metrics thread: {e}"))?;
        tracing::info!(%addr, "serving metrics at /metrics");
        Ok(MetricsServer { addr, stop, thread: Some(thread) })
    }

    /// Where it listens (the port chosen, for `:0`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving and waits for the thread (a scrape in progress ends within its timeouts).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn serve(listener: TcpListener, source: &tutti_daemon::MetricsSource, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, peer)) => {
                if let Err(e) = answer(stream, source) {
                    tracing::debug!(%peer, error = %e, "a metrics request failed");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(POLL),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(error = %e, "accepting a metrics connection failed");
                std::thread::sleep(POLL);
            }
        }
    }
}

/// Reads one request head and answers it, then closes.
fn answer(mut stream: TcpStream, source: &tutti_daemon::MetricsSource) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(PEER_TIMEOUT))?;
    stream.set_write_timeout(Some(PEER_TIMEOUT))?;
    let deadline = Instant::now() + PEER_TIMEOUT;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_REQUEST || Instant::now() >= deadline {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                "request too large or slow\n",
            );
        }
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = head.split(|b| *b == b'\r').next().unwrap_or(&[]);
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    match (method, path) {
        ("GET", "/metrics") => match exposition(&source.snapshot()) {
            Ok(text) => respond(
                &mut stream,
                "200 OK",
                prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
                &text,
            ),
            Err(_) => respond(
                &mut stream,
                "500 Internal Server Error",
                "text/plain",
                "encoding the metrics failed\n",
            ),
        },
        ("GET", "/") => respond(&mut stream, "200 OK", "text/plain", "tuttid: metrics at /metrics\n"),
        ("GET", _) => respond(&mut stream, "404 Not Found", "text/plain", "only /metrics is here\n"),
        _ => respond(&mut stream, "405 Method Not Allowed", "text/plain", "only GET\n"),
    }
}

fn respond(stream: &mut TcpStream, status: &str, content_type: &str, body: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()
}
