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
use std::time::{SystemTime, UNIX_EPOCH};
use tutti_driver::owner::{holders_of, read_record, remove_own_record, sidecar_path, write_record, Holder};
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

/// Names whoever holds the media file `path`: the owner record when a live
/// process it names (one with the file open, where a scan can tell) wrote it,
/// else the processes a `/proc` scan finds with the file open.
fn describe_holder(proc_root: &Path, path: &Path) -> String {
    let sidecar = sidecar_path(path);
    let record = read_record(&sidecar);
    let found = holders_of(proc_root, path);
    if let Some(r) = &record {
        let alive = proc_root.join(r.pid.to_string()).exists();
        if alive && (found.is_empty() || found.iter().any(|h| h.pid == r.pid)) {
            let holder = Holder { pid: r.pid, command: r.command.clone() };
            let since = r
                .since
                .and_then(|s| {
                    let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_secs();
                    Some(format!(", owner since {}s ago", now.checked_sub(s)?))
                })
                .unwrap_or_default();
            return format!("{holder}{since} (recorded in {})", sidecar.display());
        }
    }
    if !found.is_empty() {
        let list: Vec<String> = found.iter().map(Holder::to_string).collect();
        return list.join(", ");
    }
    format!(
        "another process that could not be identified ({} names no live owner, and no process \
         visible in {} has the file open)",
        sidecar.display(),
        proc_root.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn temp_dir(tag: &str) -> PathBuf {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("tutti-owner-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A fake `/proc`: each process gets a command line and fd links.
    fn fake_proc(root: &Path, pid: u32, cmdline: &[u8], links: &[&str]) {
        let fd = root.join(pid.to_string()).join("fd");
        std::fs::create_dir_all(&fd).unwrap();
        std::fs::write(root.join(pid.to_string()).join("cmdline"), cmdline).unwrap();
        for (i, l) in links.iter().enumerate() {
            symlink(l, fd.join((i + 3).to_string())).unwrap();
        }
    }

    #[test]
    fn holder_named_from_live_record_or_from_the_scan() {
        let root = temp_dir("desc");
        let media = root.join("emu0.img");
        std::fs::write(&media, b"").unwrap();
        let media = std::fs::canonicalize(&media).unwrap();
        let proc_root = root.join("proc");
        // A live recorded owner that has the file open is named from its record.
        fake_proc(&proc_root, 77, b"engine\0", &[media.to_str().unwrap()]);
        std::fs::write(sidecar_path(&media), "pid=77\ncommand=engine --tp 2\nsince=0\n").unwrap();
        let d = describe_holder(&proc_root, &media);
        assert!(d.starts_with("pid 77 (engine --tp 2)") && d.contains("emu0.img.owner"), "{d}");
        // A stale record (dead pid) is not believed; the scan names the real holder.
        std::fs::write(sidecar_path(&media), "pid=76\ncommand=dead\n").unwrap();
        assert_eq!(describe_holder(&proc_root, &media), "pid 77 (engine)");
        // Nothing found anywhere: said so.
        std::fs::remove_dir_all(&proc_root).unwrap();
        let d = describe_holder(&proc_root, &media);
        assert!(d.contains("could not be identified") && d.contains("emu0.img.owner"), "{d}");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
