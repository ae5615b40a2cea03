//! Futex wait and wake on a 32-bit word, shared (not `FUTEX_PRIVATE`): the word
//! may be mapped by another process (an emulated register file a tuttid client
//! maps, a ring the host executor's lanes share). Used by the emulated
//! controller's park and by gio_uring's ring waiters.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Wakes every waiter on `word`.
pub fn wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only reads the address, which is a live, aligned word.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX, 0usize, 0usize, 0u32)
    };
}

/// Waits until `word` is no longer `seen`, a wake, a signal, or `timeout`
/// (spurious returns allowed: callers look again).
pub fn wait(word: &AtomicU32, seen: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: the word is live and aligned and `ts` outlives the call; the
    // kernel compares the word with `seen` before sleeping.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            seen,
            &ts as *const libc::timespec,
            0usize,
            0u32,
        )
    };
}
