//! PCI functions as Linux shows them in sysfs: what is there, which driver
//! holds it, which IOMMU group it is in, and moving NVMe drives between the
//! kernel's `nvme` driver and `vfio-pci`.
//!
//! Everything goes through a [`PciSystem`] rooted at `/` on a real machine, or
//! at a directory holding a fake `sys/`, `proc/` and `dev/` tree in tests.
//!
//! - [`usage`]: block devices of a drive and every way one is in use (mounted, swap,
//!   root, md RAID, device-mapper/LVM, ZFS, held open by a process).
//! - [`bind`]: `bind`/`unbind` with the checks that make them safe, and the
//!   VFIO prerequisites (module, IOMMU, group viability) with errors saying what to do.

pub mod bind;
mod sysfs;
pub mod usage;

#[cfg(test)]
mod fake;

pub use bind::{BindOptions, BindOutcome, UnbindOutcome, VfioSupport};
pub use usage::{BlockDevice, DriveInfo, Use};

use crate::error::{DriverError, Result};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// PCI class code of an NVM Express I/O controller: mass storage (01h),
/// non-volatile memory (08h), NVMe programming interface (02h).
pub const NVME_CLASS: u32 = 0x01_08_02;

/// A PCI address, `domain:bus:device.function`, always printed in the long form.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(into = "String")]
pub struct Bdf(String);

impl Bdf {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for Bdf {
    type Err = DriverError;

    /// Accepts `0000:00:04.0` and the short `00:04.0` (domain 0), any case.
    fn from_str(s: &str) -> Result<Bdf> {
        let bad = || {
            DriverError::invalid(format!(
                "{s:?} is not a PCI address: expected domain:bus:device.function, e.g. 0000:00:04.0"
            ))
        };
        let lower = s.trim().to_ascii_lowercase();
        let parts: Vec<&str> = lower.split(':').collect();
        let (domain, bus, devfn) = match parts.as_slice() {
            [bus, devfn] => ("0000", *bus, *devfn),
            [domain, bus, devfn] => (*domain, *bus, *devfn),
            _ => return Err(bad()),
        };
        let (dev, func) = devfn.split_once('.').ok_or_else(bad)?;
        let hex = |t: &str, min: usize, max: usize| {
            t.len() >= min && t.len() <= max && t.bytes().all(|b| b.is_ascii_hexdigit())
        };
        if !hex(domain, 4, 8) || !hex(bus, 2, 2) || !hex(dev, 2, 2) || !hex(func, 1, 1) {
            return Err(bad());
        }
        let (d, f) = (u8::from_str_radix(dev, 16).map_err(|_| bad())?, func.as_bytes()[0] - b'0');
        if d > 0x1f || f > 7 {
            return Err(bad());
        }
        Ok(Bdf(format!("{domain}:{bus}:{dev}.{func}")))
    }
}

impl fmt::Display for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.0)
    }
}

impl fmt::Debug for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<Bdf> for String {
    fn from(b: Bdf) -> String {
        b.0
    }
}

/// One PCI function as sysfs describes it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PciFunction {
    pub bdf: Bdf,
    pub vendor: u16,
    pub device: u16,
    /// 24-bit class code: base class, subclass, programming interface.
    pub class: u32,
    /// The driver bound now (`nvme`, `vfio-pci`), if any.
    pub driver: Option<String>,
    /// The driver this function is pinned to by `driver_override`, if any.
    pub driver_override: Option<String>,
    pub iommu_group: Option<u32>,
}

impl PciFunction {
    pub fn is_nvme(&self) -> bool {
        self.class == NVME_CLASS
    }

    /// What kind of device this is, for messages ("host bridge", "NVMe controller").
    pub fn kind(&self) -> &'static str {
        class_name(self.class)
    }
}

/// A rough name for a PCI class code (PCI Code and ID Assignment specification).
pub fn class_name(class: u32) -> &'static str {
    match (class >> 16, (class >> 8) & 0xff, class & 0xff) {
        (0x01, 0x08, 0x02) => "NVMe controller",
        (0x01, 0x08, _) => "non-volatile memory controller (not NVMe)",
        (0x01, 0x06, _) => "SATA controller",
        (0x01, 0x00, _) => "SCSI controller",
        (0x01, _, _) => "mass storage controller",
        (0x02, _, _) => "network controller",
        (0x03, _, _) => "display controller",
        (0x06, 0x00, _) => "host bridge",
        (0x06, 0x01, _) => "ISA bridge",
        (0x06, 0x04, _) => "PCI bridge",
        (0x06, _, _) => "bridge",
        (0x0c, 0x03, _) => "USB controller",
        (0x0c, 0x05, _) => "SMBus controller",
        (0x0c, _, _) => "serial bus controller",
        (0x12, _, _) => "processing accelerator",
        _ => "device",
    }
}

#[cfg(test)]
pub(crate) type WriteHook = std::sync::Arc<dyn Fn(&Path, &str) + Send + Sync>;
#[cfg(test)]
pub(crate) type OpenHook = std::sync::Arc<dyn Fn(&Path) -> std::io::Result<()> + Send + Sync>;

/// The machine's PCI view, rooted at `/` or at a test tree.
#[derive(Clone)]
pub struct PciSystem {
    root: PathBuf,
    /// Stands in for the kernel in tests: called after every sysfs write.
    #[cfg(test)]
    pub(crate) on_write: Option<WriteHook>,
    /// Stands in for the kernel's answer to an exclusive open of a block device in tests.
    #[cfg(test)]
    pub(crate) on_open_exclusive: Option<OpenHook>,
}

