//! What the kernel is doing with a drive: its block devices (namespaces,
//! partitions, device-mapper and md devices stacked on them) and every way
//! one of them is in use: mounted, active swap, the root filesystem, an md
//! RAID member, under LVM/device-mapper, a ZFS pool member, or open by
//! another process. A source that cannot be read is itself a finding
//! ([`Use::Unverified`]): a check that could not run must not pass.

use super::{sysfs, Bdf, PciFunction, PciSystem};
use crate::error::Result;
use std::collections::BTreeSet;
use std::io::{ErrorKind, Read};
use std::path::{Path, PathBuf};

/// One way a block device is in use.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Use {
    Mounted {
        device: String,
        mountpoint: String,
        fstype: String,
    },
    Swap {
        device: String,
    },
    /// A member (active or spare) of an assembled md array.
    RaidMember {
        device: String,
        array: String,
    },
    /// A device-mapper device (LVM, dm-crypt, multipath...) is stacked on it.
    Holder {
        device: String,
        holder: String,
        name: Option<String>,
        subsystem: Option<String>,
    },
    /// Carries ZFS vdev labels: a member of a ZFS pool, imported or not.
    ZfsMember {
        device: String,
    },
    /// The kernel refused an exclusive open (EBUSY): someone holds it.
    Busy {
        device: String,
    },
    /// A process has the device node open.
    OpenBy {
        device: String,
        pid: u32,
        comm: String,
    },
    /// A source the checks need could not be read, so the drive may be in use.
    Unverified {
        source: String,
        error: String,
    },
}

impl Use {
    pub fn holds_root(&self) -> bool {
        matches!(self, Use::Mounted { mountpoint, .. } if mountpoint == "/")
    }

    /// Why this use stops a bind, and what to do about it.
    pub fn explain(&self) -> String {
        match self {
            Use::Mounted { device, mountpoint, .. } if mountpoint == "/" => format!(
                "{device} holds the root filesystem; taking this drive away from the kernel would crash \
                 the system"
            ),
            Use::Mounted { device, mountpoint, fstype } => format!(
                "{device} is mounted at {mountpoint} ({fstype}); unmount it (umount {mountpoint}) and \
                 remove it from /etc/fstab"
            ),
            Use::Swap { device } => {
                format!("{device} is active swap; run `swapoff /dev/{device}` and remove it from /etc/fstab")
            }
            Use::RaidMember { device, array } => format!(
                "{device} is a member of the md RAID array {array}; unmount what is on /dev/{array}, stop \
                 the array (`mdadm --stop /dev/{array}`) and remove it from /etc/mdadm/mdadm.conf"
            ),
            Use::Holder { device, holder, name, subsystem } => {
                let what = match subsystem.as_deref() {
                    Some("LVM") => "an LVM logical volume",
                    Some("CRYPT") => "a dm-crypt mapping",
                    Some("mpath") => "a dm-multipath map",
                    _ => "a device-mapper device",
                };
                let named = name.as_deref().map_or(String::new(), |n| format!(" (/dev/mapper/{n})"));
                let how = match (subsystem.as_deref(), name.as_deref()) {
                    (Some("LVM"), _) => "deactivate its volume group (`vgchange -an VG`)".to_string(),
                    (Some("CRYPT"), Some(n)) => format!("close it (`cryptsetup close {n}`)"),
                    (_, Some(n)) => format!("remove it (`dmsetup remove {n}`)"),
                    (_, None) => format!("remove it (`dmsetup remove /dev/{holder}`)"),
                };
                format!(
                    "{device} is under {what} {holder}{named}; unmount what is on it, {how}, and remove \
                     it from /etc/fstab and /etc/crypttab"
                )
            }
            Use::ZfsMember { device } => format!(
                "{device} carries ZFS labels (a ZFS pool member); export or destroy the pool (`zpool \
                 export POOL`), and clear the labels (`zpool labelclear /dev/{device}`) if it is to \
                 leave the pool for good"
            ),
            Use::Busy { device } => format!(
                "{device} is held exclusively by someone (the kernel refused an exclusive open with \
                 EBUSY); find the holder with `ls /sys/class/block/{device}/holders`, `fuser -vm \
                 /dev/{device}` or `lsof /dev/{device}` and stop it"
            ),
            Use::OpenBy { device, pid, comm } => {
                format!("{device} is open by pid {pid} ({comm}); stop that process first")
            }
            Use::Unverified { source, error } => format!(
                "cannot tell whether the drive is in use: {source} could not be read ({error}); mount \
                 /proc and /sys and run as root"
            ),
        }
    }
}

