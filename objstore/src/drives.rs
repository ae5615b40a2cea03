//! The pool's drives: controller handles, their shapes, and metadata I/O.
//!
//! Superblocks and journal pages move through the controller's shared queue
//! pair (`Controller::shared_io_queue_pair`: one per controller, whatever
//! number of its namespaces the pool uses) and a staging buffer per drive,
//! on the CPU and off the data path. KV objects never pass through here,
//! except that on a controller with no pair left for the data path the
//! direct backend takes turns on the same pair (see `io::direct`).

use crate::error::{ObjError, Result};
use crate::journal::MetaDev;
use crate::stripe::DriveShape;
use std::sync::{Arc, Mutex};
use tutti_driver::command::DataMode;
use tutti_driver::controller::{Controller, ControllerInfo};
use tutti_driver::queue::IoQueuePair;
use tutti_driver::queue::SharedQueuePair;
use tutti_driver::transport::DmaBuffer;

/// Staging for metadata transfers; larger reads and writes go in windows.
const STAGING: usize = 1 << 20;
const META_QUEUE_DEPTH: u32 = 32;

/// A drive handed to the pool: a controller that is up, and a namespace on it.
#[derive(Clone)]
pub struct DriveSpec {
    pub ctrl: Arc<Controller>,
    pub nsid: u32,
}

impl DriveSpec {
    pub fn new(ctrl: Arc<Controller>, nsid: u32) -> Self {
        DriveSpec { ctrl, nsid }
    }
    /// The controller's first active namespace the driver can use as plain
    /// blocks (no metadata, no protection information, NVM command set).
    pub fn first_namespace(ctrl: Arc<Controller>) -> Result<Self> {
        let mut why = Vec::new();
        for ns in &ctrl.info().namespaces {
            match ctrl.data_namespace(ns.nsid) {
                Ok(_) => return Ok(DriveSpec { ctrl: ctrl.clone(), nsid: ns.nsid }),
                Err(e) => why.push(e.to_string()),
            }
        }
        if why.is_empty() {
            return Err(ObjError::drive(ctrl.name(), "has no active namespace"));
        }
        Err(ObjError::drive(ctrl.name(), format!("has no namespace the pool can use: {}", why.join("; "))))
    }
}

impl DriveSpec {
    /// Opens the NVMe controller at PCI address `bdf` (bound to vfio-pci),
    /// brings it up and takes its first namespace. `noiommu` selects vfio's
    /// unsafe no-IOMMU mode (machines without an IOMMU, testing only).
    pub fn open_vfio(bdf: &str, noiommu: bool) -> Result<Self> {
        use tutti_driver::transport::vfio::{IommuMode, VfioDevice, VfioOptions};
        let addr: tutti_driver::pci::Bdf = bdf.parse()?;
        let mode = if noiommu { IommuMode::NoIommu } else { IommuMode::Type1 };
        let dev = VfioDevice::open(&addr, &VfioOptions { mode, ..VfioOptions::default() })?;
        // The controller keeps BAR0 and the DMA space (and so the VFIO fds) alive.
        let ctrl = Controller::new(dev.registers(), dev.dma_space(), Default::default())?;
        Self::first_namespace(ctrl)
    }
}

impl std::fmt::Debug for DriveSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} nsid {}", self.ctrl.name(), self.nsid)
    }
}

/// A pool drive as the data path sees it: no metadata I/O of its own.
pub(crate) struct DriveView {
    /// How this process reaches the drive; `None` in a store that moves no
    /// bytes ([`KvStore::attach_control`](crate::KvStore::attach_control)).
    pub spec: Option<DriveSpec>,
    pub device: String,
    pub serial: String,
    pub nsid: u32,
    pub shape: DriveShape,
}

impl DriveView {
    pub fn open(spec: DriveSpec) -> Result<Self> {
        let mut v = Self::described(spec.ctrl.info(), spec.nsid)?;
        v.spec = Some(spec);
        Ok(v)
    }

    /// A drive known only from its owner's description of its controller.
    pub fn described(info: &ControllerInfo, nsid: u32) -> Result<Self> {
        let ns = info.data_namespace(nsid)?;
        Ok(DriveView {
            spec: None,
            device: info.device.clone(),
            serial: info.serial.clone(),
            nsid,
            shape: DriveShape { lba_size: ns.lba_size, blocks: ns.blocks, max_transfer: info.max_transfer },
        })
    }

