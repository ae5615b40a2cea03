//! Registered (file, block) pair lists: the pairs of a request copied to the
//! executor once, then referenced by the layer IOCBs of every layer.
//!
//! With [`GioUring::submit_layer`] the host copies every pair into each
//! layer's IOCBs, so a layer of n blocks costs O(n) host work. A request
//! moves the same pairs for every layer, so [`GioUring::register_pairs`]
//! copies them once into executor memory and
//! [`GioUring::submit_layer_list`] writes only IOCB headers that name the
//! list, a first pair and a count (`TT_IOCB_LAYER_LIST`): O(IOCBs) per layer.
//! The executor checks the list id and the range against the list's
//! descriptor; a bad reference fails each IOCTX with
//! `Translation::PairList` / `Translation::PairRange`, never an
//! out-of-bounds read.

use super::state::{PairListSlot, Registered, SlotState};
use super::GioUring;
use crate::error::{GioError, Result};
use crate::handle::PairListId;
use crate::mem::MemKind;
use tutti_kernels::abi::{LayerPair, PairListDesc};
use zerocopy::IntoBytes;

impl GioUring {
    /// Copies `pairs` (file, block) once into executor memory and returns a
    /// handle for [`submit_layer_list`](Self::submit_layer_list). Pairs are
    /// not checked against any layer table here: a pair outside the table
    /// fails its IOCTXs with a translation status, as with `submit_layer`.
    ///
    /// The list lives in executor-private memory allocated like the layer
    /// tables: host memory for the `HostExecutor`; device memory
    /// (`cuMemAlloc`, filled through the executor's copy stream) for the
    /// `CudaExecutor`, so far run only through the stand-in driver. It
    /// allocates device memory per list, which a sub-allocator would avoid;
    /// a list given back while a persistent kernel runs is freed after it stops.
    ///
    /// Fails with [`GioError::PairListsFull`] when `max_pair_lists` lists are
    /// registered; callers can fall back to [`submit_layer`](Self::submit_layer).
    pub fn register_pairs(&self, pairs: &[(u32, u32)]) -> Result<PairListId> {
        if pairs.is_empty() {
            return Err(GioError::pair_list("registering an empty pair list"));
        }
        let len = u32::try_from(pairs.len()).map_err(|_| {
            GioError::pair_list(format!("{} pairs; a list holds at most 2^32 - 1", pairs.len()))
        })?;
        let mut lists = self.lists()?;
        let slot = lists
            .iter()
            .position(|s| s.list.is_none())
            .ok_or(GioError::PairListsFull { slots: self.opts.max_pair_lists })?;
        let packed: Vec<LayerPair> = pairs.iter().map(|&(file, block)| LayerPair { file, block }).collect();
        let bytes = packed.as_bytes();
        let mem = self.exec.alloc(MemKind::Private, bytes.len())?;
        mem.write_bytes(0, bytes)?;
        // The executor sees the list from the next issue on: the ring push (release) orders
        // these writes before any IOCB that names the slot.
        let desc = PairListDesc { pairs: mem.exec_addr(), npairs: len as u64 };
        self.private.write_obj(self.pair_list_desc(slot), &desc)?;
        let s = &mut lists[slot];
        s.gen = s.gen.wrapping_add(1);
        s.list = Some(Registered { len, _mem: mem });
        Ok(PairListId { index: slot as u32, gen: s.gen })
    }

    /// Frees a pair list. Refused while an IOCB that references it is being
    /// filled or is in flight (the executor may still read it): wait for
    /// those IOCBs first. IOCBs completed but not yet collected do not count.
    pub fn unregister_pairs(&self, id: PairListId) -> Result<()> {
        let mut lists = self.lists()?;
        Self::registered(&lists, id)?;
        let pool = self.pool()?;
        let busy = pool
            .slots
            .iter()
            .filter(|s| {
                s.pair_list == Some(id.index) && matches!(s.state, SlotState::Filling | SlotState::InFlight)
            })
            .count();
        if busy > 0 {
            return Err(GioError::pair_list(format!("{id} is used by {busy} IOCB(s) in flight")));
        }
        drop(pool);
        self.private.write_obj(self.pair_list_desc(id.index as usize), &PairListDesc::default())?;
        lists[id.index as usize].list = None;
        Ok(())
    }

    /// Pairs in a registered list.
    pub fn pair_list_len(&self, id: PairListId) -> Result<u32> {
        let lists = self.lists()?;
        Self::registered(&lists, id)
    }

    /// Pair lists registered now.
    pub fn pair_lists_in_use(&self) -> Result<usize> {
        Ok(self.lists()?.iter().filter(|s| s.list.is_some()).count())
    }

    pub(super) fn lists(&self) -> Result<std::sync::MutexGuard<'_, Vec<PairListSlot>>> {
        self.pair_lists.lock().map_err(|_| GioError::invalid("pair list lock poisoned by a panic"))
    }

    /// The length of `id` if it is registered under this generation.
    pub(super) fn registered(lists: &[PairListSlot], id: PairListId) -> Result<u32> {
        match lists.get(id.index as usize) {
            Some(PairListSlot { gen, list: Some(r) }) if *gen == id.gen => Ok(r.len),
            _ => Err(GioError::pair_list(format!("{id} is not registered"))),
        }
    }

    fn pair_list_desc(&self, slot: usize) -> usize {
        self.layout.pair_lists + slot * size_of::<PairListDesc>()
    }
}
