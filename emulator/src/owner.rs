//! One owner per media file.
//!
//! An emulated drive's media file is locked with `flock(LOCK_EX | LOCK_NB)` for
//! as long as its controller lives. The lock belongs to the open file
//! description, so it conflicts across processes and between two opens in one
//! process, and the kernel drops it when the holder exits, however it exits.
//! Once it has the lock, the holder writes `<media>.owner` (pid, command line,
//! start time; [`tutti_driver::owner::write_record`]) so that a refused opener
//! can name it. The record only names; the lock decides, so a record a dead
//! holder left behind blocks nothing.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use tutti_driver::owner::{describe_holder, remove_own_record, sidecar_path, write_record};
use tutti_driver::{DriverError, Result};

/// `flock` retries after EINTR.
const LOCK_TRIES: u32 = 8;

/// Ownership of a locked media file: the lock itself lives on the file's
/// descriptor. Dropping this removes the owner record; drop it before the file.
pub(crate) struct MediaOwner {
    sidecar: PathBuf,
}

impl Drop for MediaOwner {
    fn drop(&mut self) {
        // Only a record that still names this process is ours to remove: while we hold the
        // lock nobody else should have written one, but the file is not ours to trust.
        remove_own_record(&self.sidecar);
    }
}

/// Takes the exclusive lock on the media file `file` (opened from `path`) and
/// records this process as its owner. Refused, the error names the holder.
/// Nothing is written to the media either way.
pub(crate) fn lock_media(name: &str, path: &Path, file: &File) -> Result<MediaOwner> {
    match try_lock(file) {
        Ok(true) => {}
        Ok(false) => {
            let holder = describe_holder(Path::new("/proc"), path);
            return Err(DriverError::InUse(format!(
                "{name}: media file {} is owned by {holder}; a media file has one owner at a time: \
                 close the runtime that owns it first, or give this one another directory",
                path.display()
            )));
        }
        Err(e) => {
            return Err(DriverError::io(
                format!(
                    "{name}: cannot lock media file {} (flock; each media file must have one owner)",
                    path.display()
                ),
                e,
            ))
        }
    }
    let sidecar = sidecar_path(path);
    if let Err(e) = write_record(&sidecar) {
        // The lock still protects the media; only the name of the holder is lost.
        tracing::warn!(file = %sidecar.display(), error = %e, "writing the media owner record failed");
    }
    Ok(MediaOwner { sidecar })
}

/// `Ok(false)` when another open file description holds the lock.
fn try_lock(file: &File) -> std::io::Result<bool> {
    for _ in 0..LOCK_TRIES {
        // SAFETY: flock on a descriptor `file` keeps open; it touches no memory.
        let r = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => return Ok(false),
            Some(libc::EINTR) => continue,
            _ => return Err(e),
        }
    }
    Err(std::io::Error::from_raw_os_error(libc::EINTR))
}