/// A namespace's block device as the kernel's nvme driver exposes it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BlockDevice {
    /// `nvme0n1`.
    pub name: String,
    pub size_bytes: u64,
    pub partitions: Vec<String>,
    /// Devices stacked on this one or its partitions (`dm-0` and their mapper names, `md127`).
    pub holders: Vec<String>,
    pub uses: Vec<Use>,
}

/// An NVMe PCI function with what the kernel knows about it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DriveInfo {
    pub function: PciFunction,
    /// The kernel's controller name (`nvme0`) while the `nvme` driver holds it.
    pub controller: Option<String>,
    pub model: Option<String>,
    pub serial: Option<String>,
    pub firmware: Option<String>,
    /// Sum of the namespaces' sizes, when the kernel driver shows them.
    pub capacity_bytes: Option<u64>,
    pub block_devices: Vec<BlockDevice>,
}

impl DriveInfo {
    pub fn uses(&self) -> impl Iterator<Item = &Use> {
        self.block_devices.iter().flat_map(|b| b.uses.iter())
    }
    pub fn is_mounted(&self) -> bool {
        self.uses().any(|u| matches!(u, Use::Mounted { .. }))
    }
    pub fn holds_root(&self) -> bool {
        self.uses().any(Use::holds_root)
    }
}

/// A line of /proc/self/mountinfo reduced to what identifies the device.
struct Mount {
    dev: String,
    source: String,
    mountpoint: String,
    fstype: String,
}

/// What the whole machine says, read once per [`PciSystem::drive`].
struct MachineState {
    mounts: Vec<Mount>,
    swaps: Vec<String>,
    /// (member, array) pairs of /proc/mdstat.
    md_members: Vec<(String, String)>,
    /// Device nodes held open: (pid, command, node path).
    open_nodes: Vec<(u32, String, String)>,
    /// Sources that could not be read.
    unverified: Vec<Use>,
}

/// ZFS vdev labels: two at the start of the device, 256 KiB each, whose
/// second half is a ring of uberblocks of at least 1 KiB, each starting with
/// this magic in the writer's byte order.
const ZFS_LABEL_BYTES: usize = 256 << 10;
const ZFS_UBERBLOCK_RING: usize = 128 << 10;
const ZFS_UBERBLOCK_MAGIC: u64 = 0x00ba_b10c;

/// Whether `head` (the first 512 KiB of a device) holds a ZFS uberblock.
fn has_zfs_label(head: &[u8]) -> bool {
    (0..2).any(|label| {
        let start = label * ZFS_LABEL_BYTES + ZFS_UBERBLOCK_RING;
        (start..(label + 1) * ZFS_LABEL_BYTES).step_by(1024).any(|off| {
            head.get(off..off + 8).and_then(|b| <[u8; 8]>::try_from(b).ok()).is_some_and(|b| {
                u64::from_le_bytes(b) == ZFS_UBERBLOCK_MAGIC || u64::from_be_bytes(b) == ZFS_UBERBLOCK_MAGIC
            })
        })
    })
}

/// `md127 : active raid1 nvme0n1p1[1] sdb1[0](S)` → (member, array) pairs.
fn parse_mdstat(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((array, rest)) = line.split_once(" : ") else { continue };
        let array = array.trim();
        if !array.starts_with("md") {
            continue;
        }
        for token in rest.split_whitespace() {
            let Some((member, idx)) = token.split_once('[') else { continue };
            let idx = idx.split(']').next().unwrap_or_default();
            if !member.is_empty() && !idx.is_empty() && idx.bytes().all(|b| b.is_ascii_digit()) {
                out.push((member.to_string(), array.to_string()));
            }
        }
    }
    out
}

