//! The VFIO path on a controller we did not write: QEMU's NVMe device in a
//! Linux guest with a virtual Intel IOMMU (scripts/qemu/, tests/guest/).
//!
//! Builds `tutti` as a static binary, packs it into an initramfs with a Debian
//! kernel's nvme/vfio/md/dm modules and Debian's mdadm and dmsetup, boots the
//! guest, and requires: the guest's verdict is pass (QEMU's exit code), every
//! in-use refusal of `tutti admin bind` ran (an md array, a device-mapper
//! target and a process holding the drive or one of its partitions), and no
//! IOMMU fault was logged before the deliberate unmapped-IOVA test (QEMU's
//! controller completes a blocked DMA with success status, so the log is the
//! only witness). tuttid on the VFIO drives serves two client processes at
//! once (each maps its own memory through the container the daemon passed),
//! gives back everything of a client SIGKILLed mid-load, serves both plain
//! namespaces of the multi-namespace controller, and on the one-pair
//! controller moves a client's layers itself on its one pair. P2P: the guest binds an
//! ivshmem device (its BAR2 is RAM shared with a file here) to vfio-pci, and the
//! drives' DMA stores KV from and loads KV into that BAR through the virtual IOMMU
//! (`tutti demo --kv-device`, both backends, data path `p2p`, every byte checked in the
//! guest); the BAR's backing file is then checked here against the digest the guest
//! printed. A target the IOMMU does not map for the drive is refused by the probe, and
//! its KV moves through staging, every byte verified. Skips with a reason when qemu-system-x86_64, a guest kernel
//! or mdadm/dmsetup cannot be had, and fails instead under CI=true
//! (tests/support/skip.rs).

// Test code: a panic is how a test fails, in helpers as in #[test] functions
// (clippy.toml's allow-*-in-tests covers only the latter).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../support/skip.rs"]
mod skip;

use std::path::{Path, PathBuf};
use std::process::Command;

const NEGATIVE_BEGIN: &str = "TUTTI-NEGATIVE-TEST-BEGIN";
const NEGATIVE_END: &str = "TUTTI-NEGATIVE-TEST-END";
const IOMMU_FAULT: &str = "DMAR: [DMA";
/// The guest prints `IN-USE-REFUSED: <case>` once `tutti admin bind` refused a
/// drive in that use with a message naming it (tests/guest/vfio-test.sh).
const IN_USE_REFUSED: &str = "IN-USE-REFUSED: ";
const IN_USE_CASES: [&str; 6] = [
    "md member",
    "dm holder",
    "open by a process",
    "md member partition",
    "dm holder partition",
    "partition open by a process",
];
/// ... and this once the same drive, cleaned up, was bound.
const IN_USE_CLEARED: &str = "IN-USE-CLEARED: ";
/// The guest prints this once tuttid released a client SIGKILLed mid-load
/// (status without it, its queue pairs free again, no pins, its own DMA
/// mappings unmapped by the daemon) and a later client verified its bytes.
const TUTTID_KILLED: &str = "TUTTID-KILLED-CLIENT-RELEASED";
/// The guest prints this once a KV device the drive cannot reach was refused by the probe
/// and its KV moved through staging, every byte verified (in the negative section).
const P2P_FALLBACK: &str = "P2P-FALLBACK-STAGED";
/// `P2P-HOST-CHECK: <offset> <bytes> <non-zero bytes> <fnv1a64>` of the BAR after the P2P demos.
const P2P_HOST_CHECK: &str = "P2P-HOST-CHECK: ";
/// Verified P2P runs the log must have (before the negative test).
const P2P_LINES: [(&str, &str); 4] = [
    ("demo: p2p (direct): ", "data path: p2p (vfio-pci 0000:00:09.0 BAR2)"),
    ("demo: p2p (direct): ", "every byte verified"),
    ("demo: p2p (gio): ", "data path: p2p (vfio-pci 0000:00:09.0 BAR2)"),
    ("demo: p2p (gio): ", "every byte verified"),
];

