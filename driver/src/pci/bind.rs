//! Handing NVMe drives to vfio-pci and back, and the VFIO prerequisites.
//!
//! Binding follows the kernel's driver_override protocol
//! (Documentation/ABI/testing/sysfs-bus-pci): pin the function to `vfio-pci`,
//! unbind it from its driver, bind it to `vfio-pci`. Before touching anything
//! it refuses what would hurt or could not work, each refusal saying what to do.

use super::{sysfs, Bdf, DriveInfo, PciFunction, PciSystem};
use crate::error::{DriverError, Result};
use std::path::PathBuf;

const VFIO_PCI: &str = "vfio-pci";

/// Drivers that may hold other functions of a group without making it
/// unusable for VFIO: the kernel's vfio core allows devices with no driver,
/// bound to vfio-pci, or bound to `pcieport` (bridges do no DMA of their own).
const VIABLE_DRIVERS: [&str; 2] = [VFIO_PCI, "pcieport"];

#[derive(Clone, Copy, Debug, Default)]
pub struct BindOptions {
    /// Bind even when the drive is in use (see [`super::Use`]), or whether it is cannot be told.
    pub force: bool,
    /// Also bind functions that are not NVMe controllers: devices whose memory BAR holds KV
    /// memory the drives reach peer to peer (`tutti admin bind --kv-device`; e.g. QEMU's
    /// ivshmem). The IOMMU and group checks apply to them as to drives.
    pub kv_device: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum BindOutcome {
    Bound { previous_driver: Option<String>, iommu_group: Option<u32> },
    AlreadyBound { iommu_group: Option<u32> },
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum UnbindOutcome {
    /// Released by vfio-pci; `driver` is what claimed it afterwards (normally `nvme`).
    Returned { driver: Option<String> },
    /// Not bound to vfio-pci; nothing was changed.
    NotBound { driver: Option<String> },
}

/// What this machine offers for VFIO.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct VfioSupport {
    /// The vfio-pci driver is registered (module loaded or built in).
    pub vfio_pci_loaded: bool,
    /// Some IOMMU group exists: an IOMMU is on.
    pub iommu_enabled: bool,
    /// vfio was loaded with `enable_unsafe_noiommu_mode=1`.
    pub noiommu_enabled: bool,
}

/// Where a bound function's VFIO group file is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VfioGroupPath {
    pub group: u32,
    pub path: PathBuf,
    /// The group was made by vfio's no-IOMMU mode: the device's DMA is not translated.
    pub noiommu: bool,
}

impl PciSystem {
    pub fn vfio_support(&self) -> VfioSupport {
        VfioSupport {
            vfio_pci_loaded: self.path("sys/bus/pci/drivers").join(VFIO_PCI).is_dir(),
            iommu_enabled: !sysfs::entries(&self.path("sys/kernel/iommu_groups"))
                .unwrap_or_default()
                .is_empty(),
            noiommu_enabled: sysfs::read_optional(
                &self.path("sys/module/vfio/parameters/enable_unsafe_noiommu_mode"),
            )
            .is_some_and(|v| v == "Y" || v == "1"),
        }
    }

    /// Everything that must hold before `bdf` may be bound, given that the
    /// functions in `together` are being bound in the same command.
    pub fn check_bindable(&self, bdf: &Bdf, together: &[Bdf], opts: BindOptions) -> Result<DriveInfo> {
        let drive = self.drive(bdf)?;
        let f = &drive.function;
        let kv_device_ok = opts.kv_device && f.class >> 16 != 0x06; // 0x06: bridges
        if !f.is_nvme() && !kv_device_ok {
            return Err(DriverError::Vfio(format!(
                "{bdf} is a {} (class {:#08x}), not an NVMe controller (class 0x010802); tutti only \
                 binds NVMe drives, and with --kv-device the device holding KV memory (never a \
                 bridge) — check the address with `tutti admin list`",
                f.kind(),
                f.class
            )));
        }
        if f.driver.as_deref() == Some(VFIO_PCI) {
            return Ok(drive);
        }
        let support = self.vfio_support();
        if !support.vfio_pci_loaded {
            return Err(DriverError::Vfio(format!(
                "cannot bind {bdf}: the vfio-pci driver is not loaded; run `modprobe vfio-pci` as root \
                 (and add vfio-pci to /etc/modules-load.d/ to keep it across reboots)"
            )));
        }
        if f.iommu_group.is_none() && !support.noiommu_enabled {
            return Err(DriverError::Vfio(format!(
                "cannot bind {bdf}: it has no IOMMU group, so the IOMMU is off; enable VT-d / AMD-Vi in \
                 the firmware and boot with intel_iommu=on (or amd_iommu=on), or, for testing only and \
                 with no protection against stray DMA, `modprobe vfio enable_unsafe_noiommu_mode=1` and \
                 use --noiommu"
            )));
        }
        let uses: Vec<String> = drive.uses().map(|u| u.explain()).collect();
        if !uses.is_empty() && !opts.force {
            return Err(DriverError::Vfio(format!(
                "refusing to bind {bdf}: {}; pass --force to take it from the kernel anyway (everything \
                 on it becomes unreachable)",
                uses.join("; ")
            )));
        }
        if let Some(group) = f.iommu_group {
            self.check_viable(bdf, group, together)?;
        }
        Ok(drive)
    }

