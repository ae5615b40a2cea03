//! A host launch's lanes must not compete with the thread still creating them.
//!
//! Lanes are created behind a gate. When waiting lanes yield-spun on it, every
//! `pthread_create` had to win the CPU back from all lanes already started, so
//! starting a launch cost a number of context switches quadratic in its lanes:
//! on two emulated (QEMU TCG) vCPUs a 96-lane launch took 6–25 s, and
//! `tutti demo`, which launches the executor for each layer, could not finish in
//! minutes. Here the process is confined to one CPU, where the spin shows as
//! context switches (counted by the kernel, not timed): lanes that block on the
//! gate switch a few times each; spinning ones thousands of times in all.
//!
//! Alone in its own test binary so no other test's threads are counted.

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../../tests/support/skip.rs"]
mod skip;

use tutti_kernels::host::{HostArgs, HostKernel, HostLaunch};

fn context_switches() -> u64 {
    // SAFETY: `getrusage` fills the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out pointer; RUSAGE_SELF sums every thread of the process, ended ones too.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) }, 0);
    (ru.ru_nvcsw + ru.ru_nivcsw) as u64
}

/// Confines the calling thread, and the threads it creates, to the CPU it runs on.
fn pin_to_one_cpu() -> bool {
    // SAFETY: plain syscalls on the calling thread with a zeroed, then filled, cpu set.
    unsafe {
        let cpu = libc::sched_getcpu();
        if cpu < 0 {
            return false;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

#[test]
fn starting_a_launch_does_not_make_lanes_fight_its_creator() {
    if !pin_to_one_cpu() {
        return skip::skip("cannot pin the test to one CPU (sched_setaffinity refused)");
    }
    // The largest launch (4096 lanes), so creating it outlasts the creator's time slices.
    let (grid, block) = (64u32, 64u32);
    let lanes = (grid * block) as u64;
    let mut done = 0u32;
    // tt_gio_wait with no IOCBs returns at once without touching the (absent) context.
    let args = HostArgs { n: 0, result: &mut done, ..HostArgs::exec(std::ptr::null_mut()) };
    let before = context_switches();
    // SAFETY: with n = 0 the kernel reads no pointer of `args`; the launch is joined below.
    let launch = unsafe { HostLaunch::start(HostKernel::Wait, grid, block, args) }.expect("launch");
    launch.join();
    let switches = context_switches() - before;
    eprintln!("{lanes} lanes on one CPU: {switches} context switches");
    // Measured on a 2-core host: ~5 switches per lane with blocking lanes (park at the
    // gate, exit), 45–65 per lane with yield-spinning ones.
    assert!(
        switches < 16 * lanes,
        "{switches} context switches to start and join {lanes} lanes on one CPU: lanes are spinning \
         instead of blocking while the launch starts"
    );
}
