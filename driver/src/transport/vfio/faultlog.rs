//! IOMMU faults as the kernel logs them.
//!
//! A controller whose DMA the IOMMU blocked may still complete the command
//! with a success status (QEMU's NVMe device does); the only trace is a line
//! in the kernel log. [`FaultLog`] follows /dev/kmsg from the moment it is
//! opened so a caller can tie such lines to the commands it just ran.

use crate::error::{DriverError, Result};
use crate::pci::Bdf;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;

/// One logged IOMMU fault.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct IommuFault {
    /// `bus:device.function` of the requester as the log names it (no domain).
    pub device: Option<String>,
    /// The device address that faulted.
    pub addr: Option<u64>,
    /// The log line.
    pub message: String,
}

impl IommuFault {
    /// Parses an Intel VT-d or AMD-Vi fault line; other lines give `None`.
    ///
    /// VT-d:   `DMAR: [DMA Write NO_PASID] Request device [00:04.0] fault addr 0xdead000 [fault reason ...]`
    /// AMD-Vi: `... 0000:00:04.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x000a address=0x1000 flags=0x0]`
    pub fn parse(line: &str) -> Option<IommuFault> {
        let hex_after = |key: &str| -> Option<u64> {
            let rest = &line[line.find(key)? + key.len()..];
            let digits: String = rest.chars().take_while(|c| c.is_ascii_hexdigit()).collect();
            u64::from_str_radix(&digits, 16).ok()
        };
        if line.contains("DMAR: [DMA") {
            let device = line
                .find("Request device [")
                .map(|i| &line[i + "Request device [".len()..])
                .and_then(|r| r.split(']').next())
                .map(str::to_string);
            return Some(IommuFault { device, addr: hex_after("fault addr 0x"), message: line.to_string() });
        }
        if line.contains("IO_PAGE_FAULT") {
            let device = match line.find("device=") {
                Some(i) => line[i + 7..].split([' ', ']']).next().map(str::to_string),
                None => line
                    .split_whitespace()
                    .find_map(|w| w.strip_suffix(':').and_then(|w| w.parse::<Bdf>().ok()))
                    .map(|b| b.as_str().split_once(':').map_or(String::new(), |(_, rest)| rest.to_string())),
            };
            return Some(IommuFault { device, addr: hex_after("address=0x"), message: line.to_string() });
        }
        None
    }

    /// Whether this fault was raised by `bdf` (the log omits the PCI domain).
    pub fn concerns(&self, bdf: &Bdf) -> bool {
        self.device.as_deref().is_some_and(|d| bdf.as_str().ends_with(&format!(":{d}")) || bdf.as_str() == d)
    }
}

/// Follows /dev/kmsg from the time it was opened.
pub struct FaultLog {
    kmsg: File,
}

impl FaultLog {
    /// Starts following the kernel log at its current end.
    pub fn open() -> Result<FaultLog> {
        let kmsg =
            File::options().read(true).custom_flags(libc::O_NONBLOCK).open("/dev/kmsg").map_err(|e| {
                DriverError::io("opening /dev/kmsg to watch for IOMMU faults (needs root)", e)
            })?;
        // SAFETY: lseek on an fd we own; /dev/kmsg treats SEEK_END as "only new records".
        if unsafe { libc::lseek(std::os::fd::AsRawFd::as_raw_fd(&kmsg), 0, libc::SEEK_END) } < 0 {
            return Err(DriverError::io("seeking /dev/kmsg to its end", std::io::Error::last_os_error()));
        }
        Ok(FaultLog { kmsg })
    }

    /// IOMMU faults logged since the last call (or since `open`).
    pub fn drain(&mut self) -> Result<Vec<IommuFault>> {
        let mut faults = Vec::new();
        let mut buf = vec![0u8; 8192];
        loop {
            // Each read returns exactly one record: "prio,seq,usec,flags;message\n".
            match self.kmsg.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let record = String::from_utf8_lossy(&buf[..n]);
                    let message = record.split_once(';').map_or(&*record, |(_, m)| m);
                    if let Some(f) = IommuFault::parse(message.lines().next().unwrap_or("")) {
                        faults.push(f);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                // Records were overwritten before we read them: carry on with what is left.
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(e) => return Err(DriverError::io("reading /dev/kmsg", e)),
            }
        }
        Ok(faults)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vtd_faults() {
        let f = IommuFault::parse(
            "DMAR: [DMA Write NO_PASID] Request device [00:04.0] fault addr 0x7f00000000 [fault reason 0x05] \
             PTE Write access is not set",
        )
        .unwrap();
        assert_eq!(f.device.as_deref(), Some("00:04.0"));
        assert_eq!(f.addr, Some(0x7f_0000_0000));
        assert!(f.concerns(&"0000:00:04.0".parse().unwrap()));
        assert!(!f.concerns(&"0000:00:05.0".parse().unwrap()));
        assert!(IommuFault::parse("DMAR: DRHD: handling fault status reg 2").is_none());
        assert!(IommuFault::parse("nvme nvme0: 2/0/0 default/read/poll queues").is_none());
    }

    #[test]
    fn parses_amd_vi_faults() {
        let f = IommuFault::parse(
            "vfio-pci 0000:41:00.0: AMD-Vi: Event logged [IO_PAGE_FAULT domain=0x000a address=0x1000 flags=0x0020]",
        )
        .unwrap();
        assert_eq!(f.device.as_deref(), Some("41:00.0"));
        assert_eq!(f.addr, Some(0x1000));
        assert!(f.concerns(&"0000:41:00.0".parse().unwrap()));
        let old = IommuFault::parse(
            "AMD-Vi: Event logged [IO_PAGE_FAULT device=41:00.0 domain=0x0 address=0x2000]",
        )
        .unwrap();
        assert_eq!((old.device.as_deref(), old.addr), (Some("41:00.0"), Some(0x2000)));
    }
}
