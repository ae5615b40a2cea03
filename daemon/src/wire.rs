//! Framing on tuttid's socket.
//!
//! A frame is a 4-byte little-endian body length, then the body: one JSON value. File
//! descriptors travel with SCM_RIGHTS on the `sendmsg` that carries the frame's first byte,
//! at most [`MAX_FDS`] per frame. The receiver reads exactly one frame's bytes, so the
//! descriptors of the next frame are never taken with this one. The length is checked
//! against [`MAX_FRAME`] before anything is allocated for the body, and the body buffer grows
//! only as bytes arrive, so a peer that announces a large frame and stalls costs nothing.
//!
//! Every read and write waits with `poll` against a deadline: a peer that stops half-way
//! through a frame, or stops reading, gives a timeout error, never a hang.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{DaemonError, Result};

/// Largest frame body, in bytes. A lookup of many block hashes is the largest request.
pub const MAX_FRAME: usize = 16 << 20;

/// Most file descriptors one frame may carry.
pub const MAX_FDS: usize = 8;

/// The version of the framing and handshake; the daemon's operations version their own types.
pub const PROTOCOL_VERSION: u32 = 1;

/// How long [`send_frame`] waits for a peer that is not reading.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes read per `recvmsg` while a body arrives.
const READ_CHUNK: usize = 64 << 10;

/// The first frame the daemon sends on every connection, before it reads any request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Hello {
    /// The client is accepted and has this id.
    Welcome { protocol: u32, client: u64, daemon_pid: u32 },
    /// The client is refused; the connection closes after this frame.
    Refused { message: String },
}

/// Sends `msg` as one frame with `fds`, waiting at most [`SEND_TIMEOUT`] for the peer to read.
pub fn send_frame<T: Serialize + ?Sized>(stream: &UnixStream, msg: &T, fds: &[BorrowedFd<'_>]) -> Result<()> {
    send_frame_by(stream, msg, fds, Instant::now() + SEND_TIMEOUT)
}

/// Sends `msg` as one frame with `fds`, giving up at `deadline`.
///
/// The message is checked (encodable, at most [`MAX_FRAME`] bytes, at most [`MAX_FDS`]
/// descriptors) before any byte is sent, so a refused message leaves the stream in step.
pub fn send_frame_by<T: Serialize + ?Sized>(
    stream: &UnixStream,
    msg: &T,
    fds: &[BorrowedFd<'_>],
    deadline: Instant,
) -> Result<()> {
    if fds.len() > MAX_FDS {
        return Err(DaemonError::TooManyFds { count: fds.len(), max: MAX_FDS });
    }
    let mut frame = vec![0u8; 4];
    serde_json::to_writer(&mut frame, msg)
        .map_err(|e| DaemonError::BadJson(format!("cannot encode the message: {e}")))?;
    let len = frame.len() - 4;
    if len > MAX_FRAME {
        return Err(DaemonError::FrameTooLarge { len: len as u64, max: MAX_FRAME });
    }
    // `len` fits in u32: MAX_FRAME does.
    frame[..4].copy_from_slice(&(len as u32).to_le_bytes());
    send_bytes(stream, &frame, fds, deadline)
}

/// Writes all of `bytes`, the descriptors with the first `sendmsg` that is accepted.
fn send_bytes(stream: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>], deadline: Instant) -> Result<()> {
    let started = Instant::now();
    let mut sent = 0;
    while sent < bytes.len() {
        let iov = [IoSlice::new(&bytes[sent..])];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if sent == 0 && !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(DaemonError::TooManyFds { count: fds.len(), max: MAX_FDS });
        }
        match rustix::net::sendmsg(stream, &iov, &mut control, SendFlags::DONTWAIT | SendFlags::NOSIGNAL) {
            Ok(n) => sent += n,
            Err(Errno::AGAIN) => {
                let what = format!("the peer to read a frame ({sent} of {} bytes sent)", bytes.len());
                wait_for(stream, PollFlags::OUT, started, deadline, &what)?;
            }
            Err(Errno::INTR) => {}
            Err(Errno::PIPE | Errno::CONNRESET) => {
                return Err(if sent == 0 {
                    DaemonError::Closed
                } else {
                    DaemonError::Truncated { got: sent, want: bytes.len() }
                })
            }
            Err(e) => return Err(DaemonError::io("sending a frame", e.into())),
        }
    }
    Ok(())
}

