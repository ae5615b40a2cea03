//! A peer's announced frame length allocates nothing: the body buffer grows only as bytes
//! arrive. Alone in its test binary, because it watches every allocation the process makes.

// Helpers outside #[test] functions may unwrap too: a panic is how a test fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tutti_daemon::{recv_frame, DaemonError, MAX_FRAME};

/// The system allocator, remembering the largest single request since the last reset.
struct Watching;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for Watching {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::SeqCst);
        // SAFETY: the caller's contract for `alloc` is passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::SeqCst);
        // SAFETY: the caller's contract for `realloc` is passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Watching = Watching;

const SMALL: usize = 1 << 20;

#[test]
fn announced_lengths_allocate_nothing_up_front() {
    // 2 GiB announced: refused from the header alone.
    let (mut a, b) = UnixStream::pair().unwrap();
    a.write_all(&(1u32 << 31).to_le_bytes()).unwrap();
    LARGEST.store(0, Ordering::SeqCst);
    let err = recv_frame::<String>(&b, Instant::now() + Duration::from_secs(20)).unwrap_err();
    assert!(matches!(err, DaemonError::FrameTooLarge { len, .. } if len == 1 << 31), "{err}");
    let largest = LARGEST.load(Ordering::SeqCst);
    assert!(largest < SMALL, "refusing a 2 GiB header allocated {largest} bytes");

    // The full 16 MiB announced, 10 bytes sent, then a stall: only what came is held.
    let (mut a, b) = UnixStream::pair().unwrap();
    a.write_all(&(MAX_FRAME as u32).to_le_bytes()).unwrap();
    a.write_all(b"\"xxxxxxxxx").unwrap();
    LARGEST.store(0, Ordering::SeqCst);
    let err = recv_frame::<String>(&b, Instant::now() + Duration::from_millis(200)).unwrap_err();
    assert!(matches!(err, DaemonError::Timeout { .. }), "{err}");
    let largest = LARGEST.load(Ordering::SeqCst);
    assert!(largest < SMALL, "a stalled 16 MiB frame allocated {largest} bytes");
}