/// FNV-1a 64, as `tutti demo` digests device KV memory.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// Checks the ivshmem BAR's backing file against the guest's `P2P-HOST-CHECK` line: the
/// bytes the drives DMA'd into the BAR (and the guest verified) are the bytes the host sees.
fn check_ivshmem(log: &str, file: &[u8]) -> Result<(), String> {
    let line = log
        .lines()
        .find_map(|l| l.trim().strip_prefix(P2P_HOST_CHECK))
        .ok_or("the guest printed no P2P-HOST-CHECK digest of the device memory")?;
    let f: Vec<&str> = line.split_whitespace().collect();
    let num = |i: usize| {
        f.get(i).and_then(|v| v.parse::<u64>().ok()).ok_or(format!("bad P2P-HOST-CHECK line: {line}"))
    };
    let (offset, bytes, nonzero) = (num(0)?, num(1)?, num(2)?);
    let want = f.get(3).and_then(|h| u64::from_str_radix(h, 16).ok()).ok_or(format!("bad digest: {line}"))?;
    let region = file
        .get(offset as usize..(offset + bytes) as usize)
        .ok_or(format!("the backing file has {} bytes, the digest covers {offset}+{bytes}", file.len()))?;
    let seen = region.iter().filter(|&&b| b != 0).count() as u64;
    if bytes == 0 || nonzero < bytes / 2 {
        return Err(format!(
            "the digest covers {bytes} bytes of which only {nonzero} are non-zero: nothing to check"
        ));
    }
    if fnv1a64(region) != want || seen != nonzero {
        return Err(format!(
            "the ivshmem backing file differs from what the guest verified in the BAR: fnv1a64 {:016x} \
             ({seen} non-zero bytes) here, {want:016x} ({nonzero}) in the guest",
            fnv1a64(region)
        ));
    }
    Ok(())
}

/// Lines of tuttid's clients on VFIO drives the log must have (before the negative test).
const TUTTID_LINES: [(&str, &str); 7] = [
    ("tuttid: selftest client 1: ", "every byte verified"),
    ("tuttid: selftest client 2: ", "every byte verified"),
    ("tuttid: after a killed client: ", "every byte verified"),
    ("tuttid: refusals: ", "with live rings kept, on 2 VFIO controllers"),
    ("tuttid: killed client: ", "after tuttid released it"),
    ("tuttid: two namespaces: ", "on 2 drives"),
    ("tuttid: one pair (0000:00:07.0, proxied): ", "every byte verified"),
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
}

/// What the console log says beyond the exit code; `Err` names the violation.
fn check_console(log: &str) -> Result<(), String> {
    let begin = log.find(NEGATIVE_BEGIN).ok_or("the guest never reached the unmapped-IOVA test")?;
    if let Some(line) = log[..begin].lines().find(|l| l.contains(IOMMU_FAULT)) {
        return Err(format!("IOMMU fault before the negative test (a command's DMA was blocked): {line}"));
    }
    let end =
        log[begin..].find(NEGATIVE_END).map(|e| begin + e).ok_or("the unmapped-IOVA test did not finish")?;
    let negative = &log[begin..end];
    if !negative.contains("counted as FAILED") {
        return Err("the unmapped-IOVA Read was not reported as a failed command".into());
    }
    if !negative.lines().any(|l| l.trim() == P2P_FALLBACK) {
        return Err(
            "the probe did not refuse an unreachable KV device (or its staged load was not verified)".into(),
        );
    }
    for (prefix, needle) in P2P_LINES {
        if !log[..begin].lines().any(|l| l.starts_with(prefix) && l.contains(needle)) {
            return Err(format!("the guest log has no `{prefix}... {needle}` line of the P2P demos"));
        }
    }
    if let Some(line) = log[end..].lines().find(|l| l.contains(IOMMU_FAULT)) {
        return Err(format!("IOMMU fault after the negative test: {line}"));
    }
    if !log.contains("GUEST-PASS") {
        return Err("the guest script did not reach its end".into());
    }
    // A drive in use the kernel's way (not mounted): each refusal, then the bind after cleanup.
    for case in IN_USE_CASES {
        if !log.lines().any(|l| l.strip_prefix(IN_USE_REFUSED) == Some(case)) {
            return Err(format!("the guest log shows no refused bind of a drive in use as `{case}`"));
        }
    }
    if !log[..begin].lines().any(|l| l.starts_with(IN_USE_CLEARED)) {
        return Err("the in-use drive was not bound after its md, dm and open holders were removed".into());
    }
    // The unusual controllers: one granting a single I/O queue pair (both
    // backends), and every plain namespace of a multi-namespace controller.
    for section in ["demo: one pair (gio): ", "demo: one pair (direct): ", "demo: two namespaces: "] {
        if !log.lines().any(|l| l.starts_with(section) && l.contains("every byte verified")) {
            return Err(format!("the guest log has no verified run of `{}`", section.trim_end_matches(": ")));
        }
    }
    // tuttid and its client processes on the VFIO drives.
    for (prefix, needle) in TUTTID_LINES {
        if !log[..begin].lines().any(|l| l.starts_with(prefix) && l.contains(needle)) {
            return Err(format!("the guest log has no `{prefix}... {needle}` line of tuttid on VFIO drives"));
        }
    }
    if !log[..begin].lines().any(|l| l.trim() == TUTTID_KILLED) {
        return Err("tuttid did not show the release of a client SIGKILLed mid-load".into());
    }
    Ok(())
}

