//! One owner per drive, and naming the holder of a busy one.
//!
//! - A file one process owns (an emulated drive's media file, which
//!   `tutti-emulator` locks with `flock`; tuttid's socket) gets an owner record
//!   beside it, `<file>.owner` (pid, command line, start time), so that a refused
//!   opener can name the holder ([`write_record`], [`read_record`],
//!   [`describe_record`], [`describe_holder`]). A record only names; the lock decides, so a record a
//!   dead holder left behind blocks nothing.
//! - A VFIO group node can be open in one process only (a second open fails with
//!   EBUSY). [`holders_of`] finds the processes that have a node open by scanning
//!   `/proc/<pid>/fd`, bounded in count and time.

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Appended to a media file's path to name its owner record.
pub const SIDECAR_SUFFIX: &str = ".owner";
/// Owner records and command lines longer than this are cut.
const RECORD_MAX: u64 = 4096;
const COMMAND_MAX: usize = 200;
/// Bounds of one `/proc` scan.
const SCAN_MAX_PROCS: usize = 1 << 16;
const SCAN_MAX_FDS: usize = 1 << 14;
const SCAN_MAX_HOLDERS: usize = 8;
const SCAN_BUDGET: Duration = Duration::from_millis(500);

/// A process found holding a media file or a device node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    /// Its command line, arguments separated by spaces, cut and with control
    /// characters replaced; empty when unreadable.
    pub command: String,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pid {}", self.pid)?;
        if !self.command.is_empty() {
            write!(f, " ({})", self.command)?;
        }
        if self.pid == std::process::id() {
            write!(f, " [this process: another runtime or controller in it]")?;
        }
        Ok(())
    }
}

/// Path of the owner record of the media file `media`.
pub fn sidecar_path(media: &Path) -> PathBuf {
    let mut s = media.as_os_str().to_os_string();
    s.push(SIDECAR_SUFFIX);
    PathBuf::from(s)
}

/// Writes an owner record at `path` naming this process (pid, command line, start time): how
/// a file that one process owns (a media file, tuttid's socket) names its owner to others.
pub fn write_record(path: &Path) -> std::io::Result<()> {
    let record = format!(
        "pid={}\ncommand={}\nsince={}\n",
        std::process::id(),
        own_command(),
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
    );
    std::fs::write(path, record)
}

/// Removes the owner record at `path` if it names this process.
pub fn remove_own_record(path: &Path) {
    if read_record(path).is_some_and(|r| r.pid == std::process::id()) {
        if let Err(e) = std::fs::remove_file(path) {
            tracing::debug!(file = %path.display(), error = %e, "removing an owner record failed");
        }
    }
}

/// Who the owner record at `path` names, and whether that process still runs: for a file its
/// owner left behind (it was killed), so that the error can name the process that left it.
/// `None` when there is no record, or it names no pid.
pub fn describe_record(path: &Path) -> Option<String> {
    let r = read_record(path)?;
    let holder = Holder { pid: r.pid, command: r.command };
    let alive = Path::new("/proc").join(r.pid.to_string()).exists();
    Some(format!(
        "{holder} ({}; recorded in {})",
        if alive { "a process with that pid is running" } else { "no longer running" },
        path.display()
    ))
}

/// Names whoever holds the file `path` (an emulated drive's media file): the owner record when a live
/// process it names (one with the file open, where a scan can tell) wrote it,
/// else the processes a `/proc` scan finds with the file open.
pub fn describe_holder(proc_root: &Path, path: &Path) -> String {
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

/// What an owner record says.
#[derive(Debug, PartialEq, Eq)]
pub struct Record {
    pub pid: u32,
    /// The command line, cleaned and cut like [`Holder::command`].
    pub command: String,
    /// When the owner took the file (seconds since the Unix epoch).
    pub since: Option<u64>,
}

/// Reads an owner record: untrusted bytes, bounded, `None` unless it names a pid.
pub fn read_record(path: &Path) -> Option<Record> {
    let mut buf = Vec::new();
    File::open(path).ok()?.take(RECORD_MAX).read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf);
    let (mut pid, mut command, mut since) = (None, String::new(), None);
    for line in text.lines() {
        match line.split_once('=') {
            Some(("pid", v)) => pid = v.trim().parse::<u32>().ok().filter(|&p| p > 0),
            Some(("command", v)) => command = clean(v),
            Some(("since", v)) => since = v.trim().parse::<u64>().ok(),
            _ => {}
        }
    }
    Some(Record { pid: pid?, command, since })
}

