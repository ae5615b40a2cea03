//! The layer table a registration becomes: why layer IOCBs cannot serve it
//! (then each command is an explicit IOCTX), and the table itself, over the
//! drives' IOVAs or, staged, over the executor's mappings of the KV memory.

use super::{gio, GioIo};
use crate::error::{ObjError, Result};
use crate::registration::KvMemoryKind as MemoryKind;
use crate::registration::Registration;
use crate::stripe::StripeMap;
use tutti_driver::command::DataPtr;
use tutti_gio_uring::mem::{HostMapping, HostRange};
use tutti_gio_uring::{Kv, LayerGeometry, LayerTable, PoolDrive, TableKind};

impl GioIo {
    /// Why layer IOCBs cannot serve this registration, if they cannot.
    pub(super) fn layer_obstacle(&self, reg: &Registration) -> Option<String> {
        if self.cfg.force_explicit {
            return Some("explicit IOCBs requested".into());
        }
        if reg.tables.len() != 1 {
            return Some(format!("the drives see the KV memory through {} IOMMU views", reg.tables.len()));
        }
        if self.ring.drives().iter().any(|d| !d.sgl.available()) {
            return Some("a drive does not support SGLs".into());
        }
        None
    }

    /// A staged table over the registration's KV memory, with the executor
    /// mappings host memory needs (CUDA memory is already the executor's).
    pub(super) fn build_staged_table(
        &self,
        reg: &Registration,
        map: &StripeMap,
    ) -> Result<(LayerTable, Vec<Box<dyn HostMapping>>)> {
        let regions = reg.layout.regions();
        let mut maps: Vec<Box<dyn HostMapping>> = Vec::new();
        let mut bases = Vec::with_capacity(regions.len());
        for r in regions {
            match reg.memory_kind {
                MemoryKind::Cuda => bases.push(r.addr),
                MemoryKind::Host | MemoryKind::HostUnmapped | MemoryKind::DeviceP2p => {
                    // SAFETY: the registration keeps the region allocated while attached
                    // (KvStore::register's contract); the mapping is dropped at detach.
                    let m = unsafe {
                        self.ring.executor().map_host(r.addr as *mut u8, r.len as usize, HostRange::Memory)
                    }
                    .map_err(gio)?;
                    bases.push(m.exec_addr());
                    maps.push(m);
                }
            }
        }
        let g = reg.layout.geometry();
        let obj = g.object_bytes();
        let mut table = LayerTable::new(Self::geometry(reg, map), TableKind::Staged).map_err(gio)?;
        Self::check_chunks(&table, map)?;
        for b in 0..reg.layout.num_blocks() {
            for layer in 0..g.layers {
                for (kv, k) in [(0, Kv::K), (1, Kv::V)] {
                    let addr = reg.layout.object_addr(b, layer, kv);
                    let (region, off) = reg.layout.region_of(addr, obj).ok_or_else(|| {
                        ObjError::invalid("layout", format!("object at {addr:#x} outside every region"))
                    })?;
                    table.set_kv(b, layer, k, bases[region] + off).map_err(gio)?;
                }
            }
        }
        Ok((table, maps))
    }

    pub(super) fn geometry(reg: &Registration, map: &StripeMap) -> LayerGeometry {
        LayerGeometry {
            layers: reg.layout.geometry().layers,
            files: map.files(),
            blocks: reg.layout.num_blocks(),
            object_bytes: map.object_bytes(),
            max_transfer: map.chunk_bytes(),
            drives: (0..map.drive_count())
                .map(|d| PoolDrive {
                    drive: d,
                    data_start_lba: map.drive(d).data_start_lba,
                    lba_size: map.drive(d).lba_size,
                })
                .collect(),
        }
    }

    pub(super) fn check_chunks(table: &LayerTable, map: &StripeMap) -> Result<()> {
        if table.geometry().chunks() != map.chunks() {
            return Err(ObjError::Gio(format!(
                "gio_uring splits objects into {} commands, the pool into {}",
                table.geometry().chunks(),
                map.chunks()
            )));
        }
        Ok(())
    }

    pub(super) fn build_table(reg: &Registration, map: &StripeMap) -> Result<LayerTable> {
        let g = reg.layout.geometry();
        let mut table = LayerTable::new(Self::geometry(reg, map), TableKind::Sgl).map_err(gio)?;
        Self::check_chunks(&table, map)?;
        for b in 0..reg.layout.num_blocks() {
            for layer in 0..g.layers {
                for (kv, k) in [(0, Kv::K), (1, Kv::V)] {
                    for c in 0..map.chunks() {
                        let d = reg.descriptor(0, b, layer, kv, c);
                        table.set_entry(b, layer, k, c, DataPtr::Sgl(d)).map_err(gio)?;
                    }
                }
            }
        }
        Ok(table)
    }
}
