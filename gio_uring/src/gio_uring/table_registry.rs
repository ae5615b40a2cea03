//! Registering layer tables where the executor reads them.

use super::state::{SlotState, TableInfo, TableSlot};
use super::GioUring;
use crate::error::{GioError, Result};
use crate::handle::TableId;
use crate::layer_table::{LayerTable, TableKind};
use crate::mem::MemKind;
use tutti_driver::spec::SglSupport;
use tutti_kernels::abi::{LayerTableDesc, TABLE_UNUSED};
use zerocopy::IntoBytes;

impl GioUring {
    /// Uploads `table` to executor memory after checking it against the drives:
    /// pool drives exist, have the LBA sizes the table places them with, carry a whole chunk in one
    /// command, support SGLs if the table is SGL, and hold every object. A staged table needs its
    /// staging slots: [`GioUring::register_staged_table`].
    pub fn register_table(&self, table: &LayerTable) -> Result<TableId> {
        if table.kind() == TableKind::Staged {
            return Err(GioError::table(
                "a staged table needs staging slots: register it with register_staged_table",
            ));
        }
        self.check_table(table)?;
        self.install_table(table, None)
    }

    pub(super) fn check_table(&self, table: &LayerTable) -> Result<()> {
        let g = table.geometry();
        for (i, pd) in g.drives.iter().enumerate() {
            let d = self.drive_info.get(pd.drive as usize).ok_or_else(|| {
                GioError::table(format!(
                    "pool drive {i} is drive {}; the ring has {}",
                    pd.drive,
                    self.drive_info.len()
                ))
            })?;
            if d.lba_size != pd.lba_size {
                return Err(GioError::table(format!(
                    "{}: LBA size {} differs from the {} the table places pool drive {i} with",
                    d.name, d.lba_size, pd.lba_size
                )));
            }
            let chunk_lbas = g.chunk_bytes() / d.lba_size as u64;
            if chunk_lbas > d.max_lbas as u64 {
                return Err(GioError::table(format!(
                    "{}: a chunk is {} blocks, above its transfer limit of {} blocks",
                    d.name, chunk_lbas, d.max_lbas
                )));
            }
            if table.kind() == TableKind::Sgl && d.sgl == SglSupport::None {
                return Err(GioError::table(format!("{} does not support SGLs: use a PRP table", d.name)));
            }
            let end = pd.data_start_lba.checked_add(g.lbas_per_drive(i as u32));
            if end.is_none_or(|e| e > d.blocks) {
                return Err(GioError::table(format!(
                    "{}: {} files need LBAs {}..{} but the namespace has {} blocks",
                    d.name,
                    g.files,
                    pd.data_start_lba,
                    pd.data_start_lba as u128 + g.lbas_per_drive(i as u32) as u128,
                    d.blocks
                )));
            }
        }
        Ok(())
    }

    /// Writes `table` (and its staging, if any) where the executor reads it.
    pub(super) fn install_table(
        &self,
        table: &LayerTable,
        staging: Option<super::state::Staging>,
    ) -> Result<TableId> {
        let g = table.geometry();
        let drive_map: Vec<u32> = (0..self.drive_info.len() as u32).collect();
        let mut tables = self.tables.lock().map_err(|_| GioError::invalid("table lock poisoned"))?;
        let slot = tables
            .iter()
            .position(Option::is_none)
            .ok_or_else(|| GioError::table(format!("all {} table slots are in use", tables.len())))?;
        let bytes = table.entries().as_bytes();
        let mem = self.exec.alloc(MemKind::Private, bytes.len())?;
        mem.write_bytes(0, bytes)?;
        let mut desc = table.descriptor(mem.exec_addr(), &drive_map);
        desc.staging = staging.as_ref().map_or(0, |st| st.exec_addr());
        self.private.write_obj(self.layout.tables + slot * size_of::<LayerTableDesc>(), &desc)?;
        let info = TableInfo {
            layers: g.layers,
            files: g.files,
            blocks: g.blocks,
            chunks: g.chunks(),
            ioctx_per_pair: g.ioctx_per_pair(),
        };
        tables[slot] = Some(TableSlot { info, _entries: mem, staging });
        Ok(TableId(slot as u8))
    }

    /// Removes a table no IOCB is using.
    pub fn unregister_table(&self, id: TableId) -> Result<()> {
        let mut tables = self.tables.lock().map_err(|_| GioError::invalid("table lock poisoned"))?;
        if tables.get(id.0 as usize).and_then(Option::as_ref).is_none() {
            return Err(GioError::table(format!("table {} is not registered", id.0)));
        }
        let pool = self.pool()?;
        let busy = pool
            .slots
            .iter()
            .filter(|s| s.table == Some(id.0) && matches!(s.state, SlotState::Filling | SlotState::InFlight))
            .count();
        if busy > 0 {
            return Err(GioError::table(format!("table {} is used by {busy} IOCB(s) in flight", id.0)));
        }
        let desc = LayerTableDesc { kind: TABLE_UNUSED, ..Default::default() };
        self.private.write_obj(self.layout.tables + id.0 as usize * size_of::<LayerTableDesc>(), &desc)?;
        tables[id.0 as usize] = None;
        Ok(())
    }

    pub fn table_info(&self, id: TableId) -> Result<TableInfo> {
        let tables = self.tables.lock().map_err(|_| GioError::invalid("table lock poisoned"))?;
        tables
            .get(id.0 as usize)
            .and_then(Option::as_ref)
            .map(|t| t.info)
            .ok_or_else(|| GioError::table(format!("table {} is not registered", id.0)))
    }
}
