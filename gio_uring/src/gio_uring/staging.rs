//! Staged layer tables: NVMe DMA through pinned host staging slots, for KV
//! memory the drives cannot reach (GPU memory without a P2P path, or host
//! memory kept out of the IOMMU).
//!
//! The slots are one page-aligned host allocation, mapped once into every
//! distinct DMA space of the pool's drives (each IOMMU view sees it at its own
//! IOVAs) and once into the executor (`Executor::map_host`). Per pool drive and
//! slot the data pointer is computed here, once: an SGL Data Block when the
//! drive takes SGLs, else PRP1 plus the second page and a PRP list built in
//! that drive's DMA memory. The free slots are a `tt_ring` of slot indices in
//! executor memory: lanes take and return them with no host involvement; a lane
//! finding none waits, bounded by the submit timeout (`gio_stage.cuh`,
//! `tt_process_staged`).
//!
//! A slot whose command ended without a known outcome (expired, or stranded on
//! a dead queue) may still be written by its drive, so it is withheld; the
//! executor hands it back once the drive can no longer touch it: after the
//! queue pair it was submitted on was deleted and created again
//! ([`GioUring::recover_drive`]), or after the command's late completion
//! arrived. Both are counted in [`StagingStats`].

use super::state::{Staging, StagingStats, RING_AT};
use super::GioUring;
use crate::error::{GioError, Result};
use crate::handle::TableId;
use crate::layer_table::{LayerTable, TableKind};
use crate::mem::{HostMemory, HostRange, MemKind};
use std::sync::Arc;
use tutti_driver::command::{prp, DataPtr};
use tutti_driver::spec::SglDescriptor;
use tutti_driver::transport::{DmaBuffer, DmaSpace};
use tutti_kernels::abi::{RingCell, RingHeader, StagingDesc};
use zerocopy::IntoBytes;

/// The memory page PRP entries are built for (§4.3; the controllers run with MPS = 4 KiB).
const PAGE: usize = 4096;

impl GioUring {
    /// Registers a [`TableKind::Staged`] table with `slots` staging slots of
    /// one chunk each (rounded up to pages). `slots` bounds the commands of
    /// this table in flight at once; more work than slots waits for them.
    pub fn register_staged_table(&self, table: &LayerTable, slots: u32) -> Result<TableId> {
        if table.kind() != TableKind::Staged {
            return Err(GioError::table(format!(
                "a {:?} table addresses memory the drives reach: use register_table",
                table.kind()
            )));
        }
        if slots == 0 || slots > 1 << 20 {
            return Err(GioError::table(format!("{slots} staging slots: 1..=1048576 are allowed")));
        }
        self.check_table(table)?;
        self.check_kv_reach(table)?;
        let staging = self.build_staging(table, slots)?;
        let id = self.install_table(table, Some(staging))?;
        tracing::info!(table = id.0, slots, "staged layer table registered");
        Ok(id)
    }

    /// Staging counters of a registered staged table.
    pub fn staging_stats(&self, id: TableId) -> Result<StagingStats> {
        let tables = self.tables.lock().map_err(|_| GioError::invalid("table lock poisoned"))?;
        let slot = tables
            .get(id.0 as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| GioError::table(format!("table {} is not registered", id.0)))?;
        slot.staging.as_ref().ok_or_else(|| GioError::table(format!("table {} is not staged", id.0)))?.stats()
    }

    /// The executor can touch every KV range the table names (checked per run of
    /// contiguous entries, before anything is allocated or uploaded).
    fn check_kv_reach(&self, table: &LayerTable) -> Result<()> {
        let mut ranges: Vec<(u64, u64)> =
            table.entries().iter().filter(|e| e[1] != 0).map(|e| (e[0], e[0].saturating_add(e[1]))).collect();
        ranges.sort_unstable();
        let mut run: Option<(u64, u64)> = None;
        for (start, end) in ranges {
            run = match run {
                Some((s, e)) if start <= e => Some((s, e.max(end))),
                Some((s, e)) => {
                    self.executor().check_kernel_access(s, e - s)?;
                    Some((start, end))
                }
                None => Some((start, end)),
            };
        }
        if let Some((s, e)) = run {
            self.executor().check_kernel_access(s, e - s)?;
        }
        Ok(())
    }

