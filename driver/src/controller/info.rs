//! What the driver asks of a controller at bring-up ([`ControllerOptions`])
//! and what it learned there ([`ControllerInfo`], [`NamespaceInfo`]): plain
//! data, the same for an owned and a leased controller.

use crate::error::{DriverError, Result};
use crate::spec::SglSupport;
use std::time::Duration;

/// The driver's own cap on one command's transfer when MDTS reports no limit.
pub const DRIVER_MAX_TRANSFER: u64 = 4 << 20;

/// How to bring a controller up.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// Admin queue entries (bounded by CAP.MQES and 4096).
    pub admin_queue_entries: u16,
    /// I/O queue pairs to ask for with Set Features (the controller may grant fewer).
    pub io_queue_pairs: u16,
    /// Deadline for one admin command.
    pub admin_timeout: Duration,
    /// Deadline for one I/O command in the synchronous helpers.
    pub io_timeout: Duration,
    /// Upper bound on waits for CSTS.RDY/SHST; `None` uses CAP.TO.
    pub ready_timeout: Option<Duration>,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        ControllerOptions {
            admin_queue_entries: 32,
            io_queue_pairs: 16,
            admin_timeout: Duration::from_secs(5),
            io_timeout: Duration::from_secs(10),
            ready_timeout: None,
        }
    }
}

/// The LBA format a namespace is formatted with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NamespaceFormat {
    /// Index of the LBA format in use (FLBAS).
    pub index: u8,
    /// Data bytes per logical block.
    pub data_size: u32,
    /// Metadata bytes per logical block (LBAF MS); 0 = none.
    pub metadata_size: u16,
    /// Metadata at the end of each block's data (FLBAS bit 4) rather than in a separate buffer.
    pub extended: bool,
    /// End-to-end protection information type (DPS bits 2:0); 0 = none.
    pub pi_type: u8,
    /// Protection information in the first bytes of metadata (DPS bit 3).
    pub pi_first: bool,
}

impl std::fmt::Display for NamespaceFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LBA format {}: {} B data", self.index, self.data_size)?;
        if self.metadata_size > 0 {
            let how = if self.extended { "extended LBA" } else { "separate buffer" };
            write!(f, " + {} B metadata ({how})", self.metadata_size)?;
        } else {
            f.write_str(", no metadata")?;
        }
        if self.pi_type > 0 {
            let at = if self.pi_first { "first" } else { "last" };
            write!(f, ", protection information type {} ({at} bytes of metadata)", self.pi_type)?;
        }
        Ok(())
    }
}

/// One active namespace.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NamespaceInfo {
    pub nsid: u32,
    /// Size in logical blocks (NSZE).
    pub blocks: u64,
    /// Logical block size in bytes (data only).
    pub lba_size: u32,
    pub format: NamespaceFormat,
    /// I/O Command Set (from the Namespace Identification Descriptor list; NVM when the controller has none).
    pub command_set: crate::spec::CommandSet,
}

impl NamespaceInfo {
    pub fn bytes(&self) -> u64 {
        self.blocks.saturating_mul(self.lba_size as u64)
    }

    /// A namespace of `blocks` plain `lba_size`-byte blocks (NVM command set, no metadata).
    pub fn plain(nsid: u32, blocks: u64, lba_size: u32) -> Self {
        NamespaceInfo {
            nsid,
            blocks,
            lba_size,
            format: NamespaceFormat {
                index: 0,
                data_size: lba_size,
                metadata_size: 0,
                extended: false,
                pi_type: 0,
                pi_first: false,
            },
            command_set: crate::spec::CommandSet::Nvm,
        }
    }

    /// Why the driver cannot read and write this namespace as plain blocks
    /// of data, and what to do about it; `None` if it can.
    pub fn unusable(&self) -> Option<(String, String)> {
        use crate::spec::CommandSet;
        if self.command_set != CommandSet::Nvm {
            let remedy = match self.command_set {
                CommandSet::Zoned => "zoned namespaces accept only sequential writes within zones; use a namespace of the NVM command set (create one with `nvme create-ns --csi=0`, or a QEMU nvme-ns without zoned=true)",
                _ => "use a namespace of the NVM command set (CSI 0)",
            };
            return Some((format!("uses the {} command set, not NVM", self.command_set), remedy.into()));
        }
        if self.format.metadata_size > 0 || self.format.pi_type > 0 {
            return Some((
                format!("is formatted with {}", self.format),
                "the driver moves plain data blocks only; reformat the namespace to an LBA format without metadata or protection information (`nvme format --lbaf=N --pi=0`, N a format whose metadata size is 0; `nvme id-ns -H` lists them)".into(),
            ));
        }
        None
    }
}

/// What the driver learned about a controller at bring-up.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ControllerInfo {
    pub device: String,
    pub vid: u16,
    pub model: String,
    pub serial: String,
    pub firmware: String,
    pub version: String,
    /// Memory page size in use (bytes).
    pub page_size: u32,
    /// Identify MDTS decoded to bytes; `None` = the controller reports no limit.
    pub mdts_bytes: Option<u64>,
    /// Largest transfer one command carries (MDTS, or the driver's own cap).
    pub max_transfer: u64,
    pub sgl: SglSupport,
    /// Maximum entries per queue (CAP.MQES + 1).
    pub max_queue_entries: u32,
    pub contiguous_queues_required: bool,
    pub doorbell_stride: u32,
    /// I/O queue pairs granted by Set Features (Number of Queues).
    pub io_queue_pairs: u16,
    pub volatile_write_cache: bool,
    pub write_zeroes: bool,
    pub dataset_management: bool,
    /// CAP.TO in milliseconds.
    pub ready_timeout_ms: u64,
    pub namespaces: Vec<NamespaceInfo>,
}

impl ControllerInfo {
    pub fn namespace(&self, nsid: u32) -> Option<&NamespaceInfo> {
        self.namespaces.iter().find(|n| n.nsid == nsid)
    }

    /// Namespace `nsid`, if it is active and holds plain data blocks (no
    /// metadata, protection information or other command set).
    pub fn data_namespace(&self, nsid: u32) -> Result<&NamespaceInfo> {
        let ns = self.namespace(nsid).ok_or_else(|| {
            let have: Vec<u32> = self.namespaces.iter().map(|n| n.nsid).collect();
            DriverError::invalid(format!("{}: no active namespace {nsid} (active: {have:?})", self.device))
        })?;
        match ns.unusable() {
            None => Ok(ns),
            Some((what, remedy)) => {
                Err(DriverError::UnusableNamespace { device: self.device.clone(), nsid, what, remedy })
            }
        }
    }
}

impl ControllerOptions {
    /// How long to wait for CSTS.RDY or SHST to change: `ready_timeout`, else CAP.TO (at least 500 ms).
    pub(crate) fn ready_wait(&self, cap: crate::spec::Cap) -> Duration {
        self.ready_timeout.unwrap_or(Duration::from_millis(cap.timeout_ms().max(500)))
    }
}