/// Receives one frame and decodes its body as `T`, giving up at `deadline`.
///
/// Errors for which [`DaemonError::is_malformed_frame`] is true (bad JSON, too many or
/// misplaced descriptors) come after the whole frame was read: the stream is still in step.
/// Any other error leaves the stream out of step and the connection should be dropped.
/// Descriptors of a refused frame are closed.
pub fn recv_frame<T: DeserializeOwned>(stream: &UnixStream, deadline: Instant) -> Result<(T, Vec<OwnedFd>)> {
    let mut rx =
        FrameReader { stream, started: Instant::now(), deadline, fds: Vec::new(), overflow: 0, misplaced: 0 };

    let mut header = [0u8; 4];
    rx.fill(&mut header, 0, 4)?;
    let len = u32::from_le_bytes(header) as usize;
    if len > MAX_FRAME {
        return Err(DaemonError::FrameTooLarge { len: len as u64, max: MAX_FRAME });
    }

    // Grow the body as it arrives: an announced length is a claim, not a reason to allocate.
    let mut body = Vec::new();
    while body.len() < len {
        let have = body.len();
        let step = (len - have).min(READ_CHUNK);
        body.resize(have + step, 0);
        let n = rx.fill(&mut body[have..], 4 + have, 4 + len)?;
        body.truncate(have + n);
    }

    if rx.overflow > 0 {
        return Err(DaemonError::TooManyFds { count: rx.fds.len() + rx.overflow, max: MAX_FDS });
    }
    if rx.misplaced > 0 {
        return Err(DaemonError::UnexpectedFds { count: rx.misplaced });
    }
    let msg = serde_json::from_slice(&body).map_err(|e| DaemonError::BadJson(e.to_string()))?;
    Ok((msg, rx.fds))
}

/// The state of one frame being received.
struct FrameReader<'a> {
    stream: &'a UnixStream,
    started: Instant,
    deadline: Instant,
    /// Descriptors that came with the frame's first byte.
    fds: Vec<OwnedFd>,
    /// Descriptors beyond [`MAX_FDS`] (counted, closed), or 1 when the kernel truncated them.
    overflow: usize,
    /// Descriptors that came with a later byte (counted, closed).
    misplaced: usize,
}

impl FrameReader<'_> {
    /// Reads at least one byte into `buf` (all of it when `buf` is the header), returning the
    /// count. `at` is the frame offset of `buf[0]`, `want` the frame's length so far known.
    fn fill(&mut self, buf: &mut [u8], at: usize, want: usize) -> Result<usize> {
        let mut got = 0;
        let whole = at == 0;
        while got < buf.len() {
            let n = self.recv_some(&mut buf[got..], at + got, want)?;
            got += n;
            if !whole {
                break;
            }
        }
        Ok(got)
    }

    /// One `recvmsg` with at least one byte, waiting up to the deadline for it.
    fn recv_some(&mut self, buf: &mut [u8], at: usize, want: usize) -> Result<usize> {
        loop {
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let mut iov = [IoSliceMut::new(buf)];
            let flags = RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC;
            match rustix::net::recvmsg(self.stream, &mut iov, &mut control, flags) {
                Ok(msg) => {
                    if msg.flags.contains(ReturnFlags::CTRUNC) {
                        self.overflow = self.overflow.max(1);
                    }
                    for cmsg in control.drain() {
                        if let RecvAncillaryMessage::ScmRights(fds) = cmsg {
                            for fd in fds {
                                if at != 0 {
                                    self.misplaced += 1;
                                } else if self.fds.len() < MAX_FDS {
                                    self.fds.push(fd);
                                } else {
                                    self.overflow += 1;
                                }
                            }
                        }
                    }
                    if msg.bytes == 0 {
                        return Err(self.closed_at(at, want));
                    }
                    return Ok(msg.bytes);
                }
                Err(Errno::AGAIN) => {
                    let what = if at == 0 {
                        "a frame".to_string()
                    } else {
                        format!("the rest of a frame ({at} of {want} bytes received)")
                    };
                    wait_for(self.stream, PollFlags::IN, self.started, self.deadline, &what)?;
                }
                Err(Errno::INTR) => {}
                Err(Errno::CONNRESET) => return Err(self.closed_at(at, want)),
                Err(e) => return Err(DaemonError::io("receiving a frame", e.into())),
            }
        }
    }

    fn closed_at(&self, at: usize, want: usize) -> DaemonError {
        if at == 0 {
            DaemonError::Closed
        } else {
            DaemonError::Truncated { got: at, want }
        }
    }
}

/// Waits until `stream` is ready for `events` (or has an error or hang-up to report),
/// or fails with a timeout naming `what` once `deadline` passes.
pub(crate) fn wait_for(
    stream: &UnixStream,
    events: PollFlags,
    started: Instant,
    deadline: Instant,
    what: &str,
) -> Result<()> {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(DaemonError::Timeout { what: what.to_string(), waited: now - started });
        }
        match poll_once(stream, events, deadline - now) {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => return Err(DaemonError::io(format!("waiting for {what}"), e)),
        }
    }
}

