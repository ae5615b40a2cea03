//! Handing out, filling and issuing IOCBs.

use super::layout::MAX_PARTS;
use super::state::{Pool, SlotState};
use super::GioUring;
use crate::error::{GioError, Result};
use crate::handle::{IocbId, PairListId, TableId};
use crate::iocb::Op;
use std::ops::Range;
use std::sync::atomic::Ordering;
use tutti_kernels::abi::{self, IoCtx, IocbHeader, LayerPair};

impl GioUring {
    /// Takes `n` free IOCBs from the pool, to be filled and issued (or released).
    pub fn get_iocb(&self, n: usize) -> Result<Vec<IocbId>> {
        let mut pool = self.pool()?;
        Self::take(&mut pool, n, self.opts.depth)
    }

    fn take(pool: &mut Pool, n: usize, depth: u32) -> Result<Vec<IocbId>> {
        if n == 0 {
            return Err(GioError::invalid("asked for 0 IOCBs"));
        }
        if pool.free.len() < n {
            return Err(GioError::PoolExhausted { wanted: n, free: pool.free.len(), depth });
        }
        let mut ids = Vec::with_capacity(n);
        for _ in 0..n {
            let index = pool.free.pop().ok_or(GioError::PoolExhausted { wanted: n, free: 0, depth })?;
            let slot = &mut pool.slots[index as usize];
            slot.gen = slot.gen.wrapping_add(1);
            slot.state = SlotState::Filling;
            slot.count = 0;
            slot.table = None;
            slot.pair_list = None;
            ids.push(IocbId { index, gen: slot.gen });
        }
        Ok(ids)
    }

    /// Returns IOCBs that were taken but not issued.
    pub fn release(&self, ids: &[IocbId]) -> Result<()> {
        let mut pool = self.pool()?;
        for &id in ids {
            let slot = Self::slot(&mut pool, id)?;
            if !matches!(slot.state, SlotState::Filling) {
                return Err(GioError::WrongState { id, state: slot.state.name(), expected: "being filled" });
            }
            slot.state = SlotState::Free;
            pool.free.push(id.index);
        }
        Ok(())
    }

    /// Fills IOCB `id` with `ctxs` (1..=2048 commands); their status is reset to pending.
    pub fn set_ioctxs(&self, id: IocbId, ctxs: &[IoCtx]) -> Result<()> {
        if ctxs.is_empty() || ctxs.len() > abi::IOCB_MAX_IOCTX {
            return Err(GioError::invalid(format!(
                "{} IOCTXs; an IOCB holds 1..={}",
                ctxs.len(),
                abi::IOCB_MAX_IOCTX
            )));
        }
        let mut pool = self.pool()?;
        let slot = Self::slot(&mut pool, id)?;
        if !matches!(slot.state, SlotState::Filling) {
            return Err(GioError::WrongState { id, state: slot.state.name(), expected: "being filled" });
        }
        let iocb = self.iocb_ptr(id.index);
        // SAFETY: the IOCB is Filling, so the executor does not touch it; the copy stays inside
        // its IOCTX array (len <= IOCB_MAX_IOCTX, checked above).
        unsafe {
            let dst = (&raw mut (*iocb).ioctx).cast::<IoCtx>();
            std::ptr::copy_nonoverlapping(ctxs.as_ptr(), dst, ctxs.len());
            for i in 0..ctxs.len() {
                (*dst.add(i)).status = abi::STATUS_PENDING;
            }
            let hdr = &raw mut (*iocb).hdr;
            (*hdr).kind = abi::IOCB_EXPLICIT;
            (*hdr).count = ctxs.len() as u32;
        }
        slot.count = ctxs.len() as u32;
        slot.table = None;
        slot.pair_list = None;
        Ok(())
    }