impl PciSystem {
    /// The drive at `bdf` with its block devices and their uses.
    pub fn drive(&self, bdf: &Bdf) -> Result<DriveInfo> {
        let function = self.function(bdf)?;
        let dir = self.device_dir(bdf);
        let controller = sysfs::entries(&dir.join("nvme"))?.into_iter().next();
        let ctrl_dir = controller.as_ref().map(|c| dir.join("nvme").join(c));
        let attr = |name: &str| {
            ctrl_dir.as_ref().and_then(|d| sysfs::read_optional(&d.join(name))).filter(|s| !s.is_empty())
        };
        let names = self.block_devices_of(&dir)?;
        let state = if names.is_empty() { None } else { Some(self.machine_state()) };
        let mut block_devices = Vec::new();
        if let Some(state) = &state {
            for name in &names {
                block_devices.push(self.block_device(name, state));
            }
        }
        let capacity_bytes =
            (!block_devices.is_empty()).then(|| block_devices.iter().map(|b| b.size_bytes).sum());
        Ok(DriveInfo {
            function,
            model: attr("model"),
            serial: attr("serial"),
            firmware: attr("firmware_rev"),
            controller,
            capacity_bytes,
            block_devices,
        })
    }

    /// Every NVMe function with what the kernel knows about it.
    pub fn drives(&self) -> Result<Vec<DriveInfo>> {
        self.nvme_functions()?.iter().map(|f| self.drive(&f.bdf)).collect()
    }

    /// Names in /sys/block that belong to the function at `dev_dir`: disks below it
    /// in the device tree, and multipath disks whose subsystem links one of its controllers.
    fn block_devices_of(&self, dev_dir: &Path) -> Result<Vec<String>> {
        let Ok(dev_real) = std::fs::canonicalize(dev_dir) else { return Ok(Vec::new()) };
        let below = |p: &Path| p.starts_with(&dev_real);
        let block = self.path("sys/block");
        let mut out = Vec::new();
        for name in sysfs::entries(&block)? {
            let Ok(real) = std::fs::canonicalize(block.join(&name)) else { continue };
            let mine = below(&real)
                || real.parent().is_some_and(|subsys| controller_links(subsys).iter().any(|t| below(t)));
            if mine {
                out.push(name);
            }
        }
        Ok(out)
    }

