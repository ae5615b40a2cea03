//! What the kernel is doing with a drive: its block devices (namespaces,
//! partitions, device-mapper devices stacked on them) and whether any is
//! mounted, active swap, or the root filesystem.

use super::{sysfs, Bdf, PciFunction, PciSystem};
use crate::error::Result;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// One way a block device is in use.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Use {
    Mounted { device: String, mountpoint: String, fstype: String },
    Swap { device: String },
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
    /// Devices stacked on this one or its partitions (`dm-0` and their mapper names).
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
        let mounts = self.mounts();
        let swaps = self.swaps();
        let mut block_devices = Vec::new();
        for name in self.block_devices_of(&dir)? {
            block_devices.push(self.block_device(&name, &mounts, &swaps));
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

    fn block_device(&self, name: &str, mounts: &[Mount], swaps: &[String]) -> BlockDevice {
        let dir = self.path("sys/block").join(name);
        let size_bytes =
            sysfs::read_optional(&dir.join("size")).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0) * 512;
        let partitions: Vec<String> = sysfs::entries(&dir)
            .unwrap_or_default()
            .into_iter()
            .filter(|p| dir.join(p).join("partition").exists())
            .collect();
        // Every name and device number that stands for this disk: itself, its
        // partitions, and whatever is stacked on either (LVM, dm-crypt, md).
        let mut names: Vec<(String, PathBuf)> = vec![(name.to_string(), dir.clone())];
        names.extend(partitions.iter().map(|p| (p.clone(), dir.join(p))));
        let mut holders = Vec::new();
        let mut i = 0;
        while i < names.len() {
            let node = names[i].1.clone();
            for h in sysfs::entries(&node.join("holders")).unwrap_or_default() {
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
        let mut uses = Vec::new();
        for m in mounts {
            if devnums.contains(&m.dev) || matches(&m.source) {
                uses.push(Use::Mounted {
                    device: m.source.trim_start_matches("/dev/").to_string(),
                    mountpoint: m.mountpoint.clone(),
                    fstype: m.fstype.clone(),
                });
            }
        }
        for s in swaps {
            if matches(s) {
                uses.push(Use::Swap { device: s.trim_start_matches("/dev/").to_string() });
            }
        }
        BlockDevice { name: name.to_string(), size_bytes, partitions, holders, uses }
    }

    /// Mounts from /proc/self/mountinfo, which (unlike /proc/mounts) carries the
    /// device number, so a root mounted as `/dev/root` is still recognised.
    fn mounts(&self) -> Vec<Mount> {
        let text = sysfs::read_optional(&self.path("proc/self/mountinfo")).unwrap_or_default();
        text.lines().filter_map(parse_mountinfo_line).collect()
    }

    /// Device paths of active swap areas from /proc/swaps.
    fn swaps(&self) -> Vec<String> {
        let text = sysfs::read_optional(&self.path("proc/swaps")).unwrap_or_default();
        text.lines().skip(1).filter_map(|l| l.split_whitespace().next()).map(unescape).collect()
    }
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
        fake.add_holder("nvme0n1/nvme0n1p2", "dm-0", "253:0", "vg-home");
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
}