    fn build_staging(&self, table: &LayerTable, slots: u32) -> Result<Staging> {
        let g = table.geometry();
        let slot_bytes = (g.chunk_bytes() as usize).next_multiple_of(PAGE);
        let slot_bytes32 = u32::try_from(slot_bytes)
            .map_err(|_| GioError::table(format!("a staging slot of {slot_bytes} bytes is too large")))?;
        let total = slot_bytes
            .checked_mul(slots as usize)
            .ok_or_else(|| GioError::table(format!("{slots} slots of {slot_bytes} bytes overflow")))?;
        let mem = HostMemory::new(total)?;
        let pool: Vec<u32> = g.drives.iter().map(|d| d.drive).collect();
        // One mapping (and one set of PRP lists) per distinct DMA space.
        let mut spaces: Vec<Arc<dyn DmaSpace>> = Vec::new();
        let mut space_of: Vec<usize> = Vec::with_capacity(pool.len());
        for &d in &pool {
            let q = self.drives.get(d as usize).and_then(|dq| dq.queues.first()).ok_or_else(|| {
                GioError::table(format!("drive {d} has no queue pair to reach its controller"))
            })?;
            let space = q.controller().dma().clone();
            let key = Arc::as_ptr(&space) as *const ();
            match spaces.iter().position(|s| Arc::as_ptr(s) as *const () == key) {
                Some(i) => space_of.push(i),
                None => {
                    space_of.push(spaces.len());
                    spaces.push(space);
                }
            }
        }
        let mut dma = Vec::with_capacity(spaces.len());
        for s in &spaces {
            // SAFETY: `mem` lives in the returned Staging, which drops this mapping first.
            dma.push(unsafe { s.map(mem.as_ptr(), total)? });
        }
        let slot_pages = slot_bytes / PAGE;
        let list_pages = prp::list_pages(slot_pages, PAGE as u64);
        let mut lists: Vec<Option<DmaBuffer>> = (0..spaces.len()).map(|_| None).collect();
        let mut words = vec![0u64; pool.len() * slots as usize * 4];
        let mut sgl_drives = 0u32;
        for (pd, &d) in pool.iter().enumerate() {
            let info = &self.drive_info[d as usize];
            let map = &dma[space_of[pd]];
            let sgl = info.sgl.available();
            if sgl {
                sgl_drives |= 1 << pd;
            } else if list_pages > 0 && lists[space_of[pd]].is_none() {
                lists[space_of[pd]] = Some(spaces[space_of[pd]].alloc(list_pages * PAGE * slots as usize)?);
            }
            for s in 0..slots as usize {
                let segs = map.translate(s * slot_bytes, slot_bytes)?;
                let w = &mut words[(pd * slots as usize + s) * 4..][..4];
                if sgl {
                    let [seg] = segs.as_slice() else {
                        return Err(GioError::table(format!(
                            "{}: staging slot {s} spans {} IOVA segments; one SGL Data Block needs one",
                            info.name,
                            segs.len()
                        )));
                    };
                    let [w0, w1] = SglDescriptor::data_block(seg.iova, slot_bytes32).to_words();
                    w[0] = w0;
                    w[1] = w1;
                } else {
                    let at = map.translate(s * slot_bytes, PAGE.min(slot_bytes))?;
                    w[0] = at.first().map_or(0, |a| a.iova);
                    if slot_pages >= 2 {
                        w[2] = map.translate(s * slot_bytes + PAGE, PAGE)?.first().map_or(0, |a| a.iova);
                    }
                    if let Some(buf) = &lists[space_of[pd]] {
                        let scratch =
                            prp::Scratch { buf, offset: s * list_pages * PAGE, len: list_pages * PAGE };
                        match prp::build(&segs, PAGE as u64, scratch)? {
                            DataPtr::Prp { prp2, .. } => w[3] = prp2,
                            other => {
                                return Err(GioError::table(format!("PRP builder returned {other:?}")));
                            }
                        }
                    }
                }
            }
        }
        let exec_map = {
            // SAFETY: `mem` outlives the mapping (Staging drops the mapping first).
            unsafe { self.exec.map_host(mem.as_ptr(), total, HostRange::Memory)? }
        };
        // Descriptor, free ring (every slot free), data pointer words, the withheld slots'
        // records (zeroed: none withheld): one executor allocation.
        let capacity = slots.next_power_of_two();
        let cells_at = RING_AT + size_of::<RingHeader>();
        let dptr_at = (cells_at + capacity as usize * size_of::<RingCell>()).next_multiple_of(64);
        let held_at = (dptr_at + words.len() * 8).next_multiple_of(64);
        let desc_mem = self.exec.alloc(MemKind::Private, held_at + slots as usize * 16)?;
        let ring =
            RingHeader { head: 0, tail: slots as u64, capacity, mask: capacity - 1, ..Default::default() };
        // Vyukov cells: cell i starts at seq i; a pushed value at position p has seq p + 1.
        let cells: Vec<RingCell> = (0..capacity as u64)
            .map(|i| {
                if i < slots as u64 {
                    RingCell { seq: i + 1, value: i }
                } else {
                    RingCell { seq: i, value: 0 }
                }
            })
            .collect();
        desc_mem.write_bytes(RING_AT, ring.as_bytes())?;
        desc_mem.write_bytes(cells_at, cells.as_bytes())?;
        desc_mem.write_bytes(dptr_at, words.as_bytes())?;
        let desc = StagingDesc {
            free: desc_mem.exec_at(RING_AT),
            base: exec_map.exec_addr(),
            dptr: desc_mem.exec_at(dptr_at),
            held: desc_mem.exec_at(held_at),
            nslots: slots,
            slot_bytes: slot_bytes32,
            sgl_drives,
            page_shift: PAGE.trailing_zeros(),
            ..Default::default()
        };
        desc_mem.write_obj(0, &desc)?;
        Ok(Staging {
            _exec: exec_map,
            _dma: dma,
            _lists: lists.into_iter().flatten().collect(),
            desc: desc_mem,
            _mem: mem,
            slots,
            slot_bytes: slot_bytes32,
        })
    }
}