    fn block_device(&self, name: &str, state: &MachineState) -> BlockDevice {
        let mut uses = state.unverified.clone();
        let unverified =
            |source: &Path, error: String| Use::Unverified { source: source.display().to_string(), error };
        let dir = self.path("sys/block").join(name);
        let size_bytes =
            sysfs::read_optional(&dir.join("size")).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0) * 512;
        let partitions: Vec<String> = match sysfs::entries(&dir) {
            Ok(e) => e.into_iter().filter(|p| dir.join(p).join("partition").exists()).collect(),
            Err(e) => {
                uses.push(unverified(&dir, e.to_string()));
                Vec::new()
            }
        };
        // Every name and device number that stands for this disk: itself, its
        // partitions, and whatever is stacked on either (LVM, dm-crypt, md).
        let mut names: Vec<(String, PathBuf)> = vec![(name.to_string(), dir.clone())];
        names.extend(partitions.iter().map(|p| (p.clone(), dir.join(p))));
        let own = names.len();
        let mut holders = Vec::new();
        let mut stacked = Vec::new();
        let mut i = 0;
        while i < names.len() {
            let (under, node) = names[i].clone();
            let hdir = node.join("holders");
            let found = match sysfs::entries(&hdir) {
                Ok(found) => found,
                Err(e) => {
                    uses.push(unverified(&hdir, e.to_string()));
                    Vec::new()
                }
            };
            for h in found {
                if i < own {
                    stacked.push((under.clone(), h.clone()));
                }
                if names.iter().all(|(n, _)| *n != h) {
                    holders.push(h.clone());
                    names.push((h.clone(), self.path("sys/block").join(&h)));
                }
            }
            i += 1;
        }
        let mut aliases: BTreeSet<String> = names.iter().map(|(n, _)| n.clone()).collect();
        let mut devnums = BTreeSet::new();
        for (n, path) in &names {
            if let Some(d) = sysfs::read_optional(&path.join("dev")) {
                devnums.insert(d);
            }
            if let Some(mapper) = sysfs::read_optional(&path.join("dm/name")).filter(|m| !m.is_empty()) {
                if !holders.contains(&mapper) && n.starts_with("dm-") {
                    holders.push(mapper.clone());
                }
                aliases.insert(format!("mapper/{mapper}"));
            }
        }
        let matches = |source: &str| {
            let rel = source.strip_prefix("/dev/").unwrap_or(source);
            aliases.contains(rel) || aliases.contains(rel.rsplit('/').next().unwrap_or(rel))
        };
        for m in &state.mounts {
            if devnums.contains(&m.dev) || matches(&m.source) {
                uses.push(Use::Mounted {
                    device: m.source.trim_start_matches("/dev/").to_string(),
                    mountpoint: m.mountpoint.clone(),
                    fstype: m.fstype.clone(),
                });
            }
        }
        for s in &state.swaps {
            if matches(s) {
                uses.push(Use::Swap { device: s.trim_start_matches("/dev/").to_string() });
            }
        }
        // Stacked devices: md arrays and device-mapper (LVM, dm-crypt) holders.
        for (under, holder) in &stacked {
            let hdir = self.path("sys/block").join(holder);
            if holder.starts_with("md") {
                uses.push(Use::RaidMember { device: under.clone(), array: holder.clone() });
            } else {
                let subsystem = sysfs::read_optional(&hdir.join("dm/uuid"))
                    .and_then(|u| u.split_once('-').map(|(s, _)| s.to_string()))
                    .filter(|s| !s.is_empty());
                let name = sysfs::read_optional(&hdir.join("dm/name")).filter(|n| !n.is_empty());
                uses.push(Use::Holder { device: under.clone(), holder: holder.clone(), name, subsystem });
            }
        }
        // An array /proc/mdstat lists although sysfs shows no holder link.
        for (member, array) in &state.md_members {
            let mine = names[..own].iter().any(|(n, _)| n == member);
            let known = uses.iter().any(|u| matches!(u, Use::RaidMember { device, .. } if device == member));
            if mine && !known {
                uses.push(Use::RaidMember { device: member.clone(), array: array.clone() });
            }
        }
        for (pid, comm, node) in &state.open_nodes {
            if matches(node) {
                let device = node.trim_start_matches("/dev/").to_string();
                let use_ = Use::OpenBy { device, pid: *pid, comm: comm.clone() };
                if !uses.contains(&use_) {
                    uses.push(use_);
                }
            }
        }
        // The device nodes themselves: ZFS labels, and whether the kernel
        // lets anyone else claim them.
        let mut busy = Vec::new();
        for (n, _) in &names[..own] {
            let node = self.path("dev").join(n);
            match read_head(&node, 2 * ZFS_LABEL_BYTES) {
                Ok(head) if has_zfs_label(&head) => uses.push(Use::ZfsMember { device: n.clone() }),
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    uses.push(unverified(&node, "no such device node; is devtmpfs mounted on /dev?".into()));
                    continue;
                }
                Err(e) => {
                    uses.push(unverified(&node, e.to_string()));
                    continue;
                }
            }
            match self.open_exclusive(&node) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => busy.push(Use::Busy { device: n.clone() }),
                Err(e) => uses.push(unverified(&node, format!("exclusive open: {e}"))),
            }
        }
        // EBUSY only adds something when nothing above explains it.
        if uses.iter().all(|u| matches!(u, Use::Unverified { .. })) {
            uses.extend(busy.into_iter().take(1));
        }
        BlockDevice { name: name.to_string(), size_bytes, partitions, holders, uses }
    }

    /// Opens a device node with `O_EXCL`, which for a block device fails with
    /// `EBUSY` while a filesystem, an md array, device-mapper, ZFS or a program
    /// has claimed it, and closes it again.
    fn open_exclusive(&self, node: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        #[cfg(test)]
        if let Some(hook) = &self.on_open_exclusive {
            hook(node)?;
        }
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_EXCL | libc::O_NONBLOCK)
            .open(node)
            .map(drop)
    }

    /// Mounts, swap areas, md arrays and open device nodes, with every source
    /// that could not be read.
    fn machine_state(&self) -> MachineState {
        let mut unverified = Vec::new();
        let mut read = |rel: &str, missing_ok: bool| {
            let path = self.path(rel);
            match std::fs::read_to_string(&path) {
                Ok(text) => text,
                Err(e) if missing_ok && e.kind() == ErrorKind::NotFound => String::new(),
                Err(e) => {
                    unverified
                        .push(Use::Unverified { source: path.display().to_string(), error: e.to_string() });
                    String::new()
                }
            }
        };
        // /proc/self/mountinfo, unlike /proc/mounts, carries the device number,
        // so a root mounted as `/dev/root` is still recognised.
        let mounts = read("proc/self/mountinfo", false).lines().filter_map(parse_mountinfo_line).collect();
        let swaps = read("proc/swaps", false)
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next())
            .map(unescape)
            .collect();
        // No /proc/mdstat: the md driver is not loaded, so no array exists.
        let md_members = parse_mdstat(&read("proc/mdstat", true));
        MachineState { mounts, swaps, md_members, open_nodes: self.open_device_nodes(), unverified }
    }

    /// Device nodes under /dev held open by other processes, as (pid, command, path).
    /// Processes whose descriptors cannot be read (gone, or not ours) are passed over:
    /// the exclusive open is the check that does not depend on them.
    fn open_device_nodes(&self) -> Vec<(u32, String, String)> {
        let proc_dir = self.path("proc");
        let me = std::process::id();
        let mut out = Vec::new();
        for pid in sysfs::entries(&proc_dir).unwrap_or_default() {
            let Ok(n) = pid.parse::<u32>() else { continue };
            if n == me {
                continue;
            }
            let fd_dir = proc_dir.join(&pid).join("fd");
            for fd in sysfs::entries(&fd_dir).unwrap_or_default() {
                let Ok(target) = std::fs::read_link(fd_dir.join(fd)) else { continue };
                let Some(t) = target.to_str().filter(|t| t.starts_with("/dev/")) else { continue };
                let comm = sysfs::read_optional(&proc_dir.join(&pid).join("comm")).unwrap_or_default();
                out.push((n, comm, t.to_string()));
            }
        }
        out
    }
}