/// Lines a reader wants: identify and verification summaries per controller
/// (with the gio_uring passes and drive recoveries, `selftest gio ...`), and
/// where QEMU's controller answered a probe differently from the spec.
fn summary(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| {
            l.starts_with("selftest ")
                || l.starts_with("demo: ")
                || l.starts_with("bench: ")
                || l.starts_with("IN-USE-")
                || l.starts_with("P2P-")
                || l.starts_with("tuttid: ")
                || l.contains("GUEST-")
                || (l.starts_with("probe ") && (l.contains(" DIFF ") || l.contains(" probes, ")))
        })
        .collect()
}

#[test]
fn driver_runs_on_qemu_nvme_through_vfio() {
    if std::env::var_os("TUTTI_SKIP_QEMU").is_some() {
        return skip::skip("the QEMU/VFIO harness: TUTTI_SKIP_QEMU is set");
    }
    if !on_path("qemu-system-x86_64") {
        return skip::skip(
            "the QEMU/VFIO harness: qemu-system-x86_64 is not installed (scripts/qemu/setup installs it)",
        );
    }
    let root = repo_root();
    let scripts = root.join("scripts/qemu");
    let kernel = Command::new(scripts.join("fetch-kernel")).output().expect("running fetch-kernel");
    if !kernel.status.success() {
        return skip::skip(format!(
            "the QEMU/VFIO harness: no guest kernel could be had: {}",
            String::from_utf8_lossy(&kernel.stderr).trim()
        ));
    }
    let kernel_root = String::from_utf8_lossy(&kernel.stdout).trim().to_string();
    // mdadm and dmsetup for the in-use refusals (md arrays, device-mapper targets).
    let tools = Command::new(scripts.join("fetch-guest-tools")).output().expect("running fetch-guest-tools");
    if !tools.status.success() {
        return skip::skip(format!(
            "the QEMU/VFIO harness: mdadm and dmsetup for the guest could not be had: {}",
            String::from_utf8_lossy(&tools.stderr).trim()
        ));
    }
    let tools_root = String::from_utf8_lossy(&tools.stdout).trim().to_string();
    let cache = std::env::var_os("TUTTI_QEMU_CACHE").map(PathBuf::from).unwrap_or(root.join(".build/qemu"));

    // The guest has no libc: a static-pie build in a target dir of its own.
    let target_dir = cache.join("target");
    let target = "x86_64-unknown-linux-gnu";
    let build = Command::new(env!("CARGO"))
        .current_dir(&root)
        .args(["build", "--locked", "--release", "--target", target, "-p", "tutti-tools", "--bin", "tutti"])
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .env("CARGO_TARGET_DIR", &target_dir)
        // Build time dominates the harness on 2 cores; the guest's work is small.
        .env("CARGO_PROFILE_RELEASE_DEBUG", "0")
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "1")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .expect("running cargo build");
    assert!(build.success(), "static build of tutti for the guest failed");
    let tutti = target_dir.join(target).join("release/tutti");

    let initrd = cache.join("vfio-test.cpio.gz");
    let pack = Command::new(scripts.join("mkinitramfs"))
        .arg("-k")
        .arg(&kernel_root)
        .arg("-o")
        .arg(&initrd)
        .arg("-t")
        .arg(root.join("tests/guest/vfio-test.sh"))
        .arg("-r")
        .arg(&tools_root)
        .arg(&tutti)
        .status()
        .expect("running mkinitramfs");
    assert!(pack.success(), "packing the initramfs failed");

    let log_path = cache.join("vfio-test.console.log");
    let ivshmem = cache.join("ivshmem.bin");
    let run = Command::new(scripts.join("run"))
        .env("TUTTI_QEMU_IVSHMEM", &ivshmem)
        .arg("-k")
        .arg(&kernel_root)
        .arg("-i")
        .arg(&initrd)
        .arg("-l")
        .arg(&log_path)
        .output()
        .expect("running the guest");
    let log =
        std::fs::read_to_string(&log_path).unwrap_or_else(|_| String::from_utf8_lossy(&run.stdout).into());
    let verdict = match run.status.code() {
        Some(0) => check_console(&log).and_then(|()| {
            let file = std::fs::read(&ivshmem).map_err(|e| format!("reading {}: {e}", ivshmem.display()))?;
            check_ivshmem(&log, &file)
        }),
        Some(1) => Err("the guest reported failure".to_string()),
        Some(3) => Err("the guest timed out".to_string()),
        other => Err(format!(
            "the guest never reported a verdict (run exit {other:?}): {}",
            String::from_utf8_lossy(&run.stderr)
        )),
    };
    if let Err(why) = verdict {
        panic!(
            "QEMU/VFIO harness failed: {why}\n----- guest console -----\n{log}\n-------------------------"
        );
    }
    eprintln!("QEMU/VFIO harness passed (console log: {}):", log_path.display());
    for line in summary(&log) {
        eprintln!("  {line}");
    }
}

