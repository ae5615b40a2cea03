//! systemd's readiness notifications (sd_notify(3)), for `Type=notify` units.
//!
//! systemd names a datagram socket in `NOTIFY_SOCKET` (a path, or `@name` in the abstract
//! namespace); the service sends `READY=1` once it serves and `STOPPING=1` when it begins to
//! stop. Without `NOTIFY_SOCKET` (not started by systemd) nothing is sent.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixDatagram;

/// Sends `state` (newline-separated `KEY=VALUE` lines) to systemd, if it asked for it. Returns
/// whether it was sent; a failure is logged, never fatal (the service runs on).
pub fn notify(state: &str) -> bool {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return false };
    match send(path.as_bytes(), state) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(socket = %path.to_string_lossy(), error = %e, "telling systemd {state:?} failed");
            false
        }
    }
}

fn send(path: &[u8], state: &str) -> std::io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    match path.first() {
        Some(b'@') => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(&path[1..])?;
            sock.send_to_addr(state.as_bytes(), &addr)?;
        }
        Some(b'/') => {
            sock.send_to(state.as_bytes(), std::ffi::OsStr::from_bytes(path))?;
        }
        _ => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "NOTIFY_SOCKET is neither an absolute path nor @abstract",
            ))
        }
    }
    Ok(())
}