/// Processes under `proc_root` (normally `/proc`) with an open descriptor on
/// `target`: at most a few, found within a bounded number of entries and time.
/// Processes whose descriptors cannot be read (other users) are skipped.
pub fn holders_of(proc_root: &Path, target: &Path) -> Vec<Holder> {
    let deadline = Instant::now() + SCAN_BUDGET;
    let target = std::fs::canonicalize(target).unwrap_or_else(|_| target.to_path_buf());
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir(proc_root) else {
        return out;
    };
    let mut fds_seen = 0usize;
    for entry in procs.take(SCAN_MAX_PROCS).flatten() {
        if out.len() >= SCAN_MAX_HOLDERS || fds_seen >= SCAN_MAX_FDS || Instant::now() > deadline {
            break;
        }
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            fds_seen += 1;
            if fds_seen >= SCAN_MAX_FDS {
                break;
            }
            if std::fs::read_link(fd.path()).is_ok_and(|l| l == target) {
                out.push(Holder { pid, command: command_of(proc_root, pid) });
                break;
            }
        }
    }
    out
}

/// The command line of `pid` under `proc_root`, cleaned; empty when unreadable.
fn command_of(proc_root: &Path, pid: u32) -> String {
    let mut buf = Vec::new();
    let read = File::open(proc_root.join(pid.to_string()).join("cmdline"))
        .and_then(|f| f.take(RECORD_MAX).read_to_end(&mut buf));
    if read.is_err() {
        return String::new();
    }
    let args: Vec<String> = buf
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    clean(&args.join(" "))
}

fn own_command() -> String {
    let args: Vec<String> = std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect();
    clean(&args.join(" "))
}

/// Control characters become '?', and the text is cut to [`COMMAND_MAX`] characters.
fn clean(s: &str) -> String {
    let mut out: String =
        s.trim().chars().take(COMMAND_MAX).map(|c| if c.is_control() { '?' } else { c }).collect();
    if s.trim().chars().count() > COMMAND_MAX {
        out.push('…');
    }
    out
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
    fn scan_finds_the_processes_holding_a_node() {
        let root = temp_dir("scan");
        fake_proc(&root, 41, b"qemu-system-x86_64\0-device\0vfio-pci\0", &["/dev/null", "/dev/vfio/7"]);
        fake_proc(&root, 42, b"other\0", &["/dev/vfio/8"]);
        fake_proc(&root, 43, b"bad\x1b[2Jname\0", &["/dev/vfio/7"]);
        std::fs::create_dir_all(root.join("self/fd")).unwrap();
        symlink("/dev/vfio/7", root.join("self/fd/3")).unwrap();
        let mut found = holders_of(&root, Path::new("/dev/vfio/7"));
        found.sort_by_key(|h| h.pid);
        assert_eq!(
            found,
            vec![
                Holder { pid: 41, command: "qemu-system-x86_64 -device vfio-pci".into() },
                Holder { pid: 43, command: "bad?[2Jname".into() },
            ]
        );
        assert!(holders_of(&root, Path::new("/dev/vfio/9")).is_empty());
        assert!(holders_of(&root.join("absent"), Path::new("/dev/vfio/7")).is_empty());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn records_are_parsed_as_untrusted_text() {
        let d = temp_dir("rec");
        let p = d.join("x.owner");
        std::fs::write(&p, "pid=12\ncommand=tutti demo\x07 --dir /x\nsince=99\n").unwrap();
        assert_eq!(
            read_record(&p),
            Some(Record { pid: 12, command: "tutti demo? --dir /x".into(), since: Some(99) })
        );
        std::fs::write(&p, "pid=zero\ncommand=x\n").unwrap();
        assert_eq!(read_record(&p), None);
        std::fs::write(&p, format!("pid=5\ncommand={}\n", "a".repeat(10_000))).unwrap();
        let r = read_record(&p).unwrap();
        assert_eq!((r.pid, r.command.chars().count()), (5, COMMAND_MAX + 1));
        std::fs::remove_dir_all(&d).unwrap();
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