    pub fn name(&self) -> &str {
        &self.device
    }
    pub fn serial(&self) -> &str {
        &self.serial
    }
}

/// Refuses namespaces with metadata, protection information or another
/// command set, naming the format and what to do.
fn shape_of(spec: &DriveSpec) -> Result<DriveShape> {
    Ok(DriveView::described(spec.ctrl.info(), spec.nsid)?.shape)
}

struct MetaQueue {
    qp: Arc<SharedQueuePair>,
    staging: DmaBuffer,
}

/// One pool drive.
pub(crate) struct Drive {
    pub spec: DriveSpec,
    pub shape: DriveShape,
    meta: Mutex<MetaQueue>,
}

impl Drive {
    pub fn open(spec: DriveSpec) -> Result<Self> {
        let info = spec.ctrl.info();
        let shape = shape_of(&spec)?;
        let depth = META_QUEUE_DEPTH.min(info.max_queue_entries);
        let qp = spec.ctrl.shared_io_queue_pair(depth)?;
        let staging = spec.ctrl.dma().alloc(STAGING)?;
        Ok(Drive { spec, shape, meta: Mutex::new(MetaQueue { qp, staging }) })
    }

    pub fn name(&self) -> &str {
        self.spec.ctrl.name()
    }
    pub fn serial(&self) -> &str {
        &self.spec.ctrl.info().serial
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, MetaQueue>> {
        self.meta.lock().map_err(|_| ObjError::Poisoned("metadata staging"))
    }

    /// The shared queue pair of the drive's controller, while the staging lock is held.
    fn pair(q: &MetaQueue) -> Result<std::sync::MutexGuard<'_, IoQueuePair>> {
        q.qp.lock().map_err(|_| ObjError::Poisoned("metadata queue"))
    }

    fn check(&self, bytes: usize) -> Result<()> {
        let lba_size = self.shape.lba_size as usize;
        if !bytes.is_multiple_of(lba_size) {
            return Err(ObjError::drive(
                self.name(),
                format!("metadata transfer of {bytes} bytes is not whole LBAs"),
            ));
        }
        Ok(())
    }

    pub fn read(&self, lba: u64, bytes: usize) -> Result<Vec<u8>> {
        self.check(bytes)?;
        let lba_size = self.shape.lba_size as u64;
        let q = self.lock()?;
        let mut qp = Self::pair(&q)?;
        let staging = &q.staging;
        let mut out = vec![0u8; bytes];
        for (i, dst) in out.chunks_mut(STAGING).enumerate() {
            let at = lba + (i * STAGING) as u64 / lba_size;
            qp.read_buf(self.spec.nsid, at, staging, 0, dst.len(), DataMode::Auto)?;
            staging.copy_out(0, dst)?;
        }
        Ok(out)
    }

    pub fn write(&self, lba: u64, data: &[u8]) -> Result<()> {
        self.check(data.len())?;
        let lba_size = self.shape.lba_size as u64;
        let q = self.lock()?;
        let mut qp = Self::pair(&q)?;
        let staging = &q.staging;
        for (i, src) in data.chunks(STAGING).enumerate() {
            let at = lba + (i * STAGING) as u64 / lba_size;
            staging.copy_in(0, src)?;
            qp.write_buf(self.spec.nsid, at, staging, 0, src.len(), DataMode::Auto)?;
        }
        Ok(())
    }

    /// Flush (§6.8): everything completed before is on non-volatile media.
    pub fn flush(&self) -> Result<()> {
        let q = self.lock()?;
        let mut qp = Self::pair(&q)?;
        Ok(qp.flush(self.spec.nsid)?)
    }
}

/// The pool's drives as a [`MetaDev`] for the journal.
pub(crate) struct DriveMeta<'a>(pub &'a [Drive]);

impl DriveMeta<'_> {
    fn drive(&self, d: u32) -> Result<&Drive> {
        self.0.get(d as usize).ok_or(ObjError::Unknown { what: "pool drive", id: d as u64 })
    }
}

impl MetaDev for DriveMeta<'_> {
    fn read(&mut self, drive: u32, lba: u64, bytes: usize) -> Result<Vec<u8>> {
        self.drive(drive)?.read(lba, bytes)
    }
    fn write(&mut self, drive: u32, lba: u64, data: &[u8]) -> Result<()> {
        self.drive(drive)?.write(lba, data)
    }
    fn flush(&mut self, drive: u32) -> Result<()> {
        self.drive(drive)?.flush()
    }
}