/// Up to `len` bytes from the start of `path`.
fn read_head(path: &Path, len: usize) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::new();
    std::fs::File::open(path)?.take(len as u64).read_to_end(&mut head)?;
    Ok(head)
}

/// Targets of the `nvmeN` links in an nvme-subsystem directory.
fn controller_links(subsys: &Path) -> Vec<PathBuf> {
    sysfs::entries(subsys)
        .unwrap_or_default()
        .into_iter()
        .filter(|c| {
            c.strip_prefix("nvme").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|c| std::fs::canonicalize(subsys.join(c)).ok())
        .collect()
}

/// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
/// (proc(5)): fields up to the optional ones, a `-`, then fstype and source.
fn parse_mountinfo_line(line: &str) -> Option<Mount> {
    let fields: Vec<&str> = line.split(' ').collect();
    let sep = fields.iter().position(|f| *f == "-")?;
    Some(Mount {
        dev: fields.get(2)?.to_string(),
        mountpoint: unescape(fields.get(4)?),
        fstype: fields.get(sep + 1)?.to_string(),
        source: unescape(fields.get(sep + 2)?),
    })
}

/// Undoes the kernel's octal escapes of space, tab, newline and backslash.
fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 4 <= bytes.len()
            && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b))
        {
            out.push((bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::super::fake::FakeSys;
    use super::super::NVME_CLASS;
    use super::*;

    #[test]
    fn mountinfo_lines() {
        let m = parse_mountinfo_line(
            "36 35 259:1 / /mnt/my\\040data rw,noatime shared:1 - ext4 /dev/nvme0n1p1 rw",
        )
        .unwrap();
        assert_eq!(
            (m.dev.as_str(), m.mountpoint.as_str(), m.fstype.as_str()),
            ("259:1", "/mnt/my data", "ext4")
        );
        assert_eq!(m.source, "/dev/nvme0n1p1");
        assert!(parse_mountinfo_line("garbage").is_none());
    }

    fn drive_fixture() -> FakeSys {
        let fake = FakeSys::new();
        fake.add_function("0000:00:04.0", NVME_CLASS, Some("nvme"), Some(1));
        fake.add_controller("0000:00:04.0", "nvme0", "QEMU NVMe Ctrl", "tutti0");
        fake.add_disk(
            "0000:00:04.0",
            "nvme0",
            "nvme0n1",
            "259:0",
            2048,
            &[("nvme0n1p1", "259:1"), ("nvme0n1p2", "259:2")],
        );
        fake.add_function("0000:00:05.0", NVME_CLASS, Some("nvme"), Some(2));
        fake.add_controller("0000:00:05.0", "nvme1", "Other", "tutti1");
        fake.add_multipath_disk("0000:00:05.0", "nvme1", "nvme-subsys1", "nvme1n1", "259:3", 4096);
        fake
    }

    #[test]
    fn finds_block_devices_and_model() {
        let fake = drive_fixture();
        let drives = fake.system().drives().unwrap();
        assert_eq!(drives.len(), 2);
        let d0 = &drives[0];
        assert_eq!(d0.controller.as_deref(), Some("nvme0"));
        assert_eq!(d0.model.as_deref(), Some("QEMU NVMe Ctrl"));
        assert_eq!(d0.capacity_bytes, Some(2048 * 512));
        assert_eq!(d0.block_devices.len(), 1);
        assert_eq!(d0.block_devices[0].partitions, ["nvme0n1p1", "nvme0n1p2"]);
        assert!(!d0.is_mounted());
        // The multipath head lives under the subsystem, not under the PCI function.
        assert_eq!(drives[1].block_devices.iter().map(|b| b.name.as_str()).collect::<Vec<_>>(), ["nvme1n1"]);
        assert_eq!(drives[1].capacity_bytes, Some(4096 * 512));
    }

    #[test]
    fn detects_mounts_swap_and_root() {
        let fake = drive_fixture();
        // Root shows up as /dev/root: only the device number ties it to the partition.
        fake.write(
            "proc/self/mountinfo",
            "1 0 259:2 / / rw - ext4 /dev/root rw\n\
             30 1 0:5 / /dev rw - devtmpfs devtmpfs rw\n\
             40 1 259:1 / /data\\040set rw - xfs /dev/nvme0n1p1 rw\n",
        );
        fake.write("proc/swaps", "Filename Type Size Used Priority\n/dev/nvme1n1 partition 1024 0 -2\n");
        let sys = fake.system();
        let d0 = sys.drive(&"0000:00:04.0".parse().unwrap()).unwrap();
        assert!(d0.holds_root());
        assert!(d0.is_mounted());
        let uses: Vec<String> = d0.uses().map(Use::explain).collect();
        assert!(uses.iter().any(|u| u.contains("root filesystem")), "{uses:?}");
        assert!(uses.iter().any(|u| u.contains("mounted at /data set (xfs)")), "{uses:?}");
        let d1 = sys.drive(&"0000:00:05.0".parse().unwrap()).unwrap();
        assert_eq!(d1.uses().cloned().collect::<Vec<_>>(), [Use::Swap { device: "nvme1n1".into() }]);
    }

    #[test]
    fn detects_mounts_through_device_mapper() {
        let fake = drive_fixture();
        fake.add_holder("nvme0n1/nvme0n1p2", "dm-0", "253:0", "vg-home", "LVM-abc");
        fake.write("proc/self/mountinfo", "50 1 253:0 / /home rw - ext4 /dev/mapper/vg-home rw\n");
        let d0 = fake.system().drive(&"0000:00:04.0".parse().unwrap()).unwrap();
        assert!(d0.block_devices[0].holders.contains(&"dm-0".to_string()));
        assert!(d0.block_devices[0].holders.contains(&"vg-home".to_string()));
        assert!(d0.is_mounted());
        assert!(!d0.holds_root());
        // Matching by name alone (no device number) works too.
        fake.write("proc/self/mountinfo", "50 1 0:99 / /home rw - ext4 /dev/mapper/vg-home rw\n");
        assert!(fake.system().drive(&"0000:00:04.0".parse().unwrap()).unwrap().is_mounted());
    }

    fn uses_of(fake: &FakeSys, bdf: &str) -> Vec<Use> {
        fake.system().drive(&bdf.parse().unwrap()).unwrap().uses().cloned().collect()
    }

    #[test]
    fn a_fresh_drive_has_no_uses() {
        let fake = drive_fixture();
        assert_eq!(uses_of(&fake, "0000:00:04.0"), []);
        assert_eq!(uses_of(&fake, "0000:00:05.0"), []);
    }

    #[test]
    fn detects_an_assembled_md_member_that_is_not_mounted() {
        let fake = drive_fixture();
        fake.add_md(&["nvme0n1/nvme0n1p2", "nvme1n1"], "md127", "9:127");
        let uses = uses_of(&fake, "0000:00:04.0");
        assert_eq!(uses, [Use::RaidMember { device: "nvme0n1p2".into(), array: "md127".into() }]);
        assert!(uses[0].explain().contains("mdadm --stop /dev/md127"), "{}", uses[0].explain());
        // A member of the whole disk (multipath head) too.
        assert_eq!(
            uses_of(&fake, "0000:00:05.0"),
            [Use::RaidMember { device: "nvme1n1".into(), array: "md127".into() }]
        );
        let d0 = fake.system().drive(&"0000:00:04.0".parse().unwrap()).unwrap();
        assert!(d0.block_devices[0].holders.contains(&"md127".to_string()));
    }

    #[test]
    fn detects_an_md_member_that_only_proc_mdstat_names() {
        let fake = drive_fixture();
        fake.write(
            "proc/mdstat",
            "Personalities : [raid1]\nmd0 : active raid1 nvme0n1p1[1] sdb1[0](S)\n                   1046528 blocks super 1.2 [2/2] [UU]\n\nunused devices: <none>\n",
        );
        assert_eq!(
            uses_of(&fake, "0000:00:04.0"),
            [Use::RaidMember { device: "nvme0n1p1".into(), array: "md0".into() }]
        );
        assert_eq!(uses_of(&fake, "0000:00:05.0"), []);
        assert_eq!(
            parse_mdstat("md1 : inactive nvme2n1[0](S) dm-3[12]\n      [2/2] [UU]\n"),
            [("nvme2n1".to_string(), "md1".to_string()), ("dm-3".to_string(), "md1".to_string())]
        );
    }

    #[test]
    fn detects_unmounted_lvm_and_dm_crypt_holders() {
        let fake = drive_fixture();
        fake.add_holder("nvme0n1/nvme0n1p1", "dm-0", "253:0", "vg-data", "LVM-Kx2");
        fake.add_holder("nvme1n1", "dm-1", "253:1", "secret", "CRYPT-LUKS2-77-secret");
        let u0 = uses_of(&fake, "0000:00:04.0");
        assert_eq!(
            u0,
            [Use::Holder {
                device: "nvme0n1p1".into(),
                holder: "dm-0".into(),
                name: Some("vg-data".into()),
                subsystem: Some("LVM".into())
            }]
        );
        let e = u0[0].explain();
        assert!(
            e.contains("LVM logical volume dm-0 (/dev/mapper/vg-data)") && e.contains("vgchange -an"),
            "{e}"
        );
        let u1 = uses_of(&fake, "0000:00:05.0");
        let e = u1[0].explain();
        assert!(e.contains("dm-crypt") && e.contains("cryptsetup close secret"), "{e}");
    }

    #[test]
    fn detects_zfs_labels_on_a_partition() {
        let fake = drive_fixture();
        let mut head = vec![0u8; 2 * ZFS_LABEL_BYTES];
        // An uberblock in slot 3 of label 0, written little-endian.
        let at = ZFS_UBERBLOCK_RING + 3 * 1024;
        head[at..at + 8].copy_from_slice(&ZFS_UBERBLOCK_MAGIC.to_le_bytes());
        fake.write_bytes("dev/nvme0n1p2", &head);
        assert_eq!(uses_of(&fake, "0000:00:04.0"), [Use::ZfsMember { device: "nvme0n1p2".into() }]);
        // Label 1 only (label 0 overwritten), big-endian, on a whole disk.
        let mut head = vec![0u8; 2 * ZFS_LABEL_BYTES];
        let at = ZFS_LABEL_BYTES + ZFS_UBERBLOCK_RING + 127 * 1024;
        head[at..at + 8].copy_from_slice(&ZFS_UBERBLOCK_MAGIC.to_be_bytes());
        fake.write_bytes("dev/nvme1n1", &head);
        assert_eq!(uses_of(&fake, "0000:00:05.0"), [Use::ZfsMember { device: "nvme1n1".into() }]);
        // The magic off an uberblock slot, or outside the ring, is not a label.
        let mut head = vec![0u8; 2 * ZFS_LABEL_BYTES];
        head[ZFS_UBERBLOCK_RING + 8..ZFS_UBERBLOCK_RING + 16]
            .copy_from_slice(&ZFS_UBERBLOCK_MAGIC.to_le_bytes());
        head[1024..1032].copy_from_slice(&ZFS_UBERBLOCK_MAGIC.to_le_bytes());
        assert!(!has_zfs_label(&head));
        assert!(!has_zfs_label(&[]));
    }

    #[test]
    fn a_device_held_exclusively_or_open_is_in_use() {
        let fake = drive_fixture();
        fake.hold_exclusively("nvme0n1p1");
        assert_eq!(uses_of(&fake, "0000:00:04.0"), [Use::Busy { device: "nvme0n1p1".into() }]);
        // Explained by a mount, EBUSY adds nothing.
        fake.write("proc/self/mountinfo", "40 1 259:1 / /data rw - ext4 /dev/nvme0n1p1 rw\n");
        let uses = uses_of(&fake, "0000:00:04.0");
        assert!(matches!(uses.as_slice(), [Use::Mounted { .. }]), "{uses:?}");
        fake.add_open_file(4321, "qemu-system-x86", "/dev/nvme1n1");
        assert_eq!(
            uses_of(&fake, "0000:00:05.0"),
            [Use::OpenBy { device: "nvme1n1".into(), pid: 4321, comm: "qemu-system-x86".into() }]
        );
    }

    #[test]
    fn unreadable_sources_are_findings_not_passes() {
        let fake = drive_fixture();
        fake.remove("proc/swaps");
        let uses = uses_of(&fake, "0000:00:04.0");
        assert!(
            matches!(uses.as_slice(), [Use::Unverified { source, .. }] if source.ends_with("proc/swaps")),
            "{uses:?}"
        );
        assert!(uses[0].explain().contains("proc/swaps could not be read"), "{}", uses[0].explain());
        fake.write("proc/swaps", "Filename Type Size Used Priority\n");
        fake.remove("proc/self/mountinfo");
        std::fs::create_dir(fake.p("proc/self/mountinfo")).unwrap();
        let uses = uses_of(&fake, "0000:00:04.0");
        assert!(
            matches!(uses.as_slice(), [Use::Unverified { source, .. }] if source.ends_with("proc/self/mountinfo")),
            "{uses:?}"
        );
        std::fs::remove_dir(fake.p("proc/self/mountinfo")).unwrap();
        fake.write("proc/self/mountinfo", "");
        // A missing device node cannot be checked either.
        fake.remove("dev/nvme0n1p2");
        let uses = uses_of(&fake, "0000:00:04.0");
        assert!(
            matches!(uses.as_slice(), [Use::Unverified { source, error }]
                if source.ends_with("dev/nvme0n1p2") && error.contains("devtmpfs")),
            "{uses:?}"
        );
        // A missing /proc/mdstat only means md is not loaded.
        assert!(!fake.p("proc/mdstat").exists());
    }
}