    /// A group is usable only when every function in it is bound to vfio-pci,
    /// to a bridge driver, or to nothing (or is being bound with it).
    fn check_viable(&self, bdf: &Bdf, group: u32, together: &[Bdf]) -> Result<()> {
        let blockers: Vec<PciFunction> = self
            .group_members(group)?
            .into_iter()
            .filter(|m| m.bdf != *bdf && !together.contains(&m.bdf))
            .filter(|m| m.driver.as_deref().is_some_and(|d| !VIABLE_DRIVERS.contains(&d)))
            .collect();
        if blockers.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = blockers
            .iter()
            .map(|m| format!("{} ({}, bound to {})", m.bdf, m.kind(), m.driver.as_deref().unwrap_or("-")))
            .collect();
        Err(DriverError::Vfio(format!(
            "refusing to bind {bdf}: its IOMMU group {group} is not viable for VFIO because it also holds \
             {}; every device in a group must be bound to vfio-pci or to no driver. Unbind those devices \
             from their drivers (or bind them together with this one), or move the drive to a slot with \
             its own IOMMU group (`ls /sys/kernel/iommu_groups/{group}/devices`)",
            names.join(", ")
        )))
    }

    /// Binds each function to vfio-pci. Every function is checked before any
    /// is touched; a function whose check fails is left alone.
    pub fn bind(&self, bdfs: &[Bdf], opts: BindOptions) -> Vec<(Bdf, Result<BindOutcome>)> {
        // A function refused for its own reasons cannot make a group viable for
        // its neighbours: recheck until the accepted set stops shrinking.
        let mut accepted: Vec<Bdf> = bdfs.to_vec();
        loop {
            let next: Vec<Bdf> = accepted
                .iter()
                .filter(|b| self.check_bindable(b, &accepted, opts).is_ok())
                .cloned()
                .collect();
            if next.len() == accepted.len() {
                break;
            }
            accepted = next;
        }
        bdfs.iter()
            .map(|bdf| {
                let result = if accepted.contains(bdf) {
                    self.bind_one(bdf)
                } else {
                    // Refused against a larger set, so refused against this one too.
                    match self.check_bindable(bdf, &accepted, opts) {
                        Err(e) => Err(e),
                        Ok(_) => Err(DriverError::Vfio(format!("{bdf}: refused with its IOMMU group"))),
                    }
                };
                (bdf.clone(), result)
            })
            .collect()
    }

    fn bind_one(&self, bdf: &Bdf) -> Result<BindOutcome> {
        let f = self.function(bdf)?;
        if f.driver.as_deref() == Some(VFIO_PCI) {
            return Ok(BindOutcome::AlreadyBound { iommu_group: f.iommu_group });
        }
        let dir = self.device_dir(bdf);
        // The override comes first: it is harmless on its own, and a permission
        // problem surfaces before the drive has been taken from its driver.
        self.write_attr(&dir.join("driver_override"), VFIO_PCI)?;
        if f.driver.is_some() {
            if let Err(e) = self.write_attr(&dir.join("driver/unbind"), bdf.as_str()) {
                self.restore(bdf);
                return Err(e);
            }
        }
        let bound = self.write_attr(&self.path("sys/bus/pci/drivers/vfio-pci/bind"), bdf.as_str());
        let now = self.function(bdf).ok().and_then(|f| f.driver);
        if now.as_deref() != Some(VFIO_PCI) {
            self.restore(bdf);
            let why = match bound {
                Err(e) => e.to_string(),
                Ok(()) => format!("the kernel accepted the bind but the function is bound to {now:?}"),
            };
            return Err(DriverError::Vfio(format!(
                "binding {bdf} to vfio-pci failed: {why}; it was handed back to the kernel (see dmesg)"
            )));
        }
        tracing::info!(%bdf, previous = ?f.driver, group = ?f.iommu_group, "bound to vfio-pci");
        Ok(BindOutcome::Bound { previous_driver: f.driver, iommu_group: f.iommu_group })
    }

