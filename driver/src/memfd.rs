//! Sealed memfds: shared memory one process makes and hands to others (an
//! emulated register file, tuttid's arbitration board). The maker fixes the
//! size and seals it; a receiver checks both before it maps, so a peer cannot
//! hand over a file that later shrinks under the mapping.

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

fn step_err(step: &str) -> std::io::Error {
    let e = std::io::Error::last_os_error();
    std::io::Error::new(e.kind(), format!("{step}: {e}"))
}

/// A new memfd of `len` zeroed bytes, sealed against shrinking, growing and
/// further sealing. `label` names it in /proc (NULs dropped, at most 200 chars).
pub fn create_sealed(label: &str, len: usize) -> std::io::Result<OwnedFd> {
    let label: String = label.chars().filter(|c| *c != '\0').take(200).collect();
    let cname = CString::new(label).map_err(|_| std::io::Error::other("memfd label"))?;
    // SAFETY: `cname` is a valid NUL-terminated string; the flags are plain constants.
    let raw = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(step_err("memfd_create"));
    }
    // SAFETY: `raw` is a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let size = libc::off_t::try_from(len).map_err(|_| std::io::Error::other(format!("{len} bytes")))?;
    // SAFETY: plain syscall on a descriptor we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
        return Err(step_err(&format!("sizing the memfd to {len} bytes")));
    }
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(step_err("sealing the memfd"));
    }
    Ok(fd)
}

/// Whether `fd` is a regular file of exactly `len` bytes sealed against
/// shrinking; `Err` says what it is instead.
pub fn check_sealed(fd: BorrowedFd<'_>, len: usize) -> Result<(), String> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `st` is writable memory of the right size for fstat.
    if unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(format!("fstat failed: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: fstat succeeded, so it filled `st` in.
    let st = unsafe { st.assume_init() };
    if st.st_mode & libc::S_IFMT != libc::S_IFREG || u64::try_from(st.st_size).ok() != Some(len as u64) {
        return Err(format!(
            "the file is {} bytes (mode {:#o}), not a {len:#x}-byte regular file",
            st.st_size, st.st_mode
        ));
    }
    // SAFETY: plain fcntl on a descriptor the caller owns.
    let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
    if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
        return Err("the file is not a memfd sealed against shrinking".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_sealed_memfd_checks_and_a_wrong_one_is_named() {
        let fd = create_sealed("tutti-test", 8192).unwrap();
        check_sealed(fd.as_fd(), 8192).unwrap();
        assert!(check_sealed(fd.as_fd(), 4096).unwrap_err().contains("not a 0x1000-byte"));
        let plain = std::fs::File::open("/proc/self/stat").unwrap();
        assert!(check_sealed(plain.as_fd(), 0).is_err());
    }
}
