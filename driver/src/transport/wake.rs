//! Waking a software controller that parks between doorbells.
//!
//! A [`DoorbellKind::Memory`](super::DoorbellKind::Memory) doorbell is ordinary
//! memory that a controller thread watches (the emulated controller in
//! `tutti-emulator`). Rather than poll forever, that thread may park: it sets
//! its BAR's wake word to [`WAKE_PARKED`] before its last look at the
//! doorbells and then waits on the word (a shared futex, so a writer in
//! another process that maps the same BAR wakes it too). Every doorbell writer
//! calls [`wake_controller`] on the word after its store. The controller's
//! wait always has a timeout, so a writer that does not (an older client, a
//! GPU) is served late, never lost.
//!
//! A writer that only holds a doorbell's address (a GPU doorbell relay, the
//! host executor's queue descriptors) finds the wake word with
//! [`wake_word_of`]: a software controller registers each such BAR mapped in
//! this process ([`register_memory_bar`]).
//!
//! This is the doorbell writer's half of the protocol, which the driver's
//! [`Doorbell`](super::Doorbell) follows; the controller's half (parking)
//! lives with the controller.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

/// The wake word's value while the controller thread is parked (or about to);
/// 0 while it runs.
pub const WAKE_PARKED: u32 = 1;

/// Called by a doorbell writer after its store (`wake` is the BAR's wake
/// word): wakes the controller if it is parked. Costs a full fence and a load
/// when it is not; the futex wake happens once per park.
#[inline]
pub fn wake_controller(wake: &AtomicU32) {
    // Orders the doorbell store before the load (the controller orders its
    // WAKE_PARKED store before its doorbell loads the same way): either it
    // sees our doorbell or we see it parked.
    std::sync::atomic::fence(Ordering::SeqCst);
    if wake.load(Ordering::Relaxed) != 0 && wake.swap(0, Ordering::SeqCst) != 0 {
        crate::futex::wake(wake);
    }
}

/// Memory BARs mapped in this process: (start address, length, wake word address).
static MAPPED: Mutex<Vec<(usize, usize, usize)>> = Mutex::new(Vec::new());

/// Records that `start..start+len` is a memory BAR of this process whose wake
/// word is at `wake`, for [`wake_word_of`]; undone by
/// [`unregister_memory_bar`] before the mapping goes.
pub fn register_memory_bar(start: usize, len: usize, wake: NonNull<u32>) {
    MAPPED.lock().unwrap_or_else(|e| e.into_inner()).push((start, len, wake.as_ptr() as usize));
}

/// Forgets the memory BAR that starts at `start`.
pub fn unregister_memory_bar(start: usize) {
    MAPPED.lock().unwrap_or_else(|e| e.into_inner()).retain(|&(s, _, _)| s != start);
}

/// The wake word of the memory BAR (mapped in this process) that `doorbell`
/// lies in, for writers that only hold a doorbell's address. `None` when the
/// address is in no registered BAR: a real BAR.
pub fn wake_word_of(doorbell: *const u32) -> Option<NonNull<u32>> {
    let a = doorbell as usize;
    let mapped = MAPPED.lock().unwrap_or_else(|e| e.into_inner());
    mapped
        .iter()
        .find(|&&(start, len, _)| a >= start && a < start + len)
        .and_then(|&(_, _, wake)| NonNull::new(wake as *mut u32))
}