    /// Best effort after a failed bind: drop the override and let the kernel reprobe.
    fn restore(&self, bdf: &Bdf) {
        let dir = self.device_dir(bdf);
        let _ = self.write_attr(&dir.join("driver_override"), "\n");
        if self.function(bdf).is_ok_and(|f| f.driver.is_none()) {
            let _ = self.write_attr(&self.path("sys/bus/pci/drivers_probe"), bdf.as_str());
        }
    }

    /// Gives each function back to the kernel: unbind from vfio-pci, clear the
    /// override, and reprobe so `nvme` claims it.
    pub fn unbind(&self, bdfs: &[Bdf]) -> Vec<(Bdf, Result<UnbindOutcome>)> {
        bdfs.iter().map(|b| (b.clone(), self.unbind_one(b))).collect()
    }

    fn unbind_one(&self, bdf: &Bdf) -> Result<UnbindOutcome> {
        let f = self.function(bdf)?;
        if !f.is_nvme() {
            return Err(DriverError::Vfio(format!(
                "{bdf} is a {} (class {:#08x}), not an NVMe controller; tutti only unbinds NVMe drives",
                f.kind(),
                f.class
            )));
        }
        if f.driver.as_deref() != Some(VFIO_PCI) {
            return Ok(UnbindOutcome::NotBound { driver: f.driver });
        }
        if let Some(group) = f.iommu_group {
            let users = self.group_users(group);
            if !users.is_empty() {
                let who: Vec<String> =
                    users.iter().map(|(pid, comm)| format!("pid {pid} ({comm})")).collect();
                // The kernel would block the unbind until they close the device.
                return Err(DriverError::Vfio(format!(
                    "{bdf} is in use through /dev/vfio/{group} by {}; stop that first",
                    who.join(", ")
                )));
            }
        }
        let dir = self.device_dir(bdf);
        self.write_attr(&dir.join("driver/unbind"), bdf.as_str())?;
        self.write_attr(&dir.join("driver_override"), "\n")?;
        self.write_attr(&self.path("sys/bus/pci/drivers_probe"), bdf.as_str())?;
        let driver = self.function(bdf)?.driver;
        if driver.is_none() {
            tracing::warn!(%bdf, "released by vfio-pci but no driver claimed it (is the nvme module loaded?)");
        }
        tracing::info!(%bdf, ?driver, "returned to the kernel");
        Ok(UnbindOutcome::Returned { driver })
    }

    /// Processes holding `/dev/vfio/<group>` open, as (pid, command name).
    pub fn group_users(&self, group: u32) -> Vec<(u32, String)> {
        let target = format!("/dev/vfio/{group}");
        let proc_dir = self.path("proc");
        let mut users = Vec::new();
        for pid in sysfs::entries(&proc_dir).unwrap_or_default() {
            let Ok(n) = pid.parse::<u32>() else { continue };
            let fd_dir = proc_dir.join(&pid).join("fd");
            let holds = sysfs::entries(&fd_dir).unwrap_or_default().iter().any(|fd| {
                std::fs::read_link(fd_dir.join(fd)).is_ok_and(|t| t.to_str() == Some(target.as_str()))
            });
            if holds {
                let comm = sysfs::read_optional(&proc_dir.join(&pid).join("comm")).unwrap_or_default();
                users.push((n, comm));
            }
        }
        users
    }