#[test]
fn console_check_requires_a_clean_log_before_the_negative_test() {
    let good = "selftest 0000:00:04.0:   PRP verified 10 bytes\n\
                IN-USE-REFUSED: md member\n\
                IN-USE-REFUSED: dm holder\n\
                IN-USE-REFUSED: open by a process\n\
                IN-USE-REFUSED: md member partition\n\
                IN-USE-REFUSED: dm holder partition\n\
                IN-USE-REFUSED: partition open by a process\n\
                IN-USE-CLEARED: 0000:00:07.0 bound after cleanup\n\
                tuttid: selftest client 1: stored 8 chunks on 2 drives ... every byte verified\n\
                tuttid: selftest client 2: stored 8 chunks on 2 drives ... every byte verified\n\
                tuttid: killed client: pinned pages 700 before it, 9100 while it held its load, 700 after tuttid released it (MemAvailable 1, 2, 3 KiB)\n\
                tuttid: refusals: selftest client 4: queue memory outside the client's mapped IOVA ranges refused, and a range with live rings kept, on 2 VFIO controllers\n\
                tuttid: after a killed client: selftest client 4: ... every byte verified\n\
                TUTTID-KILLED-CLIENT-RELEASED\n\
                tuttid: two namespaces: selftest client 5: stored 4 chunks on 2 drives ...\n\
                tuttid: one pair (0000:00:07.0, proxied): selftest client 6: stored 8 chunks on 1 drives ... every byte verified\n\
                demo: p2p (direct): data path: p2p (vfio-pci 0000:00:09.0 BAR2)\n\
                demo: p2p (direct): every byte verified\n\
                demo: p2p (gio): data path: p2p (vfio-pci 0000:00:09.0 BAR2)\n\
                demo: p2p (gio): every byte verified\n\
                TUTTI-NEGATIVE-TEST-BEGIN\n\
                DMAR: [DMA Write NO_PASID] Request device [00:05.0] fault addr 0x7f00000000\n\
                P2P-FALLBACK-STAGED\n\
                0000:00:05.0 qid 1 cid 0: Read completed ... counted as FAILED\n\
                TUTTI-NEGATIVE-TEST-END\n\
                demo: one pair (gio): every byte verified\n\
                demo: one pair (direct): every byte verified\n\
                demo: two namespaces: every byte verified\n\
                GUEST-PASS\n";
    assert_eq!(check_console(good), Ok(()));
    let fault_first = format!("DMAR: [DMA Read NO_PASID] Request device [00:04.0] fault addr 0x1000\n{good}");
    assert!(check_console(&fault_first).unwrap_err().contains("before the negative test"));
    let undetected = good.replace("counted as FAILED", "completed");
    assert!(check_console(&undetected).unwrap_err().contains("not reported as a failed command"));
    assert!(check_console("GUEST-PASS\n").is_err(), "a log without the negative test fails");
    let unfinished = good.replace("GUEST-PASS", "");
    assert!(check_console(&unfinished).is_err());
    let no_two_ns = good.replace("demo: two namespaces: every byte verified\n", "");
    assert!(check_console(&no_two_ns).unwrap_err().contains("two namespaces"));
    let one_pair_failed = good.replace("one pair (direct): every byte verified", "one pair (direct): error");
    assert!(check_console(&one_pair_failed).unwrap_err().contains("one pair (direct)"));
    for case in IN_USE_CASES {
        let missing = good.replace(&format!("{IN_USE_REFUSED}{case}\n"), "");
        assert!(
            check_console(&missing).unwrap_err().contains(&format!("`{case}`")),
            "a log without the `{case}` refusal fails"
        );
    }
    let never_cleared = good.replace("IN-USE-CLEARED: 0000:00:07.0 bound after cleanup\n", "");
    assert!(check_console(&never_cleared).unwrap_err().contains("bound after"));
    for (prefix, _) in TUTTID_LINES {
        let missing: String =
            good.lines().filter(|l| !l.starts_with(prefix)).map(|l| format!("{l}\n")).collect();
        assert!(
            check_console(&missing).unwrap_err().contains(prefix),
            "a log without a `{prefix}` line fails"
        );
    }
    let no_fallback = good.replace("P2P-FALLBACK-STAGED\n", "");
    assert!(check_console(&no_fallback).unwrap_err().contains("unreachable KV device"));
    for (prefix, needle) in P2P_LINES {
        let missing = good.replace(&format!("{prefix}{needle}\n"), "");
        assert!(
            check_console(&missing).unwrap_err().contains("P2P demos"),
            "a log without `{prefix}{needle}` fails"
        );
    }
    let not_released = good.replace("TUTTID-KILLED-CLIENT-RELEASED\n", "");
    assert!(check_console(&not_released).unwrap_err().contains("SIGKILLed"));
    assert_eq!(summary(good).len(), 24);
    let probes = "probe 0000:00:04.0: 29 probes, 1 differ from the spec\n\
                  probe 0000:00:04.0: read one block (PRP)   ok   got Generic/Successful Completion (0x0000)\n\
                  probe 0000:00:04.0: PRP1 offset not dword aligned   DIFF got ...\n";
    assert_eq!(summary(probes).len(), 2, "the count and the DIFF line, not the conforming probe");
    let bench = "guest: === tutti bench sgl-vs-prp\nbench:    32K  object  SGL  0.0123\nsomething else\n";
    assert_eq!(summary(bench), ["bench:    32K  object  SGL  0.0123"], "benchmark lines are shown");
    let recovery = "selftest gio recovery: 0000:00:04.0 ns 1: 2 queue pair(s) (qid 1, 2) deleted and created again\n\
                    guest: === next\n\
                    selftest gio recovery: after recovery: host executor ... bytes verified on 0000:00:04.0\n";
    assert_eq!(summary(recovery).len(), 2, "the recovery of each drive and the pass after it are shown");
}

#[test]
fn the_host_side_check_compares_the_backing_file_with_the_guest_digest() {
    let mut file = vec![0u8; 64 << 10];
    for (i, b) in file[4096..4096 + 8192].iter_mut().enumerate() {
        *b = (i % 251) as u8 + 1;
    }
    let region = &file[4096..4096 + 8192];
    let log = format!("P2P-HOST-CHECK: 4096 8192 8192 {:016x}\n", fnv1a64(region));
    assert_eq!(check_ivshmem(&log, &file), Ok(()));
    let mut changed = file.clone();
    changed[4096 + 100] ^= 1;
    assert!(check_ivshmem(&log, &changed).unwrap_err().contains("differs"));
    assert!(check_ivshmem("", &file).unwrap_err().contains("no P2P-HOST-CHECK"));
    let zeros = format!("P2P-HOST-CHECK: 0 4096 0 {:016x}\n", fnv1a64(&file[..4096]));
    assert!(check_ivshmem(&zeros, &file).unwrap_err().contains("nothing to check"));
    let past = format!("P2P-HOST-CHECK: 60000 8192 8192 {:016x}\n", fnv1a64(region));
    assert!(check_ivshmem(&past, &file).unwrap_err().contains("backing file has"));
}