/// One `poll` of `stream` for `events`, at most `timeout` long. True when it is ready (or
/// reports an error or hang-up, which the next read or write will surface).
pub(crate) fn poll_once(fd: impl AsFd, events: PollFlags, timeout: Duration) -> std::io::Result<bool> {
    let ts = Timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    let mut pfd = [PollFd::new(&fd, events)];
    match rustix::event::poll(&mut pfd, Some(&ts)) {
        Ok(0) => Ok(false),
        Ok(_) => Ok(true),
        Err(Errno::INTR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Msg {
        text: String,
    }

    fn pair() -> (UnixStream, UnixStream) {
        UnixStream::pair().unwrap()
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    #[test]
    fn frame_round_trips_with_its_fds() {
        let (a, b) = pair();
        let file = std::fs::File::open("/dev/null").unwrap();
        send_frame(&a, &Msg { text: "hi".into() }, &[file.as_fd(), file.as_fd()]).unwrap();
        send_frame(&a, &Msg { text: "second".into() }, &[]).unwrap();
        let (m, fds): (Msg, _) = recv_frame(&b, soon()).unwrap();
        assert_eq!(m.text, "hi");
        assert_eq!(fds.len(), 2);
        // The next frame's descriptors (none) are not mixed up with this one's.
        let (m, fds): (Msg, _) = recv_frame(&b, soon()).unwrap();
        assert_eq!(m.text, "second");
        assert!(fds.is_empty());
    }

    #[test]
    fn announced_length_over_the_cap_is_refused() {
        let (mut a, b) = pair();
        a.write_all(&((MAX_FRAME as u32) + 1).to_le_bytes()).unwrap();
        let err = recv_frame::<Msg>(&b, soon()).unwrap_err();
        assert!(
            matches!(err, DaemonError::FrameTooLarge { len, .. } if len == MAX_FRAME as u64 + 1),
            "{err}"
        );
    }

    #[test]
    fn a_frame_at_the_cap_is_accepted() {
        let (a, b) = pair();
        // A JSON string of MAX_FRAME bytes including its quotes.
        let s = "x".repeat(MAX_FRAME - 2);
        let sender = std::thread::spawn(move || send_frame(&a, &s, &[]));
        let (got, _): (String, _) = recv_frame(&b, soon()).unwrap();
        sender.join().unwrap().unwrap();
        assert_eq!(got.len(), MAX_FRAME - 2);
        let (a, _b) = pair();
        let err = send_frame(&a, &"x".repeat(MAX_FRAME - 1), &[]).unwrap_err();
        assert!(matches!(err, DaemonError::FrameTooLarge { .. }), "{err}");
    }

    #[test]
    fn closed_between_frames_and_inside_one_differ() {
        let (a, b) = pair();
        drop(a);
        assert!(matches!(recv_frame::<Msg>(&b, soon()), Err(DaemonError::Closed)));

        let (mut a, b) = pair();
        a.write_all(&10u32.to_le_bytes()).unwrap();
        a.write_all(b"{\"te").unwrap();
        drop(a);
        let err = recv_frame::<Msg>(&b, soon()).unwrap_err();
        assert!(matches!(err, DaemonError::Truncated { got: 8, want: 14 }), "{err}");
    }

    #[test]
    fn partial_frame_times_out_at_the_deadline() {
        let (mut a, b) = pair();
        a.write_all(&100u32.to_le_bytes()).unwrap();
        a.write_all(b"{\"text\"").unwrap();
        let wait = Duration::from_millis(200);
        let started = Instant::now();
        let err = recv_frame::<Msg>(&b, started + wait).unwrap_err();
        assert!(started.elapsed() >= wait, "returned before the deadline");
        match err {
            DaemonError::Timeout { what, .. } => assert!(what.contains("11 of 104 bytes"), "{what}"),
            other => panic!("expected a timeout, got {other}"),
        }
    }

    #[test]
    fn bad_json_leaves_the_stream_in_step() {
        let (mut a, b) = pair();
        a.write_all(&9u32.to_le_bytes()).unwrap();
        a.write_all(b"{not json").unwrap();
        send_frame(&a, &Msg { text: "ok".into() }, &[]).unwrap();
        let err = recv_frame::<Msg>(&b, soon()).unwrap_err();
        assert!(err.is_malformed_frame(), "{err}");
        let (m, _): (Msg, _) = recv_frame(&b, soon()).unwrap();
        assert_eq!(m.text, "ok");
    }

    #[test]
    fn sending_too_many_fds_is_refused_before_any_byte() {
        let (a, b) = pair();
        let file = std::fs::File::open("/dev/null").unwrap();
        let fds = vec![file.as_fd(); MAX_FDS + 1];
        let err = send_frame(&a, &Msg { text: "x".into() }, &fds).unwrap_err();
        assert!(matches!(err, DaemonError::TooManyFds { count: 9, max: 8 }), "{err}");
        drop(a);
        assert!(matches!(recv_frame::<Msg>(&b, soon()), Err(DaemonError::Closed)));
    }
}