    /// Issues filled IOCBs: each is split into up to `sm_budget` parts (fewer
    /// for small IOCBs) and handed to the executor. All or none are issued.
    pub fn issue(&self, ids: &[IocbId], sm_budget: u32) -> Result<()> {
        if sm_budget == 0 {
            return Err(GioError::invalid("sm_budget is 0"));
        }
        let shape = self.exec.shape();
        let mut pool = self.pool()?;
        for (k, &id) in ids.iter().enumerate() {
            if ids[..k].contains(&id) {
                return Err(GioError::invalid(format!("{id} is listed twice")));
            }
            let slot = Self::slot(&mut pool, id)?;
            if !matches!(slot.state, SlotState::Filling) {
                return Err(GioError::WrongState { id, state: slot.state.name(), expected: "being filled" });
            }
            if slot.count == 0 {
                return Err(GioError::invalid(format!("{id} has no IOCTXs")));
            }
        }
        let budget_blocks =
            sm_budget.saturating_mul(shape.blocks_per_unit).min(shape.max_blocks).min(MAX_PARTS);
        // Before the push: a block outside the budget must not take these parts.
        self.exec.budget(sm_budget)?;
        for &id in ids {
            let slot = Self::slot(&mut pool, id)?;
            let parts = slot.count.div_ceil(shape.block_threads).clamp(1, budget_blocks.max(1));
            let mut seq = self.seq.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
            if seq == 0 {
                seq = self.seq.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
            }
            let iocb = self.iocb_ptr(id.index);
            // SAFETY: the IOCB is Filling (not the executor's); header writes stay inside it.
            unsafe {
                let hdr = &raw mut (*iocb).hdr;
                let mut h: IocbHeader = hdr.read_volatile();
                h.id = id.index;
                h.seq = seq;
                h.nparts = parts;
                h.parts_left = parts;
                h.completed = 0;
                h.failed = 0;
                h.first_error = abi::NO_ERROR;
                h.start_ns = 0;
                h.done_ns = 0;
                hdr.write_volatile(h);
            }
            slot.seq = seq;
            slot.state = SlotState::InFlight;
            for part in 0..parts {
                // The ring has a cell for every part of every IOCB of the pool: it cannot fill.
                if !self.sq.push(abi::ring_entry(id.index, part as u16, parts as u16)) {
                    return Err(GioError::Executor {
                        executor: self.exec.name().into(),
                        what: "submission ring full (the executor is not consuming it)".into(),
                    });
                }
            }
        }
        drop(pool);
        self.exec.kick(sm_budget)
    }

    /// Reads or writes `layer` of every (file, block) pair through layer table
    /// `table`: the executor expands each pair into 2 x chunks commands, so the
    /// host only copies the pairs. Uses as many IOCBs as needed (each holds up
    /// to 2048 IOCTXs) and returns them, issued.
    ///
    /// Pairs naming a file or block outside the table fail per IOCTX with a
    /// translation status; a layer outside the table is refused here.
    ///
    /// The copy is O(pairs) per layer; to move the same pairs for many
    /// layers, [`register_pairs`](Self::register_pairs) once and use
    /// [`submit_layer_list`](Self::submit_layer_list).
    pub fn submit_layer(
        &self,
        table: TableId,
        layer: u32,
        pairs: &[(u32, u32)],
        op: Op,
        sm_budget: u32,
    ) -> Result<Vec<IocbId>> {
        if pairs.is_empty() {
            return Err(GioError::invalid("submit_layer with no (file, block) pairs"));
        }
        let per_pair = self.check_layer(table, layer)?;
        let per_iocb = pairs_per_iocb(per_pair) as usize;
        let ids = {
            let mut pool = self.pool()?;
            let ids = Self::take(&mut pool, pairs.len().div_ceil(per_iocb), self.opts.depth)?;
            for (&id, chunk) in ids.iter().zip(pairs.chunks(per_iocb)) {
                let iocb = self.iocb_ptr(id.index);
                // SAFETY: the IOCB was just taken (Filling): the executor does not touch it;
                // `chunk.len() <= per_iocb <= IOCB_MAX_PAIRS`.
                unsafe {
                    let dst = (&raw mut (*iocb).pairs).cast::<LayerPair>();
                    for (i, &(file, block)) in chunk.iter().enumerate() {
                        dst.add(i).write_volatile(LayerPair { file, block });
                    }
                }
                let head = LayerHead { table, layer, op, per_pair, list: None };
                self.write_layer_head(&mut pool, id, &head, 0, chunk.len() as u32)?;
            }
            ids
        };
        self.issue_or_release(ids, sm_budget)
    }

    /// [`submit_layer`](Self::submit_layer) for pairs `range` of a
    /// registered list: each IOCB header names the list, its first pair and
    /// its pair count, so the host writes O(IOCBs) words whatever the number
    /// of pairs. IOCBs hold the same pairs as `submit_layer`'s would (IOCB k
    /// starts at pair `range.start + k * per_iocb`, per_iocb =
    /// min(2048 / (2 x chunks), 1024)), so IOCTX `i` of IOCB k is pair
    /// `k * per_iocb + i / (2 x chunks)` of the range.
    ///
    /// A stale or unknown list, or a range beyond it, is refused here; the
    /// executor checks the reference again (see [`fill_layer_list`](Self::fill_layer_list)).
    pub fn submit_layer_list(
        &self,
        table: TableId,
        layer: u32,
        list: PairListId,
        range: Range<u32>,
        op: Op,
        sm_budget: u32,
    ) -> Result<Vec<IocbId>> {
        if range.is_empty() {
            return Err(GioError::invalid(format!(
                "submit_layer_list with no pairs ({}..{})",
                range.start, range.end
            )));
        }
        let per_pair = self.check_layer(table, layer)?;
        let per_iocb = pairs_per_iocb(per_pair);
        let ids = {
            // Held until the IOCBs name the list, so it cannot be unregistered in between.
            let lists = self.lists()?;
            let len = Self::registered(&lists, list)?;
            if range.end > len {
                return Err(GioError::pair_list(format!(
                    "pairs {}..{} of {list}, which holds {len}",
                    range.start, range.end
                )));
            }
            let mut pool = self.pool()?;
            let n = range.len().div_ceil(per_iocb as usize);
            let ids = Self::take(&mut pool, n, self.opts.depth)?;
            for (k, &id) in ids.iter().enumerate() {
                let first = range.start + k as u32 * per_iocb;
                let npairs = per_iocb.min(range.end - first);
                let head = LayerHead { table, layer, op, per_pair, list: Some(list.index) };
                self.write_layer_head(&mut pool, id, &head, first, npairs)?;
            }
            ids
        };
        self.issue_or_release(ids, sm_budget)
    }