impl fmt::Debug for PciSystem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PciSystem({})", self.root.display())
    }
}

impl PciSystem {
    /// The running machine.
    pub fn host() -> PciSystem {
        PciSystem::with_root("/")
    }

    /// A tree whose `sys/`, `proc/` and `dev/` stand in for the real ones.
    pub fn with_root(root: impl Into<PathBuf>) -> PciSystem {
        PciSystem {
            root: root.into(),
            #[cfg(test)]
            on_write: None,
            #[cfg(test)]
            on_open_exclusive: None,
        }
    }

    /// `rel` (e.g. `sys/bus/pci/devices`) under the root.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    pub(crate) fn device_dir(&self, bdf: &Bdf) -> PathBuf {
        self.path("sys/bus/pci/devices").join(bdf.as_str())
    }

    /// The function at `bdf`, or an error saying there is none.
    pub fn function(&self, bdf: &Bdf) -> Result<PciFunction> {
        let dir = self.device_dir(bdf);
        if !dir.exists() {
            return Err(DriverError::Vfio(format!(
                "no PCI function {bdf} on this machine (`tutti admin list` shows the NVMe drives; \
                 {} lists every function)",
                self.path("sys/bus/pci/devices").display()
            )));
        }
        let hex = |name: &str| -> Result<u32> {
            let text = sysfs::read_trimmed(&dir.join(name))?;
            u32::from_str_radix(text.trim_start_matches("0x"), 16).map_err(|_| {
                DriverError::Vfio(format!("{}: {text:?} is not a hex number", dir.join(name).display()))
            })
        };
        Ok(PciFunction {
            bdf: bdf.clone(),
            vendor: hex("vendor")? as u16,
            device: hex("device")? as u16,
            class: hex("class")? & 0xff_ffff,
            driver: sysfs::link_name(&dir.join("driver")),
            driver_override: sysfs::read_optional(&dir.join("driver_override"))
                .filter(|s| !s.is_empty() && s != "(null)"),
            iommu_group: sysfs::link_name(&dir.join("iommu_group")).and_then(|g| g.parse().ok()),
        })
    }

    /// Every PCI function, in address order.
    pub fn functions(&self) -> Result<Vec<PciFunction>> {
        let dir = self.path("sys/bus/pci/devices");
        let mut bdfs: Vec<Bdf> =
            sysfs::entries(&dir)?.into_iter().filter_map(|name| name.parse::<Bdf>().ok()).collect();
        bdfs.sort();
        bdfs.iter().map(|b| self.function(b)).collect()
    }

    /// Every NVMe controller function, in address order.
    pub fn nvme_functions(&self) -> Result<Vec<PciFunction>> {
        Ok(self.functions()?.into_iter().filter(PciFunction::is_nvme).collect())
    }

    /// The functions in IOMMU group `group`.
    pub fn group_members(&self, group: u32) -> Result<Vec<PciFunction>> {
        let dir = self.path("sys/kernel/iommu_groups").join(group.to_string()).join("devices");
        let mut bdfs: Vec<Bdf> =
            sysfs::entries(&dir)?.into_iter().filter_map(|name| name.parse::<Bdf>().ok()).collect();
        bdfs.sort();
        bdfs.iter().map(|b| self.function(b)).collect()
    }

    /// Writes `value` to a sysfs attribute; a refused or short write is an error
    /// that names the file and, for permissions, says what to do.
    pub(crate) fn write_attr(&self, path: &Path, value: &str) -> Result<()> {
        sysfs::write(path, value)?;
        #[cfg(test)]
        if let Some(hook) = &self.on_write {
            hook(path, value);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bdf_parsing() {
        assert_eq!("0000:00:04.0".parse::<Bdf>().unwrap().as_str(), "0000:00:04.0");
        assert_eq!("00:1F.3".parse::<Bdf>().unwrap().as_str(), "0000:00:1f.3");
        assert_eq!("10000:e1:00.0".parse::<Bdf>().unwrap().as_str(), "10000:e1:00.0");
        for bad in ["", "00:04", "0000:00:04.8", "0000:00:20.0", "000:00:04.0", "0000:0:04.0", "x0:04.0"] {
            let err = bad.parse::<Bdf>().unwrap_err().to_string();
            assert!(err.contains("not a PCI address"), "{bad}: {err}");
        }
    }

    #[test]
    fn class_names() {
        assert_eq!(class_name(NVME_CLASS), "NVMe controller");
        assert_eq!(class_name(0x060000), "host bridge");
        assert_eq!(class_name(0x010601), "SATA controller");
    }

    #[test]
    fn reads_functions_from_sysfs() {
        let fake = fake::FakeSys::new();
        fake.add_function("0000:00:04.0", NVME_CLASS, Some("nvme"), Some(1));
        fake.add_function("0000:00:00.0", 0x060000, None, Some(0));
        let sys = fake.system();
        let all = sys.functions().unwrap();
        assert_eq!(all.iter().map(|f| f.bdf.as_str()).collect::<Vec<_>>(), ["0000:00:00.0", "0000:00:04.0"]);
        let nvme = sys.nvme_functions().unwrap();
        assert_eq!(nvme.len(), 1);
        assert_eq!(nvme[0].driver.as_deref(), Some("nvme"));
        assert_eq!(nvme[0].iommu_group, Some(1));
        assert_eq!(nvme[0].vendor, 0x1b36);
        assert_eq!(sys.group_members(1).unwrap().len(), 1);
        let missing = sys.function(&"0000:00:09.0".parse().unwrap()).unwrap_err().to_string();
        assert!(missing.contains("no PCI function 0000:00:09.0"), "{missing}");
    }
}