    /// The VFIO group file of a function bound to vfio-pci.
    pub fn vfio_group(&self, bdf: &Bdf) -> Result<VfioGroupPath> {
        let f = self.function(bdf)?;
        if f.driver.as_deref() != Some(VFIO_PCI) {
            let now = f.driver.as_deref().map_or("no driver".to_string(), |d| format!("bound to {d}"));
            return Err(DriverError::Vfio(format!(
                "{bdf} is {now}, not to vfio-pci; run `tutti admin bind {bdf}` first"
            )));
        }
        let group = f.iommu_group.ok_or_else(|| {
            DriverError::Vfio(format!("{bdf} is bound to vfio-pci but has no IOMMU group (kernel bug?)"))
        })?;
        let dev = self.path("dev/vfio");
        let plain = dev.join(group.to_string());
        let noiommu = dev.join(format!("noiommu-{group}"));
        if plain.exists() {
            Ok(VfioGroupPath { group, path: plain, noiommu: false })
        } else if noiommu.exists() {
            Ok(VfioGroupPath { group, path: noiommu, noiommu: true })
        } else {
            Err(DriverError::Vfio(format!(
                "{bdf}: neither {} nor {} exists; is /dev mounted (devtmpfs) and udev running?",
                plain.display(),
                noiommu.display()
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake::FakeSys;
    use super::super::NVME_CLASS;
    use super::*;

    fn bdf(s: &str) -> Bdf {
        s.parse().unwrap()
    }

    /// Two drives in their own groups, a host bridge, and a drive sharing a
    /// group with a virtio device behind a PCI bridge.
    fn machine() -> FakeSys {
        let fake = FakeSys::new();
        fake.add_driver("vfio-pci");
        fake.add_function("0000:00:00.0", 0x060000, None, Some(0));
        fake.add_function("0000:00:04.0", NVME_CLASS, Some("nvme"), Some(1));
        fake.add_controller("0000:00:04.0", "nvme0", "QEMU NVMe Ctrl", "tutti0");
        fake.add_disk("0000:00:04.0", "nvme0", "nvme0n1", "259:0", 2048, &[("nvme0n1p1", "259:1")]);
        fake.add_function("0000:00:05.0", NVME_CLASS, Some("nvme"), Some(2));
        fake.add_function("0000:00:06.0", 0x060400, None, Some(3));
        fake.add_function("0000:01:01.0", NVME_CLASS, Some("nvme"), Some(3));
        fake.add_function("0000:01:02.0", 0x00ff00, Some("virtio-pci"), Some(3));
        fake
    }

    fn err_of(results: Vec<(Bdf, Result<BindOutcome>)>) -> String {
        results.into_iter().next().unwrap().1.unwrap_err().to_string()
    }

    #[test]
    fn binds_and_unbinds_a_drive() {
        let fake = machine();
        let sys = fake.system();
        let out = sys.bind(&[bdf("0000:00:04.0"), bdf("0000:00:05.0")], BindOptions::default());
        for (b, r) in &out {
            assert_eq!(
                r.as_ref().unwrap(),
                &BindOutcome::Bound {
                    previous_driver: Some("nvme".into()),
                    iommu_group: sys.function(b).unwrap().iommu_group
                }
            );
        }
        assert_eq!(fake.driver("0000:00:04.0").as_deref(), Some("vfio-pci"));
        let override_ = sys.function(&bdf("0000:00:04.0")).unwrap().driver_override;
        assert_eq!(override_.as_deref(), Some("vfio-pci"));
        let g = sys.vfio_group(&bdf("0000:00:04.0")).unwrap();
        assert_eq!((g.group, g.noiommu), (1, false));
        // Binding again changes nothing.
        let again = sys.bind(&[bdf("0000:00:04.0")], BindOptions::default());
        assert_eq!(again[0].1.as_ref().unwrap(), &BindOutcome::AlreadyBound { iommu_group: Some(1) });

        let back = sys.unbind(&[bdf("0000:00:04.0")]);
        assert_eq!(back[0].1.as_ref().unwrap(), &UnbindOutcome::Returned { driver: Some("nvme".into()) });
        assert_eq!(sys.function(&bdf("0000:00:04.0")).unwrap().driver_override, None);
        let not = sys.unbind(&[bdf("0000:00:04.0")]);
        assert_eq!(not[0].1.as_ref().unwrap(), &UnbindOutcome::NotBound { driver: Some("nvme".into()) });
        let e = sys.vfio_group(&bdf("0000:00:04.0")).unwrap_err().to_string();
        assert!(e.contains("run `tutti admin bind 0000:00:04.0` first"), "{e}");
    }

    #[test]
    fn refuses_a_device_that_is_not_nvme() {
        let fake = machine();
        let e =
            err_of(fake.system().bind(&[bdf("0000:00:00.0")], BindOptions { force: true, kv_device: true }));
        assert!(e.contains("0000:00:00.0 is a host bridge (class 0x060000), not an NVMe controller"), "{e}");
        assert!(e.contains("tutti admin list"), "{e}");
        let e = fake.system().unbind(&[bdf("0000:01:02.0")]).remove(0).1.unwrap_err().to_string();
        assert!(e.contains("not an NVMe controller"), "{e}");
    }

    #[test]
    fn refuses_a_group_that_is_not_viable() {
        let fake = machine();
        let e = err_of(
            fake.system().bind(&[bdf("0000:01:01.0")], BindOptions { force: true, ..Default::default() }),
        );
        assert!(e.contains("IOMMU group 3 is not viable"), "{e}");
        // The other device is named with its driver; the bridge (no driver) is not a blocker.
        assert!(e.contains("0000:01:02.0 (device, bound to virtio-pci)"), "{e}");
        assert!(!e.contains("0000:00:06.0"), "{e}");
        assert!(e.contains("Unbind those devices"), "{e}");
        assert_eq!(fake.driver("0000:01:01.0").as_deref(), Some("nvme"), "nothing was touched");
        // With the neighbour released from its driver the group is viable.
        fake.set_driver("0000:01:02.0", None);
        let ok = fake.system().bind(&[bdf("0000:01:01.0")], BindOptions::default());
        assert!(ok[0].1.is_ok(), "{:?}", ok[0].1);
    }

    #[test]
    fn neighbours_bound_together_keep_a_group_viable() {
        let fake = FakeSys::new();
        fake.add_driver("vfio-pci");
        fake.add_function("0000:02:00.0", NVME_CLASS, Some("nvme"), Some(7));
        fake.add_function("0000:02:00.1", NVME_CLASS, Some("nvme"), Some(7));
        let sys = fake.system();
        let alone = sys.bind(&[bdf("0000:02:00.0")], BindOptions::default());
        assert!(alone[0].1.is_err());
        let both = sys.bind(&[bdf("0000:02:00.0"), bdf("0000:02:00.1")], BindOptions::default());
        assert!(both.iter().all(|(_, r)| r.is_ok()), "{both:?}");
    }

    #[test]
    fn a_refused_neighbour_does_not_make_a_group_viable() {
        let fake = FakeSys::new();
        fake.add_driver("vfio-pci");
        fake.add_function("0000:02:00.0", NVME_CLASS, Some("nvme"), Some(7));
        fake.add_function("0000:02:00.1", NVME_CLASS, Some("nvme"), Some(7));
        fake.add_controller("0000:02:00.1", "nvme1", "m", "s");
        fake.add_disk("0000:02:00.1", "nvme1", "nvme1n1", "259:5", 100, &[]);
        fake.write("proc/self/mountinfo", "9 1 259:5 / /srv rw - ext4 /dev/nvme1n1 rw\n");
        let out = fake.system().bind(&[bdf("0000:02:00.0"), bdf("0000:02:00.1")], BindOptions::default());
        let e0 = out[0].1.as_ref().unwrap_err().to_string();
        let e1 = out[1].1.as_ref().unwrap_err().to_string();
        assert!(e1.contains("mounted at /srv"), "{e1}");
        assert!(e0.contains("not viable") && e0.contains("0000:02:00.1"), "{e0}");
        assert_eq!(fake.driver("0000:02:00.0").as_deref(), Some("nvme"));
    }

    #[test]
    fn refuses_mounted_swap_and_root_unless_forced() {
        let fake = machine();
        fake.write("proc/self/mountinfo", "40 1 259:1 / /data rw - ext4 /dev/nvme0n1p1 rw\n");
        let e = err_of(fake.system().bind(&[bdf("0000:00:04.0")], BindOptions::default()));
        assert!(e.contains("nvme0n1p1 is mounted at /data (ext4)") && e.contains("--force"), "{e}");
        assert_eq!(fake.driver("0000:00:04.0").as_deref(), Some("nvme"));

        fake.write("proc/self/mountinfo", "1 0 259:1 / / rw - ext4 /dev/root rw\n");
        let e = err_of(fake.system().bind(&[bdf("0000:00:04.0")], BindOptions::default()));
        assert!(e.contains("holds the root filesystem"), "{e}");

        fake.write("proc/self/mountinfo", "");
        fake.write("proc/swaps", "Filename Type Size Used Priority\n/dev/nvme0n1p1 partition 1 0 -2\n");
        let e = err_of(fake.system().bind(&[bdf("0000:00:04.0")], BindOptions::default()));
        assert!(e.contains("swapoff /dev/nvme0n1p1"), "{e}");

        let forced =
            fake.system().bind(&[bdf("0000:00:04.0")], BindOptions { force: true, ..Default::default() });
        assert!(forced[0].1.is_ok());
        assert_eq!(fake.driver("0000:00:04.0").as_deref(), Some("vfio-pci"));
    }

    #[test]
    fn refuses_raid_lvm_zfs_busy_and_unverifiable_drives_unless_forced() {
        type Setup = fn(&FakeSys);
        let cases: [(&str, Setup, &str); 7] = [
            (
                "md member",
                |f| f.add_md(&["nvme0n1/nvme0n1p1"], "md5", "9:5"),
                "member of the md RAID array md5",
            ),
            (
                "LVM",
                |f| f.add_holder("nvme0n1", "dm-2", "253:2", "vg0-lv", "LVM-q"),
                "nvme0n1 is under an LVM logical volume dm-2",
            ),
            (
                "ZFS",
                |f| {
                    let mut head = vec![0u8; 512 << 10];
                    head[128 << 10..(128 << 10) + 8].copy_from_slice(&0x00ba_b10c_u64.to_le_bytes());
                    f.write_bytes("dev/nvme0n1p1", &head);
                },
                "nvme0n1p1 carries ZFS labels",
            ),
            ("O_EXCL", |f| f.hold_exclusively("nvme0n1"), "refused an exclusive open with EBUSY"),
            ("open", |f| f.add_open_file(99, "fio", "/dev/nvme0n1p1"), "nvme0n1p1 is open by pid 99 (fio)"),
            ("no /proc/swaps", |f| f.remove("proc/swaps"), "proc/swaps could not be read"),
            ("no mountinfo", |f| f.remove("proc/self/mountinfo"), "proc/self/mountinfo could not be read"),
        ];
        for (what, setup, want) in cases {
            let fake = machine();
            setup(&fake);
            let e = err_of(fake.system().bind(&[bdf("0000:00:04.0")], BindOptions::default()));
            assert!(e.contains("refusing to bind 0000:00:04.0") && e.contains(want), "{what}: {e}");
            assert_eq!(fake.driver("0000:00:04.0").as_deref(), Some("nvme"), "{what}: left alone");
            let forced =
                fake.system().bind(&[bdf("0000:00:04.0")], BindOptions { force: true, ..Default::default() });
            assert!(forced[0].1.is_ok(), "{what}: {:?}", forced[0].1);
        }
    }

    #[test]
    fn explains_missing_vfio_pci_and_iommu() {
        let fake = FakeSys::new();
        fake.add_function("0000:00:04.0", NVME_CLASS, Some("nvme"), None);
        let e = err_of(fake.system().bind(&[bdf("0000:00:04.0")], BindOptions::default()));
        assert!(e.contains("vfio-pci driver is not loaded") && e.contains("modprobe vfio-pci"), "{e}");
        fake.add_driver("vfio-pci");
        let e = err_of(fake.system().bind(&[bdf("0000:00:04.0")], BindOptions::default()));
        assert!(e.contains("no IOMMU group") && e.contains("intel_iommu=on"), "{e}");
        assert!(e.contains("enable_unsafe_noiommu_mode=1"), "{e}");
        fake.write("sys/module/vfio/parameters/enable_unsafe_noiommu_mode", "Y\n");
        assert!(fake.system().vfio_support().noiommu_enabled);
        let ok = fake.system().bind(&[bdf("0000:00:04.0")], BindOptions::default());
        assert!(ok[0].1.is_ok(), "{:?}", ok[0].1);
    }

    #[test]
    fn refuses_to_unbind_a_device_in_use() {
        let fake = machine();
        let sys = fake.system();
        assert!(sys.bind(&[bdf("0000:00:05.0")], BindOptions::default())[0].1.is_ok());
        fake.add_group_user(4242, "tutti", 2);
        let e = sys.unbind(&[bdf("0000:00:05.0")]).remove(0).1.unwrap_err().to_string();
        assert!(e.contains("in use through /dev/vfio/2 by pid 4242 (tutti)"), "{e}");
        assert_eq!(fake.driver("0000:00:05.0").as_deref(), Some("vfio-pci"));
    }

    #[test]
    fn failed_bind_is_rolled_back() {
        let fake = machine();
        // A vfio-pci directory without a bind attribute: the write fails.
        std::fs::remove_file(fake.p("sys/bus/pci/drivers/vfio-pci/bind")).unwrap();
        let e = err_of(fake.system().bind(&[bdf("0000:00:05.0")], BindOptions::default()));
        assert!(e.contains("binding 0000:00:05.0 to vfio-pci failed"), "{e}");
        assert_eq!(fake.driver("0000:00:05.0").as_deref(), Some("nvme"), "handed back to nvme");
        assert_eq!(fake.system().function(&bdf("0000:00:05.0")).unwrap().driver_override, None);
    }
}