    /// Fills one taken IOCB to expand pairs `first..first + npairs` of pair
    /// list slot `list` through `table` at `layer`, without checking the list
    /// on the host: the executor bounds-checks the reference, and a slot that
    /// is not registered or a range beyond its list fails every IOCTX with
    /// `Translation::PairList` or `Translation::PairRange`. The table and the
    /// layer are checked (they size the IOCB). Issue it with [`issue`](Self::issue).
    #[allow(clippy::too_many_arguments)]
    pub fn fill_layer_list(
        &self,
        id: IocbId,
        table: TableId,
        layer: u32,
        list: u32,
        first: u32,
        npairs: u32,
        op: Op,
    ) -> Result<()> {
        let per_pair = self.check_layer(table, layer)?;
        if npairs == 0 || npairs > pairs_per_iocb(per_pair) {
            return Err(GioError::invalid(format!(
                "{npairs} pairs; an IOCB of this table holds 1..={}",
                pairs_per_iocb(per_pair)
            )));
        }
        let mut pool = self.pool()?;
        let head = LayerHead { table, layer, op, per_pair, list: Some(list) };
        self.write_layer_head(&mut pool, id, &head, first, npairs)
    }

    /// IOCTXs per pair of `table`, once `layer` is known to be inside it.
    fn check_layer(&self, table: TableId, layer: u32) -> Result<u32> {
        let info = self.table_info(table)?;
        if layer >= info.layers {
            return Err(GioError::invalid(format!("layer {layer} of a table with {} layers", info.layers)));
        }
        Ok(info.ioctx_per_pair)
    }

    /// Writes the request fields of a layer IOCB that is being filled.
    fn write_layer_head(
        &self,
        pool: &mut Pool,
        id: IocbId,
        head: &LayerHead,
        first: u32,
        npairs: u32,
    ) -> Result<()> {
        let slot = Self::slot(pool, id)?;
        if !matches!(slot.state, SlotState::Filling) {
            return Err(GioError::WrongState { id, state: slot.state.name(), expected: "being filled" });
        }
        let count = npairs * head.per_pair;
        let iocb = self.iocb_ptr(id.index);
        // SAFETY: the IOCB is Filling: the executor does not touch it until it is issued.
        unsafe {
            let hdr = &raw mut (*iocb).hdr;
            let kind = if head.list.is_some() { abi::IOCB_LAYER_LIST } else { abi::IOCB_LAYER };
            (&raw mut (*hdr).kind).write_volatile(kind);
            (&raw mut (*hdr).table).write_volatile(head.table.0 as u32);
            (&raw mut (*hdr).layer).write_volatile(head.layer);
            (&raw mut (*hdr).npairs).write_volatile(npairs);
            (&raw mut (*hdr).opcode).write_volatile(head.op as u8);
            (&raw mut (*hdr).count).write_volatile(count);
            (&raw mut (*hdr).pair_list).write_volatile(head.list.unwrap_or(0));
            (&raw mut (*hdr).pair_first).write_volatile(first);
        }
        slot.count = count;
        slot.table = Some(head.table.0);
        slot.pair_list = head.list;
        Ok(())
    }

    fn issue_or_release(&self, ids: Vec<IocbId>, sm_budget: u32) -> Result<Vec<IocbId>> {
        if let Err(e) = self.issue(&ids, sm_budget) {
            let _ = self.release(&ids);
            return Err(e);
        }
        Ok(ids)
    }
}

/// What every IOCB of one layer submission shares.
struct LayerHead {
    table: TableId,
    layer: u32,
    op: Op,
    per_pair: u32,
    /// Pair list slot (`TT_IOCB_LAYER_LIST`), or the IOCB's own pairs.
    list: Option<u32>,
}

/// Pairs one layer IOCB carries: as many as fill its IOCTXs, at most
/// `IOCB_MAX_PAIRS`. IOCB k of a layer submission starts at pair `k` times this.
pub fn pairs_per_iocb(ioctx_per_pair: u32) -> u32 {
    (abi::IOCB_MAX_IOCTX as u32 / ioctx_per_pair.max(1)).clamp(1, abi::IOCB_MAX_PAIRS as u32)
}
