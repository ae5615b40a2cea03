//! A fake sysfs/procfs tree in a temporary directory, and a stand-in for the
//! kernel's reaction to writes into it (bind, unbind, driver_override).

use super::PciSystem;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The tree; removed when dropped.
pub struct FakeSys(Tree);

/// Helpers over a fake tree at `root`.
pub struct Tree {
    pub root: PathBuf,
}

impl Drop for FakeSys {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0.root);
    }
}

impl std::ops::Deref for FakeSys {
    type Target = Tree;
    fn deref(&self) -> &Tree {
        &self.0
    }
}

fn mkdir(p: &Path) {
    std::fs::create_dir_all(p).unwrap();
}

fn put(p: &Path, text: &str) {
    mkdir(p.parent().unwrap());
    std::fs::write(p, text).unwrap();
}

impl FakeSys {
    pub fn new() -> FakeSys {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let root = std::env::temp_dir().join(format!(
            "tutti-fakesys-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&root);
        for d in ["sys/bus/pci/devices", "sys/kernel/iommu_groups", "sys/block", "proc/self", "dev/vfio"] {
            mkdir(&root.join(d));
        }
        put(&root.join("sys/bus/pci/drivers_probe"), "");
        // A machine with nothing mounted and no swap.
        put(&root.join("proc/self/mountinfo"), "");
        put(&root.join("proc/swaps"), "Filename\tType\tSize\tUsed\tPriority\n");
        let fake = FakeSys(Tree { root });
        fake.add_driver("nvme");
        fake
    }

    /// A `PciSystem` over this tree whose writes move driver links like the kernel does.
    pub fn system(&self) -> PciSystem {
        let root = self.root.clone();
        let mut sys = PciSystem::with_root(&self.root);
        sys.on_write = Some(Arc::new(move |path: &Path, value: &str| kernel(&root, path, value)));
        let held = self.p("dev/.held");
        sys.on_open_exclusive = Some(Arc::new(move |node: &Path| match node.file_name() {
            Some(n) if held.join(n).exists() => Err(std::io::Error::from_raw_os_error(libc::EBUSY)),
            _ => Ok(()),
        }));
        sys
    }
}

impl Tree {
    pub fn p(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    pub fn write(&self, rel: &str, text: &str) {
        put(&self.p(rel), text);
    }

    pub fn write_bytes(&self, rel: &str, bytes: &[u8]) {
        mkdir(self.p(rel).parent().unwrap());
        std::fs::write(self.p(rel), bytes).unwrap();
    }

    pub fn remove(&self, rel: &str) {
        std::fs::remove_file(self.p(rel)).unwrap();
    }

    /// Makes the kernel refuse exclusive opens of `/dev/<name>` (EBUSY).
    pub fn hold_exclusively(&self, name: &str) {
        put(&self.p("dev/.held").join(name), "");
    }

    pub fn add_driver(&self, name: &str) {
        let dir = self.p("sys/bus/pci/drivers").join(name);
        put(&dir.join("bind"), "");
        put(&dir.join("unbind"), "");
    }

    pub fn dev_dir(&self, bdf: &str) -> PathBuf {
        self.p("sys/devices/pci0000:00").join(bdf)
    }

    /// A function with a driver link and an IOMMU group, as the kernel lays them out.
    pub fn add_function(&self, bdf: &str, class: u32, driver: Option<&str>, group: Option<u32>) {
        let dir = self.dev_dir(bdf);
        put(&dir.join("vendor"), "0x1b36\n");
        put(&dir.join("device"), "0x0010\n");
        put(&dir.join("class"), &format!("{class:#08x}\n"));
        put(&dir.join("driver_override"), "(null)\n");
        symlink(&dir, self.p("sys/bus/pci/devices").join(bdf)).unwrap();
        if let Some(drv) = driver {
            self.set_driver(bdf, Some(drv));
        }
        if let Some(g) = group {
            let gdir = self.p("sys/kernel/iommu_groups").join(g.to_string());
            mkdir(&gdir.join("devices"));
            symlink(&dir, gdir.join("devices").join(bdf)).unwrap();
            symlink(&gdir, dir.join("iommu_group")).unwrap();
        }
    }

    pub fn set_driver(&self, bdf: &str, driver: Option<&str>) {
        let link = self.dev_dir(bdf).join("driver");
        let _ = std::fs::remove_file(&link);
        if let Some(drv) = driver {
            let ddir = self.p("sys/bus/pci/drivers").join(drv);
            if !ddir.exists() {
                self.add_driver(drv);
            }
            symlink(ddir, link).unwrap();
        }
    }

    pub fn driver(&self, bdf: &str) -> Option<String> {
        std::fs::read_link(self.dev_dir(bdf).join("driver"))
            .ok()
            .map(|t| t.file_name().unwrap().to_string_lossy().into_owned())
    }

    pub fn add_controller(&self, bdf: &str, ctrl: &str, model: &str, serial: &str) {
        let dir = self.dev_dir(bdf).join("nvme").join(ctrl);
        put(&dir.join("model"), &format!("{model:<40}\n"));
        put(&dir.join("serial"), &format!("{serial:<20}\n"));
        put(&dir.join("firmware_rev"), "7.2\n");
    }

    /// A namespace disk below its controller (single path), with partitions.
    pub fn add_disk(
        &self,
        bdf: &str,
        ctrl: &str,
        disk: &str,
        dev: &str,
        sectors: u64,
        parts: &[(&str, &str)],
    ) {
        let dir = self.dev_dir(bdf).join("nvme").join(ctrl).join(disk);
        put(&dir.join("size"), &format!("{sectors}\n"));
        put(&dir.join("dev"), &format!("{dev}\n"));
        mkdir(&dir.join("holders"));
        put(&self.p("dev").join(disk), "");
        for (p, pdev) in parts {
            put(&dir.join(p).join("partition"), "1\n");
            put(&dir.join(p).join("dev"), &format!("{pdev}\n"));
            mkdir(&dir.join(p).join("holders"));
            put(&self.p("dev").join(p), "");
        }
        symlink(&dir, self.p("sys/block").join(disk)).unwrap();
    }

    /// A multipath head disk that lives under its nvme-subsystem.
    pub fn add_multipath_disk(
        &self,
        bdf: &str,
        ctrl: &str,
        subsys: &str,
        disk: &str,
        dev: &str,
        sectors: u64,
    ) {
        let sdir = self.p("sys/devices/virtual/nvme-subsystem").join(subsys);
        let dir = sdir.join(disk);
        put(&dir.join("size"), &format!("{sectors}\n"));
        put(&dir.join("dev"), &format!("{dev}\n"));
        put(&self.p("dev").join(disk), "");
        symlink(self.dev_dir(bdf).join("nvme").join(ctrl), sdir.join(ctrl)).unwrap();
        symlink(&dir, self.p("sys/block").join(disk)).unwrap();
    }

    /// A device-mapper device stacked on `under` (`disk` or `disk/partition`),
    /// with its dm UUID (`LVM-…`, `CRYPT-…`).
    pub fn add_holder(&self, under: &str, dm: &str, dev: &str, mapper_name: &str, uuid: &str) {
        let dir = self.stacked(&[under], dm, dev);
        put(&dir.join("dm/name"), &format!("{mapper_name}\n"));
        put(&dir.join("dm/uuid"), &format!("{uuid}\n"));
    }

    /// An assembled md array over `members` (`disk` or `disk/partition`).
    pub fn add_md(&self, members: &[&str], md: &str, dev: &str) {
        let dir = self.stacked(members, md, dev);
        put(&dir.join("md/level"), "raid1\n");
    }

    /// A virtual block device stacked on `under`: `holders/` links below them,
    /// `slaves/` links below it, its /sys/block entry and its device node.
    fn stacked(&self, under: &[&str], name: &str, dev: &str) -> PathBuf {
        let dir = self.p("sys/devices/virtual/block").join(name);
        put(&dir.join("dev"), &format!("{dev}\n"));
        for u in under {
            let base = std::fs::canonicalize(self.p("sys/block").join(u.split('/').next().unwrap())).unwrap();
            let node = match u.split_once('/') {
                Some((_, part)) => base.join(part),
                None => base,
            };
            mkdir(&node.join("holders"));
            symlink(&dir, node.join("holders").join(name)).unwrap();
            mkdir(&dir.join("slaves"));
            symlink(&node, dir.join("slaves").join(node.file_name().unwrap())).unwrap();
        }
        symlink(&dir, self.p("sys/block").join(name)).unwrap();
        put(&self.p("dev").join(name), "");
        dir
    }

    /// A process holding the VFIO group file `/dev/vfio/<group>` open.
    pub fn add_group_user(&self, pid: u32, comm: &str, group: u32) {
        self.add_open_file(pid, comm, &format!("/dev/vfio/{group}"));
    }

    /// A process holding `target` (e.g. `/dev/nvme0n1`) open.
    pub fn add_open_file(&self, pid: u32, comm: &str, target: &str) {
        let dir = self.p("proc").join(pid.to_string());
        put(&dir.join("comm"), &format!("{comm}\n"));
        mkdir(&dir.join("fd"));
        let fd = std::fs::read_dir(dir.join("fd")).unwrap().count() + 3;
        symlink(target, dir.join("fd").join(fd.to_string())).unwrap();
    }
}

/// What the kernel does for a write to a bind-related attribute.
fn kernel(root: &Path, path: &Path, value: &str) {
    let fake = Tree { root: root.to_path_buf() };
    let file = path.file_name().unwrap().to_string_lossy().into_owned();
    let bdf = value.trim();
    match file.as_str() {
        "driver_override" => {
            std::fs::write(path, format!("{}\n", if bdf.is_empty() { "(null)" } else { bdf })).unwrap();
        }
        "unbind" => fake.set_driver(bdf, None),
        "bind" => {
            let drv = path.parent().unwrap().file_name().unwrap().to_string_lossy().into_owned();
            fake.set_driver(bdf, Some(&drv));
            if drv == "vfio-pci" {
                if let Ok(g) = std::fs::read_link(fake.dev_dir(bdf).join("iommu_group")) {
                    put(&root.join("dev/vfio").join(g.file_name().unwrap()), "");
                }
            }
        }
        "drivers_probe" => {
            let ov = std::fs::read_to_string(fake.dev_dir(bdf).join("driver_override")).unwrap();
            let ov = ov.trim();
            let drv = if ov == "(null)" || ov.is_empty() { "nvme" } else { ov };
            if root.join("sys/bus/pci/drivers").join(drv).exists() {
                fake.set_driver(bdf, Some(drv));
            }
        }
        _ => {}
    }
}
